// The building blocks every strategy composes (the seeds' gather and redistribute functions and
// the schedule around them), and the builder they emit plan ops into:
//
//   PlanBuilder         owns the plan under construction (streams, buffers, ops)
//   GatherPolicy        emits the ops that bring each matrix's full update to where NS runs
//   RedistributePolicy  emits the ops that bring the result back to every holder's piece
//   Schedule            a strategy's composition of them: where NS runs (NsPlacement), units of
//                       one matrix or chunks of matrices, lanes (one per owner, spread over
//                       communication streams), prefetch gates (at most depth + 1 units of a rank
//                       in flight), barriers, and where the optimizer state lives.
//
// build_plan (core/plan/strategy.hpp) runs a Schedule with one pipelined scheduler
// (core/plan/src/schedule.cpp):
//   units   what moves and is orthogonalized together: one matrix, or a chunk of matrices with
//           the same group;
//   lanes   units that share one owner (or one group) form a lane, processed in order; round j
//           holds the j-th unit of every lane, so lanes run side by side;
//   depth   gathers run `depth` rounds ahead of NS, on their own stream; a lane's gather j
//           waits for the release of its unit j-depth-1, which bounds the transient memory by
//           depth+1 full updates per owner (seed 000).
// Streams: "compute" (momentum, AdamW, NS, apply), "comm" (gathers and, without prefetch, every
// collective) and "comm_scatter" (redistribution, overlapping the next gathers, when depth > 0);
// lane k > 0 adds "comm.k" and "comm_scatter.k".
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/plan/plan.hpp"

namespace muonbed {

class PlanBuilder;

// Emits the ops that bring the full update of each param to its owner. Returns, per param, the
// op ids whose completion means the owner holds the full update.
class GatherPolicy {
 public:
  virtual ~GatherPolicy() = default;
  virtual std::string name() const = 0;
  virtual std::vector<int> emit(PlanBuilder& builder, std::span<const int> params, int stream,
                                std::vector<int> deps) const = 0;
};

// Emits the ops that bring the owner's orthogonalized update back to every holder's piece.
class RedistributePolicy {
 public:
  virtual ~RedistributePolicy() = default;
  virtual std::string name() const = 0;
  virtual std::vector<int> emit(PlanBuilder& builder, std::span<const int> params, int stream,
                                std::vector<int> deps) const = 0;
};

// Helper for policies and schedules: owns the plan under construction.
class PlanBuilder {
 public:
  PlanBuilder(ShardedModel model, Assignment assignment, PlanSettings settings);

  const ShardedModel& model() const { return plan_.model; }
  const DeviceMesh& mesh() const { return plan_.model.mesh; }
  const Assignment& assignment() const { return plan_.assignment; }
  const DistributedParam& param(int index) const { return plan_.model.params.at(index); }
  int owner(int param) const { return plan_.assignment.owner.at(param); }

  int stream(const std::string& name);  // index of the named stream, added on first use
  int add_buffer(std::string name, std::vector<int> params, DimSet gathered, bool owned_only);
  const std::string& buffer_name(int buffer) const { return plan_.buffers.at(buffer).name; }
  // Appends op (its id is set here) and returns the id. Deps must be earlier ops.
  int emit(Op op);

  // The ranks that hold a param: every coordinate except the param's independent ones.
  RankBox holders_box(int param) const;
  // holders_box with the coords of `fixed` dims set to those of `rank`.
  RankBox box_through(int param, int rank, DimSet fixed) const;

  StepPlan finish(std::string strategy_name, std::string options_json);

 private:
  StepPlan plan_;
};

// Policies by name. Gather: "hierarchical" (one stage per sharding mesh dim, innermost first:
// TP before FSDP, seed 004: a node's pieces are joined over NVLink, then one transfer per node
// crosses the network), "rails" (the same stages outermost first: the cross-node stage runs on
// every NIC rail at once into the owner's node, then NVLink joins the pieces), "flat" (one gather
// over all sharding dims). Redistribute: the reverse of each, followed by broadcasts along
// replicate dims ("hierarchical", "rails", "flat").
std::unique_ptr<GatherPolicy> make_gather_policy(const std::string& name);
std::unique_ptr<RedistributePolicy> make_redistribute_policy(const std::string& name);
using GatherPolicyFactory = std::unique_ptr<GatherPolicy> (*)();
using RedistributePolicyFactory = std::unique_ptr<RedistributePolicy> (*)();
void register_gather_policy(const std::string& name, GatherPolicyFactory factory);
void register_redistribute_policy(const std::string& name, RedistributePolicyFactory factory);

// Where Newton-Schulz of a unit runs.
enum class NsPlacement {
  owner,            // each matrix on its owner, one NS op per matrix
  owners_of_chunk,  // each owner of a chunk's matrices on its own, one op (owned_only)
  every_holder,     // every rank that holds the matrix (no owner: the redundancy baseline)
};

// The order of a staged gather's stages: one sharding mesh dim per stage, innermost (TP) first
// (seed 004, "hierarchical": the pieces of a node are joined over NVLink, then one transfer per
// node crosses the network to the owner's rail), outermost first ("rails": the cross-node stage
// runs on every rail at once, each into the GPU of the owner's node on that rail, so the owner's
// node takes the matrix through all of its NICs; then the pieces are joined over NVLink), or
// all at once ("flat"). Redistribution runs the stages in reverse.
enum class StageOrder { inner_first, outer_first, flat };
// The stage order of a staged gather policy's name; false for other policies (split
// Newton-Schulz needs a staged gather: its members keep their slices, gathered over the rest).
bool staged_order(const std::string& gather_policy, StageOrder& order);

// A strategy's composition of the building blocks, which build_plan runs.
struct Schedule {
  std::unique_ptr<GatherPolicy> gather;
  std::unique_ptr<RedistributePolicy> redistribute;
  NsPlacement ns = NsPlacement::owner;
  // Units are chunks of same-group matrices (cut by chunk_size, chunk_sizing, chunk_by_shape)
  // instead of single matrices.
  bool chunked = false;
  bool barrier_per_unit = false;  // one unit at a time, each closed by a barrier
  bool barrier_per_lane = false;  // one lane (owner) at a time, each closed by a barrier
  int depth = 0;                  // units in flight per rank class beyond the current one
  int lanes = 1;                  // communication lanes
  StageOrder order = StageOrder::inner_first;  // of split units' gathers (a staged gather)
  // Where momentum lives: on the pieces each rank holds (false), or on the owners' whole matrices,
  // with gradients all-reduced over every dim so the owner has them whole (ZeRO-1; true).
  bool owner_holds_full_state = false;
};

}  // namespace muonbed
