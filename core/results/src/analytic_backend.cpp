// The analytic backend: estimate_step() for each step pattern of the plan, the closed-form time
// of every collective instance, and the closed-form traffic of the same algorithms the simulator
// lowers to, assembled into a record by fill_record (core/results/results.hpp).
#include "core/results/results.hpp"

#include <vector>

#include "core/engine/cost_model.hpp"
#include "core/engine/engine.hpp"
#include "core/results/src/record_internal.hpp"

namespace muonbed {

namespace {

// Closed-form bytes the simulator's algorithms move for one instance, split by link class, and
// what each member sends. Ring collectives use node-contiguous rings with one channel per member
// on a node, so a channel crosses node boundaries once per node it visits (m edges of n when the
// group spans m > 1 nodes).
struct InstanceTraffic {
  double intra = 0;
  double network = 0;
};

InstanceTraffic closed_form_traffic(const StepPlan& plan, const Op& op,
                                    const std::vector<int>& members, int gpn,
                                    AllReduceAlgorithm algorithm, std::vector<double>& sent) {
  const int n = static_cast<int>(members.size());
  InstanceTraffic t;
  if (n < 2 || op.kind == OpKind::barrier) return t;
  std::vector<int> node_of(n);
  for (int i = 0; i < n; ++i) node_of[i] = members[i] / gpn;
  int nodes = 0;
  for (int i = 0; i < n; ++i)
    if (i == 0 || node_of[i] != node_of[i - 1]) ++nodes;
  const double ring_net = nodes > 1 ? static_cast<double>(nodes) / n : 0.0;
  const auto split = [&](double total, double net_fraction) {
    t.network += total * net_fraction;
    t.intra += total * (1 - net_fraction);
  };
  if (op.kind == OpKind::all_reduce && algorithm != AllReduceAlgorithm::ring) {
    // NVLS: each GPU moves S (g+1)/g over NVLink; NVLS tree adds 2(N-1)/N S/g over its NIC.
    const double s = static_cast<double>(collective_bytes(plan, op, members[0]));
    const double g = static_cast<double>(n) / nodes;
    const double intra = s * (g + 1) / g;
    const double net = nodes > 1 ? 2.0 * (nodes - 1) / nodes * s / g : 0.0;
    t.intra += n * intra;
    t.network += n * net;
    for (int i = 0; i < n; ++i) sent[members[i]] += intra + net;
    return t;
  }
  switch (op.kind) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
    case OpKind::all_reduce: {
      const double s = static_cast<double>(collective_bytes(plan, op, members[0]));
      const double factor = op.kind == OpKind::all_reduce ? 2.0 : 1.0;
      const double total = factor * (n - 1) * s;
      split(total, ring_net);
      for (int i = 0; i < n; ++i) sent[members[i]] += total / n;
      break;
    }
    case OpKind::broadcast: {
      const double s = static_cast<double>(piece_bytes(plan, op, members[0]));
      split((n - 1) * s, nodes > 1 ? static_cast<double>(nodes - 1) / (n - 1) : 0.0);
      // A chain from the root along the ring: every member but the one before the root sends.
      for (int i = 0; i < n; ++i)
        if (i != (op.root + n - 1) % n) sent[members[i]] += s;
      break;
    }
    case OpKind::gather:
    case OpKind::scatter: {
      const int root = op.root;
      for (int i = 0; i < n; ++i) {
        if (i == root) continue;
        const double b = static_cast<double>(piece_bytes(plan, op, members[i]));
        (node_of[i] == node_of[root] ? t.intra : t.network) += b;
        sent[op.kind == OpKind::gather ? members[i] : members[root]] += b;
      }
      break;
    }
    case OpKind::send:
    case OpKind::recv: {
      const double b = static_cast<double>(piece_bytes(plan, op, members[op.root]));
      (node_of[op.root] == node_of[op.peer] ? t.intra : t.network) += b;
      sent[members[op.root]] += b;
      break;
    }
    case OpKind::split_newton_schulz: {  // its all-reduces, on rings like all_reduce's
      double total = 0;
      for (int i = 0; i < n; ++i) {
        double out = 0;
        for (auto b : bytes_sent(plan, op, members[i])) out += static_cast<double>(b);
        sent[members[i]] += out;
        total += out;
      }
      split(total, ring_net);
      break;
    }
    case OpKind::all_to_all: {
      // Each member's send buffer minus its own part, spread evenly over its peers.
      for (int i = 0; i < n; ++i) {
        double out = 0;
        for (auto b : bytes_sent(plan, op, members[i])) out += static_cast<double>(b);
        int same_node = 0;
        for (int j = 0; j < n; ++j)
          if (j != i && node_of[j] == node_of[i]) ++same_node;
        const double net = static_cast<double>(n - 1 - same_node) / (n - 1);
        t.network += out * net;
        t.intra += out * (1 - net);
        sent[members[i]] += out;
      }
      break;
    }
    default:
      break;
  }
  return t;
}

}  // namespace

