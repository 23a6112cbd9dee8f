// Invariants of every built-in strategy on every topology, checked by interpreting the plan on
// the host: a data-flow replay tracks which elements of each matrix every rank holds (momentum
// and orthogonalized update), so gather -> NS -> redistribute is verified element by element;
// a progress replay proves the per-rank programs cannot deadlock; byte counts and memory bounds
// are checked against independent recomputation.
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "core/engine/engine.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/strategy.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

namespace {

using testing::make_model;
using testing::strategies;
using testing::topologies;
using testing::Topology;

using ElementSet = std::vector<char>;  // one flag per element of the full tensor

ElementSet elements_of(const DistributedParam& dp, const ShardIndexSet& set) {
  ElementSet e(static_cast<std::size_t>(dp.numel()), 0);
  for_each_element(set, dp.shape, [&](std::int64_t f, std::int64_t) { e[f] = 1; });
  return e;
}

bool subset(const ElementSet& a, const ElementSet& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] && !b[i]) return false;
  return true;
}

void unite(ElementSet& into, const ElementSet& from) {
  for (std::size_t i = 0; i < into.size(); ++i) into[i] |= from[i];
}

bool full(const ElementSet& e) {
  return std::all_of(e.begin(), e.end(), [](char c) { return c != 0; });
}

