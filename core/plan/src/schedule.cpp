// The pipelined scheduler every strategy's Schedule runs on (core/plan/schedule.hpp: units,
// lanes, prefetch gates, barriers, split units), and how units are cut from the matrices.
#include <algorithm>
#include <map>

#include "core/base/errors.hpp"
#include "core/plan/src/policy_blocks.hpp"

namespace muonbed::plan_detail {

namespace {

class Scheduler {
 public:
  Scheduler(PlanBuilder& b, const Schedule& c, int ns_steps) : b_(b), c_(c), ns_steps_(ns_steps) {
    compute_ = b_.stream("compute");
    // Lane 0 keeps the seeds' stream names; lane k > 0 adds "comm.k" and "comm_scatter.k".
    for (int k = 0; k < std::max(1, c_.lanes); ++k) {
      const std::string suffix = k == 0 ? "" : "." + std::to_string(k);
      gather_streams_.push_back(b_.stream("comm" + suffix));
      scatter_streams_.push_back(c_.depth > 0 ? b_.stream("comm_scatter" + suffix)
                                              : gather_streams_.back());
    }
    gather_stream_ = gather_streams_[0];
  }

  // Runs the pipeline over `units` (grouped into lanes by lane_key, in first-seen order).
  // Returns the op ids after which every update of these units is in place.
  std::vector<int> run(const std::vector<Unit>& units, const std::vector<int>& start_deps) {
    start_deps_ = start_deps;
    classify_ranks(units);
    std::vector<std::vector<int>> lanes_order;
    std::map<std::vector<int>, std::vector<const Unit*>> lanes;
    for (const auto& u : units) {
      if (!lanes.count(u.lane_key)) {
        // Lanes (owners) take the communication lanes in turn, in the order they first appear.
        lane_stream_[u.lane_key] = static_cast<int>(lanes_order.size()) % gather_streams_.size();
        lanes_order.push_back(u.lane_key);
      }
      lanes[u.lane_key].push_back(&u);
    }
    std::vector<int> finished;
    std::vector<int> deps = start_deps;
    if (c_.barrier_per_lane || c_.barrier_per_unit) {
      // One block at a time, each closed by a barrier; prefetch stays inside a block.
      for (const auto& key : lanes_order) {
        if (c_.barrier_per_unit) {
          for (const Unit* u : lanes[key]) {
            auto done = pipeline({{u}}, deps);
            deps = {barrier(done)};
            finished.push_back(deps.back());
          }
        } else {
          std::vector<std::vector<const Unit*>> rounds;
          for (const Unit* u : lanes[key]) rounds.push_back({u});
          auto done = pipeline(rounds, deps);
          deps = {barrier(done)};
          finished.push_back(deps.back());
        }
      }
      return finished;
    }
    std::vector<std::vector<const Unit*>> rounds;
    for (const auto& key : lanes_order) {
      const auto& lane = lanes[key];
      for (std::size_t j = 0; j < lane.size(); ++j) {
        if (rounds.size() <= j) rounds.emplace_back();
        rounds[j].push_back(lane[j]);
      }
    }
    return pipeline(rounds, deps);
  }

 private:
  struct InFlight {
    const Unit* unit = nullptr;
    int buffer = -1;
    RankBox buffer_box;
    std::vector<int> gathered;  // completion of the gather
  };

  int barrier(const std::vector<int>& deps) {
    Op op;
    op.kind = OpKind::barrier;
    op.stream = gather_stream_;
    op.ranks = RankBox::everyone(b_.mesh());
    op.group = DimSet::all(b_.mesh().ndims());
    op.deps = deps;
    op.label = "barrier";
    return b_.emit(std::move(op));
  }

  // Where a unit's full updates live while it is processed.
  RankBox result_box(const Unit& u) const {
    const int p0 = u.params[0];
    if (!u.split.empty())  // the split group of the owner: its slices gathered over the rest
      return b_.box_through(p0, b_.owner(p0),
                            b_.param(p0).layout.replicate_dims() | split_gathered(u));
    switch (c_.ns) {
      case NsPlacement::owner:
        return RankBox::single(b_.mesh(), b_.owner(p0));
      case NsPlacement::owners_of_chunk:
        return c_.gather->name() == "none"
                   ? b_.holders_box(p0)
                   : b_.box_through(p0, b_.owner(p0), b_.param(p0).layout.replicate_dims());
      case NsPlacement::every_holder:
        return b_.holders_box(p0);
    }
    return b_.holders_box(p0);
  }

