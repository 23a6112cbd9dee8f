// build_plan: a strategy's assignment and Schedule run over the model (core/plan/strategy.hpp),
// with what every step shares around it: option checks, seed 002's level-scheduled gradient
// sync, momentum and AdamW, split Newton-Schulz groups, the small-matrix path, the update.
#include <algorithm>
#include <map>
#include <numeric>

#include "core/base/errors.hpp"
#include "core/plan/assignment.hpp"
#include "core/plan/split_ns.hpp"
#include "core/plan/src/policy_blocks.hpp"
#include "core/plan/strategy.hpp"
#include "core/plan/training.hpp"

namespace muonbed {

namespace {

using plan_detail::group_key;
using plan_detail::make_units;
using plan_detail::minus;
using plan_detail::run_schedule;
using plan_detail::shard_dims_inner_first;
using plan_detail::Unit;
using plan_detail::UnitOptions;

void check_options(const StrategyOptions& o) {
  if (o.prefetch_count < 0)
    throw PlanError("strategy.prefetch_count must be >= 0 (0 disables prefetching)");
  if (o.chunk_size < 1) throw PlanError("strategy.chunk_size must be >= 1");
  if (o.max_chunks_in_flight < 1) throw PlanError("strategy.max_chunks_in_flight must be >= 1");
  if (o.chunk_sizing != "count" && o.chunk_sizing != "ns_cost")
    throw PlanError("strategy.chunk_sizing '" + o.chunk_sizing + "': use count or ns_cost");
  if (o.small_param_threshold < 0) throw PlanError("strategy.small_param_threshold must be >= 0");
  if (o.comm_lanes < 1) throw PlanError("strategy.comm_lanes must be >= 1 (1: one comm stream)");
  if (o.order != "plan" && o.order != "lpt")
    throw PlanError("unknown strategy.order '" + o.order + "'; use plan or lpt");
  if (o.split_ns.enabled) {
    StageOrder order;
    if (!strategy_reads_option(o, "split_ns"))
      throw PlanError(
          "strategy.split_ns needs a strategy whose owners gather matrices in stages (" +
          strategies_reading_option("split_ns") + "), not '" + o.name +
          "'; fix: set strategy.name: owner, or remove split_ns");
    if (!staged_order(o.gather, order))
      throw PlanError(
          "strategy.split_ns needs a staged gather (hierarchical, rails or flat), not '" +
          o.gather + "'; fix: set strategy.gather, or remove split_ns");
    if (o.split_ns.max_members < 2)
      throw PlanError("strategy.split_ns.max_members must be >= 2 (a group splits a matrix)");
    if (!(o.split_ns.threshold >= 0))
      throw PlanError("strategy.split_ns.threshold must be >= 0 (0: split every matrix it can)");
  }
  if (o.grad_sync.level_periods.empty())
    throw PlanError("strategy.grad_sync.level_periods needs at least one period (e.g. [1])");
  for (int period : o.grad_sync.level_periods)
    if (period < 1) throw PlanError("strategy.grad_sync.level_periods must all be >= 1");
}

// Seed 002's level-scheduled synchronization, bucketed per level and group. FSDP-style layouts
// reduce-scatter over their shard dims, then all-reduce over replicate dims; a schedule whose
// owners hold the full state (ZeRO-1) keeps full gradients, so it all-reduces over every dim.
//
// In a training step (`training` given) the buckets are per layer too, emitted in backward order
// on their own stream, each after the backward ops that complete its gradients, and every param's
// sync ops are reported in `synced` (the optimizer of that param may start after them).
std::vector<int> emit_grad_sync(PlanBuilder& b, const StrategyOptions& o, bool full_gradients,
                                const TrainingEmission* training = nullptr,
                                std::map<int, std::vector<int>>* synced = nullptr) {
  static const std::vector<int> kEveryStep = {1};
  const auto& periods = o.grad_sync.enabled ? o.grad_sync.level_periods : kEveryStep;
  const int levels = static_cast<int>(periods.size());
  int num_layers = 0;
  for (const auto& dp : b.model().params) num_layers = std::max(num_layers, dp.layer + 1);
  const int stream = b.stream(training ? "grad_sync" : "comm");
  // (level, group, layer in a training step) -> params
  using Key = std::tuple<int, std::vector<int>, int>;
  std::map<Key, std::vector<int>> buckets;
  std::vector<Key> order;
  for (const auto& dp : b.model().params) {
    const int level =
        dp.layer < 0 || num_layers == 0 ? 0 : static_cast<int>((dp.layer * levels) / num_layers);
    Key key{level, group_key(b, dp.index), training ? dp.layer : 0};
    if (!buckets.count(key)) order.push_back(key);
    buckets[key].push_back(dp.index);
  }
  if (training)  // backward order: the last layer's gradients are complete first
    std::stable_sort(order.begin(), order.end(),
                     [](const Key& x, const Key& y) { return std::get<2>(x) > std::get<2>(y); });
  std::vector<int> done;
  for (const auto& key : order) {
    const auto& ps = buckets[key];
    const auto& layout = b.param(ps[0]).layout;
    const int period = periods[std::get<0>(key)];
    std::vector<int> ready;
    if (training)
      for (int p : ps)
        if (const auto it = training->gradient_ready.find(p); it != training->gradient_ready.end())
          ready.insert(ready.end(), it->second.begin(), it->second.end());
    const auto record = [&](int id) {
      if (synced)
        for (int p : ps) (*synced)[p].push_back(id);
    };
    const std::string what = "level " + std::to_string(std::get<0>(key)) +
                             (training ? " layer " + std::to_string(std::get<2>(key)) : "") +
                             " gradients (" + std::to_string(ps.size()) + " params from " +
                             b.param(ps[0]).name + ")";
    // The dims a gradient is summed over: the data-parallel ones. The backward computes each TP
    // rank's own slice, which no other rank contributes to, so no gradient is summed over TP
    // (the executors seed, and the reference sums, contributions over these dims only).
    // Weights TP replicates (norms) see the same activations on every TP rank, so their
    // gradients agree there too (no sequence parallelism).
    DimSet shard_dims = layout.shard_dims();
    DimSet replicate_dims = layout.replicate_dims();
    DimSet tp_shard_dims;
    for (int d : b.mesh().dims_with_role(DimRole::tp)) {
      if (shard_dims.contains(d)) tp_shard_dims = tp_shard_dims.with(d);
      shard_dims = shard_dims.without(d);
      replicate_dims = replicate_dims.without(d);
    }
    // One sync op of this bucket's gradients.
    const auto sync_op = [&](OpKind kind, DimSet group, DimSet gathered, std::vector<int> deps,
                             const std::string& label) {
      Op op;
      op.kind = kind;
      op.stream = stream;
      op.ranks = b.holders_box(ps[0]);
      op.group = group;
      op.params = ps;
      op.gathered = gathered;
      op.tensor = TensorRole::gradient;
      op.period = period;
      op.deps = std::move(deps);
      op.label = label + what;
      return b.emit(std::move(op));
    };
    if (full_gradients || shard_dims.empty()) {
      const DimSet group = shard_dims | replicate_dims;
      std::vector<int> synced_ids = ready;
      if (!group.empty())
        synced_ids = {sync_op(OpKind::all_reduce, group, shard_dims, ready, "all_reduce ")};
      // A strategy that keeps whole matrices on every rank (full_gradients) needs the other TP
      // ranks' slices too: they are gathered, not summed.
      if (full_gradients && !tp_shard_dims.empty())
        synced_ids = {sync_op(OpKind::all_gather, tp_shard_dims, shard_dims, synced_ids,
                              "all_gather tp slices of ")};
      for (int id : synced_ids) record(id);
      if (!group.empty() || (full_gradients && !tp_shard_dims.empty()))
        done.insert(done.end(), synced_ids.begin(), synced_ids.end());
      continue;
    }
    int id = sync_op(OpKind::reduce_scatter, shard_dims, DimSet{}, ready, "reduce_scatter ");
    if (!replicate_dims.empty())
      id = sync_op(OpKind::all_reduce, replicate_dims, DimSet{}, {id}, "all_reduce ");
    done.push_back(id);
    record(id);
  }
  return done;
}

// SplitNsOptions: the split group of each matrix that splits. The per-rank share is the NS work
// of every Muon matrix on one GPU over the ranks that hold Muon matrices (what a perfect balance
// gives each); a matrix above threshold x share splits over the smallest candidate group whose
// member's part (core/plan/split_ns.hpp's FLOPs: 4 g^2 |S_r| + 2 g^3 per step, the largest
// member's) is within the share, else over the candidate with the smallest part. Candidates: the
// inner-first prefixes of the matrix's sharding dims, of 2 .. max_members ranks, that
// split_ns_problem accepts at the owner.
//
// A split matrix occupies every member of its group, which the assign policy (one matrix, one
// owner) did not plan for, so unless the owners are explicit its group is placed again: largest
// member part first, on the group instance (the owner's choice of coordinates outside the split
// dims) whose busiest member has the least NS work so far, counting the other matrices at their
// assigned owners (LPT over groups). The owner becomes that instance's first member holding a
// piece.
std::map<int, DimSet> choose_split_groups(const ShardedModel& model, Assignment& assignment,
                                          const std::vector<int>& params, const SplitNsOptions& o,
                                          int steps, bool place) {
  std::map<int, DimSet> groups;
  if (!o.enabled || params.empty()) return groups;
  const DeviceMesh& mesh = model.mesh;
  auto work = [&](int p) {
    const auto& dp = model.params.at(p);
    return newton_schulz_flops(dp.rows(), dp.cols(), steps, dp.batch());
  };
  auto holders = [&](int p) {
    RankBox box = RankBox::everyone(mesh);
    const auto& layout = model.params.at(p).layout;
    for (int d = 0; d < mesh.ndims(); ++d)
      if (layout.independent_dims().contains(d)) box.coord[d] = layout.placements()[d].coord;
    return box.ranks(mesh);
  };
  double total = 0;
  std::vector<char> holds(static_cast<std::size_t>(mesh.world_size()), 0);
  for (int p : model.muon_params()) {
    total += work(p);
    for (int r : holders(p)) holds[r] = 1;
  }
  const double share =
      total / std::max<double>(1, static_cast<double>(std::count(holds.begin(), holds.end(), 1)));
  std::map<int, double> part_of;  // split param -> its largest member's FLOPs
  for (int p : params) {
    const auto& dp = model.params.at(p);
    if (dp.shape.size() != 2 || !(work(p) > o.threshold * share)) continue;
    const int owner = assignment.owner.at(p);
    const DimSet shard = dp.layout.shard_dims();
    DimSet group, best;
    double best_part = work(p);
    for (int d : shard_dims_inner_first(mesh, dp.layout)) {
      group = group.with(d);
      const int k = mesh.group_size(group);
      if (k > o.max_members) break;
      if (k < 2 || !split_ns_problem(model, p, owner, minus(shard, group), group).empty()) continue;
      const SplitNsSlice slice = split_ns_slice(model, p, owner, minus(shard, group));
      const double g = static_cast<double>(slice.gram);
      const double part = static_cast<double>((slice.split + k - 1) / k);  // torch.chunk's first
      const double member = steps * (4.0 * g * g * part + 2.0 * g * g * g);
      if (member < best_part) {
        best = group;
        best_part = member;
      }
      if (member <= share) break;
    }
    if (!best.empty()) {
      groups[p] = best;
      part_of[p] = best_part;
    }
  }
  if (!place || groups.empty()) return groups;
  std::vector<double> load(static_cast<std::size_t>(mesh.world_size()), 0.0);
  for (int p : model.muon_params())
    if (!groups.count(p) && assignment.owner.at(p) >= 0) load[assignment.owner.at(p)] += work(p);
  std::vector<int> order;
  for (const auto& [p, g] : groups) order.push_back(p);
  std::stable_sort(order.begin(), order.end(),
                   [&](int x, int y) { return part_of[x] > part_of[y]; });
  for (int p : order) {
    const DimSet g = groups[p];
    const DimSet gathered = minus(model.params.at(p).layout.shard_dims(), g);
    std::vector<std::pair<double, int>> options;  // (busiest member's load, leader)
    for (int h : holders(p)) {
      if (mesh.group_index(h, g) != 0) continue;
      double busiest = 0;
      for (int m : mesh.group_members(h, g)) busiest = std::max(busiest, load[m]);
      options.emplace_back(busiest, h);
    }
    std::stable_sort(options.begin(), options.end());
    for (const auto& [busiest, leader] : options) {
      int owner = -1;
      for (int m : mesh.group_members(leader, g))
        if (owner < 0 && model.params.at(p).layout.shard_numel(mesh, m) > 0) owner = m;
      if (owner < 0 || !split_ns_problem(model, p, owner, gathered, g).empty()) continue;
      assignment.owner[p] = owner;
      for (int m : mesh.group_members(leader, g)) load[m] += part_of[p];
      break;
    }
  }
  return groups;
}

}  // namespace

StepPlan build_plan(const ShardedModel& model, const StrategyOptions& options,
                    const PlanSettings& settings) {
  const Strategy& strategy = find_strategy(options.name);
  check_options(options);
  const Schedule main = strategy.schedule(options);

  // Where every holder orthogonalizes, nothing is owned; otherwise every matrix has one owner.
  Assignment assignment = strategy.assign(model, options, settings.ns_steps());
  if (main.ns != NsPlacement::every_holder) validate_assignment(model, assignment);
  // Split Newton-Schulz of the large matrices (the others take the small-matrix path below);
  // their groups may move the owners (choose_split_groups).
  std::map<int, DimSet> split;
  if (options.split_ns.enabled && strategy_reads_option(options, "split_ns")) {
    std::vector<int> large;
    for (int p : model.muon_params())
      if (!(options.small_param_threshold > 0 &&
            model.params[p].numel() < options.small_param_threshold))
        large.push_back(p);
    split = choose_split_groups(model, assignment, large, options.split_ns, settings.ns_steps(),
                                options.assign != "explicit");
    validate_assignment(model, assignment);
  }
  summarize(model, settings.ns_steps(), assignment);

  PlanBuilder b(model, assignment, settings);
  const int compute = b.stream("compute");
  b.stream("comm");

  // The training step around the optimizer (core/plan/training.hpp): forward and backward, then
  // each layer's gradient sync as its backward completes.
  const bool training = settings.training.enabled;
  const bool overlap = training && settings.training.overlap == "backward";
  std::vector<int> start;
  std::map<int, std::vector<int>> synced;  // param -> the ops after which its gradient is synced
  if (training) {
    const TrainingEmission emitted = emit_training(b, settings.training);
    start = emit_grad_sync(b, options, main.owner_holds_full_state, &emitted, &synced);
    // Also after the backward itself: gradients with nothing to sync (TP only) are ready then.
    start.insert(start.end(), emitted.last_ops.begin(), emitted.last_ops.end());
  } else if (options.grad_sync.enabled) {
    start = emit_grad_sync(b, options, main.owner_holds_full_state);
  }

  // Momentum on the pieces each rank holds (or on the owners' whole matrices): one op after every
  // sync, or with overlap one per layer, after that layer's sync, in backward order.
  std::vector<int> muon = b.model().muon_params();
  std::map<int, int> momentum_of;  // param -> its momentum op (overlap)
  // One op of `kind` on the compute stream over `params` (momentum, adamw, apply), after `deps`.
  const auto compute_op = [&](OpKind kind, std::vector<int> params, std::vector<int> deps,
                              std::string label) {
    Op op;
    op.kind = kind;
    op.stream = compute;
    op.params = std::move(params);
    if (kind == OpKind::momentum && main.owner_holds_full_state) {
      op.owned_only = true;
      op.gathered = DimSet::all(b.mesh().ndims());
    }
    op.deps = std::move(deps);
    op.label = std::move(label);
    return b.emit(std::move(op));
  };
  if (overlap) {
    std::stable_sort(muon.begin(), muon.end(),
                     [&](int x, int y) { return b.param(x).layer > b.param(y).layer; });
    std::map<int, std::vector<int>, std::greater<>> by_layer;
    for (int p : muon) by_layer[b.param(p).layer].push_back(p);
    std::vector<int> all;
    for (const auto& [layer, params] : by_layer) {
      std::vector<int> deps;
      for (int p : params) deps.insert(deps.end(), synced[p].begin(), synced[p].end());
      const int id =
          compute_op(OpKind::momentum, params, deps, "momentum layer " + std::to_string(layer));
      for (int p : params) momentum_of[p] = id;
      all.push_back(id);
    }
    start = all;
  } else if (!muon.empty()) {
    start = {compute_op(OpKind::momentum, muon, start, "momentum")};
  }
  const auto adamw = b.model().adamw_params();
  if (!adamw.empty()) compute_op(OpKind::adamw, adamw, start, "adamw");

  std::vector<int> small, large;
  for (int p : muon) {
    const bool is_small = options.small_param_threshold > 0 &&
                          b.param(p).numel() < options.small_param_threshold &&
                          strategy_reads_option(options, "small_param_threshold");
    (is_small ? small : large).push_back(p);
  }
  const UnitOptions cut{options.chunk_size, options.order == "lpt", options.chunk_by_shape,
                        options.chunk_sizing == "ns_cost"};
  // With overlap a unit starts after its own matrices' momentum, not after every layer's.
  const auto own_deps = [&](std::vector<Unit> units) {
    if (!overlap) return units;
    for (Unit& u : units) {
      for (int p : u.params) u.deps.push_back(momentum_of.at(p));
      std::sort(u.deps.begin(), u.deps.end());
      u.deps.erase(std::unique(u.deps.begin(), u.deps.end()), u.deps.end());
    }
    return units;
  };
  const std::vector<int> unit_start = overlap ? std::vector<int>{} : start;
  std::vector<int> finished;
  if (!small.empty()) {
    const Schedule small_path = replicated_schedule(options);
    auto done = run_schedule(b, small_path, settings.ns_steps(),
                             own_deps(make_units(b, small, small_path, cut)), unit_start);
    finished.insert(finished.end(), done.begin(), done.end());
  }
  if (!large.empty()) {
    auto done = run_schedule(b, main, settings.ns_steps(),
                             own_deps(make_units(b, large, main, cut, split)), unit_start);
    finished.insert(finished.end(), done.begin(), done.end());
  }
  if (!muon.empty()) compute_op(OpKind::apply_update, muon, finished, "apply Muon updates");
  return b.finish(options.name, options.to_json_text());
}

}  // namespace muonbed