// Replays the plan's data movement (plan.hpp's piece rules) for the Muon matrices and returns,
// per param, how many ranks orthogonalized it. Fails the test at the first op whose sender does
// not hold what it must send, or an NS whose rank does not hold the full momentum.
std::vector<int> replay_data_flow(const StepPlan& plan) {
  const auto& mesh = plan.mesh();
  const int world = mesh.world_size();
  const auto& params = plan.model.params;
  // momentum[p][rank], update[p][rank]
  std::vector<std::vector<ElementSet>> momentum(params.size()), update(params.size());
  std::vector<int> ns_count(params.size(), 0);
  // The plan says where momentum lives: the piece its momentum op computes on (owner_allgather:
  // the owner's full matrices), not the strategy's name.
  std::vector<const Op*> momentum_op(params.size(), nullptr);
  for (const Op& op : plan.ops)
    if (op.kind == OpKind::momentum)
      for (int p : op.params) momentum_op[p] = &op;
  for (const auto& dp : params) {
    if (dp.optimizer != OptimizerKind::muon) continue;
    momentum[dp.index].resize(world);
    update[dp.index].resize(world, ElementSet(dp.numel(), 0));
    const Op* op = momentum_op[dp.index];
    REQUIRE(op != nullptr);
    for (int r = 0; r < world; ++r) {
      const bool computes =
          op->ranks.contains(mesh, r) && (!op->owned_only || plan.assignment.owner[dp.index] == r);
      momentum[dp.index][r] = computes ? elements_of(dp, dp.layout.index_set(mesh, r, op->gathered))
                                       : ElementSet(dp.numel(), 0);
    }
  }
  auto piece = [&](int p, int r, DimSet gathered) {
    return elements_of(params[p], params[p].layout.index_set(mesh, r, gathered));
  };
  for (const Op& op : plan.ops) {
    const bool data_op = op.kind == OpKind::gather || op.kind == OpKind::scatter ||
                         op.kind == OpKind::broadcast || op.kind == OpKind::all_gather ||
                         op.kind == OpKind::all_to_all || op.kind == OpKind::newton_schulz ||
                         op.kind == OpKind::split_newton_schulz;
    // Gradient syncs (a strategy's all_gather of TP slices among them) come before momentum;
    // that momentum reads only gradients they produced is the lowering's check (program_test).
    if (!data_op || op.tensor == TensorRole::gradient) continue;
    for (int p : op.params) {
      if (params[p].optimizer != OptimizerKind::muon) continue;
      const int owner = plan.assignment.owner[p];
      // Which state moves: gathers move momentum, redistribution moves the update.
      const bool moves_update =
          op.kind == OpKind::scatter || op.kind == OpKind::broadcast ||
          (op.kind == OpKind::all_to_all && op.direction == AllToAllDirection::from_owners) ||
          (op.kind == OpKind::all_gather && op.owned_only);
      auto& state = moves_update ? update[p] : momentum[p];
      if (op.kind == OpKind::newton_schulz) {
        for (int r : op.ranks.ranks(mesh)) {
          if (op.owned_only && owner != r) continue;
          if (!params[p].layout.holds(mesh, r)) continue;
          INFO("NS of " << params[p].name << " on rank " << r << ", op " << op.label);
          REQUIRE(full(momentum[p][r]));
          std::fill(update[p][r].begin(), update[p][r].end(), 1);
          ++ns_count[p];
        }
        continue;
      }
      if (op.kind == OpKind::split_newton_schulz) {
        // Each group instance orthogonalizes the matrix once: its members hold slices of the
        // momentum that cover it together, and each ends with its slice of the result.
        std::set<int> leaders;
        for (int r : op.ranks.ranks(mesh)) leaders.insert(mesh.group_leader(r, op.group));
        for (int leader : leaders) {
          ElementSet together(params[p].numel(), 0);
          for (int m : mesh.group_members(leader, op.group)) {
            INFO("split NS of " << params[p].name << " on rank " << m << ", op " << op.label);
            REQUIRE(subset(piece(p, m, op.gathered), momentum[p][m]));
            unite(together, piece(p, m, op.gathered));
            unite(update[p][m], piece(p, m, op.gathered));
          }
          REQUIRE(full(together));
          ++ns_count[p];
        }
        continue;
      }
      std::set<int> leaders;
      for (int r : op.ranks.ranks(mesh)) leaders.insert(mesh.group_leader(r, op.group));
      for (int leader : leaders) {
        const auto members = mesh.group_members(leader, op.group);
        const int n = static_cast<int>(members.size());
        auto next = state;  // collectives read before anyone writes
        INFO("op " << op.id << " " << op.label << " instance led by " << leader);
        switch (op.kind) {
          case OpKind::gather: {
            const int root = members[op.root];
            for (int m : members) {
              const auto sent = piece(p, m, op.gathered);
              REQUIRE(subset(sent, state[m]));
              unite(next[root], sent);
            }
            REQUIRE(subset(piece(p, root, op.gathered | op.group), next[root]));
            break;
          }
          case OpKind::scatter: {
            const int root = members[op.root];
            REQUIRE(subset(piece(p, root, op.gathered | op.group), state[root]));
            for (int m : members) unite(next[m], piece(p, m, op.gathered));
            break;
          }
          case OpKind::broadcast: {
            const int root = members[op.root];
            const auto sent = piece(p, root, op.gathered);
            REQUIRE(subset(sent, state[root]));
            for (int m : members) unite(next[m], sent);
            break;
          }
          case OpKind::all_gather: {
            for (int m : members) {
              if (op.owned_only && owner != m) continue;
              const auto sent =
                  op.owned_only ? ElementSet(params[p].numel(), 1) : piece(p, m, op.gathered);
              REQUIRE(subset(sent, state[m]));
              for (int k = 0; k < n; ++k) unite(next[members[k]], sent);
            }
            break;
          }
          case OpKind::all_to_all: {
            REQUIRE(std::find(members.begin(), members.end(), owner) != members.end());
            for (int m : members) {
              const auto mine = piece(p, m, op.gathered);
              if (op.direction == AllToAllDirection::to_owners) {
                REQUIRE(subset(mine, state[m]));
                unite(next[owner], mine);
              } else {
                REQUIRE(subset(mine, state[owner]));
                unite(next[m], mine);
              }
            }
            break;
          }
          default:
            break;
        }
        state = std::move(next);
      }
    }
  }
  // Every holder ends with the orthogonalized update of its own piece.
  for (const auto& dp : params) {
    if (dp.optimizer != OptimizerKind::muon) continue;
    for (int r = 0; r < world; ++r) {
      INFO(dp.name << " on rank " << r);
      REQUIRE(subset(piece(dp.index, r, DimSet{}), update[dp.index][r]));
    }
  }
  return ns_count;
}

// Runs every step of the plan's hyper-period on the execution engine (core/engine/engine.hpp) with
// handlers that complete each op at once, and checks the order the engine ran them in against the
// semantics, independently: on every rank, each active op it takes part in ran exactly once, after
// the ops before it on its stream and after its active deps; inactive ops never ran. Returns
// false if a step did not finish (a deadlock).
class RecordingHandler final : public OpHandler {
 public:
  explicit RecordingHandler(const StepPlan& plan) : plan_(plan) {}
  Engine* engine = nullptr;
  std::vector<std::vector<int>> order;  // per rank: op ids in completion order

