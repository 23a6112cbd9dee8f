// Measuring a plan under MPI, nccl-tests' way: `warmup` untimed steps, then `timed` steps, each
// after a barrier, every rank timing its own ops on its own monotonic clock. Rank 0 gathers every
// rank's op intervals (MPI_Gatherv) and builds the same record as the simulator's
// (core/results.hpp, with core/timeline.hpp's StepTimeline and fill_record):
//
//   step time          per timed step, the slowest rank's time from the barrier to its last op;
//                      average, worst, median, p95, standard deviation over the timed steps.
//   collective time    per instance, from the last member's arrival to completion: the shortest
//                      of the members' (completion - arrival), each on its own clock, so clocks of
//                      different hosts never need to agree. A rank's span before that is waiting.
//   per rank           compute / communication / exposed / idle from those intervals.
//   traffic            the bytes of the program's messages per rank, split by whether the peer
//                      runs on the same host (not the MPI library's internal transfers).
//   trace              the slowest timed step of the first ranks, in the simulator's Chrome
//                      trace format (so analysis/plot.py draws both alike).
//   execution          MPI library and standard, hosts, ranks per host, oversubscription, BLAS
//                      and its threads, and the executor's own host time (engine, handlers, MPI).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "backends/mpi/executor.hpp"
#include "core/results.hpp"

namespace muonbed::mpi {

struct MeasureSettings {
  int warmup_steps = 2;
  int timed_steps = 10;
  int trace_ranks = 64;
  // What fill_record needs of the experiment's cluster (its name and the GPU's peak, for
  // utilization); nodes and ranks per node come from the hosts the ranks ran on.
  std::string cluster_name;
  double peak_tflops = 0;
  std::string launcher;
  int blas_threads = 1;  // per rank (OpenBLAS, when the build uses it)
};

struct Measured {
  ResultRecord record;  // provenance's experiment part left to the caller
  nlohmann::json trace;
  double wall_s = 0;
  double peak_rss_bytes = 0;  // rank 0's
  std::int64_t messages = 0;  // sent by all ranks over all steps run
};

// Collective over `world`: runs the steps and returns the record on rank 0 (nullopt elsewhere).
std::optional<Measured> measure(const StepPlan& plan, MPI_Comm world,
                                const ExecutorOptions& options, const MeasureSettings& settings);

// OpenBLAS found in this process (by its exported symbols, without linking it): its
// configuration text and thread count, after setting the count to `threads` when > 0.
struct BlasInfo {
  std::string name;  // "" when no OpenBLAS is loaded
  int threads = 0;
};
BlasInfo set_blas_threads(int threads);

}  // namespace muonbed::mpi
