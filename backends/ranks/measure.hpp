// Measuring a plan on the ranks of a measured backend (any executor under backends/launch/'s
// mpirun: the MPI executor, the NCCL executor), nccl-tests' way: `warmup` untimed steps, then
// `timed` steps, each after a barrier, every rank timing its own ops on its own monotonic clock.
// Rank 0 gathers every rank's op intervals (MPI_Gatherv) and builds the same record as the
// simulator's (core/results/results.hpp, with core/engine/timeline.hpp's StepTimeline and
// fill_record):
//
//   step time          per timed step, the slowest rank's time from the barrier to its last op;
//                      average, worst, median, p95, standard deviation over the timed steps.
//   collective time    per instance, from the last member's arrival to completion: the shortest
//                      of the members' (completion - arrival), each on its own clock, so clocks of
//                      different hosts never need to agree. A rank's span before that is waiting.
//   per rank           compute / communication / exposed / idle from those intervals, and the
//                      peak bytes its pool held for the plan's tensors (beside rank_memory's).
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
#include <vector>

#include "backends/ranks/record.hpp"
#include "core/plan/plan.hpp"
#include "core/results/results.hpp"

namespace muonbed::mpi {

// What measuring needs of a rank's executor, so that every executor under MPI (this one, the
// NCCL executor of backends/gpu) shares the warm-up / timed loop, the gathering of timings and
// the record: run a step (barrier included), report its timings on the rank's clock.
class MeasuredRank {
 public:
  virtual ~MeasuredRank() = default;
  virtual void run_step(int step) = 0;
  virtual const StepTimings& timings() const = 0;
  virtual int rank() const = 0;
  virtual const std::vector<int>& host_of() const = 0;
  virtual const std::vector<std::string>& hosts() const = 0;
  virtual int compute_threads() const = 0;
  // ExecutionInfo::compute_mode ("" where it means nothing, as for a GPU's streams).
  virtual std::string compute_mode() const { return ""; }
  // One untimed step whose messages carry a known pattern; timings().wrong_elements counts what
  // this rank received off it. Executors without it throw Error.
  virtual void run_check_step(int step) = 0;
  // What the rank's pool held for the plan's tensors at its peak so far (the record's
  // ranks[].memory.measured_peak_bytes, beside rank_memory), or -1 where it is not measured.
  virtual std::int64_t pool_peak_bytes() const { return -1; }
};

// measure() with any executor: `settings.backend` names the record's backend.
std::optional<Measured> measure_rank(const StepPlan& plan, MPI_Comm world, MeasuredRank& executor,
                                     double timeout_s, const MeasureSettings& settings);

// The steps measure_rank runs, for one executor or several sharing the world (one plan each):
// every executor's `warmup` untimed steps, one executor after the other, then `timed` rounds
// in which each executor runs one timed step in turn (A, B, A, B, ...), so that a drift of the
// machine's speed during the run falls on every plan alike. Step numbers count from 0 per
// executor over its warm-up and timed steps. Returns each executor's timed steps' timings;
// `messages` gets each executor's messages over all its steps. Local to the rank (no MPI call of
// its own: each run_step has its barrier).
std::vector<std::vector<StepTimings>> run_interleaved_steps(
    const std::vector<MeasuredRank*>& executors, int warmup, int timed,
    std::vector<double>& messages);

// A training point and its AdamW twin (issue 24's muon_overhead) measured in one job and world,
// their executors side by side and their timed steps interleaved (run_interleaved_steps): the
// ratio of the two steps is then a paired comparison, which a drift of the machine between two
// separate runs would otherwise bias. Each plan's record is measure_rank's; on rank 0 the
// point's record carries the twin's (Measured::twin: run_plan takes adamw_step_s and
// muon_overhead from it) and the spread of the per-pair overheads (training.overhead_pairs,
// overhead_spread) with a note saying how the twin ran. `settings.check_data` checks the point's
// plan only.
std::optional<Measured> measure_paired(const StepPlan& plan, const StepPlan& twin_plan,
                                       MPI_Comm world, MeasuredRank& executor,
                                       MeasuredRank& twin_executor, double timeout_s,
                                       const MeasureSettings& settings);

// The per-pair overheads of interleaved steps: point[i] / twin[i] - 1 for each timed round i
// (Error when the counts differ or a twin step is not positive).
std::vector<double> paired_overheads(const std::vector<double>& point_steps_s,
                                     const std::vector<double>& twin_steps_s);

// OpenBLAS found in this process (by its exported symbols, without linking it): its
// configuration text and thread count, after setting the count to `threads` when > 0.
struct BlasInfo {
  std::string name;  // "" when no OpenBLAS is loaded
  int threads = 0;
};
BlasInfo set_blas_threads(int threads);

}  // namespace muonbed::mpi
