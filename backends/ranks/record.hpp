// The record of a measured run, from every rank's op intervals of its timed steps: the step
// times, the collectives' instance times, per rank compute / communication / exposed / idle, the
// traffic and the Chrome trace (core/engine/timeline.hpp's StepTimeline and fill_record, as the
// simulator's record). What backends/ranks/measure.hpp gathers under MPI, and what the CUDA
// loopback worker (every rank on one GPU, no MPI) builds in one process. No MPI here.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/launch/launch.hpp"
#include "core/plan/plan.hpp"
#include "core/results/results.hpp"
#include "core/results/run_point.hpp"

namespace muonbed::mpi {

// One op of a step as this rank ran it, in seconds on the rank's monotonic clock from the step's
// start (right after the barrier before it).
struct OpTiming {
  int op = -1;
  double start = 0;  // compute: its run began on the worker; collective: posted (arrival)
  double end = 0;    // compute: its run ended; collective: completion seen by this rank
};

struct StepTimings {
  int step = 0;
  double finish = 0;  // the rank's last op done
  std::vector<OpTiming> ops;
  double bytes_sent = 0, bytes_received = 0;       // of the program's messages
  double intra_host_bytes = 0, network_bytes = 0;  // sent, split by the peer's host
  double messages = 0;
  // The main thread's CPU time (not wall time: ranks sharing cores would inflate that) in the
  // engine and its bookkeeping, in the handlers (packing / unpacking messages, alloc, release,
  // keep copies) and inside MPI calls (posting and testing, which progresses them); and the wall
  // time it slept waiting for something to complete.
  double engine_s = 0;
  double handlers_s = 0;
  double mpi_s = 0;
  double idle_s = 0;
  std::int64_t wrong_elements = 0;  // run_check_step: received elements off the pattern
  // FLOPs of the GEMMs the rank's forward and backward ops ran (a training step), counted by the
  // CPU handlers as they multiply: the check of the plan's op_flops.
  double gemm_flops = 0;
};

struct MeasureSettings {
  int warmup_steps = 2;
  int timed_steps = 10;
  int trace_ranks = 64;
  // What fill_record needs of the experiment's cluster (its name and the GPU's peak, for
  // utilization); nodes and ranks per node come from the hosts the ranks ran on.
  std::string cluster_name;
  double peak_tflops = 0;
  std::string launcher;
  int blas_threads = 1;                        // per rank (OpenBLAS, when the build uses it)
  std::string backend = "mpi";                 // the record's backend, and its notes' prefix
  std::string messages_what = "MPI messages";  // what Measured::messages counts
  // Replaces the MPI library as the record's execution library when set (the NCCL executor:
  // GPU, driver, CUDA, cuBLAS, NCCL versions), and notes added to the record.
  std::string library;
  std::vector<std::string> notes;
  // How a step and the trace are timed, as the record's notes say it.
  std::string step_clock =
      "from the barrier before it to the rank's last op, on the rank's own monotonic clock";
  std::string trace_clock =
      "from each rank's own start after the barrier (hosts' clocks are not aligned)";
  // After the timed steps, one untimed check step whose messages carry a known pattern
  // (Executor::run_check_step); Measured::wrong_elements sums what the receivers found wrong.
  bool check_data = false;
};

struct Measured {
  ResultRecord record;  // provenance's experiment part left to the caller
  std::string trace;    // Chrome trace (JSON text), empty when none
  double wall_s = 0;
  double peak_rss_bytes = 0;         // rank 0's
  std::int64_t messages = 0;         // sent by all ranks over all steps run
  std::string messages_what;         // MeasureSettings::messages_what
  std::int64_t wrong_elements = -1;  // check_data: elements received wrong (-1: not checked)
  std::vector<double> step_times_s;  // each timed step's time, in the order they ran
  // measure_paired: the twin's record (its provenance's experiment part left to the caller too).
  std::optional<ResultRecord> twin;
};

// Where the ranks ran: each rank's host (an index into hosts), the cores of each host (ranks
// beyond them are oversubscribed, which the record says out loud), and how each rank computed.
struct RanksPlacement {
  std::vector<int> host_of;
  std::vector<std::string> hosts;
  std::vector<int> cores_of_host;
  int compute_threads = 0;
  std::string compute_mode;  // ExecutionInfo::compute_mode
};

// The record of the timed steps `ranks[r][i]` (rank r's i-th timed step; every rank the same
// number). `execution` arrives with what only the caller knows (library, MPI standard, BLAS);
// the rest of the record's execution part is filled here. Measured's wall time, peak RSS and
// message counts are the caller's too.
Measured measured_record(const StepPlan& plan, const std::vector<std::vector<StepTimings>>& ranks,
                         const RanksPlacement& placement, const MeasureSettings& settings,
                         ExecutionInfo execution);

// What the record's ranks and its run cost add after measured_record: each rank's pool peak
// (ranks[].memory.measured_peak_bytes; -1 where not measured), the run's wall time since `start`,
// this process's peak RSS, and the messages sent over all steps run.
void add_run_cost(Measured& measured, const std::vector<std::int64_t>& pool_peak_bytes,
                  std::int64_t messages, std::chrono::steady_clock::time_point start);

// The settings a job gives every measured backend (warm-up and timed steps, trace ranks,
// cluster, launcher, BLAS threads, the data check, the record's backend).
MeasureSettings measure_settings(const launch::Job& job);
// The point's run from rank 0's measurement (what launch_job reads back).
PointRun point_run(Measured measured);

}  // namespace muonbed::mpi
