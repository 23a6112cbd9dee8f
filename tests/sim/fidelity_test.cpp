// sim.fidelity auto's rule (sim/src/fidelity.hpp) against the simulator itself: over a matrix of
// meshes, strategies, presets and clusters, every plan is simulated at step fidelity (the
// reference) and at flow fidelity, and the rule may pick flow only where flow's step time is
// within 1 % of step's. Each exclusion of the rule must also be needed: some case of the matrix
// in each excluded class differs by more than 1 %. The cases, worst first, are printed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/experiment/experiment.hpp"
#include "core/plan/strategy.hpp"
#include "muonbed/config.hpp"
#include "sim/simulate.hpp"
#include "sim/src/collectives.hpp"
#include "sim/src/fidelity.hpp"
#include "sim/src/harness.hpp"
#include "tests/common/strategy_matrix.hpp"
#include "tests/sim/contended_clusters.hpp"

using namespace muonbed;

namespace {

constexpr double kProven = 0.01;  // issue 23: flow within 1 % of step

struct Case {
  std::string where;
  StepPlan plan;
  ClusterSpec cluster;
  SimOptions options;  // auto, trace off; the flow lowering's knobs as the case needs
};

struct Outcome {
  std::string where;
  double step_s = 0, flow_s = 0;
  sim::FidelityChoice choice;
  sim::FidelityCase facts;
  bool uneven_ring = false;  // a ring the lowering pipelines at both fidelities
  double gap() const { return flow_s / step_s - 1; }
};

std::string strategy_text(const StrategyOptions& o) {
  return (o.preset.empty() ? "" : "preset " + o.preset + " ") + o.to_json_text();
}

// The invariant matrix (9 topologies of 4-16 ranks) with every strategy variant and preset on the
// contended clusters: nodes of 2 GPUs behind one NIC, PCIe nodes (with and without a host
// bridge), oversubscribed leaves.
std::vector<Case> small_cases() {
  std::vector<Case> out;
  for (const testing::NamedCluster& cluster : testing::contended_clusters())
    for (const auto& topology : testing::topologies()) {
      const ShardedModel model = testing::make_model(topology);
      std::vector<StrategyOptions> variants = testing::strategies();
      for (const std::string& preset : strategy_preset_names())
        variants.push_back(strategy_preset(preset, model.mesh.world_size()));
      for (const StrategyOptions& o : variants)
        out.push_back({cluster.name + " | " + topology.name + " | " + strategy_text(o),
                       build_plan(model, o, PlanSettings{}), cluster.spec, SimOptions{}});
    }
  return out;
}

Case dgx_case(const std::string& mesh, const std::string& model, const std::string& what,
              const std::string& strategy) {
  const std::string yaml = "name: fidelity\ncluster: dgx-h100\nmesh: {dims: " + mesh +
                           "}\nmodel: {dense: " + model + "}\nstrategy: " + strategy + "\n";
  const std::vector<Experiment> points = parse_experiment(yaml, "fidelity_test.yaml");
  REQUIRE(points.size() == 1);
  return {"dgx-h100 | " + mesh + " | " + what + " | " + strategy, plan_experiment(points[0]),
          points[0].cluster, SimOptions{}};
}

// A llama-shaped model of 2 layers (hidden 2048), and llama-70B's shapes in 2 layers, whose
// owner_allgather all-gathers of whole matrices fill the NICs as on the shipped experiments.
const char* const kSmallModel =
    "{hidden: 2048, layers: 2, heads: 16, kv_heads: 8, ffn: 8192, vocab: 8192}";
const char* const kLargeModel =
    "{hidden: 8192, layers: 10, heads: 64, kv_heads: 8, ffn: 28672, vocab: 8192}";

// DGX H100 nodes (8 GPUs, NVSwitch, rail NICs, fat tree) at 32-64 ranks: every strategy and
// preset on the small model over FSDP x TP, FSDP over nodes and HSDP; the presets on the large
// model over FSDP x TP.
std::vector<Case> dgx_cases() {
  std::vector<Case> out;
  std::vector<std::string> presets;
  for (const std::string& preset : strategy_preset_names())
    presets.push_back("{preset: " + preset + "}");
  std::vector<std::string> strategies = {"{name: sequential}", "{name: owner}",
                                         "{name: all_to_all}", "{name: owner_allgather}"};
  strategies.insert(strategies.end(), presets.begin(), presets.end());
  for (const char* mesh :
       {"[{name: dp_shard, size: 8}, {name: tp, size: 8}]", "[{name: dp_shard, size: 32}]",
        "[{name: dp_replicate, size: 2}, {name: dp_shard, size: 16}]"})
    for (const std::string& strategy : strategies)
      out.push_back(dgx_case(mesh, kSmallModel, "hidden 2048", strategy));
  // Gathers over 16 and 32 nodes, pooled at flow fidelity, on muonbed's 128 lanes (and on one).
  for (const char* mesh : {"[{name: dp_shard, size: 16}, {name: tp, size: 8}]",
                           "[{name: dp_shard, size: 32}, {name: tp, size: 4}]"})
    for (const char* strategy : {"{preset: muonbed}", "{preset: seeds}"})
      out.push_back(dgx_case(mesh, kSmallModel, "hidden 2048", strategy));
  for (const char* strategy : {"{name: owner_allgather}", "{preset: keller_jordan}"})
    out.push_back(dgx_case("[{name: dp_shard, size: 8}, {name: tp, size: 8}]", kLargeModel,
                           "hidden 8192", strategy));
  return out;
}

// Every point of the shipped experiments of up to 32 GPUs that auto simulates (one node to four
// DGX H100 nodes): the cases users run first. (The larger ones, 64-256 GPUs, agree as well:
// experiments/BENCHMARKS.md, "Fidelity auto"; they take minutes at step fidelity here.)
std::vector<Case> shipped_cases() {
  std::vector<Case> out;
  for (const char* file :
       {"quickstart", "ddp", "cp", "example_strategy", "hsdp", "pp", "fsdp_tp", "hf_qwen3_moe"})
    for (const Experiment& point :
         load_experiment(std::string(MUONBED_SOURCE_DIR) + "/experiments/" + file + ".yaml")) {
      REQUIRE(point.sim_fidelity == "auto");
      out.push_back({std::string("experiments/") + file + ".yaml | " + point.point_label,
                     plan_experiment(point), point.cluster, SimOptions{}});
    }
  return out;
}

// Whether the plan has a ring with uneven pieces (ring_needs_pipelining): no class of the rule,
// since both fidelities lower it alike, so the matrix must hold such plans that auto runs at flow.
bool has_uneven_ring(const StepPlan& plan) {
  const DeviceMesh& mesh = plan.mesh();
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::all_gather && op.kind != OpKind::reduce_scatter) continue;
    if (mesh.group_size(op.group) < 2) continue;
    std::vector<double> pieces;
    for (int member : mesh.group_members(op.ranks.ranks(mesh).front(), op.group))
      pieces.push_back(static_cast<double>(piece_bytes(plan, op, member)));
    if (sim::ring_needs_pipelining(op.kind, pieces)) return true;
  }
  return false;
}

