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

#include <cstdint>
#include <string>
#include <string_view>
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
};
std::string_view to_string(OpKind kind);
OpKind op_kind_from_string(std::string_view text);
bool is_collective(OpKind kind);  // every communication kind, barrier included
bool is_compute(OpKind kind);
bool is_memory(OpKind kind);

enum class AllToAllDirection { to_owners, from_owners };

// The tensor a collective, pack or unpack op moves (see the header comment).
enum class TensorRole { none, gradient, update, result };
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
  std::vector<int> deps;
  std::string label;  // human-readable, for tables and traces
};

// The role a data op moves when the plan does not say: gather, all_to_all to owners, all_gather
// of pieces, pack and unpack move the update; scatter, broadcast, all_to_all from owners,
// all_gather of owned results and pack of owned results move the result; reductions move the
// gradient; send, recv and barrier none (send/recv must name theirs).
TensorRole default_tensor(const Op& op);

struct PlanSettings {
  OptimizerConfig optimizer;        // what every executor and the reference compute
  DType state_dtype = DType::fp32;  // momentum and Adam moments
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
  // Ops rank `rank` takes part in, in plan order.
  std::vector<int> ops_of_rank(int rank) const;
  bool active_in_step(const Op& op, int step) const { return step % op.period == 0; }
};

// Sizes of data movement, derived from layouts and the assignment (never stored in the plan).
// The vectors are indexed by group-local member index of `rank`'s group instance.
std::vector<std::int64_t> bytes_sent(const StepPlan& plan, const Op& op, int rank);
std::vector<std::int64_t> bytes_received(const StepPlan& plan, const Op& op, int rank);
// What member `rank` contributes to / ends with in a collective; with them the simulator lowers
// collectives to algorithms without materializing per-peer tables:
//   gather/scatter: the piece of this member; broadcast: the root's piece;
//   all_gather: this member's contribution; reduce_scatter: the full input / group size ratio is
//   implied, this returns the member's output piece; all_reduce: the piece; send: the piece.
std::int64_t piece_bytes(const StepPlan& plan, const Op& op, int rank);
// The total buffer size S of nccl-tests for this collective instance (algbw = S / time).
std::int64_t collective_bytes(const StepPlan& plan, const Op& op, int rank);
std::int64_t buffer_bytes(const StepPlan& plan, const Buffer& buffer, int rank);

// FLOPs and memory traffic (bytes read + written) of a compute op on `rank`.
double op_flops(const StepPlan& plan, const Op& op, int rank);
// Elements an elementwise compute op (momentum, apply_update, adamw) touches on `rank`.
std::int64_t elementwise_numel(const StepPlan& plan, const Op& op, int rank);
double op_memory_bytes(const StepPlan& plan, const Op& op, int rank);

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

// Checks the structural invariants and throws PlanError naming the op and the rule broken:
// ids are positions, deps point backwards, streams/buffers/params/roots in range, boxes fit the
// mesh, group dims are free dims of the box, every alloc has a release, collectives' params are
// held by every member, data ops move a role that fits their kind.
void validate_plan(const StepPlan& plan);

}  // namespace muonbed
