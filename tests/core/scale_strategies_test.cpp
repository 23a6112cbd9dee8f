// The levers of issue 13 on their own plans: communication lanes, largest-NS-first order, one
// shape per chunk, the anchor presets, and the inter-node bytes of muonbed's preset against
// Keller Jordan's round-robin one, counted here pair by pair from the plan's byte rules. The
// invariants of every lever (data flow, deadlock freedom, byte symmetry, memory bound) are in the
// invariant matrix (tests/common/strategy_matrix.hpp, strategy_test and tests/backends).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "core/model/model.hpp"
#include "core/model/parallelize.hpp"
#include "core/plan/assignment.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/strategy.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

namespace {

double ns_flops_of(const StepPlan& plan, int p) {
  const auto& dp = plan.model.params[p];
  return newton_schulz_flops(dp.rows(), dp.cols(), 5, dp.batch());
}

// Bytes that cross a node boundary in one step, under plan.hpp's per-peer rules (every collective
// as its direct transfers: the volume, whatever algorithm a backend picks).
double inter_node_bytes(const StepPlan& plan) {
  const DeviceMesh& mesh = plan.mesh();
  double total = 0;
  for (const Op& op : plan.ops) {
    if (!is_collective(op.kind)) continue;
    for (int r : op.ranks.ranks(mesh)) {
      const auto sent = bytes_sent(plan, op, r);
      for (int i = 0; i < static_cast<int>(sent.size()); ++i)
        if (mesh.node_of(mesh.group_member(r, op.group, i)) != mesh.node_of(r))
          total += static_cast<double>(sent[i]);
    }
  }
  return total;
}

ShardedModel llama_fsdp_tp(int nodes) {
  DeviceMesh mesh({{"dp_shard", nodes, DimRole::fsdp}, {"tp", 8, DimRole::tp}}, 8);
  return parallelize(*find_preset("llama-70b"), mesh, ParallelRules{});
}

}  // namespace

TEST_CASE("communication lanes: each owner's units on one lane, owners spread over the lanes",
          "[strategy][lanes]") {
  const ShardedModel model = testing::make_model(testing::topologies()[1]);  // FSDP over 4
  for (int lanes : {1, 2, 3, 8}) {
    INFO(lanes << " lanes");
    StrategyOptions o;
    o.comm_lanes = lanes;
    const StepPlan plan = build_plan(model, o, PlanSettings{});
    std::map<int, std::set<int>> gather_streams;  // owner -> streams of its gathers
    std::set<int> used;
    for (const Op& op : plan.ops) {
      if (op.kind != OpKind::gather && op.kind != OpKind::scatter) continue;
      const std::string& name = plan.streams[op.stream];
      CHECK((name.rfind("comm", 0) == 0));
      if (op.kind == OpKind::gather) {
        gather_streams[plan.assignment.owner[op.params[0]]].insert(op.stream);
        used.insert(op.stream);
      }
    }
    for (const auto& [owner, streams] : gather_streams) CHECK(streams.size() == 1);
    const int owners = static_cast<int>(gather_streams.size());
    CHECK(static_cast<int>(used.size()) == std::min(lanes, owners));
    // comm + comm_scatter per lane, and compute.
    CHECK(static_cast<int>(plan.streams.size()) == 1 + 2 * lanes);
  }
}

TEST_CASE("lanes change only the streams: the same ops and the same bytes", "[strategy][lanes]") {
  // llama-70B on 4 nodes: one stream queues all 560 gathers; 8 lanes let 8 owners' run at once.
  const ShardedModel model = llama_fsdp_tp(4);
  StrategyOptions one;
  StrategyOptions eight = one;
  eight.comm_lanes = 8;
  const StepPlan a = build_plan(model, one, PlanSettings{});
  const StepPlan b = build_plan(model, eight, PlanSettings{});
  // Same work and the same bytes; only the streams differ.
  CHECK(a.ops.size() == b.ops.size());
  CHECK(inter_node_bytes(a) == inter_node_bytes(b));
}

