// The step plan: everything a backend needs to execute or replay one distributed Muon optimizer
// step, and nothing else. Plans are plain data: built by strategies (core/plan/strategy.hpp),
// printed, serialized to JSON, checked, and interpreted by the simulator and the real backends.
//
// A plan is SPMD. It holds one global, ordered list of ops; each op names the set of ranks that
// run it (a RankBox) and, for collectives, the mesh dims its groups span. Rank r's program is the
// subsequence of ops whose box contains r, in plan order. So a collective is described once for
// all its group instances, and sizes follow from the layouts: a 16,384-rank plan holds thousands
// of ops, not millions of per-rank entries.
//
// Execution semantics, which every backend must honour:
//  * Each op runs on one stream of each participating rank. Ops of one stream of one rank run in
//    plan order, one at a time (like a CUDA stream); different streams run concurrently.
//  * `deps` lists earlier ops that must have completed on this rank before the op starts (cross-
//    stream dependencies). A dep the rank does not take part in is ignored for that rank.
//  * A collective instance starts when all its members have reached it, and completes for all.
//  * Ops only refer to earlier ops, so plan order is a valid sequential execution.
//  * An op with period p > 1 runs only in steps k with k % p == 0 (level-scheduled gradient sync);
//    hyper_period() steps cover every pattern.
//
// What data moves (the "piece" of parameter p a rank r holds before a collective is
// layout.index_set(r, op.gathered), in the plan's comm dtype):
//   gather(root)      each member sends its piece to the root; the root ends with the union over
//                     the group, index_set(root, gathered | group).
//   scatter(root)     the inverse: the root holds index_set(root, gathered | group) and sends each
//                     member its piece.
//   broadcast(root)   the root's piece goes to every member (the group spans dims along which the
//                     param is replicated, so the pieces agree).
//   all_gather        every member contributes its piece (or, with owned_only, the full tensors
//                     of the params it owns) and every member ends with all contributions.
//   all_to_all        to_owners: member s sends member j its piece of every param j owns;
//                     from_owners: owner s sends member j j's piece of every param s owns.
//   reduce_scatter    members hold index_set(r, gathered | group) of the gradient and end with the
//                     sum over the group of their own piece.
//   all_reduce        members hold their piece and end with its sum over the group.
//   send / recv       group member `root` sends its piece to member `peer`; one op describes
//                     both sides (recv is the same transfer seen from the receiver, for
//                     readability); other members of the group do nothing.
//   barrier           no data.
//   split_newton_schulz  the members of a group instance orthogonalize each param together
//                     (core/plan/split_ns.hpp): member r holds the update piece index_set(r,
//                     gathered), a slice along one tensor dim (the long one) that is whole along
//                     the other, and the members' slices cover the matrix once; per NS run they
//                     all-reduce their squared norms and, per step, their partial Gram matrices,
//                     and each ends with the same slice of the result, in place. It is a collective
//                     for the engine (its members start together) and a compute op for time
//                     accounting.
//   pack / unpack     stage an all_to_all through the plan buffer they name (Op::buffer): pack
//                     fills it in the send order of the next all_to_all of the same params and
//                     tensor on the rank (one block per member, in group order); unpack places
//                     what the previous one received there into the piece of the rank
//                     (index_set(r, gathered), owned params only with owned_only).
//
// Which tensor a data op moves is explicit (Op::tensor; split_newton_schulz names the update it
// reads and turns into the result): the gradient (reductions), Muon's update
// (the momentum direction to orthogonalize, in the comm dtype) or the result (the orthogonalized
// update, in the comm dtype). Compute ops read and write fixed roles: momentum turns the gradient
// into the update, newton_schulz the update into the result, apply_update applies the result;
// pack and unpack stage the role in Op::tensor. core/plan/program.hpp lowers a plan to per-rank
// programs with concrete buffers, per-peer counts and element maps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/model/optimizer.hpp"
#include "core/model/parallelize.hpp"
#include "core/plan/assignment.hpp"

