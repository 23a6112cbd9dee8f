// One rank's program on a GPU: the CUDA handlers of every op kind, shared by the CUDA loopback
// runtime (N logical ranks on one GPU, cuda_loopback.hpp) and the NCCL executor (one rank per
// GPU, nccl_executor.hpp). Neither interprets the plan: the engine (core/engine/engine.hpp) says
// which op starts, and this class *issues* it, asynchronously, on the CUDA stream of the op's plan
// stream.
//
//   memory      one device pool allocated once (backends/gpu/layout.hpp's plan_pool: static
//               tensors and transient buffers at fixed offsets, each in its plan dtype, then
//               per-stream fp32 scratch and staging), one NS workspace per stream, the run tables
//               of every view, uploaded once.
//   ordering    one CUDA stream per plan stream (with a cuBLAS handle where it computes); every
//               issued op records an event when its work is queued, and an op first waits for
//               the events of its deps on other streams. Ops that are not issued follow the
//               engine's semantics: one inactive in the step stands for its deps, a send/recv
//               this rank passes through for its deps and the ops before it on its stream. alloc
//               and release are issued the same way (no work), and an alloc also waits for the
//               releases whose space it reuses (layout.hpp), so reuse is ordered on the device.
//   compute     momentum (+ Nesterov), apply (+ QK-clip), AdamW (+ QK-clip) with the fused kernels
//               of kernels/gpu.hpp, the update rounded to the comm dtype; Newton-Schulz through
//               the kernel registry (v2 by default), the op's same-shape matrices as one batch,
//               the result rounded to the comm dtype; pack, unpack and keep copies through the
//               run tables. Kernels compute in fp32: a view that is one stretch of an fp32 tensor
//               is used in place; otherwise it is gathered (widened) into the stream's scratch
//               and scattered back, rounded to each tensor's dtype (bf16 parameters, say), as
//               backends/cpu's RankStore reads and writes.
//   collectives begin_phase gathers each message, in the wire dtype, into the stream's send
//               staging at its displacement (and the own part); the transport moves the bytes
//               (cudaMemcpyAsync, or grouped ncclSend/ncclRecv); finish_phase writes the own part
//               and every received message (reducing phases: added in fp32, in group order).
//
// Per-step inputs that change between steps (QK-clip row scales, AdamW's bias corrections) live
// in device memory written by prepare_step before the step is issued, so a captured CUDA graph
// of the step replays any step. Every CUDA call is checked; errors throw ExecutionError naming
// the rank, op and call. Plain C++20 header: no CUDA include (kernels/gpu.hpp's forward
// declarations).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/store.hpp"
#include "backends/gpu/layout.hpp"
#include "backends/gpu/op_times.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/program.hpp"
#include "kernels/gpu.hpp"

struct CUevent_st;  // cudaEvent_t is CUevent_st*

namespace muonbed::gpu {

// Throws ExecutionError "FILE:LINE: CALL failed: NAME (description)" for a cudaError_t value.
void check_cuda(int code, const char* call, const char* file, int line);
#define MUONBED_GPU_CHECK(call) \
  ::muonbed::gpu::check_cuda(static_cast<int>(call), #call, __FILE__, __LINE__)

struct DeviceOptions {
  int device = 0;
  int ns_version = 2;     // kernels/gpu.hpp's registry; a shape v2 cannot run falls back to v1
  bool poison = false;    // fill transient buffers with NaN at their alloc (tests)
  bool time_ops = false;  // CUDA events around every op (eager steps only)
  // Test hook: Newton-Schulz leaves the update as it is (only the rounding to the comm dtype), so
  // a step moves data through every other kernel and can be compared bit for bit with the CPU
  // executors doing the same.
  bool ns_identity = false;
};

// Executors issue each rank's ops in plan order (after the engine has said which ops run in the
// step): every event an op waits for is then recorded before the wait is issued.

class DeviceRank {
 public:
  DeviceRank(const StepPlan& plan, const RankProgram& program, const DeviceOptions& options);
  ~DeviceRank();
  DeviceRank(const DeviceRank&) = delete;
  DeviceRank& operator=(const DeviceRank&) = delete;

  int rank() const { return program_->rank; }
  const RankProgram& program() const { return *program_; }
  const PoolLayout& layout() const { return layout_; }
  // The plan's tensors in the pool (static and transient regions, layout().bytes()): what
  // rank_memory counts, plus alignment and first-fit gaps (tests/backends/memory_test.cpp).
  std::int64_t pool_bytes() const { return layout_.bytes(); }
  std::int64_t device_bytes() const;  // pool (with scratch) + workspaces + tables
  CUstream_st* stream(int plan_stream) const;
  int num_streams() const;

  // Host <-> device (synchronous; never inside a capture).
  void upload_static(const cpu::RankStore& store);     // every static tensor
  void upload_gradients(const cpu::RankStore& store);  // the gradient pieces of the step
  void download_static(cpu::RankStore& store) const;
  // Timing runs without host data (CudaLoopbackOptions::random_device_data): parameters drawn on
  // the device, uniform in [-0.02, 0.02), every other static tensor zero (the optimizer state a
  // run starts from); then per step the gradient pieces, drawn on the device in the same range.
  // Never the reference's values: such a run is timed, not checked.
  void fill_random_static(std::uint64_t seed);
  void fill_random_gradients(std::uint64_t seed, int step);
  // The per-step device inputs of step `step` (QK-clip scales, AdamW scalars).
  void prepare_step(std::uint64_t seed, int step);

  // Ordering. begin_step: every stream waits for `start` (an event recorded before the step,
  // also what makes every stream part of a capture). end_step: `join` waits for every stream,
  // through events the caller owns (`next_event` hands out one per stream; none is created here,
  // so nothing is created during a capture).
  void begin_step(CUevent_st* start);
  void end_step(CUstream_st* join, const std::function<CUevent_st*()>& next_event);
  void wait_deps(int plan_op, int step);
  void mark_start(int plan_op);  // a timing event (time_ops)
  void record(int plan_op);      // the op's completion event on its stream
  CUevent_st* done_event(int plan_op) const;

  // Work, queued on the op's stream.
  // alloc: waits for the releases whose space it reuses (layout.hpp's reuse_waits), poisons
  // (option); release: nothing (its event, recorded by record(), is what a reuse waits for).
  void run_memory(const RankOp& op, int step);
  void run_compute(const RankOp& op);
  void run_keep(const RankOp& op);
  const PhaseWire& wire(const RankOp& op, int phase) const;
  // Where message k of a phase is in the op's stream staging (wire dtype bytes): what the
  // transport sends from and receives into.
  std::byte* send_data(const RankOp& op, int phase, int k) const;
  std::byte* recv_data(const RankOp& op, int phase, int k) const;
  void begin_phase(const RankOp& op, int phase);
  void finish_phase(const RankOp& op, int phase);

  // Per-op times of the last step (time_ops), after the step's work has finished.
  std::vector<DeviceOpTime> op_times(CUevent_st* step_start) const;

  struct Impl;  // defined in device_rank.cpp

 private:
  const RankProgram* program_;
  PoolLayout layout_;
  std::unique_ptr<Impl> impl_;
};

// The devices' description for provenance: GPU model, driver, runtime, cuBLAS, NCCL versions.
std::string describe_device(int device);

}  // namespace muonbed::gpu
