// Analytic step-time model: nccl-tests bus factors, the link a collective instance sees on a
// modelled cluster, alpha-beta closed forms per collective, compute at the GPU's sustained rate
// (or HBM bandwidth for memory-bound ops), and a replay of a plan on core/engine/engine.hpp's
// execution engine with these durations on a virtual clock, which yields each rank's finish time
// and its busy, exposed-communication and idle time (see "The replay" below).
#include "core/engine/cost_model.hpp"

#include "core/plan/training.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/base/errors.hpp"
#include "core/engine/engine.hpp"
#include "core/engine/link_sharing.hpp"
#include "core/engine/measurement.hpp"
#include "core/engine/timeline.hpp"
#include "core/plan/split_ns.hpp"

namespace muonbed {

namespace {

constexpr double kGB = 1e9;
constexpr double kMicro = 1e-6;

// Where a group's members sit: enough to pick its links. Built from members in ascending rank
// order (nodes then come in nondecreasing order, so per-node counts are runs).
struct GroupProfile {
  int members = 0;
  int nodes = 0;
  int min_per_node = 0;
  int max_per_node = 0;
  int leaves = 0;  // fat-tree leaves the group's nodes sit under (runs: nodes come in order)
  int pods = 0;    // and 3-level pods
};

class ProfileBuilder {
 public:
  ProfileBuilder(int gpus_per_node, const ClusterSpec& cluster)
      : gpus_per_node_(gpus_per_node), cluster_(&cluster) {}

  void add(int rank) {
    const int node = rank / gpus_per_node_;
    if (p_.members > 0 && node != node_) close_run();
    if (p_.members == 0 || node != node_) {
      const int leaf = fat_tree_leaf(*cluster_, node), pod = fat_tree_pod(*cluster_, node);
      if (p_.members == 0 || leaf != leaf_) ++p_.leaves;
      if (p_.members == 0 || pod != pod_) ++p_.pods;
      node_ = node;
      leaf_ = leaf;
      pod_ = pod;
      run_ = 0;
      ++p_.nodes;
    }
    ++run_;
    ++p_.members;
  }

  GroupProfile finish() {
    if (p_.members > 0) close_run();
    GroupProfile out = p_;
    *this = ProfileBuilder(gpus_per_node_, *cluster_);
    return out;
  }

 private:
  void close_run() {
    p_.min_per_node = p_.nodes == 1 ? run_ : std::min(p_.min_per_node, run_);
    p_.max_per_node = std::max(p_.max_per_node, run_);
  }

