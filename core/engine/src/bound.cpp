// T_bound, the lower bound of core/engine/bound.hpp: per-matrix Newton-Schulz work and span from
// the cost model's compute time, first-gather and last-scatter times from link_for_group's figures,
// and the balanced and longest terms over the rank sets that hold Muon matrices.
#include "core/engine/bound.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <vector>

#include "core/base/errors.hpp"
#include "core/engine/cost_model.hpp"
#include "core/plan/split_ns.hpp"
#include "core/plan/training.hpp"

namespace muonbed {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Rank r runs on GPU r of node r / gpus_per_node, as the cost model and the simulator place it.
int physical_gpn(const ClusterSpec& cluster, const DeviceMesh& mesh) {
  return cluster.gpus_per_node > 0 ? cluster.gpus_per_node : std::max(1, mesh.gpus_per_node());
}

// The links a rank receives through (and sends through: links are symmetric).
struct RankLinks {
  double latency_intra_s = 0, latency_network_s = 0;
  double nvlink_Bps = 0;  // from the other GPUs of its node (0: alone on its node)
  double nic_Bps = 0;     // its own NIC (0: one node)
  double node_Bps = 0;    // its node's NICs together
};

RankLinks links_of(const ClusterSpec& cluster, const DeviceMesh& mesh, int rank) {
  const int world = mesh.world_size();
  const int gpn = physical_gpn(cluster, mesh);
  const int node = rank / gpn;
  const int nodes = (world + gpn - 1) / gpn;
  const int first = node * gpn, last = std::min(world, first + gpn) - 1;
  RankLinks l;
  if (last > first) {
    const int peer = rank == first ? first + 1 : first;
    const LinkParams p = link_for_group(cluster, mesh, {rank, peer}, OpKind::gather);
    l.nvlink_Bps = p.bandwidth_Bps;
    l.latency_intra_s = p.latency_s;
  }
  if (nodes > 1) {
    const int other = node == 0 ? 1 : 0;
    const int other_first = other * gpn, other_last = std::min(world, other_first + gpn) - 1;
    const LinkParams p = link_for_group(cluster, mesh, {rank, other_first}, OpKind::gather);
    l.nic_Bps = p.bandwidth_Bps;
    l.latency_network_s = p.latency_s;
    // A ring over both nodes' GPUs pushes each node's NICs together (cost_model.cpp's rule).
    std::vector<int> both;
    for (int r = first; r <= last; ++r) both.push_back(r);
    for (int r = other_first; r <= other_last; ++r) both.push_back(r);
    l.node_Bps = link_for_group(cluster, mesh, both, OpKind::all_gather).bandwidth_Bps;
  }
  return l;
}

// Elements `rank` holds of p when the step starts: the piece the plan's momentum op computes
// there (owner_allgather: the owner's whole matrix), else its shard.
std::int64_t start_numel(const StepPlan& plan, const std::vector<const Op*>& momentum, int p,
                         int rank) {
  const auto& layout = plan.model.params[p].layout;
  if (!layout.holds(plan.mesh(), rank)) return 0;
  const Op* op = momentum.empty() ? nullptr : momentum[p];
  DimSet gathered;
  if (op && op->ranks.contains(plan.mesh(), rank) &&
      (!op->owned_only || plan.assignment.owner[p] == rank))
    gathered = op->gathered;
  return layout.shard_numel(plan.mesh(), rank, gathered);
}

// The least time to bring what `ranks` lack of p into them (or back out): each through its NVLink
// and NIC together, and everything a node lacks through the node's NICs together, plus the
// latency of the slowest path. Each of `ranks` must end with `need` elements (its part).
double transfer_time(const StepPlan& plan, const ClusterSpec& cluster,
                     const std::vector<const Op*>& momentum, int p, const std::vector<int>& ranks,
                     std::int64_t need) {
  // What a rank holds: its start piece for a gather; for a scatter (momentum empty) its shard,
  // the piece of the result it needs back.
  const DeviceMesh& mesh = plan.mesh();
  const int gpn = physical_gpn(cluster, mesh);
  const double width = static_cast<double>(bytes_of(plan.settings.comm_dtype()));
  const std::int64_t full = plan.model.params[p].numel();
  double t = 0;
  bool any = false, network = false;
  std::map<int, int> receivers;  // node -> how many of `ranks` it has
  for (int r : ranks) ++receivers[r / gpn];
  for (int r : ranks) {
    const RankLinks l = links_of(cluster, mesh, r);
    const std::int64_t lacks = std::max<std::int64_t>(0, need - start_numel(plan, momentum, p, r));
    if (lacks == 0) continue;
    any = true;
    const double bw = l.nvlink_Bps + l.nic_Bps;
    if (!(bw > 0))
      throw PlanError("bound: rank " + std::to_string(r) + " has no link to receive '" +
                      plan.model.params[p].name + "'; fix: give the cluster positive bandwidths");
    t = std::max(t, static_cast<double>(lacks) * width / bw);
  }
  for (const auto& [node, count] : receivers) {
    // What the node holds is at most the sum of its ranks' pieces (replicas counted twice).
    std::int64_t held = 0;
    const int first = node * gpn, last = std::min(mesh.world_size(), first + gpn);
    for (int q = first; q < last; ++q) held += start_numel(plan, momentum, p, q);
    const std::int64_t lacking = std::min(full, need * count) - held;
    const RankLinks l = links_of(cluster, mesh, first);
    if (lacking <= 0 || !(l.node_Bps > 0)) continue;
    network = true;
    t = std::max(t, static_cast<double>(lacking) * width / l.node_Bps);
  }
  if (!any && !network) return 0;
  const RankLinks l = links_of(cluster, mesh, ranks.front());
  return t + (network ? l.latency_network_s : l.latency_intra_s);
}

struct MatrixTerms {
  int p = -1;
  RankBox box;  // holders
  double work = 0, span = 0, gather = 0, scatter = 0;
};

bool box_inside(const RankBox& inner, const RankBox& outer) {
  for (std::size_t d = 0; d < outer.coord.size(); ++d)
    if (outer.coord[d] != RankBox::kAll && inner.coord[d] != outer.coord[d]) return false;
  return true;
}

}  // namespace