Outcome simulate_both(const Case& c) {
  SimOptions step = c.options;
  step.trace_max_ranks = 0;
  step.fidelity = "step";
  SimOptions flow = step;
  flow.fidelity = "flow";
  SimOptions automatic = step;
  automatic.fidelity = "auto";
  // The class of plans the rule proves, whatever the cost: above auto_step_max_cost an
  // unproven plan runs at flow with a warning, which is no claim of agreement (a later test case).
  automatic.auto_step_max_cost = std::numeric_limits<double>::infinity();
  Outcome o;
  o.where = c.where;
  o.facts = sim::fidelity_case(c.plan, c.cluster, automatic);
  o.choice = sim::choose_fidelity(o.facts, automatic);
  {  // what the backend runs: the same choice, step's cost estimated only where it is read
    const sim::FidelityChoice picked = sim::pick_fidelity(c.plan, c.cluster, automatic);
    CHECK(picked.fidelity == o.choice.fidelity);
    CHECK(picked.reason == o.choice.reason);
    CHECK(picked.per_member_rooted == o.choice.per_member_rooted);
    CHECK(picked.keep_all_rounds == o.choice.keep_all_rounds);
  }
  o.uneven_ring = has_uneven_ring(c.plan);
  o.step_s = simulate(c.plan, c.cluster, step).record.step.average_s;
  // Flow as auto runs it (per-member gathers where it says so).
  o.flow_s = simulate(c.plan, c.cluster, sim::options_for(o.choice, flow)).record.step.average_s;
  return o;
}

}  // namespace