  void start_compute(int rank, int op) override {
    order[rank].push_back(op);
    engine->finish_compute(rank, op);
  }
  void start_collective(const CollectiveInstance& instance) override {
    for (int m : instance.participants) order[m].push_back(instance.op);
    engine->finish_collective(instance.id);
  }
  void memory(int rank, int op) override { order[rank].push_back(op); }

 private:
  const StepPlan& plan_;
};

bool replay_progress(const StepPlan& plan) {
  const auto& mesh = plan.mesh();
  const int world = mesh.world_size();
  const PlanIndex index(plan);
  RecordingHandler handler(plan);
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[r] = r;
  Engine engine(index, handler, all);
  handler.engine = &engine;
  for (int step = 0; step < plan.hyper_period(); ++step) {
    handler.order.assign(world, {});
    engine.begin_step(step);
    INFO("step " << step << ": " << engine.stall_report());
    if (!engine.step_done()) return false;
    for (int r = 0; r < world; ++r) {
      std::vector<int> at(plan.ops.size(), -1);  // position in r's order
      for (std::size_t i = 0; i < handler.order[r].size(); ++i) {
        const int op = handler.order[r][i];
        REQUIRE(at[op] == -1);  // at most once
        at[op] = static_cast<int>(i);
      }
      // An inactive op passes when its own deps have: its "time" is the latest of theirs.
      std::vector<int> done(plan.ops.size(), -1);
      std::vector<int> last_on_stream(plan.streams.size(), -1);
      for (const Op& op : plan.ops) {
        const bool mine = op.ranks.contains(mesh, r);
        const bool pair_bystander = (op.kind == OpKind::send || op.kind == OpKind::recv) &&
                                    mesh.group_index(r, op.group) != op.root &&
                                    mesh.group_index(r, op.group) != op.peer;
        const bool runs = mine && plan.active_in_step(op, step) && !pair_bystander;
        INFO("rank " << r << " op " << op.id << " " << op.label);
        CHECK((at[op.id] >= 0) == runs);
        if (!mine) continue;
        int after = -1;
        for (int d : op.deps)
          if (plan.ops[d].ranks.contains(mesh, r)) after = std::max(after, done[d]);
        if (runs) {
          CHECK(at[op.id] > after);
          CHECK(at[op.id] > last_on_stream[op.stream]);
          last_on_stream[op.stream] = at[op.id];
          done[op.id] = at[op.id];
        } else {
          done[op.id] = after;
        }
      }
    }
  }
  return true;
}

std::int64_t max_full_bytes(const StepPlan& plan) {
  std::int64_t m = 0;
  for (const auto& dp : plan.model.params)
    if (dp.optimizer == OptimizerKind::muon) m = std::max(m, dp.numel());
  return m * bytes_of(plan.settings.comm_dtype());
}

// Every strategy's plan of `model` (named `topology` in messages) keeps the step's invariants.
void check_step_invariants(const std::string& topology, const ShardedModel& model) {
  for (const auto& options : strategies()) {
    INFO("topology " << topology << ", strategy " << options.to_json_text());
    PlanSettings settings;
    const StepPlan plan = build_plan(model, options, settings);

    // Exactly once per step (replicated: once per holder), with the data in place.
    const auto ns_count = replay_data_flow(plan);
    for (const auto& dp : plan.model.params) {
      if (dp.optimizer != OptimizerKind::muon) continue;
      INFO(dp.name);
      const bool redundant =
          options.name == "replicated" ||
          (options.small_param_threshold > 0 && dp.numel() < options.small_param_threshold);
      if (redundant) {
        int holders = 0;
        for (int r = 0; r < model.mesh.world_size(); ++r)
          holders += dp.layout.holds(model.mesh, r) ? 1 : 0;
        CHECK(ns_count[dp.index] == holders);
      } else {
        CHECK(ns_count[dp.index] == 1);
      }
    }

    // Bytes sent equal bytes received, pair by pair, in every collective instance.
    for (const Op& op : plan.ops) {
      if (!is_collective(op.kind)) continue;
      for (int r : op.ranks.ranks(model.mesh)) {
        const auto sent = bytes_sent(plan, op, r);
        for (int i = 0; i < static_cast<int>(sent.size()); ++i) {
          const int peer = model.mesh.group_member(r, op.group, i);
          const auto received = bytes_received(plan, op, peer);
          const int me = model.mesh.group_index(r, op.group);
          INFO("op " << op.id << " " << op.label << " from " << r << " to " << peer);
          CHECK(sent[i] == received[me]);
        }
      }
    }

    CHECK(replay_progress(plan));

    // Transient memory within seed 000's bound: prefetch+1 full updates in flight (chunks
    // count as chunk_size matrices), plus the pieces of one staged gather; all_to_all also
    // stages one chunk's exchange (a send and a receive buffer of at most a chunk each).
    const int depth = options.name == "all_to_all"   ? options.max_chunks_in_flight - 1
                      : options.name == "sequential" ? 0
                                                     : options.prefetch_count;
    const int unit =
        options.name == "all_to_all" || options.name == "owner_allgather" ? options.chunk_size : 1;
    const int staging = options.name == "all_to_all" ? 2 * unit : 0;
    const std::int64_t bound =
        (static_cast<std::int64_t>(depth) + 1) * unit * max_full_bytes(plan) +
        (1 + staging) * max_full_bytes(plan);
    for (int r = 0; r < model.mesh.world_size(); ++r) {
      INFO("rank " << r);
      CHECK(rank_memory(plan, r).peak_transient_bytes <= bound);
    }
  }
}

}  // namespace