  int gpus_per_node_;
  const ClusterSpec* cluster_;
  GroupProfile p_;
  int node_ = -1, leaf_ = -1, pod_ = -1;
  int run_ = 0;
};

// The physical placement of ranks: rank r runs on GPU r, node r / gpus_per_node of the cluster
// (the simulator numbers GPUs the same way). The mesh's own gpus_per_node is used only when the
// cluster does not give one.
int physical_gpus_per_node(const ClusterSpec& cluster, const DeviceMesh& mesh) {
  return cluster.gpus_per_node > 0 ? cluster.gpus_per_node : std::max(1, mesh.gpus_per_node());
}

constexpr double kUnbounded = std::numeric_limits<double>::infinity();

// Per-rank bandwidth when a fraction `cross` of a member's traffic goes to other nodes (at
// `network` per rank) and the rest stays on the node (at `intra`), both at once.
double overlapped_bandwidth(double cross, double intra, double network) {
  if (!(cross > 0)) return intra;
  if (!(cross < 1)) return network;
  return std::min(network / cross, intra / (1 - cross));
}

// The link rules.
//
// Inside one node: NVSwitch gives every GPU its per-GPU bandwidth and latency, PCIe its link
// bandwidth (a host bridge, pcie_switch_GBps, is a shared link of the replay). Every link class
// runs at its efficiency for the kind's collective class (cluster.efficiency).
//
// Across nodes: the crossing latency = NIC latency + switch hops x switch latency (single switch
// or one leaf: 1 hop; across leaves 3, across pods 5: core/config/cluster.hpp), the group's worst
// path for most kinds; a ring's edges pay their own (ring_latency); steps inside a node keep the
// intra-node latency. Let nic_total = NICs per
// node x NIC bandwidth, let one GPU drive at most max(1, NICs / GPUs per node) NICs (gpu_nic),
// and let m be the fewest and M the most members on a node:
//   ring (all_gather, reduce_scatter, all_reduce, broadcast chain, barrier): NCCL runs one
//     channel per member on a node, each entering and leaving the node once on its own rail, so
//     a rank's per-step traffic leaves the node through up to min(m x gpu_nic, nic_total), and
//     of the m channels a GPU sends on, m-1 stay on NVLink: bandwidth = min(network share,
//     intra x m/(m-1)) (one member per node: the network share).
//   all_to_all: a member's traffic to the n-M members on other nodes leaves through its own NIC
//     (a GPU cannot aggregate NICs: min(gpu_nic, nic_total / M)), the rest goes over NVLink at
//     the same time (NCCL posts every peer at once), so the per-rank bandwidth is what makes both
//     parts take equally long: min(net / f, intra / (1 - f)), f = (n-M)/(n-1).
//   rooted (gather, scatter, send, recv): the same overlap through the root's own NIC (gpu_nic).
// These are figures for one instance alone. What instances in flight at once take from each
// other (NIC links, PCIe links and host bridges, GPU links, the uplinks of an oversubscribed fat
// tree's leaves) is the replay's link sharing (core/engine/link_sharing.hpp), which also holds
// back an instance whose own traffic exceeds a link (two members behind one NIC, a leaf's
// uplinks under an all-to-all); a ring alone crosses a leaf boundary through one node's uplink
// and is not slowed by oversubscription. Rail-optimized wiring does not change these figures.
LinkParams link_from_profile(const ClusterSpec& c, int gpus_per_node, const GroupProfile& g,
                             OpKind kind) {
  const CollectiveClass cls = collective_class(kind);
  const LinkEfficiency& ei = c.efficiency.intra_node;
  const LinkEfficiency& en = c.efficiency.network;
  // A PCIe host bridge is not divided here: how much of it an instance gets depends on what
  // else crosses it (a gather loads it with the root's bytes only, a ring with every member's),
  // which the replay's link sharing counts.
  const double intra_bw = c.intra.bandwidth_GBps * kGB;
  LinkParams link;
  link.intra_latency_s = c.intra.latency_us * kMicro;
  link.latency_s = link.intra_latency_s;
  link.launch_s = c.launch_overhead.collective_us * kMicro;
  link.nodes = std::max(1, g.nodes);
  const int nic_count = std::max(1, c.nic.count_per_node);
  const double nic_bw = c.nic.bandwidth_GBps * kGB;
  const double nic_total = nic_count * nic_bw;
  const double gpu_nic = nic_bw * std::max(1, nic_count / std::max(1, gpus_per_node));
  // Switch hops (core/config/cluster.hpp switch_hops_between): 1 under one leaf, 3 across
  // leaves of a pod, 5 across pods; latency_s is the group's worst path.
  const auto crossing = [&](int hops) {
    return (c.nic.latency_us + hops * c.network.switch_latency_us) * kMicro;
  };
  link.leaves = std::max(1, g.leaves);
  link.pods = std::max(1, g.pods);
  if (g.nodes > 1) {
    link.node_latency_s = crossing(1);
    link.leaf_latency_s = crossing(3);
    link.latency_s = crossing(link.pods > 1 ? 5 : link.leaves > 1 ? 3 : 1);
  }

  // NVLS: the NVSwitch reduces; needs >= 2 members on every node, the same count on each.
  if (kind == OpKind::all_reduce && c.intra.nvls && c.intra.kind == IntraNodeKind::nvswitch &&
      g.min_per_node >= 2 && g.min_per_node == g.max_per_node) {
    NvlsParams& v = link.nvls;
    v.available = true;
    v.per_node = g.min_per_node;
    v.nodes = std::max(1, g.nodes);
    v.latency_s = c.intra.nvls_latency_us * kMicro;
    v.intra_Bps = intra_bw * ei.nvls;
    v.network_Bps = std::min(gpu_nic, nic_total / v.per_node) * en.nvls;
    v.step_latency_s = link.latency_s;
  }

  const double intra = intra_bw * ei.of(cls);
  link.intra_Bps = intra;
  if (g.nodes <= 1) {
    link.bandwidth_Bps = intra;
    return link;
  }
  const int m = std::max(1, g.min_per_node), big_m = std::max(1, g.max_per_node);
  const int n = std::max(1, g.members);
  switch (cls) {
    case CollectiveClass::ring:
    case CollectiveClass::nvls: {
      const double share = std::min(m * gpu_nic, nic_total) * en.of(cls);
      link.network_Bps = share;
      link.bandwidth_Bps = m > 1 ? std::min(share, intra * m / static_cast<double>(m - 1)) : share;
      link.channels = m;
      link.intra_channel_Bps = intra;
      break;
    }
    case CollectiveClass::all_to_all:
    case CollectiveClass::p2p: {
      const double net =
          (cls == CollectiveClass::all_to_all ? std::min(gpu_nic, nic_total / big_m) : gpu_nic) *
          en.of(cls);
      link.network_Bps = net;
      const double cross =
          n > 1 ? static_cast<double>(n - std::min(n, big_m)) / static_cast<double>(n - 1) : 1.0;
      link.bandwidth_Bps = overlapped_bandwidth(cross, intra, net);
      break;
    }
  }
  return link;
}

double checked_bandwidth(double bandwidth_Bps, double bytes, OpKind kind) {
  if (bytes > 0 && !(bandwidth_Bps > 0))
    throw PlanError("collective_time: " + std::string(to_string(kind)) + " of " +
                    std::to_string(bytes) +
                    " bytes over a link with no bandwidth; fix: give the cluster's intra-node "
                    "and NIC bandwidths (GB/s) positive values");
  return bandwidth_Bps;
}

int ceil_log2(int n) {
  int k = 0;
  while ((1LL << k) < n) ++k;
  return k;
}

// Latency of `steps` consecutive steps around a ring of n members (node-contiguous, as NCCL
// and the simulator order them): of its n edges, `nodes` cross nodes, `leaves` of those cross
// leaves and `pods` cross pods (each count 0 when it is 1: the ring stays inside), and the worst
// window of `steps` edges holds ceil(steps x count / n) of each (at most `steps`).
double ring_latency(long steps, int n, const LinkParams& link) {
  if (steps <= 0) return 0;
  if (link.nodes <= 1 || n <= 1) return steps * link.latency_s;
  const auto worst_window = [&](int count) {
    if (count <= 1) return 0L;
    return std::min<long>(
        steps, static_cast<long>(std::ceil(static_cast<double>(steps) * count / n - 1e-9)));
  };
  const long node_edges = worst_window(link.nodes), leaf_edges = worst_window(link.leaves),
             pod_edges = worst_window(link.pods);
  return pod_edges * link.latency_s + (leaf_edges - pod_edges) * link.leaf_latency_s +
         (node_edges - leaf_edges) * link.node_latency_s +
         (steps - node_edges) * link.intra_latency_s;
}

// ------------------------------------------------------------------------------------------------
// Compute durations. Newton-Schulz runs each matrix (or stacked batch, one call) for the time
// gpu.ns_table measured for the chosen kernel version, interpolated in FLOPs; without an entry of
// that version, at the GPU's sustained GEMM rate for its smallest dimension plus one kernel
// launch. Elementwise ops take gpu.elementwise_table's measured time for the elements they touch
// when it has their kind; else they run their few FLOPs at peak, bounded below by their HBM
// traffic at HBM bandwidth (hbm_GBps = 0: not modelled), plus one kernel launch per parameter.
//
// `flops_out` (optional) receives op_flops(plan, op, rank) (training ops: `training`'s): the
// simulator's replay asks both per op and rank, and an elementwise op's elements are counted once
// for both (elementwise_numel walks every param's piece: a tenth of a 1,024-GPU megatron
// optimizer's simulation, counted three times).
double compute_seconds(const StepPlan& plan, const Op& op, int rank, const ClusterSpec& cluster,
                       TrainingCosts* training = nullptr, double* flops_out = nullptr) {
  const GpuSpec& gpu = cluster.gpu;
  const double launch = cluster.launch_overhead.kernel_us * kMicro;
  double t = 0;
  const auto no_rate = [&](double flops) {
    return PlanError("compute_time: op " + std::to_string(op.id) + " (" +
                     std::string(to_string(op.kind)) + ") has " + std::to_string(flops) +
                     " FLOPs but the GPU '" + gpu.name +
                     "' has no compute rate; fix: set gpu.peak_tflops in the cluster");
  };
  if (flops_out != nullptr) *flops_out = 0;
  if (op.kind == OpKind::newton_schulz) {
    if (flops_out != nullptr) *flops_out = op_flops(plan, op, rank);
    for (const MatrixWork& w : ns_work(plan, op, rank)) {
      if (!(w.flops > 0)) continue;
      if (!gpu.ns_kernel.empty()) {
        const double measured =
            gpu.ns_call_seconds(w.rows, w.cols, w.batch, op.ns_steps, gpu.ns_kernel);
        if (measured >= 0) {
          t += measured;
          continue;
        }
      }
      const double rate = gpu.sustained_flops(w.min_dim);
      if (!(rate > 0)) throw no_rate(w.flops);
      t += w.flops / rate + launch;
    }
    // The memory bound holds for the peak-rate estimate only: measured times include it.
    if (gpu.hbm_GBps > 0 && gpu.ns_kernel.empty())
      t = std::max(t, op_memory_bytes(plan, op, rank) / (gpu.hbm_GBps * kGB));
    return t;
  }
  if (op.kind == OpKind::forward || op.kind == OpKind::backward) {
    // The training step: its FLOPs at the profile's training efficiency (published MFU), or at the
    // GEMM-efficiency curve of its smallest GEMM dim, plus one kernel launch.
    const double flops = training ? training->flops(op, rank) : op_flops(plan, op, rank);
    if (flops_out != nullptr) *flops_out = flops;
    if (!(flops > 0)) return 0;
    const double efficiency =
        gpu.training_efficiency > 0
            ? gpu.training_efficiency
            : gpu.efficiency(training ? training->gemm_min_dim(op, rank)
                                      : training_gemm_min_dim(plan, op, rank));
    const double rate = gpu.peak_tflops * 1e12 * efficiency;
    if (!(rate > 0)) throw no_rate(flops);
    return flops / rate + launch;
  }
  const bool timed = op.kind == OpKind::momentum || op.kind == OpKind::apply_update ||
                     op.kind == OpKind::adamw;  // gpu.elementwise_table's kernels
  const bool elementwise = timed || op.kind == OpKind::pack || op.kind == OpKind::unpack;
  const double numel = elementwise ? static_cast<double>(elementwise_numel(plan, op, rank)) : 0.0;
  // op_flops's and op_memory_bytes's rules, on the elements counted once
  const double flops =
      elementwise ? elementwise_flops_per_element(plan, op.kind) * numel : op_flops(plan, op, rank);
  if (flops_out != nullptr) *flops_out = flops;
  if (timed) {
    const double measured =
        gpu.elementwise_seconds(to_string(op.kind), static_cast<std::int64_t>(numel));
    if (measured >= 0) return measured;
  }
  if (flops > 0) {
    if (!(gpu.peak_tflops > 0)) throw no_rate(flops);
    t = flops / (gpu.peak_tflops * 1e12);
  }
  if (gpu.hbm_GBps > 0)
    t = std::max(t, (elementwise ? elementwise_memory_bytes(plan, op.kind, numel)
                                 : op_memory_bytes(plan, op, rank)) /
                        (gpu.hbm_GBps * kGB));
  if (launch > 0) {
    int calls = 0;
    for (int p : op.params)
      if ((!op.owned_only || plan.assignment.owner[p] == rank) &&
          plan.model.params[p].layout.holds(plan.mesh(), rank))
        ++calls;
    t += calls * launch;
  }
  return t;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
double bus_factor(OpKind kind, int group_size) {
  if (group_size < 1)
    throw PlanError("bus_factor: group size " + std::to_string(group_size) + " is below 1");
  const double n = group_size;
  switch (kind) {
    case OpKind::all_reduce:
      return 2.0 * (n - 1) / n;
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
    case OpKind::all_to_all:
    case OpKind::gather:
    case OpKind::scatter:
      return (n - 1) / n;
    case OpKind::broadcast:
    case OpKind::send:
    case OpKind::recv:
      return 1.0;
    case OpKind::barrier:
      return 0.0;  // moves no data
    default:
      throw PlanError("bus_factor: '" + std::string(to_string(kind)) + "' is not a collective");
  }
}

LinkParams link_for_group(const ClusterSpec& cluster, int gpus_per_node,
                          const std::vector<int>& members, OpKind kind) {
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  const int gpn = std::max(1, gpus_per_node);
  ProfileBuilder builder(gpn, cluster);
  for (int r : sorted) builder.add(r);
  return link_from_profile(cluster, gpn, builder.finish(), kind);
}

LinkParams link_for_group(const ClusterSpec& cluster, const DeviceMesh& mesh,
                          const std::vector<int>& members, OpKind kind) {
  return link_for_group(cluster, physical_gpus_per_node(cluster, mesh), members, kind);
}

CollectiveClass collective_class(OpKind kind) {
  switch (kind) {
    case OpKind::gather:
    case OpKind::scatter:
    case OpKind::send:
    case OpKind::recv:
      return CollectiveClass::p2p;
    case OpKind::all_to_all:
      return CollectiveClass::all_to_all;
    default:
      return CollectiveClass::ring;  // all_gather, reduce_scatter, all_reduce, broadcast, barrier
  }
}

std::string_view to_string(AllReduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllReduceAlgorithm::ring:
      return "ring";
    case AllReduceAlgorithm::nvls:
      return "nvls";
    case AllReduceAlgorithm::nvls_tree:
      return "nvls_tree";
  }
  return "?";
}

double all_reduce_time(AllReduceAlgorithm algorithm, int group_size, double total_bytes,
                       const LinkParams& link) {
  const int n = group_size;
  const double S = total_bytes;
  if (n <= 1) return 0;
  if (algorithm == AllReduceAlgorithm::ring)
    return link.launch_s + ring_latency(2L * (n - 1), n, link) +
           (S > 0 ? 2.0 * (n - 1) * S /
                        (n * checked_bandwidth(link.bandwidth_Bps, S, OpKind::all_reduce))
                  : 0);
  const NvlsParams& v = link.nvls;
  const bool tree = v.nodes > 1;
  if (!v.available || tree != (algorithm == AllReduceAlgorithm::nvls_tree)) return kUnbounded;
  const double g = v.per_node;
  double bw = S > 0 ? S * (g + 1) / g / checked_bandwidth(v.intra_Bps, S, OpKind::all_reduce) : 0;
  if (tree && S > 0)
    bw = std::max(bw, 2.0 * (v.nodes - 1) / v.nodes * S / g /
                          checked_bandwidth(v.network_Bps, S, OpKind::all_reduce));
  const double latency =
      v.latency_s + (tree ? 2.0 * (v.nodes - 1) * v.step_latency_s : link.latency_s);
  return link.launch_s + latency + bw;
}

AllReduceAlgorithm all_reduce_algorithm(int group_size, double total_bytes,
                                        const LinkParams& link) {
  if (!link.nvls.available || group_size <= 1) return AllReduceAlgorithm::ring;
  const AllReduceAlgorithm nvls =
      link.nvls.nodes > 1 ? AllReduceAlgorithm::nvls_tree : AllReduceAlgorithm::nvls;
  return all_reduce_time(nvls, group_size, total_bytes, link) <
                 all_reduce_time(AllReduceAlgorithm::ring, group_size, total_bytes, link)
             ? nvls
             : AllReduceAlgorithm::ring;
}

double collective_time(OpKind kind, int group_size, double total_bytes, const LinkParams& link,
                       double min_piece_bytes) {
  if (group_size < 1)
    throw PlanError("collective_time: group size " + std::to_string(group_size) + " is below 1");
  if (total_bytes < 0)
    throw PlanError("collective_time: negative size " + std::to_string(total_bytes));
  if (group_size == 1) return 0;  // nothing leaves the rank
  const int n = group_size;
  const double a = link.latency_s;
  const double S = total_bytes;
  const auto bw = [&](double bytes) {
    return bytes > 0 ? bytes / checked_bandwidth(link.bandwidth_Bps, S, kind) : 0.0;
  };
  switch (kind) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter: {
      // Each ring edge carries everything but its receiver's (or sender's) piece.
      const double p_min = min_piece_bytes >= 0 ? std::min(min_piece_bytes, S) : S / n;
      return link.launch_s + ring_latency(n - 1, n, link) + bw(S - p_min);
    }
    case OpKind::all_reduce:
      return all_reduce_time(all_reduce_algorithm(n, S, link), n, S, link);
    case OpKind::all_to_all: {
      const long rounds = (n - 1 + kAllToAllPeersInFlight - 1) / kAllToAllPeersInFlight;
      return link.launch_s + rounds * a + bw(S * (n - 1) / n);
    }
    case OpKind::gather:
    case OpKind::scatter:  // direct: the root's links carry the n-1 other pieces
      return link.launch_s + a + bw(S * (n - 1) / n);
    case OpKind::broadcast: {
      // Pipelined chains, one per channel (c = the fewest members on a node; 1 inside a node),
      // each channel's S/c cut into k chunks: a hop forwards one chunk at a time, paying its
      // latency each time. Across nodes a channel's hop uses one NIC (B / c of the ring
      // bandwidth); inside a node a GPU's NVLink serves the c-1 channels that stay on it.
      // The steady rate is the slowest hop's; the first chunk pays every hop, and while it
      // fills the chains the channels reach a GPU staggered, so about half of them share it.
      const int channels = link.nodes > 1 ? std::max(1, link.channels) : 1;
      const double per_channel = S / channels;
      const int k = static_cast<int>(std::clamp(std::ceil(per_channel / kBroadcastChunkBytes), 1.0,
                                                static_cast<double>(kBroadcastMaxChunks)));
      const double chunk = per_channel / k;
      if (link.nodes <= 1) {
        const double hop = a + bw(chunk);
        return link.launch_s + (n - 2 + k) * hop;
      }
      const double intra = std::max(1e-300, link.intra_channel_Bps);
      const double net_hop = a + bw(chunk * channels);
      const double intra_steady = link.intra_latency_s + chunk * (channels - 1) / intra;
      const double intra_fill = link.intra_latency_s + chunk * 0.5 * (channels - 1) / intra +
                                (channels > 1 ? 0.0 : chunk / intra);
      const long crossing = std::min<long>(n - 1, link.nodes - 1);
      const double fill = crossing * net_hop + (n - 1 - crossing) * intra_fill;
      return link.launch_s + fill + (k - 1) * std::max(net_hop, intra_steady);
    }
    case OpKind::send:
    case OpKind::recv:
      return link.launch_s + a + bw(S);
    case OpKind::barrier:  // dissemination barrier: ceil(log2 n) rounds of a message each way
      return link.launch_s + 2 * a * ceil_log2(group_size);
    default:
      throw PlanError("collective_time: '" + std::string(to_string(kind)) +
                      "' is not a collective");
  }
}

double compute_time(const StepPlan& plan, const Op& op, int rank, const ClusterSpec& cluster,
                    TrainingCosts* training) {
  return compute_cost(plan, op, rank, cluster, training, false).seconds;
}

ComputeCost compute_cost(const StepPlan& plan, const Op& op, int rank, const ClusterSpec& cluster,
                         TrainingCosts* training, bool with_flops) {
  ComputeCost cost;
  if (is_memory(op.kind)) return cost;
  if (!is_compute(op.kind))
    throw PlanError("compute_time: op " + std::to_string(op.id) + " is a " +
                    std::string(to_string(op.kind)) + ", not a compute op");
  cost.seconds =
      compute_seconds(plan, op, rank, cluster, training, with_flops ? &cost.flops : nullptr);
  return cost;
}

// ------------------------------------------------------------------------------------------------
// The replay: core/engine/engine.hpp's semantics on a virtual clock.
//
// The engine decides when each op starts (stream order, deps, collective members); this handler
// only says how long it takes and keeps the clock. A min-heap holds the completions in flight,
// ordered by time and then by the order they were started (so ties resolve the same way on every
// run); popping one advances the clock and reports it to the engine, which starts whatever it
// unblocks at that instant. Durations are the closed forms above: a compute op takes
// compute_time on its rank; a collective instance starts when the engine starts it (when its last
// member arrives, so early members wait, which shows up as idle time), takes
// collective_time(kind, n, collective_bytes, link of the instance) and completes for every
// participant at once (send/recv: the pair, sized by the sender). StepTimeline turns the begin
// and end events into each rank's compute, communication, exposed-communication and idle time.
//
// Scale: sizes and compute durations are evaluated once per distinct value of the coordinates
// they can depend on (see varying_dims), except for owner-dependent ops (owned_only,
// all_to_all), which are evaluated per rank or instance; an op's cache lives while the op has
// starts left in the step.
namespace {

// The mesh dims along which `layout`'s pieces may differ in size (for any set of gathered
// dims): independent dims (a rank holds the tensor or nothing) and the shard dims of a tensor
// dim that the shards do not split evenly. A tensor dim of size n sharded by mesh dims of sizes
// k1, k2, ... (strided ones with split factors f) is split evenly at every stage, whatever the
// gathered subset, when n is a multiple of the product of all the k and f: then every chunk of
// torch.chunk has the same size. Other dims never change a piece's size.
DimSet varying_dims(const DeviceMesh& mesh, const TensorLayout& layout) {
  const auto& placements = layout.placements();
  const auto& shape = layout.shape();
  if (static_cast<int>(placements.size()) != mesh.ndims()) return DimSet::all(mesh.ndims());
  std::vector<std::int64_t> product(shape.size(), 1);
  DimSet out;
  for (int d = 0; d < mesh.ndims(); ++d) {
    const Placement& pl = placements[d];
    if (pl.kind == PlacementKind::independent) out = out.with(d);
    if (!pl.is_shard()) continue;
    if (pl.tensor_dim < 0 || pl.tensor_dim >= static_cast<int>(shape.size()))
      return DimSet::all(mesh.ndims());
    product[pl.tensor_dim] *= static_cast<std::int64_t>(mesh.size(d)) *
                              (pl.kind == PlacementKind::strided_shard ? pl.split_factor : 1);
  }
  for (int d = 0; d < mesh.ndims(); ++d) {
    const Placement& pl = placements[d];
    if (pl.is_shard() &&
        (product[pl.tensor_dim] <= 0 || shape[pl.tensor_dim] % product[pl.tensor_dim] != 0))
      out = out.with(d);
  }
  return out;
}

// Per op: how its duration (compute) or size (collective) is cached, and the cache itself.
struct OpCost {
  bool cacheable = false;
  // Key of a rank (compute) or instance (collective, by its leader or sender): sum of the
  // coordinates along these dims times their multipliers.
  std::vector<std::pair<int, std::int64_t>> key;
  // Elementwise compute ops (their time depends on a rank only through holds() and shard_numel()
  // of their params): the key takes, instead of each coordinate, the interval between the params'
  // TensorLayout::size_breaks along that dim that holds it, so ranks of one interval share an
  // entry (breaks[i] goes with key[i]; empty: plain coordinates).
  std::vector<std::vector<int>> breaks;
  std::int64_t key_count = 1;
  std::int64_t starts = 0;  // compute: ranks of the box; collective: instances
  std::int64_t left = 0;    // starts left in this step; the cache goes at zero
  std::vector<double> cache;
  std::vector<double> cache_min;  // all_gather / reduce_scatter: the smallest member piece
  // Every member's piece has one size (cacheable, and no param's pieces differ along any mesh
  // dim): it is computed once per step.
  bool uniform_pieces = false;
  double uniform_piece = -1;
};

// Bytes one participant of a collective instance moves, by where they go.
struct MemberTraffic {
  double intra_out = 0, intra_in = 0;  // to and from members on its node
  double cross_out = 0, cross_in = 0;  // to and from other nodes (through its NIC)
  double leaf_out = 0, leaf_in = 0;    // of those, across leaf switches
};

// A ring-class instance (members ascending, volumes[i] bytes through member i: a ring edge
// carries everything but its receiver's piece): inside one node a member sends and receives its
// volume over its link; across nodes
// each node's channels (sim/src/collectives.hpp: one per member on a node, each entering and
// leaving the node once) move `volume` through the node's NICs, spread over its members, and
// the rest stays on the node.
std::vector<MemberTraffic> ring_traffic(const std::vector<int>& members,
                                        const std::vector<double>& volumes,
                                        const ClusterLinks& links) {
  const int n = static_cast<int>(members.size());
  std::vector<MemberTraffic> out(n);
  std::vector<std::pair<int, int>> runs;  // node -> [first, end) of its members
  for (int i = 0; i < n; ++i) {
    const int node = links.node_of(members[i]);
    if (runs.empty() || links.node_of(members[runs.back().first]) != node) runs.emplace_back(i, i);
    runs.back().second = i + 1;
  }
  const int nodes = static_cast<int>(runs.size());
  for (int j = 0; j < nodes; ++j) {
    const int k = runs[j].second - runs[j].first;
    const int node = links.node_of(members[runs[j].first]);
    const int next = links.node_of(members[runs[(j + 1) % nodes].first]);
    const int prev = links.node_of(members[runs[(j + nodes - 1) % nodes].first]);
    for (int i = runs[j].first; i < runs[j].second; ++i) {
      MemberTraffic& t = out[i];
      const double volume = volumes[i];
      if (nodes <= 1) {
        t.intra_out = t.intra_in = volume;
        continue;
      }
      t.cross_out = t.cross_in = volume / k;
      t.intra_out = t.intra_in = volume - volume / k;
      if (links.leaf_of_node(next) != links.leaf_of_node(node)) t.leaf_out = volume / k;
      if (links.leaf_of_node(prev) != links.leaf_of_node(node)) t.leaf_in = volume / k;
    }
  }
  return out;
}

// A member's piece (plan.hpp's piece_bytes), possibly from a cache.
using PieceOf = std::function<double(int rank)>;

// Point-to-point classes (all_to_all, gather, scatter, send/recv): the plan's bytes per peer.
std::vector<MemberTraffic> peer_traffic(const StepPlan& plan, const Op& op,
                                        const std::vector<int>& participants,
                                        const ClusterLinks& links, const PieceOf& piece) {
  const int n = static_cast<int>(participants.size());
  std::vector<MemberTraffic> out(n);
  const auto index_of = [&](int rank) {
    for (int i = 0; i < n; ++i)
      if (participants[i] == rank) return i;
    return -1;
  };
  const auto move = [&](int i, int j, double b) {
    const int from = links.node_of(participants[i]), to = links.node_of(participants[j]);
    if (from == to) {
      out[i].intra_out += b;
      out[j].intra_in += b;
      return;
    }
    out[i].cross_out += b;
    out[j].cross_in += b;
    if (links.leaf_of_node(from) != links.leaf_of_node(to)) {
      out[i].leaf_out += b;
      out[j].leaf_in += b;
    }
  };
  // Rooted kinds move one piece per member (plan.hpp's piece_bytes): O(n), not O(n^2).
  if (op.kind == OpKind::send || op.kind == OpKind::recv) {
    if (n == 2) move(0, 1, piece(participants[0]));
    return out;
  }
  if (op.kind == OpKind::gather || op.kind == OpKind::scatter) {
    const int root = op.root;  // group order is ascending world ranks: participants' order
    for (int i = 0; i < n; ++i) {
      if (i == root) continue;
      const double b = piece(participants[i]);
      if (b <= 0) continue;
      if (op.kind == OpKind::gather)
        move(i, root, b);
      else
        move(root, i, b);
    }
    return out;
  }
  const bool sorted = std::is_sorted(participants.begin(), participants.end());
  // An all-to-all over its whole group: each param's transfers at once (O(params x n), not
  // O(params x n^2)); bytes are whole numbers, so the sums are the same in any order.
  if (op.kind == OpKind::all_to_all && sorted && n == plan.mesh().group_size(op.group) &&
      plan.mesh().group_leader(participants.front(), op.group) == participants.front()) {
    for (const PairBytes& t : all_to_all_transfers(plan, op, participants))
      move(t.from, t.to, static_cast<double>(t.bytes));
    return out;
  }
  for (int i = 0; i < n; ++i) {
    const int rank = participants[i];
    const std::vector<std::int64_t> sent = bytes_sent(plan, op, rank);
    for (int k = 0; k < static_cast<int>(sent.size()); ++k) {
      if (sent[k] <= 0) continue;
      const int peer = plan.mesh().group_member(rank, op.group, k);
      int j = -1;
      if (sorted) {
        const auto it = std::lower_bound(participants.begin(), participants.end(), peer);
        if (it != participants.end() && *it == peer)
          j = static_cast<int>(it - participants.begin());
      } else {
        j = index_of(peer);
      }
      if (j < 0 || j == i) continue;
      move(i, j, static_cast<double>(sent[k]));
    }
  }
  return out;
}

// Seconds of each link the traffic occupies (bytes over capacity at the class's efficiency;
// the routes of sim/src/platform.cpp: on PCIe nodes NIC traffic also crosses the GPU's PCIe link
// and the host bridge; a byte between two GPUs crosses the bridge once).
LinkOccupancy link_occupancy(const std::vector<int>& participants,
                             const std::vector<MemberTraffic>& traffic, const ClusterLinks& links,
                             double intra_efficiency, double network_efficiency) {
  LinkOccupancy out;
  const auto add = [&](int link, double bytes, double efficiency) {
    if (bytes > 0) out.emplace_back(link, bytes / (links.capacity_Bps(link) * efficiency));
  };
  for (std::size_t i = 0; i < participants.size(); ++i) {
    const int r = participants[i];
    const MemberTraffic& t = traffic[i];
    const double via_pcie_out = links.pcie() ? t.cross_out : 0;
    const double via_pcie_in = links.pcie() ? t.cross_in : 0;
    add(links.gpu_out(r), t.intra_out + via_pcie_out, intra_efficiency);
    add(links.gpu_in(r), t.intra_in + via_pcie_in, intra_efficiency);
    add(links.nic_out(r), t.cross_out, network_efficiency);
    add(links.nic_in(r), t.cross_in, network_efficiency);
    if (links.has_bridge())
      add(links.bridge(links.node_of(r)), t.intra_out + t.cross_out + t.cross_in, intra_efficiency);
    if (links.has_leaves()) {
      const int leaf = links.leaf_of_node(links.node_of(r));
      add(links.leaf_up(leaf), t.leaf_out, network_efficiency);
      add(links.leaf_down(leaf), t.leaf_in, network_efficiency);
    }
  }
  return out;
}

// What one collective instance costs alone, and what it asks of the shared links: the closed
// form's latency part and bandwidth part (ring classes: S from the instance's leader; point-to-
// point classes: the busiest member's bytes to its node and to other nodes, so a skewed
// exchange is priced by the receiver it piles onto), and each link's occupancy.
struct InstancePrice {
  double seconds = 0;    // alone
  double latency_s = 0;  // paid after the shared part
  double shared_s = 0;   // occupancy of the busiest link (0: nothing to share)
  LinkOccupancy occupancy;
};

InstancePrice price_instance(const StepPlan& plan, const ClusterSpec& cluster,
                             const ClusterLinks& links, const Op& o,
                             const std::vector<int>& members, double bytes, double min_piece,
                             const LinkParams& link, const PieceOf& piece) {
  const int n = static_cast<int>(members.size());
  // Ring classes move the same S on every member; point-to-point classes are sized per member
  // below (the leader may send nothing while others send a lot: a skewed all-to-all).
  const CollectiveClass cls = collective_class(o.kind);
  const bool per_member = cls == CollectiveClass::all_to_all || cls == CollectiveClass::p2p;
  InstancePrice price;
  if (o.kind == OpKind::barrier || n <= 1 || (!per_member && !(bytes > 0))) {
    price.seconds = collective_time(o.kind, n, bytes, link, min_piece);
    return price;
  }
  // The closed form alone: latency part L and bandwidth part W; the bandwidth part then shares
  // the links with every other instance in flight.
  double intra_eff = cluster.efficiency.intra_node.of(cls);
  double net_eff = cluster.efficiency.network.of(cls);
  double latency = 0, work = 0;
  std::vector<MemberTraffic> traffic;
  switch (cls) {
    case CollectiveClass::ring:
    case CollectiveClass::nvls: {
      double volume = bytes;
      if (o.kind == OpKind::all_reduce) {
        const AllReduceAlgorithm algorithm = all_reduce_algorithm(n, bytes, link);
        latency = all_reduce_time(algorithm, n, 0, link);
        work = all_reduce_time(algorithm, n, bytes, link) - latency;
        if (algorithm != AllReduceAlgorithm::ring) {
          // The NVSwitch reduces: each GPU moves S (g+1)/g over NVLink per direction, and in a
          // tree 2 (N-1)/N S/g through its NIC (cost_model.hpp).
          const NvlsParams& v = link.nvls;
          const double g = std::max(1, v.per_node);
          traffic.assign(n, MemberTraffic{});
          for (MemberTraffic& t : traffic) {
            t.intra_out = t.intra_in = bytes * (g + 1) / g;
            if (v.nodes > 1) t.cross_out = t.cross_in = 2.0 * (v.nodes - 1) / v.nodes * bytes / g;
          }
          intra_eff = cluster.efficiency.intra_node.nvls;
          net_eff = cluster.efficiency.network.nvls;
          break;
        }
        volume = 2.0 * (n - 1) * bytes / n;
      } else {
        latency = collective_time(o.kind, n, 0, link, 0);
        work = collective_time(o.kind, n, bytes, link, min_piece) - latency;
        if (o.kind == OpKind::all_gather || o.kind == OpKind::reduce_scatter)
          volume = bytes - (min_piece >= 0 ? std::min(min_piece, bytes) : bytes / n);
      }
      std::vector<double> volumes(n, volume);
      // Uneven pieces: an edge carries everything but its receiver's piece (even: S - S/n).
      const bool uneven = min_piece >= 0 && std::abs(min_piece * n - bytes) > 0.5 * n;
      if ((o.kind == OpKind::all_gather || o.kind == OpKind::reduce_scatter) && uneven)
        for (int i = 0; i < n; ++i) volumes[i] = std::max(0.0, bytes - piece(members[i]));
      traffic = ring_traffic(members, volumes, links);
      break;
    }
    case CollectiveClass::all_to_all:
    case CollectiveClass::p2p: {
      // Sized by the busiest member: each one's bytes to its node and to other nodes, both at
      // once, over its NVLink and its NIC share (the closed form for even pieces).
      latency = collective_time(o.kind, n, 0, link);
      traffic = peer_traffic(plan, o, members, links, piece);
      for (const MemberTraffic& t : traffic) {
        const double net = std::max(t.cross_out, t.cross_in);
        const double intra = std::max(t.intra_out, t.intra_in);
        if (net > 0) work = std::max(work, net / checked_bandwidth(link.network_Bps, net, o.kind));
        if (intra > 0)
          work = std::max(work, intra / checked_bandwidth(link.intra_Bps, intra, o.kind));
      }
      break;
    }
  }
  if (!(work > 0)) {
    price.seconds = latency + std::max(0.0, work);
    return price;
  }
  // Only the time the instance keeps its busiest link busy is shared; the rest of its closed
  // form (pipeline fill, a ring's wait on its slowest edge) is paid after it like latency, so
  // contention stretches what crosses the links and not the instance's own idle part. An
  // instance whose own traffic exceeds a link (two members behind one NIC) takes that long even
  // alone.
  price.occupancy = link_occupancy(members, traffic, links, intra_eff, net_eff);
  std::sort(price.occupancy.begin(), price.occupancy.end());
  double busiest = 0;
  for (std::size_t i = 0; i < price.occupancy.size();) {
    double on_link = 0;
    std::size_t k = i;
    for (; k < price.occupancy.size() && price.occupancy[k].first == price.occupancy[i].first; ++k)
      on_link += price.occupancy[k].second;
    busiest = std::max(busiest, on_link);
    i = k;
  }
  price.seconds = latency + std::max(work, busiest);
  price.latency_s = latency + std::max(0.0, work - busiest);
  price.shared_s = busiest;
  return price;
}

class AnalyticReplay final : public OpHandler {
 public:
  AnalyticReplay(const StepPlan& plan, const ClusterSpec& cluster, const AnalyticOptions& options);
  StepEstimate run(int step);

