// sim.fidelity auto's rule (see fidelity.hpp).
#include "sim/src/fidelity.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <utility>

#include "core/engine/measurement.hpp"
#include "core/experiment/experiment.hpp"
#include "sim/src/collectives.hpp"
#include "sim/src/platform.hpp"

namespace muonbed::sim {

namespace {

// Step fidelity's cost model, fitted to the step runs of experiments/BENCHMARKS.md ("Fidelity
// auto", 2-core VM): a transfer costs a fixed event plus SimGrid's bandwidth sharing, which grows
// with the transfers in flight beside it; the sharing equals the fixed part at this many in
// flight (5.0 us + 4.1 ns per transfer in flight: 9.2 us per transfer on strategies_at_scale's
// owner_allgather at 128 GPUs, 1,024 in flight, and 13.4 us at 256 GPUs, 2,048 in flight).
constexpr double kSharingTransfers = 1220;

// What step fidelity's lowering (sim/src/collectives.cpp) posts for one instance of an op.
struct StepMessages {
  double transfers = 0;  // to SimGrid: every ring step, all-to-all round, chain chunk and rooted
                         // piece that moves bytes
  double messages = 0;   // and with the zero-byte ones (timers: cheaper, not free)
  double rounds = 1;     // waves they come in (ring steps, all-to-all windows, broadcast chunks)
};

// An all-reduce is counted as a ring (NVLS, where it runs, posts fewer), a split Newton-Schulz as
// its all-reduces. `sent` is scratch space for the all-to-all's pairs.
StepMessages step_messages(const StepPlan& plan, const Op& op, const std::vector<int>& members,
                           const Topology& topology, std::vector<char>& sent) {
  const int n = static_cast<int>(members.size());
  StepMessages m;
  if (n < 2) return m;
  const auto channels = [&] {
    return static_cast<double>(ring_channels(members, topology).size());
  };
  switch (op.kind) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter: {
      const double ch = channels();
      std::vector<double> pieces;
      double total = 0;
      for (int member : members) {
        pieces.push_back(static_cast<double>(piece_bytes(plan, op, member)));
        total += pieces.back();
      }
      // Uneven pieces take the flow lowering at both fidelities: one flow per ring edge, each
      // carrying every piece but one; even ones send each piece n-1 times along each channel.
      const bool uneven = ring_needs_pipelining(op.kind, pieces);
      m.rounds = uneven ? 1 : n - 1;
      double moving = 0;
      for (double piece : pieces) moving += ((uneven ? total - piece : piece) / ch >= 1) ? 1 : 0;
      m.transfers = ch * moving * m.rounds;
      m.messages = ch * n * m.rounds;
      return m;
    }
    case OpKind::all_reduce:
    case OpKind::split_newton_schulz: {  // the norms' all-reduce, then one per NS step
      const double all_reduces = op.kind == OpKind::all_reduce ? 1 : 1 + std::max(0, op.ns_steps);
      m.rounds = all_reduces * 2 * (n - 1);
      m.transfers = m.messages = channels() * n * m.rounds;
      return m;
    }
    case OpKind::broadcast: {
      const double ch = channels();
      const double share = static_cast<double>(piece_bytes(plan, op, members.front())) / ch;
      m.rounds = std::clamp(std::ceil(share / kBroadcastChunkBytes), 1.0,
                            static_cast<double>(kBroadcastMaxChunks));
      m.messages = ch * (n - 1) * m.rounds;
      m.transfers = share >= 1 ? m.messages : 0;
      return m;
    }
    case OpKind::all_to_all: {
      m.rounds = std::max(1.0, static_cast<double>(n - 1) / kAllToAllPeersInFlight);
      sent.assign(static_cast<std::size_t>(n) * n, 0);
      for (const PairBytes& t : all_to_all_transfers(plan, op, members))
        if (t.from != t.to && t.bytes > 0) sent[static_cast<std::size_t>(t.from) * n + t.to] = 1;
      m.transfers = static_cast<double>(std::count(sent.begin(), sent.end(), 1));
      m.messages = static_cast<double>(n) * (n - 1);  // every round, with bytes or without
      return m;
    }
    case OpKind::gather:
    case OpKind::scatter: {
      const int root = std::max(0, op.root);
      for (int i = 0; i < n; ++i) m.transfers += i != root && piece_bytes(plan, op, members[i]) > 0;
      m.messages = m.transfers;  // members without bytes post nothing
      return m;
    }
    case OpKind::send:
    case OpKind::recv:
      m.transfers = piece_bytes(plan, op, members.front()) > 0 ? 1 : 0;
      m.messages = 1;
      return m;
    default:  // barrier: zero-byte messages, 2 ceil(log2 n) per member
      m.messages = 2 * std::ceil(std::log2(n)) * n;
      return m;
  }
}

// "1.2 M" style, for the reason text.
std::string transfers_text(double transfers) {
  char text[32];
  if (transfers >= 1e6)
    std::snprintf(text, sizeof text, "%.1f M", transfers / 1e6);
  else if (transfers >= 1e3)
    std::snprintf(text, sizeof text, "%.0f k", transfers / 1e3);
  else
    std::snprintf(text, sizeof text, "%.0f", transfers);
  return text;
}

}  // namespace

