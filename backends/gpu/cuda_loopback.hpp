// The CUDA loopback runtime: every rank of a plan as a logical rank in one process on one GPU,
// with its own device pool and CUDA streams (backends/gpu/device_rank.hpp), the same handlers and
// kernels as the NCCL executor, and messages moved by cudaMemcpyAsync between the ranks' staging.
// It exists because NCCL refuses two ranks on one GPU, and a lent machine has one GPU: with it, a
// plan of 8 ranks runs on the GPU and is checked against the single-device reference.
//
// The one execution engine (core/engine/engine.hpp) drives it, all ranks local, exactly like the
// CPU loopback executor: it says which ops run in the step and checks that the step can finish;
// every op completes at once for it, and the ops are then *issued* to the GPU in plan order (the
// GPU's order comes from the CUDA streams and events, see device_rank.hpp). A
// collective phase: every member gathers its messages on its own stream and records an event;
// each receiver's stream waits for its senders' events, copies their messages into its staging
// and writes them; each sender's stream then waits for its receivers (its staging is free again).
//
// Options: `graph` captures the whole step as one CUDA graph (per pattern of active ops, so
// level-scheduled sync gets one graph per step of its hyper-period) and replays it; the per-step
// inputs (gradients, QK-clip scales, AdamW scalars) are written to fixed device memory before
// each launch. `time_ops` records CUDA events around every op (eager only).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cpu/store.hpp"
#include "backends/gpu/device_rank.hpp"
#include "core/engine/engine.hpp"
#include "core/plan/program.hpp"

namespace muonbed::gpu {

struct CudaLoopbackOptions {
  std::uint64_t seed = 1;
  DeviceOptions device;
  bool graph = false;
  LowerOptions lower;
  // Timing runs: parameters and each step's gradients drawn on the device, state starting at
  // zero (DeviceRank::fill_random_static), with no host copy of any tensor. The reference data
  // (cpu::fill_parameters / fill_gradients, one host thread per element) takes about a minute
  // per billion parameters and step; device data takes milliseconds, and the step's GPU work is
  // the same. store() then throws: such a run is timed, never checked.
  bool random_device_data = false;
};

struct StepTime {
  int step = 0;
  double gpu_ms = 0;      // from the step's start event to its end event on the GPU
  double host_ms = 0;     // CPU time of issuing the step (engine + handlers, or the graph launch)
  bool captured = false;  // this step captured its graph (the capture does not run the step)
};

class CudaLoopbackExecutor {
 public:
  // Throws ExecutionError (no device, a plan it cannot run) before running anything.
  CudaLoopbackExecutor(const StepPlan& plan, CudaLoopbackOptions options);
  ~CudaLoopbackExecutor();

  void run_step();
  void run(int steps) {
    for (int i = 0; i < steps; ++i) run_step();
  }
  int steps_done() const { return steps_; }
  const StepTime& last_step() const { return last_; }
  // Every rank's static tensors copied back from the device (parameters, state) for the check.
  const cpu::RankStore& store(int rank);
  const RankProgram& program(int rank) const {
    return programs_.at(static_cast<std::size_t>(rank));
  }
  const DeviceRank& device(int rank) const { return *devices_.at(static_cast<std::size_t>(rank)); }
  // Per-op GPU times of the last eager step of rank `rank` (time_ops).
  std::vector<DeviceOpTime> op_times(int rank) const;

 private:
  class Handler;
  struct Events;
  void issue_step(int step);
  const StepPlan& plan_;
  CudaLoopbackOptions options_;
  std::vector<RankProgram> programs_;
  std::vector<std::unique_ptr<cpu::RankStore>> stores_;
  std::vector<std::unique_ptr<DeviceRank>> devices_;
  PlanIndex index_;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Events> events_;
  std::vector<char> downloaded_;
  int steps_ = 0;
  StepTime last_;
};

}  // namespace muonbed::gpu