namespace muonbed {

enum class OpKind {
  alloc,
  release,  // memory
  momentum,
  newton_schulz,
  apply_update,
  adamw,
  pack,
  unpack,  // compute
  all_gather,
  gather,
  scatter,
  broadcast,
  all_to_all,  // communication
  reduce_scatter,
  all_reduce,
  send,
  recv,
  barrier,
  split_newton_schulz,  // compute and communication: NS of a matrix split over a group
  forward,              // training step: a layer's forward pass over Op::tokens (compute)
  backward,             // training step: its backward pass (compute)
};
std::string_view to_string(OpKind kind);
OpKind op_kind_from_string(std::string_view text);
bool is_collective(OpKind kind);  // every communication kind, barrier included
bool is_compute(OpKind kind);
bool is_memory(OpKind kind);

enum class AllToAllDirection { to_owners, from_owners };

// The tensor a collective, pack or unpack op moves (see the header comment). The training step
// (core/plan/training.hpp) adds two: `parameter` (FSDP's all-gather of parameter shards before a
// layer's forward and backward: pieces by the layout, in the param's dtype) and `activation`
// (activations and their gradients between ranks: TP all-reduces, the EP token all-to-all,
// context-parallel key/value all-gathers, pipeline sends), whose size is Op::bytes, not a
// layout's piece.
enum class TensorRole { none, gradient, update, result, parameter, activation };
std::string_view to_string(TensorRole role);
TensorRole tensor_role_from_string(std::string_view text);

// A set of ranks: per mesh dim either one fixed coordinate or every coordinate (kAll).
struct RankBox {
  static constexpr int kAll = -1;
  std::vector<int> coord;

  static RankBox everyone(const DeviceMesh& mesh);
  static RankBox single(const DeviceMesh& mesh, int rank);
  bool contains(const DeviceMesh& mesh, int rank) const;
  std::int64_t count(const DeviceMesh& mesh) const;
  std::vector<int> ranks(const DeviceMesh& mesh) const;  // ascending
  DimSet free_dims() const;                              // dims with kAll
  bool operator==(const RankBox&) const = default;
};

// Transient memory: a buffer's size on rank r is the sum over its params of
// numel(index_set(r, gathered)) in the comm dtype, counting only params r owns when owned_only.
struct Buffer {
  int id = 0;
  std::string name;
  std::vector<int> params;
  DimSet gathered;
  bool owned_only = false;
};

struct Op {
  int id = 0;
  OpKind kind = OpKind::barrier;
  int stream = 0;
  RankBox ranks;
  DimSet group;             // collectives: a group instance = ranks of the box differing only here
  int root = -1;            // gather/scatter/broadcast: group-local index of the root
  int peer = -1;            // send/recv: group-local index of the other side
  std::vector<int> params;  // DistributedParam indices this op computes on or moves
  DimSet gathered;          // see the piece rule above; for compute ops, the piece computed on
  // all_gather: members contribute the full tensors they own; compute ops: a rank computes only
  // on the params it owns (newton_schulz without it: every rank of the box computes every param)
  bool owned_only = false;
  AllToAllDirection direction = AllToAllDirection::to_owners;
  TensorRole tensor = TensorRole::none;  // data ops; PlanBuilder fills default_tensor() when none
  int buffer = -1;                       // alloc/release; pack/unpack: their staging buffer
  int ns_steps = 0;                      // newton_schulz
  int period = 1;
  // Training ops (core/plan/training.hpp). forward/backward: the tokens each of its ranks
  // processes (FLOPs follow from the op's params and the model: op_flops). Activation
  // collectives: the bytes each member contributes (all_reduce, all_gather: its buffer;
  // all_to_all: its whole send buffer, split evenly over the group; send: the message).
  std::int64_t tokens = 0;
  std::int64_t bytes = 0;
  std::vector<int> deps;
  std::string label;  // human-readable, for tables and traces
};

// The role a data op moves when the plan does not say: gather, all_to_all to owners, all_gather
// of pieces, pack and unpack move the update; scatter, broadcast, all_to_all from owners,
// all_gather of owned results and pack of owned results move the result; reductions move the
// gradient; send, recv and barrier none (send/recv must name theirs).
TensorRole default_tensor(const Op& op);

// The training state around the optimizer step, for the memory feasibility check (issue 22):
// what a rank holds besides the optimizer's own tensors. It changes no step time; the executors
// allocate only the optimizer's part (rank_memory), the check counts all of it (training_memory).
enum class MasterWeights {
  automatic,  // an fp32 copy of each parameter shard whose dtype is lower (mixed precision)
  fp32,       // an fp32 copy of every shard, whatever its dtype
  none,       // the parameters are the only copy (pure bf16 training)
};
std::string_view to_string(MasterWeights master);
MasterWeights master_weights_from_string(std::string_view text);  // throws Error listing names

struct TrainingMemoryOptions {
  MasterWeights master_weights = MasterWeights::automatic;
  // Per rank: activations kept for the backward pass (live during forward/backward, freed before
  // the optimizer step), and memory the framework holds throughout (CUDA context, communication
  // buffers, allocator slack). Both 0 unless the experiment gives them.
  std::int64_t activations_bytes = 0;
  std::int64_t reserved_bytes = 0;
  bool operator==(const TrainingMemoryOptions&) const = default;
};

// The training step around the optimizer step (issue 24; core/plan/training.hpp). Disabled: the
// plan is the optimizer step alone, as it always was.
struct TrainingOptions {
  bool enabled = false;
  std::int64_t tokens_per_step = 0;   // the global batch, in tokens
  std::int64_t seq_len = 0;           // tokens per sequence
  std::int64_t micro_batch_size = 1;  // sequences per micro-batch per data-parallel rank
  // none: the optimizer starts once every gradient is synced; backward: a matrix's momentum,
  // gathers and Newton-Schulz start once its own gradient is synced, sharing the GPU and the
  // links with the rest of the backward pass.
  std::string overlap = "none";
  std::int64_t experts_per_token = 0;  // MoE routing top-k (0: a dense model)
  // Micro-batches run in at most this many groups (each op of a group processes its
  // micro-batches' tokens at once), which bounds the plan's size.
  int max_micro_batch_groups = 8;
  // Attention by FlashAttention-style kernels, which keep no score matrix: the activation memory
  // drops its 5 a s / h term.
  bool flash_attention = true;
  bool operator==(const TrainingOptions&) const = default;
};

struct PlanSettings {
  OptimizerConfig optimizer;        // what every executor and the reference compute
  DType state_dtype = DType::fp32;  // momentum and Adam moments
  TrainingMemoryOptions training_memory;
  TrainingOptions training;
  int ns_steps() const { return optimizer.muon.ns_steps; }
  DType comm_dtype() const { return optimizer.comm_dtype; }  // of updates moved between ranks
};

struct StepPlan {
  std::string strategy;          // name of the strategy that built it
  std::string strategy_options;  // resolved options, for provenance (JSON text)
  ShardedModel model;
  Assignment assignment;
  PlanSettings settings;
  std::vector<std::string> streams;
  std::vector<Buffer> buffers;
  std::vector<Op> ops;