TEST_CASE("every strategy on every topology keeps the step's invariants", "[strategy]") {
  for (const auto& topology : topologies())
    check_step_invariants(topology.name, make_model(topology));
}

TEST_CASE("dense weights sharded over fsdp x ep (torchtitan, Megatron) keep the invariants",
          "[strategy]") {
  // parallel.dense_over_ep: shard, with ep outer and inner to the fsdp dim, under TP, and with an
  // uneven split (3 x 2 ranks over tiny-moe's 64-wide dims).
  ParallelRules shard_dense;
  shard_dense.dense_over_ep = DenseOverEp::shard;
  const std::vector<Topology> cases = {
      {"FSDP 2 x EP 2, dense sharded",
       {{"dp_shard", 2, DimRole::fsdp}, {"ep", 2, DimRole::ep}},
       "tiny-moe"},
      {"EP 2 x FSDP 2, dense sharded",
       {{"ep", 2, DimRole::ep}, {"dp_shard", 2, DimRole::fsdp}},
       "tiny-moe"},
      {"FSDP 3 x EP 2 x TP 2, dense sharded",
       {{"dp_shard", 3, DimRole::fsdp}, {"ep", 2, DimRole::ep}, {"tp", 2, DimRole::tp}},
       "tiny-moe"},
  };
  for (const Topology& t : cases) check_step_invariants(t.name, make_model(t, shard_dense));
}

namespace {

// An execution that prefetches as far as the plan lets it: collectives complete the moment they
// start, compute ops wait in a queue and finish one at a time only when nothing else can move.
// Every gather the deps allow therefore runs before the NS that would free a buffer, so the live
// "full updates" buffers per rank reach the most any execution can hold.
class EagerGathers final : public OpHandler {
 public:
  EagerGathers(const StepPlan& plan) : plan_(plan), live_(plan.mesh().world_size(), 0) {
    peak_.assign(live_.size(), 0);
  }
  Engine* engine = nullptr;
  std::deque<std::pair<int, int>> pending;  // (rank, op)
  std::vector<int> peak_;

  void start_compute(int rank, int op) override { pending.emplace_back(rank, op); }
  void start_collective(const CollectiveInstance& instance) override {
    engine->finish_collective(instance.id);
  }
  void memory(int rank, int op) override {
    const Op& o = plan_.ops[op];
    const std::string& name = plan_.buffers[o.buffer].name;  // a unit's buffer: whole or split
    if (name.rfind("full updates", 0) != 0 && name.rfind("split slices", 0) != 0) return;
    live_[rank] += o.kind == OpKind::alloc ? 1 : -1;
    peak_[rank] = std::max(peak_[rank], live_[rank]);
  }

 private:
  const StepPlan& plan_;
  std::vector<int> live_;
};

// Most "full updates" buffers live at once on each rank in the eager execution above.
std::vector<int> eager_live_units(const StepPlan& plan) {
  const PlanIndex index(plan);
  EagerGathers handler(plan);
  Engine engine(index, handler, index.all_ranks());
  handler.engine = &engine;
  for (int step = 0; step < plan.hyper_period(); ++step) {
    engine.begin_step(step);
    while (!handler.pending.empty()) {
      const auto [rank, op] = handler.pending.front();
      handler.pending.pop_front();
      engine.finish_compute(rank, op);
    }
    REQUIRE(engine.step_done());
  }
  return handler.peak_;
}

}  // namespace

