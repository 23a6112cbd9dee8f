// The Open MPI executor of one rank: the rank's lowered program (core/plan/program.hpp) on its CPU
// store (backends/cpu), driven by the one execution engine (core/engine/engine.hpp) with this rank
// as its only local rank. Collectives become nonblocking MPI calls when the engine starts an
// instance (this rank's own arrival: the library matches the other members), one MPI communicator
// per communicator identity of the plan (stream + group dims, MPI_Comm_split once, every rank
// calling every split in one order), so comm and comm_scatter progress independently, as CUDA
// streams would. Compute ops run on one worker thread per stream that has compute ops, so
// Newton-Schulz really overlaps communication, when the host has a core for every thread; otherwise
// on the main thread, which tests its requests at the kernels' progress points (ComputeMode below).
// Only the main thread calls MPI (MPI_THREAD_FUNNELED); testing outstanding requests is what
// progresses them.
//
// How each collective maps to MPI (bytes as MPI_BYTE in the wire dtype, counts from the program's
// exchange phases, so uneven pieces are v-variants):
//   gather -> MPI_Igatherv, scatter -> MPI_Iscatterv, broadcast -> MPI_Ibcast,
//   all_gather -> MPI_Iallgatherv, all_to_all -> MPI_Ialltoallv,
//   reduce_scatter -> MPI_Ialltoallv of the pieces, then backends/cpu's fixed-order fp32 sum
//   (so results are bit-exact whatever MPI's reduction order would be),
//   all_reduce -> that reduce-scatter, then MPI_Iallgatherv of the reduced parts,
//   send/recv -> MPI_Isend / MPI_Irecv, barrier -> MPI_Ibarrier.
// With `generic_exchange` every data phase is an MPI_Ialltoallv instead (a cross-check).
//
// Failures are loud: any exception names the rank, step, op id and label; a watchdog ends a step
// that stops progressing (timeout_s: a rank with a stuck op of its own after half of it, a rank
// only waiting for others after all of it, so the stuck rank reports first); fault injection
// (`Fault`) makes a rank exit, throw or hang at a given step and op, for the tests.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cpu/store.hpp"
#include "core/plan/program.hpp"

namespace muonbed::mpi {

// Throws ExecutionError with the call's text, file:line and MPI's error string.
void check_mpi(int code, const char* call, const char* file, int line);
#define MUONBED_MPI_CHECK(call) ::muonbed::mpi::check_mpi((call), #call, __FILE__, __LINE__)

// Fault injection: rank `rank` exits (code 3, without finalizing MPI), throws, or hangs when it
// reaches plan op `op` in step `step` (counted from 0 over warm-up and timed steps).
enum class FaultKind { none, exit, raise, hang };
struct Fault {
  int rank = -1;
  int step = -1;
  int op = -1;
  FaultKind kind = FaultKind::none;
  bool active() const { return kind != FaultKind::none; }
};
// "RANK:STEP:OP:KIND" with KIND exit | throw | hang; "" is no fault. Throws Error on bad text.
Fault parse_fault(const std::string& text);
std::string to_string(const Fault& fault);

// Where compute ops run beside communication.
//   threads          one worker thread per stream with compute ops, while the main thread tests
//                    the MPI requests: real overlap when every thread of the host has a core.
//   progress_points  on the main thread, which tests its requests at the CPU kernels' progress
//                    points (kernels/progress.hpp: after every GEMM of Newton-Schulz, between
//                    slices of an elementwise update): one thread per rank, for a rank with one
//                    core, where a second thread would take the core from the kernel on each of
//                    its wake-ups (measured: ~12 preemptions per Newton-Schulz on the 2-core VM,
//                    40-90 us each) and the peer's messages still wait for this rank's MPI calls.
//   automatic        threads when ranks on the host x (1 + compute streams) <= its cores, else
//                    progress_points.
enum class ComputeMode { automatic, threads, progress_points };
std::string_view to_string(ComputeMode mode);
// "auto" | "threads" | "progress_points"; throws Error naming the valid ones.
ComputeMode parse_compute_mode(const std::string& text);

struct ExecutorOptions {
  std::uint64_t seed = 1;  // backends/cpu/data.hpp's step data
  double timeout_s = 60;   // watchdog (see the header comment)
  Fault fault;
  bool generic_exchange = false;
  // Compute ops on the main thread, one at a time (no overlap with communication): a
  // cross-check that isolates the executor's concurrency.
  bool inline_compute = false;
  ComputeMode compute_mode = ComputeMode::automatic;
  int max_poll_sleep_us = 200;  // longest sleep between MPI tests while requests are outstanding
  LowerOptions lower;
  // Negative controls: edits the lowered program before anything runs (LoopbackOptions' hook).
  std::function<void(RankProgram&)> edit_program;
};

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

class Executor {
 public:
  // Collective over `world` (MPI_Comm_split of every communicator identity, host names): every
  // rank of `world` must construct it. Throws ExecutionError when `world`'s size is not the plan's.
  Executor(const StepPlan& plan, MPI_Comm world, ExecutorOptions options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs step `step` (fills its gradients, a barrier, then the step); keeps its timings.
  void run_step(int step);
  // An untimed check step (nccl-tests' -c): every message carries a known pattern instead of
  // the step's data and every receiver counts the elements that differ
  // (timings().wrong_elements). It leaves the rank's data meaningless: run it last.
  void run_check_step(int step);
  const StepTimings& timings() const;

  int rank() const;
  const RankProgram& program() const;
  const cpu::RankStore& store() const;
  // Host index of every world rank (hosts in order of their first rank) and the host names.
  const std::vector<int>& host_of() const;
  const std::vector<std::string>& hosts() const;
  int compute_threads() const;
  ComputeMode compute_mode() const;  // resolved: threads or progress_points

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// How `wait_for` and the step loop wait for MPI. Open MPI moves data only inside MPI calls (the
// shared-memory transport's single copy runs in the receiver's MPI_Test), so a rank that sleeps
// between tests delays every message by its sleep: `spin` keeps testing, for a rank whose core
// has nothing else to do; `sleep` backs off, leaving the core to another rank or to compute.
enum class WaitMode { sleep, spin };

// Tests `request` until it completes; throws ExecutionError "`where`: no progress for T s in
// `what`" after `timeout_s`.
void wait_for(MPI_Request& request, double timeout_s, const std::string& where,
              const std::string& what, WaitMode mode = WaitMode::sleep);

// Cores this process may run on (its affinity mask).
int available_cores();

// Freed memory stays with the process (as the executor keeps it, so steps after the warm-up pay
// no page faults): what the compute benchmark of `muonbed calibrate` runs under too.
void retain_freed_memory();

// Prints "muonbed: error: `message`" on stderr and ends every rank with MPI_Abort.
[[noreturn]] void abort_world(const std::string& message, int code = 1);

}  // namespace muonbed::mpi