  void reached(int rank, int /*op*/) override { timeline_.touch_finish(rank, now_); }
  void start_compute(int rank, int op) override;
  void start_collective(const CollectiveInstance& instance) override;

 private:
  // Completions due at one time: the ranks that finish a compute op, or the instances of a
  // collective op that finish. Starts of one op that end at the same time share a batch (every
  // rank of a box typically starts an op at once and takes as long), which keeps the heap small;
  // the order within a time does not change any figure (the schedule is the earliest one, and
  // the accounting adds nothing over zero time).
  struct Batch {
    int op = -1;
    double t = 0;
    std::vector<int> items;  // compute: ranks; collective: engine instance ids
  };
  struct Due {
    double t = 0;
    std::uint64_t seq = 0;  // ties are taken in the order their batches opened
    int batch = 0;
    bool operator>(const Due& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  template <typename Eval>
  double cached(int op, int rank, Eval eval, bool smallest_piece = false);
  void due(int op, double t, int item);

  AnalyticOptions options_;
  const StepPlan& plan_;
  const ClusterSpec& cluster_;
  PlanIndex index_;
  StepTimeline timeline_;
  Engine engine_;
  int gpn_ = 1;
  std::vector<OpCost> cost_;
  std::vector<int> open_batch_;  // op -> its batch still in the heap, or -1
  std::vector<Batch> batches_;
  std::vector<int> free_batches_;
  std::vector<Due> heap_;
  std::uint64_t seq_ = 0;
  std::vector<std::vector<int>> members_;  // engine instance id -> participants, while running
  std::vector<int> done_;                  // items of the batch being completed
  double now_ = 0;
  HostCommCharge host_comm_;
  // Bandwidth parts of the instances in flight, sharing the cluster's links (link_sharing.hpp).
  struct Flowing {
    double t = 0;
    std::uint64_t seq = 0;
    int instance = 0;
    std::uint64_t version = 0;
    bool operator>(const Flowing& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  void start_sharing(int instance, int op, double latency_s, double work_s,
                     const LinkOccupancy& occupancy);
  void schedule_changed();
  ClusterLinks links_;
  SharedLinks sharing_;
  std::vector<Flowing> flowing_;
  std::vector<std::pair<int, double>> instance_tail_;  // instance -> op, latency after its bytes
  std::vector<double> instance_start_;                 // instance -> when it started
  std::vector<InstanceTimes> instance_times_;          // op -> its instances this step
  // Compute ops of one rank that run at once (a training step's backward and the optimizer on
  // two streams) share the GPU: processor sharing, each of k at 1/k of its speed, as SimGrid's
  // hosts do. Only plans with compute on more than one stream take this path.
  struct PsJob {
    int op = 0;
    double remaining = 0;  // seconds of work left at full speed
  };
  struct PsRank {
    std::vector<PsJob> jobs;
    double last = 0;
    std::uint64_t version = 0;
  };
  struct PsDue {
    double t = 0;
    std::uint64_t seq = 0;
    int rank = 0;
    std::uint64_t version = 0;
    bool operator>(const PsDue& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  void ps_progress(int rank);
  void ps_schedule(int rank);
  void ps_finish(int rank);
  bool processor_sharing_ = false;
  std::vector<PsRank> ps_;
  std::vector<PsDue> ps_heap_;
};

AnalyticReplay::AnalyticReplay(const StepPlan& plan, const ClusterSpec& cluster,
                               const AnalyticOptions& options)
    : options_(options),
      plan_(plan),
      cluster_(cluster),
      index_(plan),
      timeline_(index_.world_size(), index_.num_ops(), 0),
      engine_(index_, *this, index_.all_ranks()),
      gpn_(physical_gpus_per_node(cluster, plan.mesh())),
      host_comm_(plan, cluster),
      links_(cluster, index_.world_size(), gpn_),
      sharing_(links_.count()) {
  if (has_training_ops(plan)) timeline_.track_phases(plan);
  const DeviceMesh& mesh = plan.mesh();
  const int nops = index_.num_ops();
  const int nparams = static_cast<int>(plan.model.params.size());
  {
    std::set<int> compute_streams;
    for (const Op& op : plan.ops)
      if (is_compute(op.kind)) compute_streams.insert(op.stream);
    processor_sharing_ = compute_streams.size() > 1;
  }
  std::vector<DimSet> varying(nparams);
  for (int p = 0; p < nparams; ++p) varying[p] = varying_dims(mesh, plan.model.params[p].layout);
  cost_.resize(nops);
  for (int i = 0; i < nops; ++i) {
    const Op& op = plan.ops[i];
    const std::string where =
        "estimate: op " + std::to_string(i) + (op.label.empty() ? "" : " ('" + op.label + "')");
    const OpClass cls = index_.op_class(i);
    const int n = index_.group_size(i);
    const bool rooted =
        op.kind == OpKind::gather || op.kind == OpKind::scatter || op.kind == OpKind::broadcast;
    if (cls == OpClass::collective && rooted && (op.root < 0 || op.root >= n))
      throw PlanError(where + ": root " + std::to_string(op.root) + " is outside its group of " +
                      std::to_string(n));
    // Which coordinates sizes depend on: the mesh dims along which a param's pieces differ.
    DimSet relevant;
    for (int p : op.params) {
      if (p < 0 || p >= nparams)
        throw PlanError(where + ": parameter " + std::to_string(p) + " is outside the model's " +
                        std::to_string(nparams));
      relevant = relevant | varying[p];
    }
    OpCost& c = cost_[i];
    // Compute ops start once per rank of the box, collectives once per instance: the box's free
    // dims outside the group.
    c.starts = 1;
    std::vector<int> walk;
    for (int d = 0; d < mesh.ndims(); ++d)
      if (op.ranks.coord[d] == RankBox::kAll &&
          (cls != OpClass::collective || !op.group.contains(d))) {
        walk.push_back(d);
        c.starts *= mesh.size(d);
      }
    c.cacheable = !op.owned_only && op.kind != OpKind::all_to_all;
    if (!c.cacheable) continue;
    c.uniform_pieces = relevant.empty();
    const bool elementwise = op.kind == OpKind::momentum || op.kind == OpKind::apply_update ||
                             op.kind == OpKind::adamw || op.kind == OpKind::pack ||
                             op.kind == OpKind::unpack;
    for (int k = static_cast<int>(walk.size()) - 1; k >= 0; --k)
      if (relevant.contains(walk[k])) {
        const int d = walk[k];
        c.key.emplace_back(d, c.key_count);
        if (!elementwise) {
          c.key_count *= mesh.size(d);
          continue;
        }
        std::vector<int> breaks;
        for (int p : op.params) plan.model.params[p].layout.size_breaks(d, breaks);
        std::erase_if(breaks, [&](int b) { return b <= 0 || b >= mesh.size(d); });
        std::sort(breaks.begin(), breaks.end());
        breaks.erase(std::unique(breaks.begin(), breaks.end()), breaks.end());
        c.key_count *= static_cast<std::int64_t>(breaks.size()) + 1;
        c.breaks.resize(c.key.size());
        c.breaks.back() = std::move(breaks);
      }
  }
}

template <typename Eval>
double AnalyticReplay::cached(int op, int rank, Eval eval, bool smallest_piece) {
  OpCost& c = cost_[op];
  if (!c.cacheable) return eval();
  std::vector<double>& cache = smallest_piece ? c.cache_min : c.cache;
  if (cache.empty()) cache.assign(c.key_count, std::numeric_limits<double>::quiet_NaN());
  std::int64_t key = 0;
  for (std::size_t i = 0; i < c.key.size(); ++i) {
    const auto& [d, mult] = c.key[i];
    const int coord = index_.coord(rank, d);
    if (i < c.breaks.size()) {
      const std::vector<int>& b = c.breaks[i];
      key += (std::upper_bound(b.begin(), b.end(), coord) - b.begin()) * mult;
    } else {
      key += coord * mult;
    }
  }
  double& slot = cache[key];
  if (std::isnan(slot)) slot = eval();
  return slot;
}

void AnalyticReplay::due(int op, double t, int item) {
  const int open = open_batch_[op];
  if (open >= 0 && batches_[open].t == t) {
    batches_[open].items.push_back(item);
    return;
  }
  int id;
  if (!free_batches_.empty()) {
    id = free_batches_.back();
    free_batches_.pop_back();
  } else {
    id = static_cast<int>(batches_.size());
    batches_.emplace_back();
  }
  Batch& b = batches_[id];
  b.op = op;
  b.t = t;
  b.items.assign(1, item);
  open_batch_[op] = id;
  heap_.push_back({t, seq_++, id});
  std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
}

void AnalyticReplay::start_compute(int rank, int op) {
  const Op& o = plan_.ops[op];
  const double seconds =
      cached(op, rank, [&] { return compute_seconds(plan_, o, rank, cluster_); }) +
      host_comm_.compute_started(rank, now_);
  if (--cost_[op].left == 0) std::vector<double>().swap(cost_[op].cache);
  timeline_.begin(rank, Activity::compute, now_, op);
  if (!processor_sharing_) {
    due(op, now_ + seconds, rank);
    return;
  }
  ps_progress(rank);
  ps_[rank].jobs.push_back({op, seconds});
  ps_schedule(rank);
}

void AnalyticReplay::ps_progress(int rank) {
  PsRank& r = ps_[rank];
  if (!r.jobs.empty()) {
    const double share = (now_ - r.last) / static_cast<double>(r.jobs.size());
    for (PsJob& j : r.jobs) j.remaining -= share;
  }
  r.last = now_;
}

void AnalyticReplay::ps_schedule(int rank) {
  PsRank& r = ps_[rank];
  ++r.version;
  if (r.jobs.empty()) return;
  double least = r.jobs.front().remaining;
  for (const PsJob& j : r.jobs) least = std::min(least, j.remaining);
  const double t = now_ + std::max(0.0, least) * static_cast<double>(r.jobs.size());
  ps_heap_.push_back({t, seq_++, rank, r.version});
  std::push_heap(ps_heap_.begin(), ps_heap_.end(), std::greater<>());
}

// The jobs of `rank` whose work is done at now_ complete (ties within rounding together).
void AnalyticReplay::ps_finish(int rank) {
  ps_progress(rank);
  PsRank& r = ps_[rank];
  double least = r.jobs.front().remaining;
  for (const PsJob& j : r.jobs) least = std::min(least, j.remaining);
  const double tolerance = 1e-12 * std::max(1.0, now_);
  std::vector<int> finished;
  std::vector<PsJob> left;
  for (const PsJob& j : r.jobs)
    (j.remaining <= least + tolerance ? finished.push_back(j.op) : left.push_back(j));
  r.jobs = std::move(left);
  for (int op : finished) {
    host_comm_.compute_finished(rank, now_);
    timeline_.end(rank, Activity::compute, now_, op);
    timeline_.touch_finish(rank, now_);
    engine_.finish_compute(rank, op);
  }
  ps_progress(rank);
  ps_schedule(rank);
}

void AnalyticReplay::start_collective(const CollectiveInstance& instance) {
  const int op = instance.op;
  const Op& o = plan_.ops[op];
  const std::vector<int>& members = instance.participants;
  // Sized by the instance's leader, or by the sender of a send/recv.
  const int sizer = index_.is_pair(op) ? members.front() : instance.leader;
  const double bytes = o.kind == OpKind::barrier ? 0 : cached(op, sizer, [&] {
    return static_cast<double>(collective_bytes(plan_, o, sizer));
  });
  const double min_piece =
      o.kind == OpKind::all_gather || o.kind == OpKind::reduce_scatter
          ? cached(
                op, sizer, [&] { return smallest_piece_bytes(plan_, o, members); }, true)
          : -1.0;
  if (--cost_[op].left == 0) {
    std::vector<double>().swap(cost_[op].cache);
    std::vector<double>().swap(cost_[op].cache_min);
  }
  ProfileBuilder builder(gpn_, cluster_);
  if (index_.is_pair(op)) {
    builder.add(std::min(members[0], members[1]));
    builder.add(std::max(members[0], members[1]));
  } else {
    for (int m : members) builder.add(m);  // ascending
  }
  const LinkParams link = link_from_profile(cluster_, gpn_, builder.finish(), o.kind);
  // Split Newton-Schulz is compute with all-reduces inside (core/plan/split_ns.hpp): its members
  // start together like a collective's, and its time counts as compute.
  const bool split = o.kind == OpKind::split_newton_schulz;
  host_comm_.collective_started(op, members);
  for (int m : members)
    timeline_.begin(m, split ? Activity::compute : Activity::communication, now_, op);
  if (instance.id >= static_cast<int>(members_.size())) {
    members_.resize(instance.id + 1);
    instance_start_.resize(instance.id + 1);
  }
  members_[instance.id] = members;
  instance_start_[instance.id] = now_;
  if (split) {
    due(op,
        now_ + cached(op, instance.leader,
                      [&] { return split_ns_time(plan_, o, instance.leader, cluster_); }),
        instance.id);
    return;
  }
  OpCost& cost = cost_[op];
  const PieceOf piece = [&](int rank) {
    if (!cost.uniform_pieces) return static_cast<double>(piece_bytes(plan_, o, rank));
    if (cost.uniform_piece < 0)
      cost.uniform_piece = static_cast<double>(piece_bytes(plan_, o, rank));
    return cost.uniform_piece;
  };
  const InstancePrice price =
      price_instance(plan_, cluster_, links_, o, members, bytes, min_piece, link, piece);
  if (!(price.shared_s > 0) || !options_.share_links) {
    due(op, now_ + price.seconds, instance.id);
    return;
  }
  start_sharing(instance.id, op, price.latency_s, price.shared_s, price.occupancy);
}

void AnalyticReplay::start_sharing(int instance, int op, double latency_s, double work_s,
                                   const LinkOccupancy& occupancy) {
  if (instance >= static_cast<int>(instance_tail_.size())) instance_tail_.resize(instance + 1);
  instance_tail_[instance] = {op, latency_s};
  sharing_.add(instance, now_, work_s, occupancy);
}

// New finish times of the instances whose speed changed; their old entries go stale.
void AnalyticReplay::schedule_changed() {
  for (int instance : sharing_.resolve(now_)) {
    flowing_.push_back({sharing_.finish_s(instance), seq_++, instance, sharing_.version(instance)});
    std::push_heap(flowing_.begin(), flowing_.end(), std::greater<>());
  }
}

StepEstimate AnalyticReplay::run(int step) {
  timeline_.begin_step();
  heap_.clear();
  batches_.clear();
  free_batches_.clear();
  open_batch_.assign(index_.num_ops(), -1);
  seq_ = 0;
  now_ = 0;
  host_comm_.begin_step();
  for (int i = 0; i < index_.num_ops(); ++i) {
    cost_[i].left = cost_[i].starts;
    cost_[i].cache.clear();
    cost_[i].cache_min.clear();
    cost_[i].uniform_piece = -1;
  }
  flowing_.clear();
  ps_.assign(processor_sharing_ ? index_.world_size() : 0, PsRank{});
  ps_heap_.clear();
  sharing_ = SharedLinks(links_.count());
  instance_times_.assign(index_.num_ops(), InstanceTimes{});
  engine_.begin_step(step);
  while (true) {
    // Speeds are re-solved once per instant, after every start and end at it.
    const auto stale = [&](const Flowing& f) { return sharing_.version(f.instance) != f.version; };
    while (!flowing_.empty() && stale(flowing_.front())) {
      std::pop_heap(flowing_.begin(), flowing_.end(), std::greater<>());
      flowing_.pop_back();
    }
    while (!ps_heap_.empty() && ps_[ps_heap_.front().rank].version != ps_heap_.front().version) {
      std::pop_heap(ps_heap_.begin(), ps_heap_.end(), std::greater<>());
      ps_heap_.pop_back();
    }
    if (sharing_.pending() && (heap_.empty() || heap_.front().t > now_) &&
        (flowing_.empty() || flowing_.front().t > now_) &&
        (ps_heap_.empty() || ps_heap_.front().t > now_)) {
      schedule_changed();
      continue;
    }
    if (!ps_heap_.empty() && (heap_.empty() || ps_heap_.front().t <= heap_.front().t) &&
        (flowing_.empty() || ps_heap_.front().t < flowing_.front().t)) {
      std::pop_heap(ps_heap_.begin(), ps_heap_.end(), std::greater<>());
      const PsDue d = ps_heap_.back();
      ps_heap_.pop_back();
      now_ = std::max(now_, d.t);
      ps_finish(d.rank);
      continue;
    }
    if (!flowing_.empty() && (heap_.empty() || flowing_.front().t <= heap_.front().t)) {
      std::pop_heap(flowing_.begin(), flowing_.end(), std::greater<>());
      const Flowing f = flowing_.back();
      flowing_.pop_back();
      now_ = std::max(now_, f.t);
      sharing_.remove(f.instance);
      const auto [op, latency] = instance_tail_[f.instance];
      due(op, now_ + latency, f.instance);
      continue;
    }
    if (heap_.empty()) break;
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    const int id = heap_.back().batch;
    heap_.pop_back();
    Batch& b = batches_[id];
    if (open_batch_[b.op] == id) open_batch_[b.op] = -1;
    now_ = b.t;
    const int op = b.op;
    done_.swap(b.items);  // the engine may start (and batch) more while these complete
    free_batches_.push_back(id);
    if (index_.op_class(op) == OpClass::compute) {
      for (int rank : done_) {
        host_comm_.compute_finished(rank, now_);
        timeline_.end(rank, Activity::compute, now_, op);
        timeline_.touch_finish(rank, now_);
        engine_.finish_compute(rank, op);
      }
    } else {
      const Activity activity = plan_.ops[op].kind == OpKind::split_newton_schulz
                                    ? Activity::compute
                                    : Activity::communication;
      InstanceTimes& times = instance_times_[op];
      for (int instance : done_) {
        const double took = now_ - instance_start_[instance];
        ++times.instances;
        times.time_sum_s += took;
        times.time_max_s = std::max(times.time_max_s, took);
        for (int m : members_[instance]) {
          timeline_.end(m, activity, now_, op);
          timeline_.touch_finish(m, now_);
        }
        engine_.finish_collective(instance);
      }
    }
  }
  if (!engine_.step_done())
    throw PlanError("estimate: step " + std::to_string(step) + " of the plan cannot finish:\n" +
                    engine_.stall_report() +
                    "\nfix: check the plan with validate_plan (a collective some members never "
                    "reach, or a dependency that never completes)");
  const StepMeasurement m = timeline_.measurement(step, 1);
  StepEstimate out;
  out.step = step;
  out.step_time_s = m.time_s;
  out.collectives = std::move(instance_times_);
  out.phase_busy_s = m.phase_busy_s;
  out.phase_end_s = m.phase_end_s;
  out.ranks.resize(m.ranks.size());
  for (std::size_t r = 0; r < m.ranks.size(); ++r) {
    const TimeBreakdown& t = m.ranks[r];
    out.ranks[r] = {t.compute_s, t.communication_s, t.exposed_comm_s, t.idle_s, t.finish_s};
  }
  return out;
}

}  // namespace

double smallest_piece_bytes(const StepPlan& plan, const Op& op, const std::vector<int>& members) {
  if (op.kind != OpKind::all_gather && op.kind != OpKind::reduce_scatter) return -1;
  double smallest = -1;
  for (int m : members) {
    const double p = static_cast<double>(piece_bytes(plan, op, m));
    if (smallest < 0 || p < smallest) smallest = p;
  }
  return smallest;
}

double instance_time(const StepPlan& plan, const ClusterSpec& cluster, const Op& op,
                     const std::vector<int>& participants, int leader) {
  const bool pair = op.kind == OpKind::send || op.kind == OpKind::recv;
  const int sizer = pair ? participants.front() : leader;
  const double bytes =
      op.kind == OpKind::barrier ? 0 : static_cast<double>(collective_bytes(plan, op, sizer));
  const LinkParams link = link_for_group(cluster, plan.mesh(), participants, op.kind);
  if (op.kind == OpKind::split_newton_schulz) return split_ns_time(plan, op, leader, cluster);
  std::vector<int> members = participants;
  if (!pair) std::sort(members.begin(), members.end());
  const ClusterLinks links(cluster, plan.mesh().world_size(),
                           physical_gpus_per_node(cluster, plan.mesh()));
  const PieceOf piece = [&](int rank) { return static_cast<double>(piece_bytes(plan, op, rank)); };
  return price_instance(plan, cluster, links, op, members, bytes,
                        smallest_piece_bytes(plan, op, members), link, piece)
      .seconds;
}

HostCommCharge::HostCommCharge(const StepPlan& plan, const ClusterSpec& cluster)
    : plan_(plan),
      seconds_per_message_(cluster.gpu.host_comm_us_per_message * 1e-6),
      seconds_per_byte_(cluster.gpu.host_comm_ns_per_byte * 1e-9) {
  if (active()) begin_step();
}

void HostCommCharge::begin_step() {
  if (!active()) return;
  owed_.assign(static_cast<std::size_t>(plan_.mesh().world_size()), 0.0);
  last_end_.assign(owed_.size(), 0.0);
}

void HostCommCharge::collective_started(int op, const std::vector<int>& participants) {
  if (!active()) return;
  const Op& o = plan_.ops[op];
  if (o.kind == OpKind::barrier || o.kind == OpKind::split_newton_schulz) return;
  for (int rank : participants) {
    std::int64_t bytes = 0, messages = 0;
    for (const auto& per_peer : {bytes_sent(plan_, o, rank), bytes_received(plan_, o, rank)})
      for (std::int64_t b : per_peer) {
        bytes += b;
        messages += b > 0 ? 1 : 0;
      }
    owed_[rank] += seconds_per_message_ * static_cast<double>(messages) +
                   seconds_per_byte_ * static_cast<double>(bytes);
  }
}

void HostCommCharge::compute_finished(int rank, double t) {
  if (active()) last_end_[rank] = t;
}

double HostCommCharge::compute_started(int rank, double t) {
  if (!active()) return 0;
  const double extra = std::max(0.0, owed_[rank] - std::max(0.0, t - last_end_[rank]));
  owed_[rank] = 0;
  return extra;
}

NsSourceSummary ns_time_sources(const StepPlan& plan, const ClusterSpec& cluster) {
  struct Shape {
    std::int64_t rows, cols, batch;
    int steps;
    bool operator<(const Shape& o) const {
      return std::tie(rows, cols, batch, steps) < std::tie(o.rows, o.cols, o.batch, o.steps);
    }
  };
  std::set<Shape> shapes;
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::newton_schulz) continue;
    for (int p : op.params) {
      const auto& param = plan.model.params[p];
      shapes.insert({param.rows(), param.cols(), param.batch(), op.ns_steps});
    }
  }
  NsSourceSummary out;
  const GpuSpec& gpu = cluster.gpu;
  for (const Shape& sh : shapes) {
    NsTimeSource source = NsTimeSource::curve;
    if (!gpu.ns_kernel.empty())
      gpu.ns_call_seconds(sh.rows, sh.cols, sh.batch, sh.steps, gpu.ns_kernel, &source);
    const std::string name = (sh.batch > 1 ? std::to_string(sh.batch) + "x[" : "") +
                             std::to_string(sh.rows) + "x" + std::to_string(sh.cols) +
                             (sh.batch > 1 ? "]" : "");
    switch (source) {
      case NsTimeSource::table:
        ++out.table;
        break;
      case NsTimeSource::interpolated:
        ++out.interpolated;
        break;
      case NsTimeSource::extrapolated:
        ++out.extrapolated;
        out.extrapolated_shapes.push_back(name);
        break;
      case NsTimeSource::curve:
        ++out.curve;
        out.curve_shapes.push_back(name);
        break;
    }
  }
  const auto list = [](const std::vector<std::string>& names) {
    std::string text;
    for (std::size_t i = 0; i < names.size() && i < 8; ++i) text += (i ? ", " : "") + names[i];
    if (names.size() > 8) text += ", ... (" + std::to_string(names.size()) + " in all)";
    return text;
  };
  std::string& n = out.note;
  if (gpu.ns_kernel.empty()) {
    n = "NS times: every shape (" + std::to_string(out.curve) +
        ") from the GEMM-efficiency curve at the GPU's peak (the cluster names no measured "
        "kernel, gpu.ns_kernel)";
    return out;
  }
  n = "NS times (gpu.ns_table " + gpu.ns_kernel + "): " + std::to_string(out.table) +
      " shape(s) from the table, " + std::to_string(out.interpolated) + " interpolated in FLOPs";
  if (out.extrapolated > 0)
    n += ", " + std::to_string(out.extrapolated) + " extrapolated past the table by at most " +
         "2x in FLOPs (" + list(out.extrapolated_shapes) + ")";
  if (out.curve > 0)
    n += ", " + std::to_string(out.curve) +
         " from the GEMM-efficiency curve (past the table by more than 2x in FLOPs: " +
         list(out.curve_shapes) + "; measure them: muonbed calibrate, or bench ns)";
  return out;
}

StepEstimate estimate_step(const StepPlan& plan, const ClusterSpec& cluster, int step,
                           const AnalyticOptions& options) {
  if (step < 0) throw PlanError("estimate_step: step " + std::to_string(step) + " is negative");
  return AnalyticReplay(plan, cluster, options).run(step);
}

EstimateSummary estimate(const StepPlan& plan, const ClusterSpec& cluster,
                         const AnalyticOptions& options) {
  const std::vector<StepPatternSpec> patterns = step_patterns(plan);
  AnalyticReplay replay(plan, cluster, options);
  EstimateSummary out;
  double total = 0;
  bool first = true;
  for (const StepPatternSpec& pattern : patterns) {
    StepEstimate e = replay.run(pattern.step);
    total += e.step_time_s * static_cast<double>(pattern.count);
    if (first || e.step_time_s > out.worst_step_s) {  // patterns come in step order
      out.worst_step_s = e.step_time_s;
      out.worst = std::move(e);
      first = false;
    }
  }
  out.average_step_s = total / static_cast<double>(pattern_steps(patterns));
  return out;
}

}  // namespace muonbed