TEST_CASE("order lpt emits the largest Newton-Schulz first on every owner", "[strategy][lpt]") {
  const ShardedModel model = llama_fsdp_tp(2);
  StrategyOptions o;
  o.order = "lpt";
  const StepPlan plan = build_plan(model, o, PlanSettings{});
  std::map<int, double> last;  // owner -> flops of its previous NS
  int first_gathered = -1;
  double heaviest = 0;
  for (int p : plan.model.muon_params()) heaviest = std::max(heaviest, ns_flops_of(plan, p));
  for (const Op& op : plan.ops) {
    if (op.kind == OpKind::gather && first_gathered < 0) first_gathered = op.params[0];
    if (op.kind != OpKind::newton_schulz) continue;
    const int owner = plan.assignment.owner[op.params[0]];
    const double f = ns_flops_of(plan, op.params[0]);
    if (last.count(owner)) CHECK(f <= last[owner]);
    last[owner] = f;
  }
  REQUIRE(first_gathered >= 0);
  CHECK(ns_flops_of(plan, first_gathered) == heaviest);
  o.order = "fastest";
  CHECK_THROWS_WITH(build_plan(model, o, PlanSettings{}), Catch::Contains("plan or lpt"));
}

TEST_CASE("chunk_by_shape: every chunk holds matrices of one shape", "[strategy][presets]") {
  const ShardedModel model = llama_fsdp_tp(2);
  StrategyOptions o = strategy_preset("dion", model.mesh.world_size());
  const StepPlan plan = build_plan(model, o, PlanSettings{});
  int chunks = 0;
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::all_to_all || op.params.empty()) continue;
    ++chunks;
    std::set<std::vector<std::int64_t>> shapes;
    for (int p : op.params) shapes.insert(plan.model.params[p].shape);
    CHECK(shapes.size() == 1);
    CHECK(static_cast<int>(op.params.size()) <= model.mesh.world_size());
  }
  CHECK(chunks > 0);
}

TEST_CASE("anchor presets build valid plans on every topology of the matrix",
          "[strategy][presets]") {
  for (const auto& topology : testing::topologies()) {
    const ShardedModel model = testing::make_model(topology);
    for (const auto& name : strategy_preset_names()) {
      INFO(topology.name << ", preset " << name);
      const StrategyOptions o = strategy_preset(name, model.mesh.world_size());
      CHECK(o.preset == name);
      CHECK_NOTHROW(build_plan(model, o, PlanSettings{}));
    }
  }
  CHECK_THROWS_WITH(strategy_preset("adam", 8), Catch::Contains("keller_jordan"));
  // Keller Jordan: the i-th matrix to rank i mod world (all ranks hold every matrix here).
  const ShardedModel model = testing::make_model(testing::topologies()[0]);  // DDP over 4
  const StepPlan kj = build_plan(model, strategy_preset("keller_jordan", 4), PlanSettings{});
  const auto muon = model.muon_params();
  for (std::size_t i = 0; i < muon.size(); ++i)
    CHECK(kj.assignment.owner[muon[i]] == static_cast<int>(i % 4));
}

TEST_CASE("muonbed's preset moves at least 30% fewer inter-node bytes than round-robin's",
          "[strategy][presets][topology]") {
  // llama-70B, FSDP x TP on 4 nodes of 8. Keller Jordan's round-robin owners all-gather every
  // full update to every rank; muonbed's topology-placed owners gather the pieces and scatter
  // them back. (Between owner placements alone the inter-node volume of gather + scatter is fixed
  // by the layout on FSDP x TP: each node's share crosses once each way wherever the owner is;
  // placement decides which links carry it at the same time, checked in placement_test.)
  const ShardedModel model = llama_fsdp_tp(4);
  const StepPlan kj = build_plan(model, strategy_preset("keller_jordan", 32), PlanSettings{});
  const StepPlan best = build_plan(model, strategy_preset("muonbed", 32), PlanSettings{});
  const double kj_bytes = inter_node_bytes(kj);
  const double best_bytes = inter_node_bytes(best);
  INFO("keller_jordan " << kj_bytes << " B, muonbed " << best_bytes << " B");
  CHECK(best_bytes <= 0.7 * kj_bytes);
  // Placement alone: topology vs flop_balanced vs round_robin owners, same owner schedule.
  StrategyOptions o = strategy_preset("muonbed", 32);
  o.assign = "round_robin";
  CHECK(inter_node_bytes(build_plan(model, o, PlanSettings{})) == best_bytes);
}