  InFlight start_gather(const Unit& u, std::vector<int> deps) {
    deps.insert(deps.end(), u.deps.begin(), u.deps.end());
    InFlight f;
    f.unit = &u;
    f.buffer_box = result_box(u);
    // The buffer holds what the ranks of the box end up with: the full updates of the matrices
    // they orthogonalize, or every matrix of the unit when every holder gets them all (replicated
    // NS, or results all-gathered from their owners).
    const bool owned_only =
        c_.ns != NsPlacement::every_holder && c_.redistribute->name() != "all_gather_owned";
    if (u.split.empty())
      f.buffer = b_.add_buffer("full updates " + param_label(b_, u.params), u.params,
                               DimSet::all(b_.mesh().ndims()), owned_only);
    else  // every member holds its slice
      f.buffer = b_.add_buffer("split slices " + param_label(b_, u.params), u.params,
                               split_gathered(u), false);
    // Each class of ranks inside the box waits for the release of its own unit `depth`+1 back:
    // the unit at position k of the class (in the order its units start, which is the order they
    // finish) waits for the release of unit k - depth - 1, so at most depth + 1 units of a class
    // are ever live at once, whenever the engine runs the gathers. (Gating on the class's latest
    // releases instead lets unit k start after unit k - depth - 2 only: depth + 2 live units.)
    // pipeline() starts a unit only when its classes have at most `depth` units in flight, so
    // that release has already been emitted.
    for (int cls : classes_in(f.buffer_box)) {
      const int position = started_[cls]++;
      if (position > c_.depth) deps.push_back(releases_.at(cls).at(position - c_.depth - 1));
    }
    Op alloc;
    alloc.kind = OpKind::alloc;
    alloc.stream = gather_streams_[lane_stream_.at(u.lane_key)];
    alloc.ranks = f.buffer_box;
    alloc.buffer = f.buffer;
    alloc.deps = deps;
    alloc.label = "alloc full updates " + param_label(b_, u.params);
    const int alloc_id = b_.emit(std::move(alloc));
    deps.push_back(alloc_id);
    const int stream = gather_streams_[lane_stream_.at(u.lane_key)];
    if (u.split.empty())
      f.gathered = c_.gather->emit(b_, u.params, stream, deps);
    else
      f.gathered = make_staged_gather(c_.gather->name(), c_.order, u.split)
                       ->emit(b_, u.params, stream, deps);
    return f;
  }

  // The dims a split unit's slices are gathered over: its sharding dims outside the split group.
  DimSet split_gathered(const Unit& u) const {
    return minus(b_.param(u.params[0]).layout.shard_dims(), u.split);
  }

  std::vector<int> orthogonalize(const InFlight& f) {
    const Unit& u = *f.unit;
    std::vector<int> ids;
    if (!u.split.empty()) {
      Op op;
      op.kind = OpKind::split_newton_schulz;
      op.stream = compute_;
      op.ranks = result_box(u);
      op.group = u.split;
      op.params = u.params;
      op.gathered = split_gathered(u);
      op.ns_steps = ns_steps_;
      op.deps = f.gathered;
      op.label = "split NS " + b_.param(u.params[0]).name;
      return {b_.emit(std::move(op))};
    }
    if (c_.ns == NsPlacement::owner) {
      for (int p : u.params) {
        Op op;
        op.kind = OpKind::newton_schulz;
        op.stream = compute_;
        op.ranks = RankBox::single(b_.mesh(), b_.owner(p));
        op.params = {p};
        op.ns_steps = ns_steps_;
        op.deps = f.gathered;
        op.label = "NS " + b_.param(p).name;
        ids.push_back(b_.emit(std::move(op)));
      }
      return ids;
    }
    Op op;
    op.kind = OpKind::newton_schulz;
    op.stream = compute_;
    op.ranks = result_box(u);
    op.params = u.params;
    op.owned_only = c_.ns == NsPlacement::owners_of_chunk;
    op.ns_steps = ns_steps_;
    op.deps = f.gathered;
    op.label = "NS " + param_label(b_, u.params);
    return {b_.emit(std::move(op))};
  }