TEST_CASE("sim.fidelity auto picks flow only where flow agrees with step within 1 %",
          "[sim][fidelity][auto]") {
  std::vector<Case> cases = small_cases();
  for (Case& c : dgx_cases()) cases.push_back(std::move(c));
  for (Case& c : shipped_cases()) cases.push_back(std::move(c));
  std::vector<Outcome> outcomes;
  for (const Case& c : cases) outcomes.push_back(simulate_both(c));

  int picked_flow = 0, agree_but_step = 0, uneven_flow = 0, per_member_flow = 0;
  double uneven_worst = 0, per_member_worst = 0;
  // Per excluded class: cases in it, and how far the worst of them is off.
  std::map<std::string, std::pair<int, double>> excluded;
  for (const Outcome& o : outcomes) {
    INFO(o.where << ": step " << o.step_s << " s, flow " << o.flow_s << " s (" << o.gap() * 100
                 << " %); auto picks " << o.choice.fidelity << ": " << o.choice.reason);
    REQUIRE(o.step_s > 0);
    REQUIRE(o.flow_s > 0);
    REQUIRE(o.choice.proven);  // step is allowed at every size here (simulate_both)
    if (o.choice.fidelity == "flow") {
      ++picked_flow;
      CHECK(std::abs(o.gap()) <= kProven);
      if (o.uneven_ring) {
        ++uneven_flow;
        uneven_worst = std::max(uneven_worst, std::abs(o.gap()));
      }
      if (o.choice.per_member_rooted) {
        ++per_member_flow;
        per_member_worst = std::max(per_member_worst, std::abs(o.gap()));
      }
    } else if (std::abs(o.gap()) <= kProven) {
      ++agree_but_step;
    }
    // A class's worst case counts only where that class alone keeps the plan from flow: a
    // class is needed only if flow misses step by more than 1 % on some plan it alone excludes.
    REQUIRE(o.facts.largest_merged_all_to_all == 0);  // at most 64 ranks: see the next test
    std::vector<std::string> classes;
    if (o.facts.pcie_nodes) classes.push_back("PCIe nodes");
    for (const std::string& cls : classes) {
      auto& [count, worst] = excluded[cls];
      ++count;
      if (classes.size() == 1) worst = std::max(worst, std::abs(o.gap()));
    }
  }
  std::sort(outcomes.begin(), outcomes.end(), [](const Outcome& a, const Outcome& b) {
    return std::abs(a.gap()) > std::abs(b.gap());
  });
  std::ostringstream report;
  report << outcomes.size() << " plans at step and flow fidelity; auto picks flow for "
         << picked_flow << " (all within 1 %), step for " << outcomes.size() - picked_flow << " ("
         << agree_but_step << " of them within 1 % all the same)\n";
  report << "  of the flow picks, " << uneven_flow << " have uneven rings, worst |flow/step - 1| "
         << std::fixed << std::setprecision(2) << uneven_worst * 100 << " %; " << per_member_flow
         << " run gathers over many nodes on several lanes per member, worst "
         << per_member_worst * 100 << " %\n";
  for (const auto& [cls, stats] : excluded)
    report << "  excluded: " << cls << ": " << stats.first
           << " cases, worst |flow/step - 1| where it is the only exclusion " << std::fixed
           << std::setprecision(1) << stats.second * 100 << " %\n";
  report << "the twelve furthest apart (flow / step - 1, auto's pick):\n";
  for (std::size_t i = 0; i < outcomes.size() && i < 12; ++i)
    report << "  " << std::showpos << std::fixed << std::setprecision(2) << outcomes[i].gap() * 100
           << std::noshowpos << " %  " << outcomes[i].choice.fidelity << "  " << outcomes[i].where
           << "\n";
  std::cout << report.str();
  // The rule is not vacuous: it picks flow for the NVLink cases, and the classes it excludes
  // hold cases where flow misses step by more than 1 % (merged all-to-all rounds: the next test;
  // pooled gathers on lanes run per member here, at most 128 GPUs: sim/src/fidelity.hpp).
  CHECK(picked_flow > 300);
  CHECK(uneven_flow > 20);      // owner_allgather and keller_jordan on NVLink clusters
  CHECK(per_member_flow >= 2);  // muonbed's preset over 16 and 32 DGX nodes
  for (const char* cls : {"PCIe nodes"}) {
    INFO(cls);
    REQUIRE(excluded.count(cls) == 1);
    CHECK(excluded[cls].second > kProven);
  }
}