FidelityCase fidelity_case(const StepPlan& plan, const ClusterSpec& cluster,
                           const SimOptions& options, bool estimate_step) {
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
  if (estimate_step) {
    // Step fidelity's cost: transfers per instance, times instances, times the step patterns the
    // replay simulates (sim/src/replay.cpp) in which the op runs.
    const Topology topology(cluster, c.ranks, per_node);
    const std::vector<StepPatternSpec> patterns = step_patterns(plan);
    std::vector<char> sent;
    std::vector<std::pair<StepMessages, double>> per_op;  // all instances and runs, in flight
    std::set<int> lanes;                                  // streams with transfers of their own
    for (const Op& op : plan.ops) {
      if (is_collective(op.kind) || op.kind == OpKind::split_newton_schulz) {
        int runs = 0;
        for (const StepPatternSpec& p : patterns) runs += plan.active_in_step(op, p.step) ? 1 : 0;
        const int n = mesh.group_size(op.group);
        if (runs > 0 && n >= 2) {
          // The first instance stands for the others, as below.
          const std::vector<int> members =
              mesh.group_members(op.ranks.ranks(mesh).front(), op.group);
          const double instances = static_cast<double>(op.ranks.count(mesh)) / n;
          const StepMessages each = step_messages(plan, op, members, topology, sent);
          const double times = runs * instances;
          per_op.push_back({{each.transfers * times, each.messages * times, each.rounds},
                            instances * each.transfers / each.rounds});
          if (each.transfers > 0) lanes.insert(op.stream);
        }
      }
    }
    // Every transfer costs a fixed event, plus its share of SimGrid's bandwidth sharing, which
    // grows with the transfers in flight beside it: the op's own, on every lane at once (lanes
    // exist to overlap). A zero-byte message costs one event.
    for (const auto& [m, in_flight] : per_op) {
      c.step_transfers += m.transfers;
      c.step_cost +=
          m.transfers * (1 + in_flight * static_cast<double>(lanes.size()) / kSharingTransfers) +
          (m.messages - m.transfers);
    }
  }
  // Rings are no class of their own: uneven ones take the same lowering at both fidelities
  // (ring_needs_pipelining, sim/src/collectives.hpp), even ones agree within 1 %
  // (tests/sim/fidelity_test.cpp).
  for (const Op& op : plan.ops) {
    const bool rooted = op.kind == OpKind::gather || op.kind == OpKind::scatter;
    if (op.kind != OpKind::all_to_all && !rooted) continue;
    const int n = mesh.group_size(op.group);
    if (n < 2) continue;
    if (op.kind == OpKind::all_to_all) {
      if (all_to_all_rounds(n, lowering) < n - 1)
        c.largest_merged_all_to_all = std::max(c.largest_merged_all_to_all, n);
      continue;
    }
    // Pooled at flow fidelity: more than flow_pooled_members members off the root's node.
    if (n <= options.flow_pooled_members) continue;
    const std::vector<int> members = mesh.group_members(op.ranks.ranks(mesh).front(), op.group);
    const int root_node = members[std::max(0, op.root)] / per_node;
    int remote = 0;
    for (int m : members) remote += m / per_node != root_node ? 1 : 0;
    if (remote > options.flow_pooled_members)
      pooled_streams[op.kind == OpKind::gather ? 0 : 1].insert(op.stream);
  }
  c.pooled_on_lanes = pooled_streams[0].size() > 1 || pooled_streams[1].size() > 1;
  return c;
}

