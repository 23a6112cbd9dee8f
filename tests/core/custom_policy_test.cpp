// The example user policy in core/policies/ is registered without any other file naming it, and
// it does what it promises (core/policies/node_local_assign.cpp): every owner sits on a node that
// holds the largest part of its matrix, and among that node's ranks the NS work is balanced like
// LPT (no rank carries more than the least loaded one plus one matrix).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include "core/plan/strategy.hpp"

using namespace muonbed;

namespace {

// Checks the policy's promises on one sharded model; returns the nodes owners landed on.
std::map<int, int> check_node_local(const ShardedModel& model, int ns_steps) {
  const DeviceMesh& mesh = model.mesh;
  const Assignment a = make_assign_policy("node_local")->assign(model, ns_steps);
  validate_assignment(model, a);  // every Muon matrix owned once, by a rank holding a piece
  std::map<int, int> nodes_used;
  std::vector<double> load(mesh.world_size(), 0.0);
  double largest = 0;
  for (int p : model.muon_params()) {
    const DistributedParam& dp = model.params[p];
    std::map<int, std::int64_t> held;  // computed here, independently of the policy
    for (int r = 0; r < mesh.world_size(); ++r)
      if (dp.layout.holds(mesh, r)) held[mesh.node_of(r)] += dp.layout.shard_numel(mesh, r);
    std::int64_t most = 0;
    for (const auto& [node, n] : held) most = std::max(most, n);
    const int owner_node = mesh.node_of(a.owner[p]);
    INFO(dp.name << " owned by rank " << a.owner[p] << " on node " << owner_node);
    // (held counts every replica; the policy ranks nodes by one replica's worth, which orders
    // the nodes the same way when replicas are spread evenly, as in these meshes)
    CHECK(held[owner_node] == most);
    ++nodes_used[owner_node];
    const double f = newton_schulz_flops(dp.rows(), dp.cols(), ns_steps, dp.batch());
    load[a.owner[p]] += f;
    largest = std::max(largest, f);
  }
  // LPT among each node's candidate ranks: loads within one matrix of each other.
  for (int node = 0; node < mesh.num_nodes(); ++node) {
    double lo = 1e300, hi = 0;
    for (int r = 0; r < mesh.world_size(); ++r)
      if (mesh.node_of(r) == node && nodes_used.count(node)) {
        lo = std::min(lo, load[r]);
        hi = std::max(hi, load[r]);
      }
    if (nodes_used.count(node)) CHECK(hi - lo <= largest * (1 + 1e-12));
  }
  return nodes_used;
}

}  // namespace

TEST_CASE("a policy file in core/policies registers itself", "[strategy][policy]") {
  const auto names = assign_policy_names();
  REQUIRE(std::find(names.begin(), names.end(), "node_local") != names.end());
}

TEST_CASE("node_local owners sit where most of the matrix is, balanced", "[strategy][policy]") {
  // TP across 2 nodes, FSDP inside each: every matrix is split evenly over both nodes.
  DeviceMesh tp_mesh({{"tp", 2, DimRole::tp}, {"dp_shard", 2, DimRole::fsdp}}, 2);
  check_node_local(parallelize(*find_preset("tiny-dense"), tp_mesh, ParallelRules{}), 5);

  // Uneven torch.chunk shards: 3 rows over 4 FSDP ranks (2 per node) are 1, 1, 1, 0 rows, so
  // node 0 holds two thirds of each matrix; 5 rows give 2, 2, 1, 0.
  DeviceMesh fsdp({{"dp_shard", 4, DimRole::fsdp}}, 2);
  Model uneven;
  uneven.name = "uneven";
  uneven.num_layers = 1;
  for (int i = 0; i < 6; ++i)
    uneven.params.push_back(Parameter{
        "w" + std::to_string(i), {i % 2 ? 3 : 5, 64}, DType::bf16, ParamRole::other_matrix, 0});
  const auto used = check_node_local(parallelize(uneven, fsdp, ParallelRules{}), 5);
  CHECK(used.at(0) == 6);

  // Pipeline stages on different nodes: each matrix lives on one node only, and its owner is
  // there (not always node 0).
  DeviceMesh pp_mesh({{"pp", 2, DimRole::pp}, {"dp_shard", 2, DimRole::fsdp}}, 2);
  const auto pp_model = parallelize(*find_preset("tiny-dense"), pp_mesh, ParallelRules{});
  const auto pp_used = check_node_local(pp_model, 5);
  CHECK(pp_used.size() == 2);
  const Assignment pp = make_assign_policy("node_local")->assign(pp_model, 5);
  for (int p : pp_model.muon_params()) {
    const int stage = pp_model.params[p].layout.placements()[0].coord;
    CHECK(pp_mesh.node_of(pp.owner[p]) == stage);
  }
}