StepBound step_bound(const StepPlan& plan, const ClusterSpec& cluster) {
  const DeviceMesh& mesh = plan.mesh();
  const auto& params = plan.model.params;
  std::vector<const Op*> momentum(params.size(), nullptr), split(params.size(), nullptr);
  for (const Op& op : plan.ops) {
    if (op.kind == OpKind::momentum)
      for (int p : op.params) momentum[p] = &op;
    if (op.kind == OpKind::split_newton_schulz)
      for (int p : op.params) split[p] = &op;
  }
  std::vector<MatrixTerms> terms;
  for (int p : plan.model.muon_params()) {
    const auto& layout = params[p].layout;
    MatrixTerms m;
    m.p = p;
    m.box = RankBox::everyone(mesh);
    for (int d = 0; d < mesh.ndims(); ++d)
      if (layout.independent_dims().contains(d)) m.box.coord[d] = layout.placements()[d].coord;
    int owner = plan.assignment.owner.empty() ? Assignment::kNoOwner : plan.assignment.owner[p];
    if (owner == Assignment::kNoOwner) owner = m.box.ranks(mesh).front();
    if (split[p] != nullptr) {
      // The members of the owner's split group each end with their slice of the matrix.
      const Op& op = *split[p];
      const std::vector<int> members = mesh.group_members(owner, op.group);
      const SplitNsCost c = split_ns_cost(plan, op, p, owner, cluster);
      m.work = c.compute_s * static_cast<double>(members.size());
      m.span = c.compute_s + c.all_reduce_s;
      const std::int64_t part = layout.shard_numel(mesh, owner, op.gathered);
      m.gather = transfer_time(plan, cluster, momentum, p, members, part);
      m.scatter = transfer_time(plan, cluster, {}, p, members, part);
    } else {
      Op ns;
      ns.kind = OpKind::newton_schulz;
      ns.ranks = RankBox::single(mesh, owner);
      ns.params = {p};
      ns.ns_steps = plan.settings.ns_steps();
      m.work = m.span = compute_time(plan, ns, owner, cluster);
      m.gather = transfer_time(plan, cluster, momentum, p, {owner}, params[p].numel());
      m.scatter = transfer_time(plan, cluster, {}, p, {owner}, params[p].numel());
    }
    terms.push_back(m);
  }
  StepBound b;
  if (terms.empty()) return b;
  for (const auto& m : terms) b.ns_total_s += m.work;

  // Longest term.
  double longest = 0;
  const MatrixTerms* arg = nullptr;
  for (const auto& m : terms) {
    b.ns_longest_s = std::max(b.ns_longest_s, m.span);
    const double t = m.gather + m.span + m.scatter;
    if (t > longest) {
      longest = t;
      arg = &m;
    }
  }
  b.bound_s = longest;
  b.binding = "longest";
  b.gather_s = arg->gather;
  b.scatter_s = arg->scatter;
  b.owner_ranks = 1;
  b.longest = params[arg->p].name;

  // Balanced terms over each distinct holders box and their union.
  std::vector<RankBox> boxes;
  for (const auto& m : terms)
    if (std::find(boxes.begin(), boxes.end(), m.box) == boxes.end()) boxes.push_back(m.box);
  std::vector<char> in_union(static_cast<std::size_t>(mesh.world_size()), 0);
  for (const RankBox& box : boxes)
    for (int r : box.ranks(mesh)) in_union[r] = 1;
  const int union_ranks = static_cast<int>(std::count(in_union.begin(), in_union.end(), 1));
  auto consider = [&](double work, int ranks, double g, double s) {
    if (ranks <= 0) return;
    b.ns_balanced_s = std::max(b.ns_balanced_s, work / ranks);
    const double t = work / ranks + g + s;
    if (t > b.bound_s) {
      b.bound_s = t;
      b.binding = "balanced";
      b.gather_s = g;
      b.scatter_s = s;
      b.owner_ranks = ranks;
    }
  };
  for (const RankBox& box : boxes) {
    double work = 0, g = kInf, s = kInf;
    for (const auto& m : terms) {
      if (!box_inside(m.box, box)) continue;
      work += m.work;
      g = std::min(g, m.gather);
      s = std::min(s, m.scatter);
    }
    consider(work, static_cast<int>(box.count(mesh)), g, s);
  }
  {
    double g = kInf, s = kInf;
    for (const auto& m : terms) {
      g = std::min(g, m.gather);
      s = std::min(s, m.scatter);
    }
    consider(b.ns_total_s, union_ranks, g, s);
  }
  // A training step (core/plan/training.hpp) cannot end before any rank has run its forward and
  // backward passes: the sum of their compute times on the busiest rank (compute shares a GPU,
  // it never runs faster beside other work).
  std::vector<double> training(static_cast<std::size_t>(mesh.world_size()), 0.0);
  TrainingCosts costs(plan);  // each op signature priced once per rank, not per micro-batch
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
    for (int r : op.ranks.ranks(mesh)) training[r] += compute_time(plan, op, r, cluster, &costs);
  }
  for (double t : training) b.training_compute_s = std::max(b.training_compute_s, t);
  if (b.training_compute_s > b.bound_s) {
    b.bound_s = b.training_compute_s;
    b.binding = "training compute";
  }
  return b;
}

}  // namespace muonbed