  const DeviceMesh& mesh() const { return model.mesh; }
  int hyper_period() const;
  bool active_in_step(const Op& op, int step) const { return step % op.period == 0; }
};

// Sizes of data movement, derived from layouts and the assignment (never stored in the plan).
// The vectors are indexed by group-local member index of `rank`'s group instance.
std::vector<std::int64_t> bytes_sent(const StepPlan& plan, const Op& op, int rank);
std::vector<std::int64_t> bytes_received(const StepPlan& plan, const Op& op, int rank);
// all_to_all: every transfer of the instance whose group (in group order) is `members`, as
// (from, to) indices into it and bytes: one entry per param and member it moves between its owner
// and that member (none of 0 bytes). Summed per (from, to) they are
// bytes_sent(plan, op, members[from])[to], found in O(params x members) instead of the
// O(params x members^2) of asking every member (an all-to-all over 2,048 members).
struct PairBytes {
  int from = 0;
  int to = 0;
  std::int64_t bytes = 0;
};
std::vector<PairBytes> all_to_all_transfers(const StepPlan& plan, const Op& op,
                                            const std::vector<int>& members);
// What member `rank` contributes to / ends with in a collective; with them the simulator lowers
// collectives to algorithms without materializing per-peer tables:
//   gather/scatter: the piece of this member; broadcast: the root's piece;
//   all_gather: this member's contribution; reduce_scatter: the full input / group size ratio is
//   implied, this returns the member's output piece; all_reduce: the piece; send: the piece.
std::int64_t piece_bytes(const StepPlan& plan, const Op& op, int rank);

// piece_bytes with every answer kept per rank and per op signature (what piece_bytes reads: kind,
// tensor, params, gathered and group dims, root, owned_only, bytes), so that ops differing only in
// the rest share them: a training step gathers each layer once per micro-batch group, and sizing
// every member's piece of every instance from the layouts was a tenth of a 1,024-GPU step's
// simulation. The plan must outlive it.
// Numbers a model's params into classes of interchangeable ones, each class named by its first
// param: p and q share one when their shapes are equal and `same(p, q)`. For the caches of
// per-rank figures that read only some of a param's fields (PieceBytes, TrainingCosts): a model's
// layers repeat the same weights, and deriving each layer's figures again for every rank was a
// few percent of a 1,024-GPU training step's simulation.
std::vector<int> param_classes(const ShardedModel& model,
                               const std::function<bool(int, int)>& same);

class PieceBytes {
 public:
  explicit PieceBytes(const StepPlan& plan);
  std::int64_t operator()(int op, int rank);