TEST_CASE("chunk_sizing ns_cost: chunk k holds every owner's k-th largest matrix",
          "[strategy][chunks]") {
  const ShardedModel model = llama_fsdp_tp(2);
  StrategyOptions o;
  o.name = "all_to_all";
  o.order = "lpt";
  o.chunk_sizing = "ns_cost";
  const StepPlan plan = build_plan(model, o, PlanSettings{});
  std::map<int, std::vector<double>> per_owner;  // owner -> its matrices' NS work, chunk order
  std::multiset<int> seen;
  int chunks = 0;
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::all_to_all || op.label.find("to owners") == std::string::npos) continue;
    ++chunks;
    std::set<int> owners;
    for (int p : op.params) {
      const int owner = plan.assignment.owner[p];
      CHECK(owners.insert(owner).second);  // at most one matrix per owner in a chunk
      per_owner[owner].push_back(ns_flops_of(plan, p));
      seen.insert(p);
    }
  }
  // Every Muon matrix in exactly one chunk; each owner's matrices largest first, one per chunk
  // from the first, so the chunks are as many as the busiest owner has matrices.
  const auto muon = plan.model.muon_params();
  CHECK(seen == std::multiset<int>(muon.begin(), muon.end()));
  std::size_t most = 0;
  for (const auto& [owner, work] : per_owner) {
    INFO("owner " << owner);
    CHECK(std::is_sorted(work.rbegin(), work.rend()));
    most = std::max(most, work.size());
  }
  CHECK(static_cast<std::size_t>(chunks) == most);
  o.chunk_sizing = "equal";
  CHECK_THROWS_WITH(build_plan(model, o, PlanSettings{}), Catch::Contains("count or ns_cost"));
}

TEST_CASE("split NS: the largest matrices split over the TP group once ranks outnumber them",
          "[strategy][split_ns]") {
  // llama-70B FSDP x TP 8: 3x the balanced share of NS work per rank falls below one 8192 x 28672
  // MLP matrix between 256 and 1,024 GPUs; from there the muonbed preset splits exactly the
  // matrices above it, over their node's TP group (8 members, whole along the short dim 8192
  // once dp_shard is gathered), and nothing below it.
  for (int nodes : {4, 128}) {
    const ShardedModel model = llama_fsdp_tp(nodes);
    const int world = nodes * 8;
    const StepPlan plan = build_plan(model, strategy_preset("muonbed", world), PlanSettings{});
    double total = 0;
    for (int p : model.muon_params()) total += ns_flops_of(plan, p);
    // The preset's threshold (3x the share: split only where TP-8 groups pack better).
    const double share = strategy_preset("muonbed", world).split_ns.threshold * total / world;
    std::set<int> split;
    for (const Op& op : plan.ops) {
      if (op.kind != OpKind::split_newton_schulz) continue;
      CHECK(op.group == DimSet::of({1}));  // tp
      CHECK(op.gathered == DimSet::of({0}));
      for (int p : op.params) split.insert(p);
    }
    INFO(world << " GPUs, share " << share << " FLOP, " << split.size() << " split");
    for (int p : model.muon_params()) {
      INFO(model.params[p].name);
      CHECK((split.count(p) == 1) == (ns_flops_of(plan, p) > share));
    }
    if (nodes == 4) CHECK(split.empty());
    if (nodes == 128) CHECK(split.size() == 240);  // the 3 MLP matrices of 80 layers
  }
}

TEST_CASE("split NS: options are checked, and only staged gathers split", "[strategy][split_ns]") {
  const ShardedModel model = testing::make_model(testing::topologies()[4]);  // FSDP + TP
  StrategyOptions o;
  o.split_ns.enabled = true;
  o.split_ns.threshold = 0;
  o.name = "all_to_all";
  CHECK_THROWS_WITH(build_plan(model, o, PlanSettings{}),
                    Catch::Contains("split_ns") && Catch::Contains("(sequential, owner)"));
  o.name = "owner";
  o.split_ns.max_members = 1;
  CHECK_THROWS_WITH(build_plan(model, o, PlanSettings{}), Catch::Contains("max_members"));
  // Groups stay within max_members, and a matrix that cannot split keeps its owner's NS.
  o.split_ns.max_members = 2;
  const StepPlan plan = build_plan(model, o, PlanSettings{});
  int split = 0, whole = 0;
  for (const Op& op : plan.ops) {
    if (op.kind == OpKind::split_newton_schulz) {
      ++split;
      CHECK(plan.mesh().group_size(op.group) <= 2);
    }
    whole += op.kind == OpKind::newton_schulz ? 1 : 0;
  }
  CHECK(split > 0);
  CHECK(whole > 0);  // e.g. attn.k [kv, hidden]: TP shards its short rows
}