TEST_CASE("the prefetch gate holds at most depth + 1 units per rank in any execution",
          "[strategy]") {
  // Scheduler::start_gather gates unit k of a rank class on the release of unit k - depth - 1.
  // Gated on the class's latest releases instead, an eager execution held depth + 2 units (the
  // plan-order memory of rank_memory never showed it).
  int checked = 0;
  for (const auto& topology : topologies()) {
    const ShardedModel model = make_model(topology);
    for (const auto& options : strategies()) {
      if (options.name == "replicated" || options.name == "sequential") continue;
      const int depth =
          options.name == "all_to_all" ? options.max_chunks_in_flight - 1 : options.prefetch_count;
      // Matrices below small_param_threshold run in a pipeline of their own (replicated NS),
      // with its own depth + 1 units.
      const int pipelines = options.small_param_threshold > 0 ? 2 : 1;
      const StepPlan plan = build_plan(model, options, PlanSettings{});
      const auto peak = eager_live_units(plan);
      INFO("topology " << topology.name << ", strategy " << options.to_json_text());
      for (int r = 0; r < model.mesh.world_size(); ++r) {
        INFO("rank " << r);
        CHECK(peak[r] <= pipelines * (depth + 1));
      }
      checked += *std::max_element(peak.begin(), peak.end()) == depth + 1 ? 1 : 0;
    }
  }
  CHECK(checked > 20);  // the bound is reached, not just respected
}

TEST_CASE("owner without prefetch holds exactly one full update at a time", "[strategy]") {
  const ShardedModel model = make_model(topologies()[1]);  // FSDP over 4 ranks
  StrategyOptions options;
  options.prefetch_count = 0;
  const StepPlan plan = build_plan(model, options, PlanSettings{});
  for (int r = 0; r < model.mesh.world_size(); ++r) {
    std::int64_t largest_owned = 0;
    for (int p : plan.assignment.owned_by(r))
      largest_owned = std::max(largest_owned, plan.model.params[p].numel() * 2);
    CHECK(rank_memory(plan, r).peak_transient_bytes == largest_owned);
  }
}

TEST_CASE("FSDP gather moves (n-1)/n of each matrix to its owner", "[strategy]") {
  const ShardedModel model = make_model(topologies()[1]);  // FSDP over 4 ranks, bf16
  const StepPlan plan = build_plan(model, StrategyOptions{}, PlanSettings{});
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::gather) continue;
    const auto& dp = plan.model.params[op.params[0]];
    const int owner = plan.assignment.owner[dp.index];
    std::int64_t received = 0;
    for (auto b : bytes_received(plan, op, owner)) received += b;
    // tiny-dense matrices have rows divisible by 4: every shard is a quarter.
    CHECK(received == dp.numel() * 2 * 3 / 4);
  }
}

TEST_CASE("plans name unknown strategies and bad options", "[strategy]") {
  const ShardedModel model = make_model(topologies()[1]);
  StrategyOptions o;
  o.name = "magic";
  REQUIRE_THROWS_WITH(build_plan(model, o, PlanSettings{}), Catch::Contains("all_to_all"));
  o = StrategyOptions{};
  o.prefetch_count = -1;
  REQUIRE_THROWS_WITH(build_plan(model, o, PlanSettings{}), Catch::Contains("prefetch_count"));
  o = StrategyOptions{};
  o.assign = "explicit";
  o.explicit_owners = {{"layers.0.attn.q", 0}};
  REQUIRE_THROWS_WITH(build_plan(model, o, PlanSettings{}), Catch::Contains("no owner"));
}

