// Example of a user-defined assign policy, and the template for writing one: a single file in
// core/policies/ is compiled into every muonbed program and registers itself at start-up, so
// `strategy: {assign: node_local}` works in any experiment without touching a backend.
//
// node_local: the owner of a matrix is chosen on the node that already holds the largest part of
// it (fewest bytes to pull over the network), and among that node's ranks by least NS FLOPs so
// far (LPT order, like flop_balanced). With FSDP inside a node and TP across nodes this keeps the
// gather on NVLink; with plain FSDP over many nodes it degenerates to flop_balanced per node.
#include <algorithm>
#include <map>

#include "core/plan/assignment.hpp"

namespace muonbed {
namespace {

class NodeLocalAssign final : public AssignPolicy {
 public:
  std::string name() const override { return "node_local"; }

  Assignment assign(const ShardedModel& model, int ns_steps) const override {
    const auto& mesh = model.mesh;
    Assignment a;
    a.owner.assign(model.params.size(), Assignment::kNoOwner);
    std::vector<int> order = model.muon_params();
    auto flops = [&](int p) {
      const auto& dp = model.params[p];
      return newton_schulz_flops(dp.rows(), dp.cols(), ns_steps, dp.batch());
    };
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return flops(x) > flops(y); });
    std::vector<double> load(mesh.world_size(), 0.0);
    for (int p : order) {
      const auto candidates = candidate_owners(model, p);
      if (candidates.empty()) continue;
      // Elements of the matrix held per node (one replica's worth is enough to rank nodes).
      std::map<int, std::int64_t> held;
      for (int r : candidates) held[mesh.node_of(r)] += model.params[p].layout.shard_numel(mesh, r);
      const int node = std::max_element(held.begin(), held.end(), [](auto& x, auto& y) {
                         return x.second < y.second;
                       })->first;
      int best = -1;
      for (int r : candidates)
        if (mesh.node_of(r) == node && (best < 0 || load[r] < load[best])) best = r;
      a.owner[p] = best;
      load[best] += flops(p);
    }
    return a;
  }
};

// Registration runs before main(); the factory is what make_assign_policy("node_local") calls.
const bool registered = [] {
  register_assign_policy("node_local",
                         [] { return std::unique_ptr<AssignPolicy>(new NodeLocalAssign()); });
  return true;
}();

}  // namespace
}  // namespace muonbed
