// sim.fidelity auto's rule (see fidelity.hpp).
#include "sim/src/fidelity.hpp"

#include <algorithm>
#include <set>

#include "sim/src/collectives.hpp"

namespace muonbed::sim {

FidelityCase fidelity_case(const StepPlan& plan, const ClusterSpec& cluster,
                           const SimOptions& options) {
  const DeviceMesh& mesh = plan.mesh();
  FidelityCase c;
  c.ranks = mesh.world_size();
  const int per_node =
      cluster.gpus_per_node > 0 ? cluster.gpus_per_node : std::max(1, mesh.gpus_per_node());
  c.pcie_nodes = cluster.intra.kind == IntraNodeKind::pcie;
  LoweringOptions lowering;
  lowering.step_fidelity = false;
  lowering.a2a_rounds = options.flow_all_to_all_rounds;
  lowering.a2a_transfers = options.flow_all_to_all_transfers;
  std::set<int> pooled_streams[2];  // of gathers, of scatters
  for (const Op& op : plan.ops) {
    const bool rooted = op.kind == OpKind::gather || op.kind == OpKind::scatter;
    if (op.kind != OpKind::all_to_all && op.kind != OpKind::all_gather &&
        op.kind != OpKind::reduce_scatter && !rooted)
      continue;
    const int n = mesh.group_size(op.group);
    if (n < 2) continue;
    if (rooted) {
      // Pooled at flow fidelity: more than flow_pooled_members members off the root's node.
      if (n <= options.flow_pooled_members) continue;
      const std::vector<int> members = mesh.group_members(op.ranks.ranks(mesh).front(), op.group);
      const int root_node = members[std::max(0, op.root)] / per_node;
      int remote = 0;
      for (int m : members) remote += m / per_node != root_node ? 1 : 0;
      if (remote > options.flow_pooled_members)
        pooled_streams[op.kind == OpKind::gather ? 0 : 1].insert(op.stream);
      continue;
    }
    if (op.kind == OpKind::all_to_all) {
      if (all_to_all_rounds(n, lowering) < n - 1)
        c.largest_merged_all_to_all = std::max(c.largest_merged_all_to_all, n);
      continue;
    }
    if (!c.uneven_ring.empty()) continue;
    // The first instance stands for the others (the box's ranks differ only in where they sit).
    const std::vector<int> members = mesh.group_members(op.ranks.ranks(mesh).front(), op.group);
    double total = 0, largest = 0;
    for (int m : members) {
      const double piece = static_cast<double>(piece_bytes(plan, op, m));
      total += piece;
      largest = std::max(largest, piece);
    }
    // As the lowering's uneven_pieces (sim/src/collectives.cpp): such rings are long flows.
    if (largest > 2 * total / static_cast<double>(n))
      c.uneven_ring = op.label.empty() ? std::string(to_string(op.kind)) : op.label;
  }
  c.pooled_on_lanes = pooled_streams[0].size() > 1 || pooled_streams[1].size() > 1;
  return c;
}

FidelityChoice choose_fidelity(const FidelityCase& c, const SimOptions& options) {
  if (options.fidelity != "auto") return {options.fidelity, true, ""};
  std::string unproven;
  if (c.largest_merged_all_to_all > 0)
    unproven = "its all-to-all groups of up to " + std::to_string(c.largest_merged_all_to_all) +
               " members would have their rounds merged";
  else if (c.pcie_nodes)
    unproven = "its GPUs sit on PCIe links, where the fidelities share links differently";
  else if (c.pooled_on_lanes)
    unproven = "its gathers or scatters pooled over many nodes run on several lanes at once";
  else if (!c.uneven_ring.empty())
    unproven = "the uneven ring '" + c.uneven_ring + "' has uneven pieces";
  if (unproven.empty())
    return {"flow", true,
            "flow agrees with step within 1 % on plans like this one (NVLink nodes, no "
            "merged all-to-all rounds, no pooled gathers on several lanes, no uneven ring: "
            "tests/sim/fidelity_test.cpp)"};
  if (c.ranks <= options.auto_step_max_ranks)
    return {"step", true,
            "flow is not proven within 1 % of step here (" + unproven +
                "), and step is affordable at " + std::to_string(c.ranks) +
                " <= " + std::to_string(options.auto_step_max_ranks) + " ranks"};
  return {"flow", false,
          "flow is not proven within 1 % of step here (" + unproven + "), but step at " +
              std::to_string(c.ranks) + " ranks (above " +
              std::to_string(options.auto_step_max_ranks) +
              ") would take too long; check a smaller mesh at sim.fidelity: step"};
}

}  // namespace muonbed::sim