TEST_CASE("merged all-to-all rounds miss step fidelity by more than 1 %", "[sim][fidelity][auto]") {
  // The third class the rule excludes. Groups of more than 257 members (the default budget) are
  // too large to simulate here at step fidelity, so the budget is lowered to 64 rounds: a
  // bandwidth-bound uniform exchange of 128 MB per member over 96 and 160 members of 8-GPU nodes
  // in a fat tree (4 nodes per leaf), as experiments/BENCHMARKS.md measured (0.87 and 1.38).
  ClusterSpec c = testing::cluster_file("dgx-h100");
  c.nodes = 0;
  c.network.levels = 2;
  c.network.nodes_per_leaf = 4;
  c.launch_overhead = {};
  sim::LoweringOptions step, merged;
  merged.step_fidelity = false;
  merged.a2a_rounds = 64;
  merged.a2a_transfers = 0;
  double worst = 0;
  for (const int n : {96, 160}) {
    REQUIRE(sim::all_to_all_rounds(n, merged) < n - 1);
    sim::CollectiveSpec s;
    s.kind = OpKind::all_to_all;
    for (int i = 0; i < n; ++i) s.members.push_back(i);
    s.pieces.assign(n, 128e6 / n);
    s.a2a.assign(n, std::vector<double>(n, 128e6 / n));
    const double t_step = sim::time_collectives(c, n, 8, {s}, step).times.at(0);
    const double t_flow = sim::time_collectives(c, n, 8, {s}, merged).times.at(0);
    INFO(n << " members: step " << t_step << " s, flow with merged rounds " << t_flow << " s");
    CHECK(t_step > 0);
    worst = std::max(worst, std::abs(t_flow / t_step - 1));
  }
  CHECK(worst > kProven);
}

// The rounds the flow lowering keeps for an all-to-all of `members` under `options`.
struct LoweringOptionsProbe {
  int rounds(const SimOptions& options, int members) const {
    sim::LoweringOptions lowering;
    lowering.step_fidelity = false;
    lowering.a2a_rounds = options.flow_all_to_all_rounds;
    lowering.a2a_transfers = options.flow_all_to_all_transfers;
    return sim::all_to_all_rounds(members, lowering);
  }
};

