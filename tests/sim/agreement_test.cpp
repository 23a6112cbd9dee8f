// The analytic model against the simulator (flow fidelity) where links are shared: every topology
// and strategy variant of the invariant matrix and the five anchor presets, on clusters built so
// that concurrent collectives contend (fewer NICs than GPUs, a PCIe host bridge, oversubscribed
// leaves, nodes of two GPUs so every topology spans nodes). Issue 22's target: the analytic step
// within 10 % of the simulated one everywhere (the simulator's step fidelity, and its flow
// fidelity wherever auto's rule shows flow within 1 % of step), and no step below the lower bound
// (core/engine/bound.hpp). The ratios are printed, worst first, so a drift shows before it fails.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/cluster.hpp"
#include "core/engine/bound.hpp"
#include "core/engine/cost_model.hpp"
#include "core/plan/strategy.hpp"
#include "core/results/collective_bench.hpp"
#include "muonbed/config.hpp"
#include "sim/simulate.hpp"
#include "sim/src/fidelity.hpp"
#include "tests/common/collective_bench_fixtures.hpp"
#include "tests/common/strategy_matrix.hpp"
#include "tests/sim/contended_clusters.hpp"

using namespace muonbed;

using testing::cluster_file;
using testing::contended_clusters;
using testing::NamedCluster;

namespace {

constexpr double kAgreement = 0.10;
// Where the analytic model stays coarser it must err on the slow side: above the simulator by
// at most this, each such case listed (issue 22: "errs on the slow side and says so").
constexpr double kSlowSide = 0.15;

// Within 10 % either way, or slower by at most kSlowSide.
bool agrees(double analytic, double sim) {
  const double r = analytic / sim - 1;
  return r >= -kAgreement && r <= kSlowSide;
}

struct Row {
  double ratio = 1;
  std::string where;
};

}  // namespace

TEST_CASE("the analytic step agrees with the simulator where links are shared",
          "[sim][analytic][agreement]") {
  SimOptions flow;
  flow.fidelity = "flow";
  flow.trace_max_ranks = 0;
  SimOptions step = flow;
  step.fidelity = "step";
  SimOptions automatic = flow;  // the rule's class, whatever step would cost
  automatic.fidelity = "auto";
  automatic.auto_step_max_cost = std::numeric_limits<double>::infinity();
  std::vector<Row> rows;
  std::vector<Row> flow_off;
  std::vector<Row> slow_side;
  int cases = 0;
  for (const NamedCluster& cluster : contended_clusters()) {
    for (const auto& topology : testing::topologies()) {
      const ShardedModel model = testing::make_model(topology);
      std::vector<StrategyOptions> variants = testing::strategies();
      for (const std::string& preset : strategy_preset_names())
        variants.push_back(strategy_preset(preset, model.mesh.world_size()));
      for (const StrategyOptions& options : variants) {
        const StepPlan plan = build_plan(model, options, PlanSettings{});
        const double analytic = estimate(plan, cluster.spec).average_step_s;
        const double sim = simulate(plan, cluster.spec, flow).record.step.average_s;
        const double sim_step = simulate(plan, cluster.spec, step).record.step.average_s;
        const double bound = step_bound(plan, cluster.spec).bound_s;
        const std::string where = cluster.name + " | " + topology.name + " | " +
                                  (options.preset.empty() ? "" : "preset " + options.preset + " ") +
                                  options.to_json_text();
        INFO(where << ": analytic " << analytic << " s, sim flow " << sim << " s, sim step "
                   << sim_step << " s, bound " << bound << " s");
        REQUIRE(sim > 0);
        REQUIRE(sim_step > 0);
        // Against the simulator's transfer-by-transfer fidelity always; against its flow
        // fidelity where sim.fidelity auto would run flow, the class of plans where flow is
        // shown within 1 % of step (sim/src/fidelity.hpp). Elsewhere (PCIe nodes) flow can be
        // 10 % off step, the analytic model beyond it on the slow side, and the cases whose
        // flow is more than 10 % off step are listed.
        CHECK(agrees(analytic, sim_step));
        const bool flow_proven =
            sim::choose_fidelity(sim::fidelity_case(plan, cluster.spec, automatic), automatic)
                .fidelity == "flow";
        if (flow_proven)
          CHECK(agrees(analytic, sim));
        else if (std::abs(sim / sim_step - 1) > kAgreement)
          flow_off.push_back({sim / sim_step, where});
        if (analytic / sim_step - 1 > kAgreement) slow_side.push_back({analytic / sim_step, where});
        CHECK(analytic >= bound * (1 - 1e-9));
        CHECK(sim >= bound * (1 - 1e-9));
        CHECK(sim_step >= bound * (1 - 1e-9));
        rows.push_back({analytic / (flow_proven ? sim : sim_step), where});
        ++cases;
      }
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::abs(a.ratio - 1) > std::abs(b.ratio - 1);
  });
  std::ostringstream report;
  report << "analytic / simulated step (at the fidelity auto picks) over " << cases
         << " cases; the ten furthest apart:\n";
  for (std::size_t i = 0; i < rows.size() && i < 10; ++i)
    report << "  " << std::showpos << std::fixed << std::setprecision(1)
           << (rows[i].ratio - 1) * 100 << std::noshowpos << " %  " << rows[i].where << "\n";
  report << slow_side.size() << " cases where the analytic step is more than 10 % slower than "
         << "the simulator's step fidelity (allowed up to " << kSlowSide * 100 << " %):\n";
  for (const Row& r : slow_side)
    report << "  " << std::showpos << std::fixed << std::setprecision(1) << (r.ratio - 1) * 100
           << std::noshowpos << " %  " << r.where << "\n";
  report << flow_off.size() << " cases outside flow's proven class where the simulator's flow "
         << "fidelity is more than 10 % off its step fidelity (flow / step):\n";
  for (std::size_t i = 0; i < flow_off.size() && i < 10; ++i)
    report << "  " << std::showpos << std::fixed << std::setprecision(1)
           << (flow_off[i].ratio - 1) * 100 << std::noshowpos << " %  " << flow_off[i].where
           << "\n";
  std::cout << report.str();
  CHECK(cases == static_cast<int>(contended_clusters().size() * testing::topologies().size() *
                                  (testing::strategies().size() + strategy_preset_names().size())));
}