namespace {

// What auto lifts up to a size it can afford: every all-to-all round, one flow per member.
bool keeps_rounds(const FidelityCase& c) {
  return c.largest_merged_all_to_all > 0 && c.ranks <= kAllRoundsMaxRanks;
}
bool per_member_flows(const FidelityCase& c) {
  return c.pooled_on_lanes && c.ranks <= kPerMemberFlowMaxRanks;
}

// What flow would still run differently from step (empty: nothing, flow is proven here).
std::string flow_unproven(const FidelityCase& c) {
  if (c.largest_merged_all_to_all > 0 && !keeps_rounds(c))
    return "its all-to-all groups of up to " + std::to_string(c.largest_merged_all_to_all) +
           " members would have their rounds merged";
  if (c.pcie_nodes)
    return "its GPUs sit on PCIe links, where the fidelities share links differently";
  if (c.pooled_on_lanes && !per_member_flows(c))
    return "its gathers or scatters pooled over many nodes run on several lanes at once";
  return "";
}

}  // namespace

FidelityChoice pick_fidelity(const StepPlan& plan, const ClusterSpec& cluster,
                             const SimOptions& options) {
  if (options.fidelity != "auto") return choose_fidelity(FidelityCase{}, options);
  const FidelityCase c = fidelity_case(plan, cluster, options, false);
  if (flow_unproven(c).empty() || c.ranks > kMaxStepFidelityRanks)
    return choose_fidelity(c, options);  // step's cost is not read
  return choose_fidelity(fidelity_case(plan, cluster, options, true), options);
}

FidelityChoice choose_fidelity(const FidelityCase& c, const SimOptions& options) {
  if (options.fidelity != "auto") return {options.fidelity, true, ""};
  const bool keep_rounds = keeps_rounds(c);
  const bool per_member = per_member_flows(c);
  const std::string unproven = flow_unproven(c);
  if (unproven.empty()) {
    FidelityChoice choice{"flow", true,
                          "flow agrees with step within 1 % on plans like this one (NVLink "
                          "nodes, every all-to-all round kept, no pooled gathers on several "
                          "lanes: tests/sim/fidelity_test.cpp)"};
    if (keep_rounds)
      choice.reason += ", run keeping every round of its all-to-alls of up to " +
                       std::to_string(c.largest_merged_all_to_all) +
                       " members (merged rounds are not proven)";
    if (per_member)
      choice.reason +=
          std::string(keep_rounds ? " and" : ", run") +
          " with one flow per member of its gathers and scatters over many nodes (pooled flows "
          "are not proven on several lanes)";
    choice.keep_all_rounds = keep_rounds;
    choice.per_member_rooted = per_member;
    return choice;
  }
  const std::string cost = "step's estimated cost " + transfers_text(c.step_cost) + " (" +
                           transfers_text(c.step_transfers) +
                           " SimGrid transfers, weighted by those in flight beside them) against "
                           "a budget of " +
                           transfers_text(options.auto_step_max_cost);
  // Above kMaxStepFidelityRanks step fidelity is refused whatever the plan (sim/simulate.cpp).
  if (c.step_cost <= options.auto_step_max_cost && c.ranks <= kMaxStepFidelityRanks)
    return {"step", true,
            "flow is not proven within 1 % of step here (" + unproven +
                "), and step is affordable (" + cost + ")"};
  return {"flow", false,
          "flow is not proven within 1 % of step here (" + unproven +
              "), but step would take too long (" +
              (c.ranks > kMaxStepFidelityRanks
                   ? std::to_string(c.ranks) + " ranks, above step's limit of " +
                         std::to_string(kMaxStepFidelityRanks)
                   : cost) +
              "); check a smaller mesh at sim.fidelity: step"};
}

SimOptions options_for(const FidelityChoice& choice, SimOptions options) {
  if (choice.keep_all_rounds) {  // all_to_all_rounds keeps n - 1 rounds of every group
    options.flow_all_to_all_rounds = kAllRoundsMaxRanks;
    options.flow_all_to_all_transfers = std::numeric_limits<long>::max();
  }
  if (choice.per_member_rooted) {
    options.flow_pooled_members = std::numeric_limits<int>::max();
    options.flow_rooted_bundles = std::numeric_limits<int>::max();
  }
  return options;
}

}  // namespace muonbed::sim
