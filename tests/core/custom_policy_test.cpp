// The example user policy in core/policies/ is registered without any other file naming it, and
// it does what it promises: owners sit on the node holding most of the matrix.
#include <catch2/catch.hpp>

#include "core/strategy.hpp"

using namespace muonbed;

TEST_CASE("a policy file in core/policies registers itself", "[strategy][policy]") {
  const auto names = assign_policy_names();
  REQUIRE(std::find(names.begin(), names.end(), "node_local") != names.end());

  // FSDP inside each node of 2, TP across the 2 nodes... here the mesh [tp=2, dp_shard=2] puts
  // the dp_shard pairs on one node each (gpus_per_node 2): every matrix is spread over both
  // nodes, TP column shards make node 0 hold rows 0..n/2 and node 1 the rest, equal shares, so
  // the first node wins ties; row-replicated matrices (routers) do too.
  DeviceMesh mesh({{"tp", 2, DimRole::tp}, {"dp_shard", 2, DimRole::fsdp}}, 2);
  const auto model = parallelize(*find_preset("tiny-dense"), mesh, ParallelRules{});
  const auto assignment = make_assign_policy("node_local")->assign(model, 5);
  validate_assignment(model, assignment);
  for (int p : model.muon_params()) CHECK(mesh.node_of(assignment.owner[p]) == 0);

  // With a model whose matrices live on one node only (PP across nodes), the owner is there.
  DeviceMesh pp_mesh({{"pp", 2, DimRole::pp}, {"dp_shard", 2, DimRole::fsdp}}, 2);
  const auto pp_model = parallelize(*find_preset("tiny-dense"), pp_mesh, ParallelRules{});
  const auto pp_assignment = make_assign_policy("node_local")->assign(pp_model, 5);
  validate_assignment(pp_model, pp_assignment);
  for (int p : pp_model.muon_params()) {
    const int stage = pp_model.params[p].layout.placements()[0].coord;
    CHECK(pp_mesh.node_of(pp_assignment.owner[p]) == stage);
  }
}