// A replica that receives a result by broadcast gathered nothing, so only a dependency orders its
// own momentum (which writes the update where the result lands) before the broadcast: without it
// the two race on a real executor (found by the MPI executor under level-scheduled sync, where
// momentum waits for the gradient all-reduce).
TEST_CASE("broadcasts of results come after the receiving rank's momentum", "[strategy]") {
  for (const Topology& t : topologies()) {
    const ShardedModel model = make_model(t);
    for (const auto& options : strategies()) {
      const StepPlan plan = build_plan(model, options, PlanSettings{});
      const DeviceMesh& mesh = plan.mesh();
      int momentum = -1;
      for (const Op& op : plan.ops)
        if (op.kind == OpKind::momentum && !op.owned_only) momentum = op.id;
      if (momentum < 0) continue;
      for (int r = 0; r < mesh.world_size(); ++r) {
        // The ops that precede each op on rank r: its deps r takes part in and the earlier op of
        // its stream on r, transitively.
        std::vector<std::set<int>> before(plan.ops.size());
        std::map<int, int> last_on_stream;
        for (const Op& op : plan.ops) {
          if (!op.ranks.contains(mesh, r)) continue;
          std::set<int>& b = before[op.id];
          std::vector<int> direct = op.deps;
          if (auto it = last_on_stream.find(op.stream); it != last_on_stream.end())
            direct.push_back(it->second);
          for (int d : direct) {
            if (!plan.ops[d].ranks.contains(mesh, r)) continue;
            b.insert(d);
            b.insert(before[d].begin(), before[d].end());
          }
          last_on_stream[op.stream] = op.id;
          if (op.kind == OpKind::broadcast && plan.ops[momentum].ranks.contains(mesh, r)) {
            INFO(t.name << ", " << options.to_json_text() << ", rank " << r << ", op " << op.id
                        << " '" << op.label << "'");
            CHECK(b.count(momentum) == 1);
          }
        }
      }
    }
  }
}

TEST_CASE("every rank's summary at once equals each rank's own", "[strategy][summary]") {
  // summarize_ranks computes each collective instance's traffic once for all its members
  // (muonbed plan of 16,384 ranks); summarize_rank, the reference, sums bytes_sent and
  // bytes_received peer by peer. Every topology x every strategy variant and preset.
  int plans = 0;
  for (const auto& topology : topologies()) {
    const ShardedModel model = make_model(topology);
    std::vector<StrategyOptions> variants = strategies();
    for (const std::string& preset : strategy_preset_names())
      variants.push_back(strategy_preset(preset, model.mesh.world_size()));
    for (const StrategyOptions& options : variants) {
      const StepPlan plan = build_plan(model, options, PlanSettings{});
      const std::vector<RankSummary> all = summarize_ranks(plan);
      REQUIRE(static_cast<int>(all.size()) == model.mesh.world_size());
      std::vector<TrainingMemory> training;
      for (int r = 0; r < model.mesh.world_size(); ++r)
        training.push_back(training_memory(plan, r));
      const std::vector<RankSummary> with_training = summarize_ranks(plan, &training);
      std::int64_t moved = 0;
      for (int r = 0; r < model.mesh.world_size(); ++r) {
        INFO(topology.name << " | " << options.preset << " " << options.to_json_text() << " | rank "
                           << r);
        const RankSummary one = summarize_rank(plan, r);
        CHECK(all[r].rank == r);
        CHECK(all[r].matrices_owned == one.matrices_owned);
        CHECK(all[r].ns_flops == one.ns_flops);
        CHECK(all[r].bytes_sent == one.bytes_sent);
        CHECK(all[r].bytes_received == one.bytes_received);
        CHECK(all[r].memory.static_bytes == one.memory.static_bytes);
        CHECK(all[r].memory.peak_transient_bytes == one.memory.peak_transient_bytes);
        CHECK(with_training[r].memory.static_bytes == one.memory.static_bytes);
        CHECK(with_training[r].memory.peak_transient_bytes == one.memory.peak_transient_bytes);
        moved += one.bytes_sent;
      }
      if (model.mesh.world_size() > 1 && options.name != "replicated") CHECK(moved > 0);
      // all_to_all_transfers, summed per pair, is bytes_sent of every member of every instance.
      for (const Op& op : plan.ops) {
        if (op.kind != OpKind::all_to_all) continue;
        for (int r : op.ranks.ranks(model.mesh)) {
          if (model.mesh.group_leader(r, op.group) != r) continue;
          const std::vector<int> members = model.mesh.group_members(r, op.group);
          const int n = static_cast<int>(members.size());
          std::vector<std::vector<std::int64_t>> pairs(n, std::vector<std::int64_t>(n, 0));
          for (const PairBytes& t : all_to_all_transfers(plan, op, members)) {
            CHECK(t.bytes > 0);
            CHECK(t.from != t.to);
            pairs[t.from][t.to] += t.bytes;
          }
          for (int i = 0; i < n; ++i) {
            INFO(topology.name << " | " << options.to_json_text() << " | op " << op.id
                               << ", member " << i);
            CHECK(pairs[i] == bytes_sent(plan, op, members[i]));
          }
        }
      }
      ++plans;
    }
  }
  CHECK(plans == static_cast<int>(topologies().size() *
                                  (strategies().size() + strategy_preset_names().size())));
}
