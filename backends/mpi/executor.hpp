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
// (backends/launch/launch.hpp's `Fault`) makes a rank exit, throw or hang at a given step and op,
// for the tests. MPI checks, waits, host maps and step timings are the ranks' shared ones
// (backends/ranks/).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cpu/store.hpp"
#include "backends/launch/launch.hpp"
#include "backends/ranks/measure.hpp"
#include "backends/ranks/world.hpp"
#include "core/plan/program.hpp"

namespace muonbed::mpi {

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
  launch::Fault fault;     // backends/launch/launch.hpp
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

// Freed memory stays with the process (as the executor keeps it, so steps after the warm-up pay
// no page faults): what the compute benchmark of `muonbed calibrate` runs under too.
void retain_freed_memory();

}  // namespace muonbed::mpi
