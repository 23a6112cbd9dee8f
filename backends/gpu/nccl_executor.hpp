// The NCCL executor of one rank: one process per GPU under mpirun (or srun), the rank's program on
// its GPU through the CUDA handlers of device_rank.hpp, collectives on NCCL. MPI is used only
// where it needs no GPU buffer (Debian's Open MPI is not CUDA-aware): to broadcast the
// ncclUniqueId, for the barrier before each step, for the host map, and to gather timings
// (backends/ranks/measure.hpp, shared with the MPI executor, builds the record).
//
// Communicators: one NCCL communicator per communicator identity of the plan (stream + group
// dims), made once by ncclCommSplit of the world communicator, every rank calling every split in
// one order (the lowering's RankProgram::splits; a rank without that communicator passes
// NCCL_SPLIT_NOCOLOR), key = group index, so a communicator's NCCL ranks are the program's group
// indices. comm and comm_scatter are distinct communicators on distinct CUDA streams.
//
// Issue order. The engine (core/engine/engine.hpp, this rank its only local rank) decides which ops
// run in the step; they are issued to the GPU in plan order on every rank (NCCL needs one issue
// order of its communicators on every rank), one CUDA stream per plan stream, events for
// cross-stream deps. Every collective phase is one NCCL group of ncclSend / ncclRecv of the phase's
// messages in the wire dtype, between begin_phase and finish_phase (so uneven gathers, scatters,
// all-to-all and the fixed-order fp32 reductions are exact and equal the CPU's); a barrier is a
// one-element ncclAllReduce.
//
// Failure. After issuing a step the host waits for it, polling: a CUDA error, an NCCL async error
// (ncclCommGetAsyncError) on any communicator, or no completion within `timeout_s`, aborts the
// communicators (ncclCommAbort) and throws ExecutionError naming the rank, the step and the first
// op whose completion event has not fired; the caller ends every rank (MPI_Abort).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/gpu/device_rank.hpp"
#include "backends/launch/launch.hpp"
#include "backends/ranks/measure.hpp"

namespace muonbed::gpu {

struct NcclOptions {
  std::uint64_t seed = 1;
  DeviceOptions device;  // device: -1 = the rank's index among the ranks of its host
  bool graph = false;    // capture each step pattern once as a CUDA graph, then replay it
  double timeout_s = 60;
  LowerOptions lower;
  // Timed runs: data drawn on the device, none on the host (CudaLoopbackOptions'
  // random_device_data); store() then throws.
  bool random_device_data = false;
  // The launcher's fault injection (MUONBED_MPI_FAULT): rank R exits, throws or hangs (its host
  // thread stops issuing) when it is about to issue plan op OP of step S.
  launch::Fault fault;
};

class NcclExecutor final : public mpi::MeasuredRank {
 public:
  // Collective over `world` (unique id, splits). Throws ExecutionError before taking a GPU when
  // the plan's world size is not `world`'s, or when this host has fewer GPUs than ranks (NCCL
  // refuses two ranks on one GPU: use the CUDA loopback runtime for more ranks than GPUs).
  NcclExecutor(const StepPlan& plan, MPI_Comm world, NcclOptions options);
  ~NcclExecutor() override;

  void run_step(int step) override;
  void run_check_step(int) override {
    throw Error("nccl: the data check step (bench collective's #wrong) is not implemented yet");
  }
  const mpi::StepTimings& timings() const override;
  int rank() const override;
  const std::vector<int>& host_of() const override;
  const std::vector<std::string>& hosts() const override;
  int compute_threads() const override { return 0; }
  // The device pool's static and transient regions (DeviceRank::pool_bytes), allocated once.
  std::int64_t pool_peak_bytes() const override;

  const RankProgram& program() const;
  const cpu::RankStore& store();  // the static tensors copied back from the GPU
  std::string device_description() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The job runner of the `nccl` backend (registered by the GPU worker program, see
// backends/ranks/jobs.hpp's register_job_runner): NcclExecutor under measure_rank.
void register_nccl_job_runner();

}  // namespace muonbed::gpu
