// Executable plans: the lowering of a step plan to one rank's program (lower_rank_program). A
// RankProgram names every allocation of the rank (static tensors and the plan's transient
// buffers, with dtypes, sizes and byte offsets), says for every op of the rank exactly which
// elements it reads and writes, and for every collective which elements travel to and from each
// peer, in which order, on which communicator. An executor (the loopback executor of
// backends/loopback, an MPI or NCCL one) interprets programs without knowing strategies: nothing
// here or there branches on a strategy's name, and the plan stays the only source of truth
// (programs are derived, never stored in it).
//
// Data model. A rank's data is a set of *pieces*: (role, param, index set) stored contiguously in
// the row-major order of the index set ("packed order", as pack_shard). Pieces live in tensors:
//
//   parameter, momentum, adam_m, adam_v   static, one per param the rank holds (momentum where
//                                         the plan's momentum op computes: owner_allgather keeps
//                                         the owner's full matrices, others the rank's piece).
//   gradient slot                         static, one per param: first the gradient the step
//                                         starts with, then (the step consumes the gradient) the
//                                         Muon update and result pieces that no transient buffer
//                                         holds; every piece starts at element 0 of the slot.
//   activation workspace                  static, only in a training step: the largest
//                                         activation collective's elements (its own part and
//                                         what it receives), which every such collective of
//                                         the rank moves through (in static_bytes, which
//                                         then exceeds rank_memory's optimizer-step figure).
//   buffer                                transient, one per plan Buffer allocated on the rank
//                                         (alloc .. release): its params' pieces back to back
//                                         (piece of p = index_set(rank, buffer.gathered)), or,
//                                         when a pack or unpack names it, the staging of an
//                                         all_to_all (one block per peer, in group order).
//
// Where the gradient starts comes from the plan, not the strategy: the input of its first sync
// op (reduce_scatter: index_set(r, gathered | group), the rank's *unreduced* contribution;
// all_reduce: index_set(r, gathered)), else the piece of the compute op that reads it (momentum
// or adamw). Update and result pieces are written where a live buffer has a slot of exactly their
// index set, else into the gradient slot; they are read from the latest write (in plan order)
// whose index set contains what is read. newton_schulz turns the update into the result in place.
// A piece that lands in a transient buffer released before a later op reads it is also *kept*:
// the op that produced it copies what is read into the gradient slot. So apply_update finds the
// rank's own result where replicated NS or an all-gather left the whole matrix in a buffer (as
// DTensor's local slice does), and a redistribution stage over a mesh dim of size 1, whose piece
// equals the next stage's, does not leave the rank's result in a stage buffer.
//
// Element maps are runs between a sequence (a message, a compute op's operand, in packed order)
// and a tensor: View = segments of runs (sequence offset, tensor offset, length), computed from the
// index lists per tensor dim (never element by element) with adjacent runs merged. A message from
// s to j is the concatenation over the op's params of the elements s sends j, each param's part in
// packed order of the set sent; sender and receiver each map that order to their own storage.
// Collectives are phases of such exchanges (all_reduce: a reduce-scatter of torch.chunk parts of
// the concatenated pieces, then an all-gather of them, as plan.hpp's byte counts assume). Each
// phase reads every send and the rank's own part before writing anything, so outputs may overlap
// inputs (in-place reduce-scatter into the gradient slot).
//
// The training step (core/plan/training.hpp). Parameters are pieces too: the step starts with
// the rank's own piece in its parameter tensor, an FSDP all_gather (TensorRole::parameter, in the
// params' dtype on the wire) writes the gathered piece into its buffer's slot (never the gradient
// slot: that is an error), and forward / backward ops read the latest piece that contains the one
// they compute with (TrainingGemmTask). Activation collectives carry Op::bytes of bf16 through
// the activation workspace: all_reduce as above, all_gather member s's block at s, all_to_all the
// send buffer's block j to member j and into the receive half, send root to peer.
//
// Memory. RankProgram::memory() is the static tensors plus the peak, along plan order, of live
// buffers, in the plan's dtypes (parameters in their dtype, the gradient slot as wide as the wider
// of the param and comm dtypes, state in state_dtype, buffers in the comm dtype); it equals
// rank_memory(plan, rank), which computes the same figures from the plan directly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/plan/plan.hpp"

