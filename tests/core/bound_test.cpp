// Tests of T_bound (core/engine/bound.hpp): a hand-computed bound on a small cluster with round
// numbers, and the property that defines it, on every plan of the invariant matrix: no plan's
// analytic step is faster than its bound.
#include <catch2/catch.hpp>

#include <algorithm>

#include "core/engine/bound.hpp"
#include "core/engine/cost_model.hpp"
#include "core/plan/strategy.hpp"
#include "tests/common/hand_clusters.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;
using Catch::Detail::Approx;

namespace {

// Two square matrices sharded on dim 0 over a 1-D FSDP mesh.
ShardedModel squares(int ranks, std::int64_t small, std::int64_t large) {
  const DeviceMesh mesh({{"dp_shard", ranks, DimRole::fsdp}}, 2);
  std::vector<DistributedParam> params(2);
  const std::int64_t n[2] = {small, large};
  for (int i = 0; i < 2; ++i) {
    params[i].name = "m" + std::to_string(i);
    params[i].shape = {n[i], n[i]};
    params[i].layout = TensorLayout(mesh, params[i].shape, {Placement::shard(0)});
  }
  return shard_explicitly(mesh, "squares", params);
}

}  // namespace

TEST_CASE("T_bound by hand: the longest NS with its gather and scatter, or the balanced work",
          "[bound]") {
  const ClusterSpec cluster = testing::unit_cluster();
  // 4 ranks on 2 nodes; matrices 256 and 1024: NS of n x n is 30 n^3 FLOPs at 1 TFLOP/s.
  const ShardedModel model = squares(4, 256, 1024);
  StrategyOptions options;
  options.assign = "round_robin";
  const StepPlan plan = build_plan(model, options, PlanSettings{});
  const double ns_large = 30.0 * 1024 * 1024 * 1024 / 1e12;
  const double ns_small = 30.0 * 256 * 256 * 256 / 1e12;
  // The owner lacks 3/4 of the 1024^2 bf16 elements, over NVLink and NIC together (125 GB/s);
  // its node lacks half of them, over the node's 2 NICs (50 GB/s); plus NIC + switch latency.
  const double full = 1024.0 * 1024 * 2;
  const double rank_side = 0.75 * full / 125e9;
  const double node_side = 0.5 * full / 50e9;
  const double g = std::max(rank_side, node_side) + 6e-6;
  const StepBound b = step_bound(plan, cluster);
  CHECK(b.binding == "longest");
  CHECK(b.longest == "m1");
  CHECK(b.ns_longest_s == Approx(ns_large).epsilon(1e-12));
  CHECK(b.ns_total_s == Approx(ns_large + ns_small).epsilon(1e-12));
  CHECK(b.ns_balanced_s == Approx((ns_large + ns_small) / 4).epsilon(1e-12));
  CHECK(b.gather_s == Approx(g).epsilon(1e-12));
  CHECK(b.scatter_s == Approx(g).epsilon(1e-12));
  CHECK(b.bound_s == Approx(2 * g + ns_large).epsilon(1e-12));

  // Eight equal matrices over 2 ranks: the balanced term binds (4 NS per rank, plus the smallest
  // gather and scatter).
  const DeviceMesh mesh({{"dp_shard", 2, DimRole::fsdp}}, 2);
  std::vector<DistributedParam> params(8);
  for (int i = 0; i < 8; ++i) {
    params[i].name = "w" + std::to_string(i);
    params[i].shape = {512, 512};
    params[i].layout = TensorLayout(mesh, params[i].shape, {Placement::shard(0)});
  }
  const ShardedModel eight = shard_explicitly(mesh, "eight", params);
  const StepPlan p8 = build_plan(eight, StrategyOptions{}, PlanSettings{});
  const StepBound b8 = step_bound(p8, cluster);
  const double ns = 30.0 * 512 * 512 * 512 / 1e12;
  const double g8 = 0.5 * 512 * 512 * 2 / 100e9 + 1e-6;  // one node: NVLink only, its latency
  CHECK(b8.binding == "balanced");
  CHECK(b8.owner_ranks == 2);
  CHECK(b8.bound_s == Approx(4 * ns + 2 * g8).epsilon(1e-12));
}

TEST_CASE("no plan of the invariant matrix is faster than its bound", "[bound]") {
  ClusterSpec cluster = testing::unit_cluster();
  cluster.gpus_per_node = 2;
  int plans = 0;
  for (const auto& topology : testing::topologies()) {
    const ShardedModel model = testing::make_model(topology);
    for (const auto& options : testing::strategies()) {
      const StepPlan plan = build_plan(model, options, PlanSettings{});
      const StepBound b = step_bound(plan, cluster);
      const EstimateSummary e = estimate(plan, cluster);
      INFO("topology " << topology.name << ", strategy " << options.to_json_text());
      CHECK(b.bound_s > 0);
      CHECK(b.bound_s <= e.average_step_s * (1 + 1e-12));
      ++plans;
    }
  }
  CHECK(plans == static_cast<int>(testing::topologies().size() * testing::strategies().size()));
}