TEST_CASE("groups that share a node's NICs split them in the analytic model as in the simulator",
          "[sim][analytic][agreement]") {
  // Issue 22's example: dp=4 x tp=4 on a100-pcie-4x (4 GPUs and 2 NICs of 23 GB/s per node), an
  // all-gather over dp of 256 MiB: each node holds one member of each of the 4 dp groups, and the
  // 4 rings leave the node through its 2 NICs at once: 46 GB/s for 4 rings, 11.5 GB/s of bus
  // bandwidth each at the network's ring efficiency. Pricing each group alone gave it a NIC.
  register_sim_backend();
  ClusterSpec c = cluster_file("a100-pcie-4x");
  const CollectiveBenchSpec spec = testing::first_dim_spec(
      "all_gather",
      DeviceMesh({{"dp", 4, DimRole::replicate}, {"tp", 4, DimRole::replicate}}, c.gpus_per_node));
  const Experiment e = testing::bench_experiment(c, spec, "flow");
  const std::int64_t size = 256LL << 20;
  const CollectiveBenchRow analytic = run_collective_bench(spec, e, size, "analytic");
  const CollectiveBenchRow sim = run_collective_bench(spec, e, size, "sim");
  const double by_hand = 2 * c.nic.bandwidth_GBps / 4 * c.efficiency.network.ring;
  INFO("analytic " << analytic.busbw_GBps << " GB/s, sim " << sim.busbw_GBps << " GB/s, by hand "
                   << by_hand << " GB/s");
  CHECK(analytic.busbw_GBps == Approx(by_hand).epsilon(0.02));
  CHECK(sim.busbw_GBps == Approx(by_hand).epsilon(0.02));
}

TEST_CASE("the training step: the analytic model agrees with the simulator",
          "[sim][analytic][agreement][training]") {
  // Every topology of the invariant matrix with a training step around the optimizer (forward
  // and backward compute, FSDP parameter gathers, TP/EP/CP/PP activation traffic, per-layer
  // gradient sync), with and without overlap of the optimizer and the backward pass, on a DGX
  // H100 and on the contended nodes of two GPUs: issue 24's target is agreement within 10 %.
  SimOptions step;
  step.fidelity = "step";
  step.trace_max_ranks = 0;
  std::vector<NamedCluster> clusters = {{"dgx-h100", cluster_file("dgx-h100")}};
  clusters.push_back(contended_clusters().front());
  std::vector<Row> rows;
  for (const NamedCluster& cluster : clusters) {
    for (const auto& topology : testing::topologies()) {
      for (const std::string overlap : {"none", "backward"}) {
        for (const std::string strategy : {"owner", "all_to_all"}) {
          const ShardedModel model = testing::make_model(topology);
          PlanSettings settings;
          settings.training.enabled = true;
          settings.training.seq_len = 512;
          settings.training.micro_batch_size = 1;
          settings.training.tokens_per_step = 4 * 512 * 4;  // 4 micro-batches at dp <= 4
          settings.training.experts_per_token = 2;
          settings.training.overlap = overlap;
          StrategyOptions options;
          options.name = strategy;
          options.grad_sync.enabled = true;
          const StepPlan plan = build_plan(model, options, settings);
          const EstimateSummary analytic = estimate(plan, cluster.spec);
          const double sim = simulate(plan, cluster.spec, step).record.step.average_s;
          const double bound = step_bound(plan, cluster.spec).bound_s;
          const std::string where =
              cluster.name + " | " + topology.name + " | " + strategy + " | overlap " + overlap;
          INFO(where << ": analytic " << analytic.average_step_s << " s, sim " << sim
                     << " s, bound " << bound << " s");
          REQUIRE(sim > 0);
          CHECK(std::abs(analytic.average_step_s / sim - 1) <= kAgreement);
          CHECK(analytic.average_step_s >= bound * (1 - 1e-9));
          CHECK(sim >= bound * (1 - 1e-9));
          rows.push_back({analytic.average_step_s / sim, where});
        }
      }
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::abs(a.ratio - 1) > std::abs(b.ratio - 1);
  });
  std::cout << "training step, analytic / simulated over " << rows.size()
            << " cases; the five furthest apart:\n";
  for (std::size_t i = 0; i < rows.size() && i < 5; ++i)
    std::cout << "  " << std::showpos << std::fixed << std::setprecision(1)
              << (rows[i].ratio - 1) * 100 << std::noshowpos << " %  " << rows[i].where << "\n";
}