TEST_CASE("sim.fidelity auto's rule on the cases it names", "[sim][fidelity][auto]") {
  SimOptions automatic;
  sim::FidelityCase plain;
  plain.ranks = 1024;
  CHECK(sim::choose_fidelity(plain, automatic).fidelity == "flow");
  CHECK(sim::choose_fidelity(plain, automatic).proven);
  CHECK_FALSE(sim::choose_fidelity(plain, automatic).per_member_rooted);
  // Pooled gathers on several lanes: per-member flows up to kPerMemberFlowMaxRanks, proven;
  // pooled above, unproven (step is out of reach there).
  sim::FidelityCase pooled = plain;
  pooled.pooled_on_lanes = true;
  pooled.step_cost = 1e12;
  pooled.ranks = sim::kPerMemberFlowMaxRanks;
  const sim::FidelityChoice per_member = sim::choose_fidelity(pooled, automatic);
  CHECK(per_member.fidelity == "flow");
  CHECK(per_member.proven);
  CHECK(per_member.per_member_rooted);
  const SimOptions lifted = sim::options_for(per_member, automatic);
  CHECK(lifted.flow_pooled_members > 1 << 30);
  CHECK(lifted.flow_rooted_bundles > 1 << 30);
  pooled.ranks = sim::kPerMemberFlowMaxRanks + 1;
  const sim::FidelityChoice pooled_flow = sim::choose_fidelity(pooled, automatic);
  CHECK(pooled_flow.fidelity == "flow");
  CHECK_FALSE(pooled_flow.proven);
  CHECK_FALSE(pooled_flow.per_member_rooted);
  CHECK(sim::options_for(pooled_flow, automatic).flow_pooled_members ==
        automatic.flow_pooled_members);
  // All-to-alls whose rounds flow would merge: every round kept up to kAllRoundsMaxRanks,
  // proven; merged above, unproven.
  sim::FidelityCase merged = plain;
  merged.largest_merged_all_to_all = sim::kAllRoundsMaxRanks;
  merged.ranks = sim::kAllRoundsMaxRanks;
  merged.step_cost = 1e12;
  const sim::FidelityChoice kept = sim::choose_fidelity(merged, automatic);
  CHECK(kept.fidelity == "flow");
  CHECK(kept.proven);
  CHECK(kept.keep_all_rounds);
  LoweringOptionsProbe probe;
  CHECK(probe.rounds(sim::options_for(kept, automatic), sim::kAllRoundsMaxRanks) ==
        sim::kAllRoundsMaxRanks - 1);
  CHECK(probe.rounds(automatic, sim::kAllRoundsMaxRanks) < sim::kAllRoundsMaxRanks - 1);
  merged.ranks = 2 * sim::kAllRoundsMaxRanks;
  merged.largest_merged_all_to_all = merged.ranks;
  const sim::FidelityChoice merging = sim::choose_fidelity(merged, automatic);
  CHECK(merging.fidelity == "flow");
  CHECK_FALSE(merging.proven);
  CHECK_FALSE(merging.keep_all_rounds);
  sim::FidelityCase pcie = plain;
  pcie.pcie_nodes = true;
  pcie.step_cost = automatic.auto_step_max_cost;
  const sim::FidelityChoice within = sim::choose_fidelity(pcie, automatic);
  CHECK(within.fidelity == "step");
  CHECK(within.proven);
  // above the budget: flow, said to be unproven, with the estimate and the budget in the reason
  pcie.step_cost = 2 * automatic.auto_step_max_cost;
  const sim::FidelityChoice above = sim::choose_fidelity(pcie, automatic);
  CHECK(above.fidelity == "flow");
  CHECK_FALSE(above.proven);
  CHECK(above.reason.find("PCIe") != std::string::npos);
  CHECK(above.reason.find("budget") != std::string::npos);
  // Above the ranks step fidelity accepts at all, flow however cheap step would be.
  pcie.step_cost = 1;
  pcie.ranks = kMaxStepFidelityRanks + 1;
  CHECK(sim::choose_fidelity(pcie, automatic).fidelity == "flow");
  CHECK_FALSE(sim::choose_fidelity(pcie, automatic).proven);
  // Explicit fidelities are kept whatever the plan.
  SimOptions step;
  step.fidelity = "step";
  CHECK(sim::choose_fidelity(pcie, step).fidelity == "step");
}

