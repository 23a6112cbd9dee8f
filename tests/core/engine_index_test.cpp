// The engine's per-rank shortcuts (core/engine/engine.hpp) against plain references on random
// plans: PlanIndex::next_position and for_each_rank_dep against a scan of every op with
// contains(), and the engine's start times (streams blocked on a dep sleep until the dep's
// stream moves) against the semantics of plan.hpp evaluated op by op in plan order.
#include <algorithm>
#include <map>
#include <queue>
#include <random>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "core/engine/engine.hpp"

using namespace muonbed;

namespace {

// A random plan: compute, alloc and all_reduce ops on random streams, rank boxes fixing random
// dims, random earlier deps, some ops with period 2 (inactive in odd steps). Plans of over 100
// ops put more than 16 ops on a stream and give ops over 16 deps, where PlanIndex leaves its
// one-by-one probe for its key index.
StepPlan random_plan(std::mt19937& rng, int num_ops) {
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  StepPlan plan;
  std::vector<MeshDim> dims;
  const int nd = 1 + pick(3);
  for (int d = 0; d < nd; ++d) dims.push_back({"d" + std::to_string(d), 1 + pick(4)});
  plan.model.mesh = DeviceMesh(dims, 1);
  const DeviceMesh& mesh = plan.model.mesh;
  const int ns = 1 + pick(4);
  for (int s = 0; s < ns; ++s) plan.streams.push_back("s" + std::to_string(s));
  for (int i = 0; i < num_ops; ++i) {
    Op op;
    op.id = i;
    const int kind = pick(6);
    op.kind = kind < 3 ? OpKind::newton_schulz : kind < 4 ? OpKind::alloc : OpKind::all_reduce;
    op.stream = pick(ns);
    op.ranks = RankBox::everyone(mesh);
    for (int d = 0; d < nd; ++d)
      if (pick(2) == 0) {
        op.ranks.coord[d] = pick(mesh.size(d));
      } else if (op.kind == OpKind::all_reduce && pick(2) == 0) {
        op.group = op.group.with(d);
      }
    op.period = pick(5) == 0 ? 2 : 1;
    // Some ops with many deps: PlanIndex tests up to kProbe deps one by one, more by key.
    const bool many = pick(4) == 0;
    for (int j = 0; j < i; ++j)
      if (pick(many ? 2 : std::max(1, i / 3)) == 0) op.deps.push_back(j);
    plan.ops.push_back(op);
  }
  return plan;
}

// Start times of every (rank, active op) by the semantics of plan.hpp, ops in plan order (deps
// and stream predecessors come first): a rank's op starts when the rank's previous active op on
// the stream has ended and its deps on the rank have completed; an inactive op completes when the
// stream reaches it and its own deps have completed; a collective instance starts when its last
// member is ready. Durations: compute 1 + op % 3, collective 2, memory 0.
std::map<std::pair<int, int>, long> reference_starts(const StepPlan& plan, int step) {
  const DeviceMesh& mesh = plan.mesh();
  const int world = mesh.world_size();
  std::vector<std::vector<long>> free_at(world, std::vector<long>(plan.streams.size(), 0));
  std::vector<std::vector<long>> done(world, std::vector<long>(plan.ops.size(), -1));
  std::map<std::pair<int, int>, long> starts;
  for (const Op& op : plan.ops) {
    auto ready = [&](int r) {
      long t = free_at[r][op.stream];
      for (int d : op.deps)
        if (plan.ops[d].ranks.contains(mesh, r)) t = std::max(t, done[r][d]);
      return t;
    };
    const std::vector<int> ranks = op.ranks.ranks(mesh);
    if (!plan.active_in_step(op, step)) {
      for (int r : ranks) done[r][op.id] = ready(r);  // the stream's reach is free_at
      continue;
    }
    const long duration = is_memory(op.kind) ? 0 : is_compute(op.kind) ? 1 + op.id % 3 : 2;
    std::map<int, std::vector<int>> instances;  // leader -> members
    for (int r : ranks)
      instances[op.kind == OpKind::all_reduce ? mesh.group_leader(r, op.group) : r].push_back(r);
    for (const auto& [leader, members] : instances) {
      long start = 0;
      for (int r : members) start = std::max(start, ready(r));
      for (int r : members) {
        starts[{r, op.id}] = start;
        done[r][op.id] = start + duration;
        free_at[r][op.stream] = start + duration;
      }
    }
  }
  return starts;
}

// Drives an Engine with a clock: compute and collectives end after the durations above, events
// of equal time in the order they were started.
class ClockHandler : public OpHandler {
 public:
  explicit ClockHandler(const StepPlan& plan) : plan_(plan) {}
  Engine* engine = nullptr;
  std::map<std::pair<int, int>, long> starts;

  void start_compute(int rank, int op) override {
    starts[{rank, op}] = now_;
    events_.push({now_ + 1 + op % 3, seq_++, rank, op, -1});
  }
  void start_collective(const CollectiveInstance& instance) override {
    for (int r : instance.participants) starts[{r, instance.op}] = now_;
    events_.push({now_ + 2, seq_++, -1, instance.op, instance.id});
  }
  void memory(int rank, int op) override { starts[{rank, op}] = now_; }

  void run(int step) {
    engine->begin_step(step);
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      now_ = e.time;
      if (e.instance >= 0)
        engine->finish_collective(e.instance);
      else
        engine->finish_compute(e.rank, e.op);
    }
  }

 private:
  struct Event {
    long time;
    long seq;
    int rank, op, instance;
    bool operator>(const Event& o) const { return std::tie(time, seq) > std::tie(o.time, o.seq); }
  };
  const StepPlan& plan_;
  long now_ = 0, seq_ = 0;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
};

}  // namespace

TEST_CASE("PlanIndex finds each rank's ops and deps as a scan of every op does",
          "[engine][engine_index]") {
  std::mt19937 rng(20261128);
  for (int trial = 0; trial < 200; ++trial) {
    const StepPlan plan = random_plan(rng, 1 + trial % 150);
    const PlanIndex index(plan);
    const int world = index.world_size();
    for (int r = 0; r < world; ++r) {
      for (int s = 0; s < index.num_streams(); ++s) {
        const std::vector<int>& list = index.stream_ops(s);
        for (int pos = 0; pos <= static_cast<int>(list.size()); ++pos) {
          int scan = pos;
          while (scan < static_cast<int>(list.size()) && !index.contains(list[scan], r)) ++scan;
          CHECK(index.next_position(s, r, pos) == scan);
        }
      }
      for (int op = 0; op < index.num_ops(); ++op) {
        std::vector<int> scan, found;
        for (int d : index.deps(op))
          if (index.contains(d, r)) scan.push_back(d);
        index.for_each_rank_dep(op, r, [&](const int* begin, const int* end) {
          found.insert(found.end(), begin, end);
          return true;
        });
        std::sort(found.begin(), found.end());  // each dep once, in any order
        CHECK(found == scan);
      }
    }
  }
}

TEST_CASE("The engine starts every op when the plan semantics say, on random plans",
          "[engine][engine_index]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const StepPlan plan = random_plan(rng, 1 + trial % 150);
    const PlanIndex index(plan);
    for (int step = 0; step < 2; ++step) {
      ClockHandler handler(plan);
      Engine engine(index, handler, index.all_ranks());
      handler.engine = &engine;
      handler.run(step);
      INFO("trial " << trial << ", step " << step);
      CHECK(engine.step_done());
      CHECK(handler.starts == reference_starts(plan, step));
    }
  }
}