  // Redistribution also waits for what the step started after (the momentum op): a replica that
  // receives the result by broadcast gathered nothing, so nothing else orders its momentum (which
  // wrote the update where the result lands) before the broadcast writes there.
  std::vector<int> finish_unit(const InFlight& f, const std::vector<int>& ns_ids) {
    const int scatter_stream = scatter_streams_[lane_stream_.at(f.unit->lane_key)];
    std::vector<int> deps = ns_ids;
    deps.insert(deps.end(), start_deps_.begin(), start_deps_.end());
    deps.insert(deps.end(), f.unit->deps.begin(), f.unit->deps.end());
    auto done = f.unit->split.empty()
                    ? c_.redistribute->emit(b_, f.unit->params, scatter_stream, deps)
                    : make_staged_redistribute(c_.redistribute->name(), c_.order, f.unit->split)
                          ->emit(b_, f.unit->params, scatter_stream, deps);
    Op release;
    release.kind = OpKind::release;
    release.stream = scatter_stream;
    release.ranks = f.buffer_box;
    release.buffer = f.buffer;
    release.deps = done;
    release.label = "release full updates " + param_label(b_, f.unit->params);
    const int release_id = b_.emit(std::move(release));
    for (int cls : classes_in(f.buffer_box)) releases_[cls].push_back(release_id);
    done.push_back(release_id);
    return done;
  }

  // Emits units in round order. A unit's gathers are emitted as early as its classes allow
  // (at most depth+1 units of a class in flight), so prefetching is counted per rank class,
  // and every gate it waits for has already been emitted.
  std::vector<int> pipeline(const std::vector<std::vector<const Unit*>>& rounds,
                            const std::vector<int>& deps) {
    std::vector<const Unit*> order;
    for (const auto& round : rounds) order.insert(order.end(), round.begin(), round.end());
    std::vector<InFlight> started;
    started.reserve(order.size());
    std::map<int, int> in_flight;  // class -> units started and not yet released
    auto can_start = [&](const Unit& u) {
      for (int cls : classes_in(result_box(u)))
        if (in_flight[cls] > c_.depth) return false;
      return true;
    };
    auto start_more = [&] {
      while (started.size() < order.size() && can_start(*order[started.size()])) {
        const Unit& u = *order[started.size()];
        for (int cls : classes_in(result_box(u))) ++in_flight[cls];
        started.push_back(start_gather(u, deps));
      }
    };
    std::vector<int> finished;
    for (std::size_t i = 0; i < order.size(); ++i) {
      start_more();
      if (i >= started.size()) throw PlanError("internal: pipeline cannot start a unit");
      const auto ns = orthogonalize(started[i]);
      auto done = finish_unit(started[i], ns);
      for (int cls : classes_in(started[i].buffer_box)) --in_flight[cls];
      finished.insert(finished.end(), done.begin(), done.end());
    }
    return finished;
  }

  // Ranks that lie in exactly the same result boxes form a class; a deps list can then gate
  // every class separately (deps apply only on ranks that take part in them), which bounds the
  // transient memory of each rank even when it holds matrices of several lanes (EP: dense and
  // expert matrices).
  void classify_ranks(const std::vector<Unit>& units) {
    boxes_.clear();
    for (const auto& u : units) {
      const RankBox box = result_box(u);
      if (std::find(boxes_.begin(), boxes_.end(), box) == boxes_.end()) boxes_.push_back(box);
    }
    std::vector<std::vector<int>> signature(b_.mesh().world_size());
    for (int i = 0; i < static_cast<int>(boxes_.size()); ++i)
      for (int r : boxes_[i].ranks(b_.mesh())) signature[r].push_back(i);
    std::map<std::vector<int>, int> ids;
    classes_of_box_.assign(boxes_.size(), {});
    for (int r = 0; r < static_cast<int>(signature.size()); ++r) {
      if (signature[r].empty()) continue;
      const auto [it, added] = ids.emplace(signature[r], static_cast<int>(ids.size()));
      if (added)
        for (int box : signature[r]) classes_of_box_[box].push_back(it->second);
    }
  }

  const std::vector<int>& classes_in(const RankBox& box) const {
    const auto it = std::find(boxes_.begin(), boxes_.end(), box);
    return classes_of_box_.at(it - boxes_.begin());
  }