namespace muonbed {

enum class PieceRole { parameter, gradient, momentum, adam_m, adam_v, update, result, staging };
std::string_view to_string(PieceRole role);

// Elements [sequence, sequence + length) of a sequence are elements [tensor, tensor + length)
// of a tensor (element offsets).
struct Run {
  std::int64_t sequence = 0;
  std::int64_t tensor = 0;
  std::int64_t length = 0;
  bool operator==(const Run&) const = default;
};

struct Segment {
  int tensor = -1;
  std::vector<Run> runs;
  bool operator==(const Segment&) const = default;
};

// A sequence of `count` elements scattered over tensors of one rank.
struct View {
  std::vector<Segment> segments;
  std::int64_t count = 0;
  bool operator==(const View&) const = default;
};

// Positions in `outer`'s packed order of the elements of `inner` (which must be a subset), as runs
// from inner's packed order (sequence) to outer's (tensor), merged. Throws LayoutError if inner is
// not contained in outer.
std::vector<Run> runs_between(const ShardIndexSet& inner, const ShardIndexSet& outer);
bool contains(const ShardIndexSet& outer, const ShardIndexSet& inner);
// Elements [begin, end) of a view, re-based to sequence offset 0.
View slice(const View& view, std::int64_t begin, std::int64_t end);

// One allocation of the rank.
struct ProgramTensor {
  int id = 0;
  std::string name;
  PieceRole role = PieceRole::parameter;  // gradient: the gradient slot; update: a buffer of
                                          // update/result pieces; staging: an all_to_all staging
  DType dtype = DType::fp32;
  int param = -1;          // static tensors
  int buffer = -1;         // transient tensors: the plan Buffer
  bool transient = false;  // allocated by the buffer's alloc op, freed by its release
  std::int64_t numel = 0;
  std::int64_t bytes = 0;
  std::int64_t offset = 0;  // static: byte offset in the rank's static arena; transient: 0 (its
                            // own allocation)
  bool operator==(const ProgramTensor&) const = default;
};

// Where a persistent piece lives: its tensor, its first element and its index set.
struct PieceRef {
  int tensor = -1;
  std::int64_t offset = 0;
  ShardIndexSet set;
  bool present() const { return tensor >= 0; }
  bool operator==(const PieceRef&) const = default;
};

// The persistent pieces of one param on the rank: where the step starts and ends.
struct ParamPieces {
  bool held = false;  // the rank holds part of the param (its independent coordinates match)
  PieceRef parameter;
  PieceRef gradient;  // the gradient the step starts with
  // The gradient the rank starts with is its contribution, member `gradient_member` of
  // `gradient_members`, to a sum over `gradient_reduced_over` (empty: it starts with the sum).
  DimSet gradient_reduced_over;
  int gradient_member = 0;
  int gradient_members = 1;
  int gradient_period = 1;  // the sync ops' period (level-scheduled sync)
  PieceRef momentum, adam_m, adam_v;
  bool operator==(const ParamPieces&) const = default;
};

// The gradient sync a param gets from the plan: the union of the groups of the reduce_scatter and
// all_reduce ops that move its gradient, and the period of its first sync op (a reduction or an
// all_gather of TP slices; 1 when there are none).
struct GradientSync {
  DimSet reduced_over;
  int period = 1;
};
GradientSync gradient_sync(const StepPlan& plan, int param);

// A communicator: one group instance of one stream. comm and comm_scatter run concurrently, so
// the same ranks on two streams are two communicators (as NCCL needs).
struct Communicator {
  int id = 0;
  int stream = 0;
  DimSet dims;
  std::vector<int> members;  // world ranks in group order
  bool operator==(const Communicator&) const = default;
};

// How executors make the communicators (MPI_Comm_split, ncclCommSplit): one split per
// (stream, group dims) of the plan's collectives, in the one order of (stream, dims bits), which
// every rank calls, so the splits match across ranks. For this rank: the color (its group
// instance's leader; -1: the rank has no communicator of that identity and passes MPI_UNDEFINED or
// NCCL_SPLIT_NOCOLOR) and the key (its position in the group, so a communicator's ranks are the
// program's group indices), and which program communicator the split makes.
struct CommunicatorSplit {
  int stream = 0;
  DimSet dims;
  int color = -1;
  int key = 0;
  int communicator = -1;  // RankProgram::communicators index, -1 with color -1
  bool operator==(const CommunicatorSplit&) const = default;
};

// One message between this rank and one peer in one phase.
struct Transfer {
  int peer = -1;       // group-local index
  int peer_rank = -1;  // world rank
  std::int64_t count = 0;
  std::int64_t displacement = 0;  // in the phase's send (recv) buffer: peers in group order
  View data;                      // sends: where the elements are read; recvs: where they land
  bool operator==(const Transfer&) const = default;
};

// One round of a collective. Non-reducing: every received element overwrites its destination.
// Reducing: the destination becomes the rank's own part plus every received message (fp32
// accumulation, peers in group order).
struct ExchangePhase {
  bool reduce = false;
  std::vector<Transfer> sends;  // peers with something to send, ascending group index
  std::vector<Transfer> recvs;
  View self_source, self_target;  // the rank's own part (count may be 0)
  bool operator==(const ExchangePhase&) const = default;
};

struct LocalCopy {
  View source, target;
  bool operator==(const LocalCopy&) const = default;
};

struct MomentumTask {
  int param = -1;
  View gradient, momentum, update;
  bool operator==(const MomentumTask&) const = default;
};
// NS of a whole matrix (stack), in place: update -> result.
struct NewtonSchulzTask {
  int param = -1;
  std::int64_t batch = 1, rows = 0, cols = 0;
  View data;
  bool operator==(const NewtonSchulzTask&) const = default;
};
// One member's part of a split_newton_schulz op (core/plan/split_ns.hpp), in place: its slice of
// the update becomes its slice of the result. The slice is row-major [part, gram] (a slice of rows)
// or [gram, part] (a slice of columns); its partial Gram (gram x gram, row-major) sits at
// gram_offset of the op's workspace, its squared norm at element norm_offset.
struct SplitNsTask {
  int param = -1;
  bool rows = false;
  std::int64_t gram = 0, part = 0;
  std::int64_t norm_offset = 0, gram_offset = 0;
  View data;
  bool operator==(const SplitNsTask&) const = default;
};
// MuonClip on the rows this rank holds of an attn_q / attn_k matrix (after its update).
struct QkClipRows {
  bool enabled = false;
  bool key = false;  // attn_k: its heads take the max logit of their query group
  int layer = -1;
  std::int64_t head_dim = 0;
  std::int64_t query_heads = 0;           // heads of the layer's attn_q
  std::int64_t heads = 0;                 // heads of this matrix
  std::vector<std::int64_t> global_rows;  // of the rows held, in packed order
  std::int64_t cols = 0;                  // columns held
  bool operator==(const QkClipRows&) const = default;
};
struct ApplyTask {
  int param = -1;
  std::int64_t rows = 0, cols = 0;  // of each matrix (Muon's learning-rate scale)
  View result, parameter;
  QkClipRows qk_clip;
  bool operator==(const ApplyTask&) const = default;
};
struct AdamwTask {
  int param = -1;
  View gradient, parameter, adam_m, adam_v;
  QkClipRows qk_clip;
  bool operator==(const AdamwTask&) const = default;
};

// A training step's forward or backward op (core/plan/training.hpp's TrainingMatrix, whose sizes
// it carries): real GEMMs with the rank's piece of the param, read from where the FSDP gather left
// it (or the parameter itself), against seeded activations the executor keeps. Backward writes
// its weight gradient to scratch: the gradient slot keeps the step's seeded gradient, so the
// optimizer's numerics stay those of the reference (backends/cpu/data.hpp).
struct TrainingGemmTask {
  int param = -1;
  View weight;  // the piece, row-major [matrices, rows, cols]
  std::int64_t matrices = 1, rows = 0, cols = 0;
  std::vector<std::int64_t> token_rows;  // per matrix
  std::int64_t attention_chunks = 0, chunk_rows = 0, keys = 0, width = 0;
  bool operator==(const TrainingGemmTask&) const = default;
};

// One op of the plan as this rank runs it.
struct RankOp {
  int op = -1;  // plan op id
  OpKind kind = OpKind::barrier;
  TensorRole moves = TensorRole::none;
  // compute
  std::vector<MomentumTask> momentum;
  std::vector<NewtonSchulzTask> newton_schulz;
  std::vector<ApplyTask> apply;
  std::vector<AdamwTask> adamw;
  std::vector<SplitNsTask> split_ns;
  std::vector<TrainingGemmTask> training;  // forward, backward
  std::vector<LocalCopy> copies;           // pack, unpack
  // collectives
  int communicator = -1;
  int group_index = -1;
  bool bystander = false;  // send/recv: a member that is neither side
  DType wire_dtype = DType::fp32;
  std::vector<ExchangePhase> phases;
  // alloc, release; split_newton_schulz: its workspace, a transient tensor the op allocates and
  // frees itself (the norms, then the Grams), outside rank_memory like NS's own scratch. Its
  // phases are two all-reduces over the workspace (plan.hpp's all_reduce: a reduce-scatter of
  // torch.chunk parts, then an all-gather): phases 0-1 the norms in fp32, once; phases 2-3 the
  // Grams in wire_dtype, once per NS step.
  int tensor = -1;
  // Copies the op makes after its main work: results it leaves in a transient buffer that
  // apply_update reads after the buffer's release.
  std::vector<LocalCopy> keep;
  // For executors that queue each plan stream in order (CUDA streams): per step of the plan's
  // hyper-period (index step % hyper_period()), wait_list of the op, empty where it is not issued.
  std::vector<std::vector<int>> stream_waits;
  bool operator==(const RankOp&) const = default;
};

struct LowerOptions {
  // A read of a piece no earlier op on the rank produced (a broken plan: a dropped op, a wrong
  // root) throws PlanError. With stale reads allowed it reads whatever its storage holds, so an
  // executor runs the broken plan and the reference check reports the consequence.
  bool allow_stale_reads = false;
};

struct RankProgram {
  int rank = 0;
  std::vector<ProgramTensor> tensors;
  std::vector<Communicator> communicators;
  std::vector<CommunicatorSplit> splits;  // every split of the plan, in the order all ranks call
  std::vector<RankOp> ops;                // the ops the rank takes part in, in plan order
  std::vector<int> op_index;              // plan op id -> index in ops, -1 if the rank has no part
  std::vector<ParamPieces> params;        // per plan param
  std::int64_t static_bytes = 0;
  std::int64_t peak_transient_bytes = 0;  // live buffers along plan order

