// Strategies build step plans. A strategy is the seeds' three-function interface carried into
// C++: an assign policy (core/plan/assignment.hpp), a gather policy and a redistribute policy, plus
// a schedule (pipelining, prefetching). Built-in strategies are compositions of these; a user adds
// a policy in one file and registers it (see experiments/custom_policy_example.cpp), without
// touching any backend.
//
//   sequential       seed 000's naive baseline: one matrix at a time, gather, NS, redistribute,
//                    barrier.
//   replicated       every rank gathers the full update and runs NS itself (PyTorch full_tensor,
//                    Motif's small-parameter path): the redundancy baseline.
//   owner            seeds 000/003/004: gather to the owner, NS once, redistribute, in rounds;
//                    async_gpu_parallelism and prefetch_count with the seeds' meanings.
//   all_to_all       Motif/dion/torchtitan: matrices in chunks; one all-to-all brings shards to
//                    owners, NS, one all-to-all sends results back; bounded chunks in flight.
//   owner_allgather  KellerJordan/Megatron layer-wise: full updates are replicated (DDP, ZeRO-1:
//                    gradients all-reduced, momentum kept whole by the owner); each rank
//                    orthogonalizes its share, then one all-gather of the results.
// small_param_threshold sends matrices below that many elements to `replicated` in any strategy.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/plan/plan.hpp"

namespace muonbed {

// Seed 002: gradient synchronization levels. Parameters are split into levels by layer
// (contiguous blocks of layers, level 0 = the first block plus non-layer parameters); level i
// syncs only in steps k with k % periods[i] == 0. One level with period 1 is plain sync.
struct GradSyncOptions {
  bool enabled = false;
  std::vector<int> level_periods = {1};
};

// Split Newton-Schulz (issue 13; core/plan/split_ns.hpp): the largest matrices are orthogonalized
// by a group of ranks instead of one owner. A matrix splits when its NS on one GPU exceeds
// `threshold` times the balanced per-rank NS (the total NS work over the ranks that hold Muon
// matrices, so it splits when ranks outnumber matrices or one matrix dominates), and a group can
// split it: some of its sharding mesh dims, innermost (e.g. tp) first, whose pieces are slices
// along its long dim, whole along the short one once the other sharding dims are gathered
// (split_ns_problem). The group is the smallest such prefix, of at most `max_members` ranks, whose
// per-member share (1/k of the matrix) is within the balanced share; else the largest one. Its
// members gather only the other sharding dims (the owner's coordinates there), run
// split_newton_schulz, and scatter the result back over those dims. Staged gathers only (strategies
// owner, sequential).
struct SplitNsOptions {
  bool enabled = false;
  int max_members = 8;     // the largest split group (8: a DGX node's TP group over NVLink)
  double threshold = 1.0;  // 0: split every matrix that can split
};

struct StrategyOptions {
  std::string name = "owner";
  std::string assign = "flop_balanced";
  std::map<std::string, int> explicit_owners;  // assign == "explicit": param name -> rank
  bool async_gpu_parallelism = true;
  int prefetch_count = 1;
  std::string gather = "hierarchical";  // owner: "hierarchical" (TP, then FSDP), "rails" or "flat"
  int chunk_size = 8;                   // all_to_all: matrices per chunk
  int max_chunks_in_flight = 2;         // all_to_all
  std::int64_t small_param_threshold = 0;  // elements; 0 = off
  // Communication lanes: units (matrices or chunks) are spread over this many gather streams
  // (and as many redistribution streams), lane by lane (owner by owner), so gathers to different
  // owners run at the same time instead of one after another on one stream. 1: the seeds' single
  // communication stream. The prefetch gate (at most prefetch_count + 1 full updates per owner)
  // is unchanged: it is a dependency, not a stream order.
  int comm_lanes = 1;
  // Unit order: "plan" (parameter order) or "lpt" (largest Newton-Schulz first, so the longest
  // NS starts first and the small ones fill in behind it).
  std::string order = "plan";
  bool chunk_by_shape = false;  // all_to_all / owner_allgather chunks hold one matrix shape only
  // How chunks are cut: "count" (chunk_size matrices each, in unit order) or "ns_cost" (by NS
  // cost: chunk k holds every owner's k-th largest matrix, so every owner computes in every chunk
  // and each chunk lasts about as long as its largest NS; chunks shrink as they go, the next
  // chunk's exchange hiding behind the current chunk's NS).
  std::string chunk_sizing = "count";
  std::string preset;  // the preset these options started from (strategy_preset)
  SplitNsOptions split_ns;
  GradSyncOptions grad_sync;
  std::string to_json_text() const;
};

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

std::vector<std::string> strategy_names();

// Which strategy options a strategy reads: whether `option` (a key of `strategy:` in an
// experiment, e.g. "chunk_sizing") can change the plan of strategy `s.name` given s's other
// options. An option no point of an experiment reads is an error
// (core/experiment/src/experiment.cpp), and the summaries show an option only where it applies.
// Conditions: chunk_size is dead under chunk_sizing: ns_cost; with small_param_threshold > 0 the
// small matrices run as replicated, which reads prefetch_count, comm_lanes and order whatever the
// strategy; order does not change replicated's step (every rank orthogonalizes every matrix).
bool strategy_reads_option(const StrategyOptions& s, std::string_view option);
// The strategies that read `option` at all, for messages: "owner, all_to_all".
std::string strategies_reading_option(std::string_view option);
// Whether `option` of `s` has the value a StrategyOptions{} has (a default value that nothing
// reads is no setting at all; a non-default one would be silently ignored).
bool strategy_option_is_default(const StrategyOptions& s, std::string_view option);
// Every option `s.name` does not read, set to its default: a point carries only the settings
// that apply to it (its resolved configuration, summaries and plan show nothing else).
void reset_unread_options(StrategyOptions& s);

// Anchor presets: what published systems run, as options of the built-in strategies, so one
// experiment compares them with muonbed's own best on the same model and cluster. The sources
// are cited at their definitions (core/plan/src/strategy.cpp). `world_size` sizes the presets whose
// batches are one matrix per rank. Throws PlanError listing the names for an unknown one.
std::vector<std::string> strategy_preset_names();
StrategyOptions strategy_preset(const std::string& name, int world_size);
// Builds the plan of one optimizer step. Throws PlanError when the strategy cannot apply (the
// message says which option or layout to change).
StepPlan build_plan(const ShardedModel& model, const StrategyOptions& options,
                    const PlanSettings& settings);

}  // namespace muonbed