  std::vector<int> start_deps_;  // what run() started after (the momentum op)
  PlanBuilder& b_;
  const Schedule& c_;
  int ns_steps_;
  int compute_ = 0, gather_stream_ = 0;
  std::vector<int> gather_streams_, scatter_streams_;  // per communication lane
  std::map<std::vector<int>, int> lane_stream_;        // lane key -> communication lane
  std::vector<RankBox> boxes_;
  std::vector<std::vector<int>> classes_of_box_;
  std::map<int, std::vector<int>> releases_;  // class -> release ops of its units, in order
  std::map<int, int> started_;                // class -> units started so far
};

}  // namespace

std::vector<int> group_key(const PlanBuilder& b, int p) {
  const auto& layout = b.param(p).layout;
  std::vector<int> key = b.holders_box(p).coord;
  key.push_back(static_cast<int>(layout.shard_dims().bits));
  key.push_back(static_cast<int>(layout.replicate_dims().bits));
  return key;
}

std::vector<Unit> make_units(const PlanBuilder& b, std::vector<int> params, const Schedule& c,
                             const UnitOptions& options, const std::map<int, DimSet>& split) {
  const int chunk_size = options.chunk_size;
  const bool lpt = options.lpt;
  const bool chunk_by_shape = options.chunk_by_shape;
  const bool ns_cost_chunks = options.ns_cost_chunks;
  std::vector<Unit> units;
  const auto flops = [&](int p) {
    const auto& dp = b.param(p);
    return newton_schulz_flops(dp.rows(), dp.cols(), 1, dp.batch());
  };
  if (lpt) {  // largest Newton-Schulz first (stable: equal matrices keep parameter order)
    std::stable_sort(params.begin(), params.end(),
                     [&](int x, int y) { return flops(x) > flops(y); });
  }
  if (!c.chunked) {
    for (int p : params) {
      Unit u;
      u.params = {p};
      if (const auto it = split.find(p); it != split.end()) u.split = it->second;
      if (c.barrier_per_unit) {
        u.lane_key = {0};
      } else if (c.ns == NsPlacement::every_holder) {
        u.lane_key = group_key(b, p);
      } else {
        u.lane_key = {b.owner(p)};
      }
      units.push_back(std::move(u));
    }
    return units;
  }
  // Chunks: same group, and for all_to_all the owners in the same replica.
  std::map<std::vector<int>, std::vector<int>> groups;
  std::vector<std::vector<int>> order;
  for (int p : params) {
    auto key = group_key(b, p);
    if (chunk_by_shape) key.insert(key.end(), b.param(p).shape.begin(), b.param(p).shape.end());
    if (c.gather->name() != "none") {
      const auto& layout = b.param(p).layout;
      for (int d = 0; d < b.mesh().ndims(); ++d)
        if (layout.replicate_dims().contains(d)) key.push_back(b.mesh().coord(b.owner(p), d));
    }
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(p);
  }
  for (const auto& key : order) {
    const auto& ps = groups[key];
    if (!ns_cost_chunks) {
      for (std::size_t i = 0; i < ps.size(); i += chunk_size) {
        Unit u;
        u.params.assign(ps.begin() + i, ps.begin() + std::min(ps.size(), i + chunk_size));
        u.lane_key = key;
        units.push_back(std::move(u));
      }
      continue;
    }
    // Rounds: chunk k holds every owner's k-th largest matrix, so each chunk keeps every owner
    // of the group computing and lasts about as long as its largest NS (with order lpt the
    // rounds shrink: the next, smaller exchange hides behind the current round's NS).
    std::map<int, std::vector<int>> by_owner;
    std::vector<int> owners;
    for (int p : ps) {
      if (!by_owner.count(b.owner(p))) owners.push_back(b.owner(p));
      by_owner[b.owner(p)].push_back(p);
    }
    for (auto& [owner, mine] : by_owner)
      std::stable_sort(mine.begin(), mine.end(), [&](int x, int y) { return flops(x) > flops(y); });
    for (std::size_t round = 0;; ++round) {
      Unit u;
      for (int owner : owners)
        if (round < by_owner[owner].size()) u.params.push_back(by_owner[owner][round]);
      if (u.params.empty()) break;
      u.lane_key = key;
      units.push_back(std::move(u));
    }
  }
  return units;
}

std::vector<int> run_schedule(PlanBuilder& b, const Schedule& schedule, int ns_steps,
                              const std::vector<Unit>& units, const std::vector<int>& start_deps) {
  Scheduler scheduler(b, schedule, ns_steps);
  return scheduler.run(units, start_deps);
}

}  // namespace muonbed::plan_detail
