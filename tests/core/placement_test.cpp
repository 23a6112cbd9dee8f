// Topology-aware owner placement (assign: topology): the same NS balance as flop_balanced, with
// the owners of the largest matrices spread over nodes and NIC rails, checked on llama-70B at
// 1,024 GPUs (FSDP x TP, 8 GPUs per node) against counts made here from the owners.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "core/model/model.hpp"
#include "core/model/parallelize.hpp"
#include "core/plan/assignment.hpp"

using namespace muonbed;

namespace {

ShardedModel llama_fsdp_tp(int nodes) {
  DeviceMesh mesh({{"dp_shard", nodes, DimRole::fsdp}, {"tp", 8, DimRole::tp}}, 8);
  return parallelize(*find_preset("llama-70b"), mesh, ParallelRules{});
}

std::vector<double> sorted_loads(const ShardedModel& model, Assignment a) {
  summarize(model, 5, a);
  auto loads = a.ns_flops_per_rank;
  std::sort(loads.begin(), loads.end());
  return loads;
}

// The Muon matrices, heaviest NS first (stable: parameter order among equals).
std::vector<int> heaviest_first(const ShardedModel& model) {
  std::vector<int> order = model.muon_params();
  auto flops = [&](int p) {
    const auto& dp = model.params[p];
    return newton_schulz_flops(dp.rows(), dp.cols(), 5, dp.batch());
  };
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return flops(x) > flops(y); });
  return order;
}

}  // namespace

TEST_CASE("topology placement keeps flop_balanced's NS balance", "[assignment][topology]") {
  for (int nodes : {4, 32, 128}) {
    INFO(nodes << " nodes");
    const ShardedModel model = llama_fsdp_tp(nodes);
    const Assignment lpt = make_assign_policy("flop_balanced")->assign(model, 5);
    const Assignment spread = make_assign_policy("topology")->assign(model, 5);
    validate_assignment(model, spread);
    // LPT gives every matrix to a least-loaded rank; which one of the tied ranks does not change
    // the multiset of loads, so both policies must give the same loads up to a permutation.
    CHECK(sorted_loads(model, lpt) == sorted_loads(model, spread));
  }
}

TEST_CASE("topology placement spreads the largest matrices over nodes and rails",
          "[assignment][topology]") {
  const int nodes = 128;  // 1,024 GPUs
  const ShardedModel model = llama_fsdp_tp(nodes);
  const Assignment lpt = make_assign_policy("flop_balanced")->assign(model, 5);
  const Assignment spread = make_assign_policy("topology")->assign(model, 5);
  const auto order = heaviest_first(model);
  // llama-70B has 3 MLP matrices of 8192 x 28672 per layer, 80 layers: 240 equal heaviest ones.
  const auto& top = model.params[order[0]];
  int heavy = 0;
  while (heavy < static_cast<int>(order.size()) &&
         model.params[order[heavy]].numel() == top.numel())
    ++heavy;
  REQUIRE(heavy == 240);
  auto per_node = [&](const Assignment& a) {
    std::map<int, int> count;
    for (int i = 0; i < heavy; ++i) ++count[model.mesh.node_of(a.owner[order[i]])];
    return count;
  };
  auto per_rail = [&](const Assignment& a) {
    std::map<int, int> count;
    for (int i = 0; i < heavy; ++i) ++count[a.owner[order[i]] % model.mesh.gpus_per_node()];
    return count;
  };
  auto most = [](const std::map<int, int>& m) {
    int x = 0;
    for (const auto& [k, v] : m) x = std::max(x, v);
    return x;
  };
  // flop_balanced fills the lowest ranks first: 30 nodes with 8 heavy owners each.
  CHECK(per_node(lpt).size() == 30);
  CHECK(most(per_node(lpt)) == 8);
  // Spread: every node gets ceil(240/128) = 2 at most, every rail 240/8 = 30.
  CHECK(per_node(spread).size() == static_cast<std::size_t>(nodes));
  CHECK(most(per_node(spread)) == 2);
  CHECK(per_rail(spread).size() == 8);
  CHECK(most(per_rail(spread)) == 30);
}