TEST_CASE("the rule's facts come from the plan", "[sim][fidelity][auto]") {
  // The default flow budget keeps every all-to-all round of groups up to 257 members.
  for (const int n : {256, 512}) {
    const std::vector<Experiment> points = parse_experiment(
        "name: f\ncluster: dgx-h100\nmesh: {dims: {dp_shard: " + std::to_string(n) +
            "}}\nmodel: {preset: tiny-dense}\nstrategy: {name: all_to_all}\n",
        "f.yaml");
    const sim::FidelityCase facts =
        sim::fidelity_case(plan_experiment(points[0]), points[0].cluster, SimOptions{});
    CHECK(facts.ranks == n);
    CHECK(facts.largest_merged_all_to_all == (n > 257 ? n : 0));
    CHECK_FALSE(facts.pcie_nodes);
  }
  std::vector<Experiment> points = parse_experiment(
      "name: f\ncluster: dgx-h100\nmesh: {dims: {dp_shard: 8}}\nmodel: {preset: tiny-dense}\n"
      "strategy: {name: owner_allgather}\n",
      "f.yaml");
  // Gathers over 16 nodes (15 members off the root's node: pooled) on 128 lanes, or on one.
  for (const char* preset : {"muonbed", "seeds"}) {
    const std::vector<Experiment> lanes = parse_experiment(
        std::string("name: f\ncluster: dgx-h100\nmesh: {dims: {dp_shard: 16, tp: 8}}\nmodel: ") +
            "{preset: tiny-dense}\nstrategy: {preset: " + preset + "}\n",
        "f.yaml");
    INFO(preset);
    CHECK(sim::fidelity_case(plan_experiment(lanes[0]), lanes[0].cluster, SimOptions{})
              .pooled_on_lanes == (std::string(preset) == "muonbed"));
  }
  ClusterSpec pcie = testing::cluster_file("a100-pcie-4x");
  pcie.nodes = 0;
  CHECK(sim::fidelity_case(plan_experiment(points[0]), pcie, SimOptions{}).pcie_nodes);
}

TEST_CASE("step's cost estimate counts the transfers step fidelity posts",
          "[sim][fidelity][auto]") {
  // auto's budget is in these transfers (sim/src/fidelity.hpp): the estimate from the plan must
  // be what the simulator then posts to SimGrid at step fidelity (SimulationStats), on rings
  // (even and uneven pieces), all-to-alls, pooled gathers and broadcasts over two nodes.
  for (const char* strategy : {"{name: owner_allgather}", "{name: all_to_all}", "{preset: muonbed}",
                               "{preset: keller_jordan}", "{preset: dion}", "{name: replicated}"}) {
    const std::vector<Experiment> points = parse_experiment(
        std::string("name: f\ncluster: dgx-h100\nmesh: {dims: {dp_shard: 16}}\nmodel: ") +
            "{preset: tiny-dense}\nstrategy: " + strategy + "\n",
        "f.yaml");
    const StepPlan plan = plan_experiment(points[0]);
    SimOptions step;
    step.fidelity = "step";
    step.trace_max_ranks = 0;
    const sim::FidelityCase facts = sim::fidelity_case(plan, points[0].cluster, step);
    const std::int64_t posted = simulate(plan, points[0].cluster, step).stats.simgrid_transfers;
    INFO(strategy << ": estimate " << facts.step_transfers << ", posted " << posted);
    CHECK(posted > 0);
    CHECK(facts.step_transfers == static_cast<double>(posted));
  }
}
