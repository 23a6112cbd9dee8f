// The host-side arithmetic of the GPU executors, in plain C++ so the CPU tests check it: where a
// rank's tensors live in its one device pool, its element maps as run tables the gather/scatter
// kernels read (kernels/gpu.hpp's DeviceRuns), the scratch and staging each stream needs, and the
// byte layout of each exchange phase's messages (what grouped ncclSend/ncclRecv or
// cudaMemcpyAsync move). The communicator splits every rank makes in one order are the
// lowering's (core/plan/program.hpp RankProgram::splits).
//
// Pool. Every tensor is stored in its plan dtype (ProgramTensor::dtype, fp32 or bf16), as in
// backends/cpu's RankStore: the pool holds the bytes the plan's rank_memory counts. Kernels compute
// in fp32, in place where a view is one stretch of an fp32 tensor, else on a contiguous fp32 copy
// in the stream's scratch (gathered, widened exactly; scattered back, rounded to nearest even to
// each run's dtype). Every tensor starts on a kPoolAlignBytes boundary. Static tensors come first,
// in program order; transient buffers get offsets once, from the plan: walking the rank's ops in
// plan order, a buffer may reuse the space of a buffer released earlier in plan order (first fit),
// so the region is about the plan's peak of live buffers (rank_memory's peak_transient_bytes).
// Plan order is not an
// execution order: two streams may run a later alloc before an earlier release. So the alloc
// *waits* for the releases whose space it reuses (reuse_waits, event waits on the GPU). Every
// wait points backwards in plan order, as stream order and deps do, and the executors issue each
// rank's ops in plan order, so the waits add no cycle and every event waited for is recorded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/plan/plan.hpp"
#include "core/plan/program.hpp"

namespace muonbed::gpu {

// Where tensors start in the pool (bytes): cudaMalloc's alignment, enough for any vector access.
inline constexpr std::int64_t kPoolAlignBytes = 256;
inline constexpr std::int64_t kAlignElements = kPoolAlignBytes / 4;  // of fp32 scratch

struct PoolLayout {
  std::vector<std::int64_t> tensor_offset;  // per program tensor: byte offset in the pool
  std::vector<int> element_bytes;           // per program tensor: 4 (fp32) or 2 (bf16)
  std::int64_t static_bytes = 0;            // static tensors: [0, static_bytes), each aligned
  std::int64_t transient_begin = 0;         // transient region: [begin, begin + bytes)
  std::int64_t transient_bytes = 0;
  // Of the plan's buffers along plan order: rank_memory's peak_transient_bytes.
  std::int64_t peak_live_bytes = 0;
  // Per program op index (allocs only): plan op ids of the releases whose space the buffer
  // reuses.
  std::vector<std::vector<int>> reuse_waits;
  std::int64_t bytes() const { return transient_begin + transient_bytes; }  // without scratch
};

// Throws ExecutionError when a transient buffer is allocated twice or released unallocated, or a
// tensor's dtype is neither fp32 nor bf16.
// Throws ExecutionError for a plan the GPU executors cannot run: a training step (forward and
// backward have CPU GEMM handlers only; issue 24 runs them on the MPI executor).
void check_gpu_can_run(const StepPlan& plan);

PoolLayout plan_pool(const StepPlan& plan, const RankProgram& program);

// A view of the pool: runs (sequence, pool byte offset, length, element bytes), sorted by
// sequence, covering [0, count): sequence element s of a run is the element at byte pool +
// (s - sequence) * element_bytes, of the run's tensor's dtype.
struct PoolRun {
  std::int64_t sequence = 0;
  std::int64_t pool = 0;
  std::int64_t length = 0;
  int element_bytes = 4;
  bool operator==(const PoolRun&) const = default;
};
// Throws ExecutionError when the view's runs do not cover [0, count) exactly once.
std::vector<PoolRun> pool_runs(const View& view, const PoolLayout& layout);

// Where a view's runs are in a RunTable, and whether it is one contiguous stretch of the pool.
struct RunRef {
  std::int64_t first = 0;     // index of its first run (kRunFields values each) in the table
  std::int64_t num_runs = 0;  // 0: an empty view
  std::int64_t elements = 0;
  bool contiguous = false;  // one run: `elements` elements of one dtype from byte pool_begin
  std::int64_t pool_begin = 0;
  int element_bytes = 4;  // of the first run
  // The view is one stretch of fp32 elements, which a kernel may read and write in place.
  bool fp32_in_place() const { return contiguous && element_bytes == 4; }
};

// Every view of a program, as one int64 array of runs (sequence, pool byte offset, length,
// element bytes: kernels/gpu.hpp's DeviceRuns) uploaded once.
class RunTable {
 public:
  explicit RunTable(const PoolLayout& layout) : layout_(&layout) {}
  RunRef add(const View& view);
  const std::vector<std::int64_t>& data() const { return data_; }

 private:
  const PoolLayout* layout_;
  std::vector<std::int64_t> data_;
};

// The byte layout of one exchange phase in its wire dtype: sends back to back at their
// displacements in a send buffer, receives at theirs in a receive buffer, the own part apart.
struct WireMessage {
  int peer = -1;            // group index (the NCCL rank in the communicator)
  int peer_rank = -1;       // world rank
  std::int64_t offset = 0;  // bytes into the send (receive) buffer
  std::int64_t bytes = 0;
  bool operator==(const WireMessage&) const = default;
};
struct PhaseWire {
  std::vector<WireMessage> sends, recvs;  // the phase's order (ascending group index)
  std::int64_t send_bytes = 0, recv_bytes = 0, own_bytes = 0;
};
// Throws ExecutionError when messages overlap in a buffer or a peer appears twice.
PhaseWire phase_wire(const ExchangePhase& phase, DType wire);

// Device scratch one op needs on its stream, in fp32 elements: contiguous copies of the views its
// kernels read and write (compute ops), or staging for one phase (collectives, bytes / 4 rounded
// up, each part aligned). The executor sizes each stream's scratch as the maximum over its ops.
struct OpScratch {
  std::int64_t elements = 0;
  std::int64_t ns_batch_elements = 0;  // the largest same-shape NS batch (for its workspace)
};
OpScratch op_scratch(const RankOp& op);

// Newton-Schulz tasks of one op grouped by shape: the plan puts matrices NS runs together in one
// op; each group runs as one batched call (batch = sum of the tasks' batches), tasks in op order.
struct NsBatch {
  std::int64_t rows = 0, cols = 0, batch = 0;
  std::vector<int> tasks;  // indices into op.newton_schulz
};
std::vector<NsBatch> ns_batches(const RankOp& op);

// QK-clip's per-row float scales of a task's rows for a step (1 where the head does not clip):
// what qk_clip_rows multiplies by, for scale_rows_cuda.
std::vector<float> qk_row_scales(const QkClipRows& qk, const StepPlan& plan, std::uint64_t seed,
                                 int step);

}  // namespace muonbed::gpu