 private:
  const StepPlan& plan_;
  using Signature =
      std::tuple<int, int, std::uint32_t, std::uint32_t, int, bool, std::int64_t, std::vector<int>>;
  std::map<Signature, int> signatures_;
  std::vector<int> signature_of_op_;              // -1: not yet known
  std::vector<std::vector<std::int64_t>> known_;  // per signature, per rank; -1: not yet known
  std::vector<int> param_class_;                  // param_classes() for what piece_bytes reads
};
// The total buffer size S of nccl-tests for this collective instance (algbw = S / time).
std::int64_t collective_bytes(const StepPlan& plan, const Op& op, int rank);
std::int64_t buffer_bytes(const StepPlan& plan, const Buffer& buffer, int rank);

// FLOPs and memory traffic (bytes read + written) of a compute op on `rank`.
double op_flops(const StepPlan& plan, const Op& op, int rank);
// Elements an elementwise compute op (momentum, apply_update, adamw) touches on `rank`.
std::int64_t elementwise_numel(const StepPlan& plan, const Op& op, int rank);
double op_memory_bytes(const StepPlan& plan, const Op& op, int rank);
// op_memory_bytes of an elementwise op (momentum, apply_update, adamw, pack, unpack) touching
// `numel` elements on a rank (elementwise_numel); 0 for other kinds.
double elementwise_memory_bytes(const StepPlan& plan, OpKind kind, double numel);
// FLOPs per element of an elementwise op kind (momentum, apply_update, adamw); 0 for others.
double elementwise_flops_per_element(const StepPlan& plan, OpKind kind);
// The optimizer FLOPs of one step with every parameter's work counted once: each Muon matrix's
// Newton-Schulz, momentum and update, each AdamW parameter's update. A strategy that repeats work
// (replicated NS, updates on every replica) executes more (op_flops summed over ranks).
double useful_step_flops(const StepPlan& plan);

// The NS work of a newton_schulz op on `rank`, one entry per matrix (stack): its FLOPs, its
// smaller dimension (for size-dependent GEMM efficiency) and its shape (for measured NS tables;
// a stack of `batch` matrices is one call).
struct MatrixWork {
  double flops = 0;
  double min_dim = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t batch = 1;
};
std::vector<MatrixWork> ns_work(const StepPlan& plan, const Op& op, int rank);

// Memory of a rank, as core/plan/program.hpp lays it out: static tensors and the peak of transient
// buffers (comm dtype) along plan order. Static, per param the rank holds: its parameter shard (the
// param's dtype); its gradient slot, which holds the gradient the step starts with (the input of
// the first sync op: a reduce_scatter's unreduced index_set(r, group), as FSDP holds unsharded
// gradients it has not reduced yet) and then Muon's update and result outside buffers, so it is the
// largest of the shard, that gradient and the momentum piece, in the wider of the param and comm
// dtypes; momentum where the momentum op computes (owner_allgather: the owner's full matrix);
// AdamW's two moments where the adamw op computes (state dtype).
struct RankMemory {
  std::int64_t static_bytes = 0;
  std::int64_t peak_transient_bytes = 0;
  std::int64_t peak_bytes() const { return static_bytes + peak_transient_bytes; }
};
RankMemory rank_memory(const StepPlan& plan, int rank);

// Scratch one Newton-Schulz call of a [batch, rows, cols] stack needs besides its input and
// output: the bf16 kernel's two iterate buffers (batch x rows x cols) and two Gram matrices
// (batch x m x m, m the smaller dim), as kernels/cuda/ns_common.cuh's NsBuffers lays them out (its
// per-block pointer tables and norm partials are small and left out).
std::int64_t ns_workspace_bytes(std::int64_t rows, std::int64_t cols, std::int64_t batch);

// The training state a rank holds while the optimizer step runs inside training, by part:
//   parameters       its parameter shards in their dtypes (rank_memory's static part)
//   master_weights   fp32 copies of the shards (TrainingMemoryOptions::master_weights)
//   gradients        the gradient slot of rank_memory (the gradient the step starts with, also
//                    holding Muon's update and result)
//   optimizer_state  momentum and AdamW's moments (state dtype)
//   step_buffers     the step's transient buffers at their peak (rank_memory)
//   ns_workspace     the scratch of the rank's largest Newton-Schulz call (ns_workspace_bytes)
//   activations      TrainingMemoryOptions::activations_bytes
//   reserved         TrainingMemoryOptions::reserved_bytes
// Activations live during forward/backward and are freed before the optimizer step, whose
// transients come after them, so the peak is persistent + max(activations, transients) +
// reserved, where persistent = parameters + master_weights + gradients + optimizer_state and
// transients = step_buffers + ns_workspace.
struct TrainingMemory {
  std::int64_t parameters = 0;
  std::int64_t master_weights = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t step_buffers = 0;
  std::int64_t ns_workspace = 0;
  std::int64_t activations = 0;
  std::int64_t reserved = 0;
  // The optimizer overlaps the backward pass (training.overlap: backward): its transients and
  // the activations the backward still holds are live at once.
  bool overlapping = false;
  std::int64_t persistent() const {
    return parameters + master_weights + gradients + optimizer_state;
  }
  std::int64_t transients() const { return step_buffers + ns_workspace; }
  std::int64_t peak_bytes() const {
    return persistent() +
           (overlapping ? activations + transients() : std::max(activations, transients())) +
           reserved;
  }
  // What the optimizer step itself holds: rank_memory(plan, rank).
  RankMemory optimizer_step() const {
    return {parameters + gradients + optimizer_state, step_buffers};
  }
};
TrainingMemory training_memory(const StepPlan& plan, int rank);
// Every rank's training_memory (index = rank), each computed once per class of ranks that hold
// the same: the same pieces' sizes of every param, in the same op boxes, owning nothing (an owner
// is a class of its own). Equal to calling training_memory for every rank (memory_test checks).
std::vector<TrainingMemory> training_memories(const StepPlan& plan);
// What any plan of this model on this mesh holds on `rank` at least, before a strategy is chosen:
// parameters, master weights, the gradient shard (in the wider of the param and comm dtypes),
// activations and reserved; optimizer state and transients are 0 (they depend on the strategy).
// `muonbed validate` checks it: a point whose floor does not fit fits under no strategy.
TrainingMemory training_memory_floor(const ShardedModel& model, const PlanSettings& settings,
                                     int rank);

// The feasibility of a plan on a device of `limit_bytes` per rank: the fullest rank's training
// memory, and how many ranks exceed the limit. Every rank is checked (meshes are not symmetric:
// owners hold more).
struct MemoryFeasibility {
  std::int64_t limit_bytes = 0;
  std::int64_t peak_bytes = 0;
  int peak_rank = 0;
  int over_ranks = 0;
  TrainingMemory peak;  // of peak_rank
  bool feasible() const { return over_ranks == 0; }
};
MemoryFeasibility memory_feasibility(const StepPlan& plan, std::int64_t limit_bytes);
// "peak 170.2 GiB on rank 3 (parameters 10.0, master weights 20.0, ...) exceeds the 80 GiB of
// one H100 on 64 of 64 ranks" (or "fits" when it does): the one wording of every command.
std::string memory_feasibility_text(const MemoryFeasibility& feasibility, std::string_view device,
                                    int world_size);
// The same from every rank's training memory, computed already (index = rank).
MemoryFeasibility memory_feasibility(const std::vector<TrainingMemory>& ranks,
                                     std::int64_t limit_bytes);

// Per-rank totals for tables and checks.
struct RankSummary {
  int rank = 0;
  int matrices_owned = 0;
  double ns_flops = 0;
  std::int64_t bytes_sent = 0;
  std::int64_t bytes_received = 0;
  RankMemory memory;
};
RankSummary summarize_rank(const StepPlan& plan, int rank);
// Every rank's summary (index = rank), equal to summarize_rank's for each, with each collective
// instance's traffic computed once for all its members (muonbed plan of 16,384 ranks). With
// `training` (every rank's training_memory, computed already) the memory comes from it:
// optimizer_step() is rank_memory.
std::vector<RankSummary> summarize_ranks(const StepPlan& plan,
                                         const std::vector<TrainingMemory>* training = nullptr);

// Checks the structural invariants and throws PlanError naming the op and the rule broken:
// ids are positions, deps point backwards, streams/buffers/params/roots in range, boxes fit the
// mesh, group dims are free dims of the box, every alloc has a release, collectives' params are
// held by every member, data ops move a role that fits their kind.
void validate_plan(const StepPlan& plan);

}  // namespace muonbed