  const RankOp* find(int plan_op) const {
    const int i =
        plan_op >= 0 && plan_op < static_cast<int>(op_index.size()) ? op_index[plan_op] : -1;
    return i < 0 ? nullptr : &ops[i];
  }
  // Static tensors plus the peak of live buffers along plan order (see the header comment).
  RankMemory memory() const { return {static_bytes, peak_transient_bytes}; }
  bool operator==(const RankProgram&) const = default;
};

// Ordering on a device whose streams run their ops in order. An op is *issued* in a step when
// the rank takes part in it, it is active in the step and the rank is not only passing through
// it (a send/recv bystander); issued ops mark their completion on their stream. wait_list: the
// issued ops on other streams whose completion `plan_op` (issued) must wait for so that the
// engine's semantics hold on the device: its deps, and the earlier ops on its stream; an op not
// issued stands for what it waits for (inactive: its deps; a bystander: its deps and the ops
// before it on its stream). Issued ops on the op's own stream are ordered by the stream. The
// lowering keeps every op's lists (RankOp::stream_waits).
bool issued_in_step(const StepPlan& plan, const RankProgram& program, int plan_op, int step);
std::vector<int> wait_list(const StepPlan& plan, const RankProgram& program, int plan_op, int step);

// Lowers `plan` for `rank`. Throws PlanError naming the op, rank, param and piece when the plan
// cannot be executed (a piece that fits no storage, a pack without its all_to_all, a read of
// nothing when stale reads are not allowed, NS on a piece that is not the whole matrix, ...).
RankProgram lower_rank_program(const StepPlan& plan, int rank, const LowerOptions& options = {});

// A one-line description of a view ("gradient slot of 'x'[0:16) + ..."), for error messages.
std::string describe(const RankProgram& program, const View& view);

}  // namespace muonbed