ResultRecord analytic_record(const StepPlan& plan, const ClusterSpec& cluster) {
  const DeviceMesh& mesh = plan.mesh();
  const int world = mesh.world_size();
  const int gpn = physical_gpus_per_node(cluster, mesh);
  const PlanIndex index(plan);
  std::vector<StepMeasurement> steps;
  std::vector<std::vector<CollectiveMeasurement>> collectives;
  for (const StepPatternSpec& pattern : step_patterns(plan)) {
    const StepEstimate e = estimate_step(plan, cluster, pattern.step);
    StepMeasurement m;
    m.step = pattern.step;
    m.count = pattern.count;
    m.time_s = e.step_time_s;
    m.ranks = e.ranks;
    m.phase_busy_s = e.phase_busy_s;
    m.phase_end_s = e.phase_end_s;
    m.bytes_sent.assign(world, 0);
    m.bytes_received.assign(world, 0);
    std::vector<CollectiveMeasurement> per_op;
    for (const Op& op : plan.ops) {
      if (!plan.active_in_step(op, pattern.step)) continue;
      if (is_compute(op.kind)) {
        for (int r : op.ranks.ranks(mesh)) m.flops += op_flops(plan, op, r);
        continue;
      }
      if (!is_collective(op.kind)) continue;
      const bool split = op.kind == OpKind::split_newton_schulz;
      if (split)
        for (int r : op.ranks.ranks(mesh)) m.flops += op_flops(plan, op, r);
      CollectiveMeasurement c;
      c.op = op.id;
      index.for_each_instance(op.id, [&](int leader) {
        const std::vector<int> group = index.members(op.id, leader);
        const std::vector<int> members = index.participants(op.id, leader);
        const int sizer = members.size() == 2 && index.is_pair(op.id) ? members.front() : leader;
        const double bytes = static_cast<double>(collective_bytes(plan, op, sizer));
        c.group_size = static_cast<int>(members.size());
        c.bytes_sum += bytes;
        if (members.front() / gpn != members.back() / gpn) c.crosses_nodes = true;
        const AllReduceAlgorithm algorithm =
            op.kind == OpKind::all_reduce
                ? all_reduce_algorithm(static_cast<int>(members.size()), bytes,
                                       link_for_group(cluster, mesh, members, op.kind))
                : AllReduceAlgorithm::ring;
        const InstanceTraffic t =
            closed_form_traffic(plan, op, group, gpn, algorithm, m.bytes_sent);
        m.intra_node_bytes += t.intra;
        m.network_bytes += t.network;
      });
      // Times as the replay ran them (links shared with whatever was in flight).
      const InstanceTimes& times = e.collectives[op.id];
      c.instances = times.instances;
      c.time_sum = times.time_sum_s;
      c.time_max = times.time_max_s;
      per_op.push_back(c);
    }
    steps.push_back(std::move(m));
    collectives.push_back(std::move(per_op));
  }
  ResultRecord record;
  record.backend = "analytic";
  record.fidelity = "closed_form";
  record.traffic.model = "closed_form";
  fill_record(record, plan, cluster, steps, collectives);
  record.notes.push_back(
      "analytic: alpha-beta closed forms per collective instance (core/cost_model.hpp): link "
      "efficiencies per collective class, per-call launch overhead, NVLS all-reduce where the "
      "cluster has it; concurrent instances share the links they cross (GPU links, NIC links, "
      "PCIe host bridge, oversubscribed leaf uplinks) max-min fairly "
      "(core/engine/link_sharing.hpp)");
  return record;
}

}  // namespace muonbed
