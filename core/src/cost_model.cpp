// Analytic step-time model: nccl-tests bus factors, the link a collective instance sees on a
// modelled cluster, alpha-beta closed forms per collective, compute at the GPU's sustained rate
// (or HBM bandwidth for memory-bound ops), and an event-driven replay of a plan that yields each
// rank's finish time and its busy, exposed-communication and idle time. The replay iterates
// boxes and groups arithmetically and keeps only bounded per-rank state, so a 16,384-rank plan
// with thousands of ops replays in seconds (see "The replay" below for the rules).
#include "core/cost_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"

namespace muonbed {

namespace {

constexpr double kGB = 1e9;
constexpr double kMicro = 1e-6;
constexpr double kInf = std::numeric_limits<double>::infinity();

// How a collective's traffic crosses node boundaries (see link_from_profile).
enum class TrafficPattern { ring, rooted, all_to_all };

TrafficPattern pattern_of(OpKind kind) {
  switch (kind) {
    case OpKind::gather:
    case OpKind::scatter:
    case OpKind::send:
    case OpKind::recv:
      return TrafficPattern::rooted;
    case OpKind::all_to_all:
      return TrafficPattern::all_to_all;
    default:
      return TrafficPattern::ring;  // all_gather, reduce_scatter, all_reduce, broadcast
  }
}

// Where a group's members sit: enough to pick its links. Built from members in ascending rank
// order (nodes then come in nondecreasing order, so per-node counts are runs).
struct GroupProfile {
  int members = 0;
  int nodes = 0;
  int min_per_node = 0;
  int max_per_node = 0;
  bool spans_leaves = false;
};

class ProfileBuilder {
 public:
  ProfileBuilder(int gpus_per_node, int nodes_per_leaf)
      : gpus_per_node_(gpus_per_node), nodes_per_leaf_(nodes_per_leaf) {}

  void add(int rank) {
    const int node = rank / gpus_per_node_;
    if (p_.members == 0) {
      first_leaf_ = leaf(node);
    } else if (node != node_) {
      close_run();
    }
    if (p_.members == 0 || node != node_) {
      node_ = node;
      run_ = 0;
      ++p_.nodes;
      if (leaf(node) != first_leaf_) p_.spans_leaves = true;
    }
    ++run_;
    ++p_.members;
  }

  GroupProfile finish() {
    if (p_.members > 0) close_run();
    GroupProfile out = p_;
    *this = ProfileBuilder(gpus_per_node_, nodes_per_leaf_);
    return out;
  }

 private:
  int leaf(int node) const { return nodes_per_leaf_ > 0 ? node / nodes_per_leaf_ : 0; }
  void close_run() {
    p_.min_per_node = p_.nodes == 1 ? run_ : std::min(p_.min_per_node, run_);
    p_.max_per_node = std::max(p_.max_per_node, run_);
  }

  int gpus_per_node_;
  int nodes_per_leaf_;
  GroupProfile p_;
  int node_ = -1;
  int run_ = 0;
  int first_leaf_ = 0;
};

// The physical placement of ranks: rank r runs on GPU r, node r / gpus_per_node of the cluster
// (the simulator numbers GPUs the same way). The mesh's own gpus_per_node is used only when the
// cluster does not give one.
int physical_gpus_per_node(const ClusterSpec& cluster, const DeviceMesh& mesh) {
  return cluster.gpus_per_node > 0 ? cluster.gpus_per_node : std::max(1, mesh.gpus_per_node());
}

int nodes_per_leaf(const ClusterSpec& cluster) {
  return cluster.network.topology == TopologyKind::fat_tree ? cluster.network.nodes_per_leaf : 0;
}

// The link rules.
//
// Inside one node: NVSwitch gives every GPU its per-GPU bandwidth and latency. PCIe gives each
// GPU its link bandwidth, but when pcie_switch_GBps is set the group's members on the node share
// that host bridge: per rank min(link, switch / members on the node).
//
// Across nodes: latency = NIC latency + switch hops x switch latency (single switch: 1 hop; fat
// tree: 1 hop under one leaf, else 2*levels-1 hops, the worst path up to the top level and
// down). Bandwidth per rank = min(intra-node bandwidth, the network's share), where the share
// depends on the traffic pattern. Let nic_total = NICs per node x NIC bandwidth and let one GPU
// drive at most max(1, NICs / GPUs per node) NICs (a GPU reaches its own rail's NIC; a NIC shared
// by several GPUs can be driven by one of them alone):
//   ring (all_gather, reduce_scatter, all_reduce, broadcast chain, barrier): NCCL runs one
//     channel (ring) per NIC, and each ring enters and leaves a node once, so a node's m members
//     together push one rank's per-step traffic through up to min(m x per-GPU NICs, all NICs):
//     share = min over nodes of min(m x gpu_nic, nic_total). A full 8-GPU node with 8 NICs thus
//     reaches the aggregate NIC bandwidth, as nccl-tests measure; one rank per node gets one NIC.
//   all_to_all: nearly all of every member's traffic leaves the node and a GPU cannot aggregate
//     NICs, so share = min(gpu_nic, nic_total / m) with m the largest count of members on a node.
//   rooted (gather, scatter, send, recv): the root's (or the pair's) own NIC is the bottleneck:
//     share = gpu_nic.
// A fat tree with oversubscription > 1 divides the share of groups that span leaves by it.
// Concurrent instances of other groups on the same NICs are not modelled (each instance is costed
// alone); rail-optimized wiring does not change these per-instance figures.
LinkParams link_from_profile(const ClusterSpec& c, int gpus_per_node, const GroupProfile& g,
                             OpKind kind) {
  double intra_bw = c.intra.bandwidth_GBps * kGB;
  if (c.intra.kind == IntraNodeKind::pcie && c.intra.pcie_switch_GBps > 0 && g.max_per_node > 0)
    intra_bw = std::min(intra_bw, c.intra.pcie_switch_GBps * kGB / g.max_per_node);
  if (g.nodes <= 1) return {c.intra.latency_us * kMicro, intra_bw};

  const int nic_count = std::max(1, c.nic.count_per_node);
  const double nic_bw = c.nic.bandwidth_GBps * kGB;
  const double nic_total = nic_count * nic_bw;
  const double gpu_nic = nic_bw * std::max(1, nic_count / std::max(1, gpus_per_node));
  double share = 0;
  switch (pattern_of(kind)) {
    case TrafficPattern::ring:
      share = std::min(g.min_per_node * gpu_nic, nic_total);
      break;
    case TrafficPattern::all_to_all:
      share = std::min(gpu_nic, nic_total / std::max(1, g.max_per_node));
      break;
    case TrafficPattern::rooted:
      share = gpu_nic;
      break;
  }
  int hops = 1;
  if (c.network.topology == TopologyKind::fat_tree && g.spans_leaves) {
    hops = 2 * std::max(1, c.network.levels) - 1;
    if (c.network.oversubscription > 1) share /= c.network.oversubscription;
  }
  return {(c.nic.latency_us + hops * c.network.switch_latency_us) * kMicro,
          std::min(intra_bw, share)};
}

double checked_bandwidth(const LinkParams& link, double bytes, OpKind kind) {
  if (bytes > 0 && !(link.bandwidth_Bps > 0))
    throw PlanError("collective_time: " + std::string(to_string(kind)) + " of " +
                    std::to_string(bytes) +
                    " bytes over a link with no bandwidth; fix: give the cluster's intra-node "
                    "and NIC bandwidths (GB/s) positive values");
  return link.bandwidth_Bps;
}

int ceil_log2(int n) {
  int k = 0;
  while ((1LL << k) < n) ++k;
  return k;
}

// ------------------------------------------------------------------------------------------------
// Compute durations. Newton-Schulz runs each matrix at the GPU's sustained GEMM rate for its
// smallest dimension (ns_work lists them); elementwise ops run their few FLOPs at peak. Either is
// bounded below by the op's HBM traffic at HBM bandwidth (hbm_GBps = 0: not modelled).
double compute_seconds(const StepPlan& plan, const Op& op, int rank, const ClusterSpec& cluster) {
  const GpuSpec& gpu = cluster.gpu;
  double t = 0;
  const auto no_rate = [&](double flops) {
    return PlanError("compute_time: op " + std::to_string(op.id) + " (" +
                     std::string(to_string(op.kind)) + ") has " + std::to_string(flops) +
                     " FLOPs but the GPU '" + gpu.name +
                     "' has no compute rate; fix: set gpu.peak_tflops in the cluster");
  };
  if (op.kind == OpKind::newton_schulz) {
    for (const MatrixWork& w : ns_work(plan, op, rank)) {
      if (!(w.flops > 0)) continue;
      const double rate = gpu.sustained_flops(w.min_dim);
      if (!(rate > 0)) throw no_rate(w.flops);
      t += w.flops / rate;
    }
  } else {
    const double flops = op_flops(plan, op, rank);
    if (flops > 0) {
      if (!(gpu.peak_tflops > 0)) throw no_rate(flops);
      t = flops / (gpu.peak_tflops * 1e12);
    }
  }
  if (gpu.hbm_GBps > 0) t = std::max(t, op_memory_bytes(plan, op, rank) / (gpu.hbm_GBps * kGB));
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

LinkParams link_for_group(const ClusterSpec& cluster, const DeviceMesh& mesh,
                          const std::vector<int>& members, OpKind kind) {
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  const int gpn = physical_gpus_per_node(cluster, mesh);
  ProfileBuilder builder(gpn, nodes_per_leaf(cluster));
  for (int r : sorted) builder.add(r);
  return link_from_profile(cluster, gpn, builder.finish(), kind);
}

double collective_time(OpKind kind, int group_size, double total_bytes, const LinkParams& link) {
  if (group_size < 1)
    throw PlanError("collective_time: group size " + std::to_string(group_size) + " is below 1");
  if (total_bytes < 0)
    throw PlanError("collective_time: negative size " + std::to_string(total_bytes));
  if (group_size == 1) return 0;  // nothing leaves the rank
  const double n = group_size;
  const double a = link.latency_s;
  const double S = total_bytes;
  switch (kind) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
    case OpKind::all_to_all:  // pairwise exchange: n-1 rounds of S/n per peer
      return (n - 1) * (a + (S > 0 ? S / (n * checked_bandwidth(link, S, kind)) : 0));
    case OpKind::all_reduce:  // ring reduce-scatter then ring all-gather
      return 2 * (n - 1) * (a + (S > 0 ? S / (n * checked_bandwidth(link, S, kind)) : 0));
    case OpKind::gather:
    case OpKind::scatter:  // direct: the root's link carries the n-1 other pieces
      return a + (S > 0 ? S * (n - 1) / (n * checked_bandwidth(link, S, kind)) : 0);
    case OpKind::broadcast:
      // Pipelined chain with k chunks: (n-2+k) (a + S/(kB)). With fine chunks (k >> n) the first
      // chunk pays n-1 latencies and the rest streams at B: a(n-1) + S/B, the bound NCCL's
      // pipelined ring broadcast approaches for large messages.
      return a * (n - 1) + (S > 0 ? S / checked_bandwidth(link, S, kind) : 0);
    case OpKind::send:
    case OpKind::recv:
      return a + (S > 0 ? S / checked_bandwidth(link, S, kind) : 0);
    case OpKind::barrier:  // dissemination barrier: ceil(log2 n) rounds of a message each way
      return 2 * a * ceil_log2(group_size);
    default:
      throw PlanError("collective_time: '" + std::string(to_string(kind)) +
                      "' is not a collective");
  }
}

double compute_time(const StepPlan& plan, const Op& op, int rank, const ClusterSpec& cluster) {
  if (is_memory(op.kind)) return 0;
  if (!is_compute(op.kind))
    throw PlanError("compute_time: op " + std::to_string(op.id) + " is a " +
                    std::string(to_string(op.kind)) + ", not a compute op");
  return compute_seconds(plan, op, rank, cluster);
}

// ------------------------------------------------------------------------------------------------
// The replay.
//
// Rules (plan.hpp's execution semantics with closed-form durations):
//  * Ops are visited in plan order, a valid topological order. Per rank and stream we keep the
//    time the stream is free; per op, while a later op still needs it, its completion time on
//    each rank of its box.
//  * A rank is ready for an op at max(its stream free time, the completion on that rank of the
//    op's deps the rank takes part in).
//  * Compute op: starts when ready, takes compute_time. Memory ops (alloc/release) take 0.
//  * Collective: the ranks of the box are grouped into instances (ranks differing only along
//    op.group); an instance starts at the latest ready time of its members, takes
//    collective_time(kind, n, collective_bytes(leader), link of the instance), and completes for
//    all members at once. Members that arrive early wait; the wait is idle time.
//  * send/recv (one op describes both sides of a transfer from group member `root` to member
//    `peer`): per instance the pair starts when both are ready (a rendezvous, as NCCL's
//    send/recv), takes alpha + S/B over the pair's link and completes for both. The other members
//    of the group do nothing: they pass through as an inactive op does.
//  * An op not active in this step (period) takes no time and leaves its stream's free time as
//    it is; its completion, for ops that depend on it, is its ready time, so dependency chains
//    pass through it.
// Busy time is classified by op kind (compute ops vs communication ops), which equals a
// classification of streams whenever a plan keeps compute and communication on separate
// streams and stays right when one stream carries both. Per rank:
//   compute_s = |union of compute intervals|, communication_s = |union of comm intervals|,
//   exposed_comm_s = |comm union minus compute union|, idle_s = step time - |union of all|,
//   finish_s = completion of the rank's last op. So compute_s + exposed_comm_s + idle_s equals
//   the step time on every rank.
// Scale: boxes and groups are walked with odometers (no member vectors); sizes and compute
// durations are evaluated once per distinct value of the coordinates they can depend on (see
// varying_dims), except for owner-dependent ops (owned_only, all_to_all), which are evaluated
// per rank or instance. Per rank, busy intervals are kept only until no later op can overlap
// them (they end before the earliest free time of the rank's streams that still have ops), then
// folded into the sums; back-to-back intervals of one class merge on arrival. Completion times
// are kept per op only until its last dependent has run. Measured on one core of this 2-core
// machine: a synthetic 16,384-rank plan of 4,900 ops (48.7 M rank-op pairs) replays in ~2.5-4 s.
namespace {

// Mesh dims to walk, outermost first (the last one varies fastest: ascending ranks).
struct DimList {
  int n = 0;
  std::array<int, 32> dim{};
  std::array<int, 32> size{};
  std::array<int, 32> stride{};

  void add(const DeviceMesh& mesh, int d) {
    dim[n] = d;
    size[n] = mesh.size(d);
    stride[n] = mesh.stride(d);
    ++n;
  }
  std::int64_t count() const {
    std::int64_t c = 1;
    for (int i = 0; i < n; ++i) c *= size[i];
    return c;
  }
};

// Calls fn(rank) for base + every combination of the dims' coordinates, ranks ascending.
template <typename Fn>
void for_each_rank(int base, const DimList& dims, Fn&& fn) {
  std::array<int, 32> digit{};
  int rank = base;
  while (true) {
    fn(rank);
    int i = dims.n - 1;
    for (; i >= 0; --i) {
      if (++digit[i] < dims.size[i]) {
        rank += dims.stride[i];
        break;
      }
      rank -= (dims.size[i] - 1) * dims.stride[i];
      digit[i] = 0;
    }
    if (i < 0) return;
  }
}

struct OpInfo {
  bool compute = false;
  bool memory = false;
  bool collective = false;
  DimList free;   // free dims of the box
  DimList outer;  // free dims outside the group: one instance per combination
  DimList group;  // the group dims
  std::vector<std::pair<int, int>> fixed;        // (dim, coord) of the box's fixed dims
  std::array<std::int64_t, 32> position_mult{};  // box position = sum coord * mult
  int base = 0;                                  // lowest rank of the box
  std::int64_t count = 0;
  int group_size = 1;
  // Sizes and durations depend only on the coordinates along these dims (when cacheable).
  bool cacheable = false;
  DimList key;
  std::array<std::int64_t, 32> key_mult{};
  int last_use = -1;  // last op that reads this op's completion (as a dep)
};

struct Interval {
  double start = 0;
  double end = 0;
  bool comm = false;
};

struct Event {
  double t = 0;
  int d_compute = 0;
  int d_comm = 0;
};

constexpr std::size_t kFoldMin = 8;

struct RankState {
  std::vector<Interval> pending;
  std::size_t fold_at = kFoldMin;
  double busy = 0, compute = 0, comm = 0, exposed = 0, finish = 0;
};

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

class Replayer {
 public:
  Replayer(const StepPlan& plan, const ClusterSpec& cluster);
  StepEstimate run(int step);

 private:
  bool contains(const OpInfo& info, int rank) const;
  std::int64_t position(const OpInfo& info, int rank) const;
  std::int64_t key_of(const OpInfo& info, int rank) const;
  double ready_at(const Op& op, int rank) const;
  void push(int rank, double start, double end, bool comm);
  void fold(RankState& st, double watermark);
  double compute_duration(const Op& op, const OpInfo& info, int rank, std::vector<double>& cache);
  double bytes_of(const Op& op, const OpInfo& info, int rank, std::vector<double>& cache);
  void pass_through(int index, int rank, bool occupies_stream);

  const StepPlan& plan_;
  const ClusterSpec& cluster_;
  const DeviceMesh& mesh_;
  int nr_ = 1, nd_ = 0, ns_ = 1;
  int gpn_ = 1;
  std::vector<int> coords_;  // rank * nd + dim
  std::vector<OpInfo> info_;
  std::vector<std::vector<int>> frees_at_;  // op index -> ops whose storage can go after it

  // Per step.
  std::vector<double> stream_free_;        // rank * ns + stream
  std::vector<int> remaining_;             // active ops left per rank and stream
  std::vector<std::vector<double>> done_;  // op -> completion per box position
  std::vector<RankState> ranks_;
  std::vector<Event> scratch_;
};

Replayer::Replayer(const StepPlan& plan, const ClusterSpec& cluster)
    : plan_(plan), cluster_(cluster), mesh_(plan.model.mesh) {
  nr_ = mesh_.world_size();
  nd_ = mesh_.ndims();
  gpn_ = physical_gpus_per_node(cluster, mesh_);
  ns_ = std::max<int>(1, static_cast<int>(plan.streams.size()));
  coords_.resize(static_cast<std::size_t>(nr_) * nd_);
  for (int r = 0; r < nr_; ++r)
    for (int d = 0; d < nd_; ++d)
      coords_[static_cast<std::size_t>(r) * nd_ + d] = mesh_.coord(r, d);

  const int nops = static_cast<int>(plan.ops.size());
  const int nparams = static_cast<int>(plan.model.params.size());
  std::vector<DimSet> varying(nparams);
  for (int p = 0; p < nparams; ++p) varying[p] = varying_dims(mesh_, plan.model.params[p].layout);
  info_.resize(nops);
  frees_at_.resize(nops);
  for (int i = 0; i < nops; ++i) {
    const Op& op = plan.ops[i];
    OpInfo& info = info_[i];
    const std::string where =
        "estimate: op " + std::to_string(i) + (op.label.empty() ? "" : " ('" + op.label + "')");
    if (op.stream < 0) throw PlanError(where + ": negative stream " + std::to_string(op.stream));
    ns_ = std::max(ns_, op.stream + 1);
    if (op.period < 1)
      throw PlanError(where + ": period " + std::to_string(op.period) + " is below 1");
    if (static_cast<int>(op.ranks.coord.size()) != nd_)
      throw PlanError(where + ": its rank box has " + std::to_string(op.ranks.coord.size()) +
                      " coordinates for the mesh " + mesh_.describe());
    info.compute = is_compute(op.kind);
    info.memory = is_memory(op.kind);
    info.collective = is_collective(op.kind);
    int base = 0;
    for (int d = 0; d < nd_; ++d) {
      const int c = op.ranks.coord[d];
      if (c == RankBox::kAll) {
        info.free.add(mesh_, d);
        if (op.group.contains(d))
          info.group.add(mesh_, d);
        else
          info.outer.add(mesh_, d);
      } else {
        if (c < 0 || c >= mesh_.size(d))
          throw PlanError(where + ": box coordinate " + std::to_string(c) + " of '" +
                          mesh_.dim(d).name + "' is outside the mesh");
        info.fixed.push_back({d, c});
        base += c * mesh_.stride(d);
      }
    }
    if (info.collective && (op.group.bits & ~op.ranks.free_dims().bits) != 0)
      throw PlanError(where + ": its group spans dims that are not free in its box");
    info.base = base;
    info.count = info.free.count();
    info.group_size = static_cast<int>(info.group.count());
    std::int64_t mult = 1;
    for (int k = info.free.n - 1; k >= 0; --k) {
      info.position_mult[info.free.dim[k]] = mult;
      mult *= info.free.size[k];
    }
    for (int dep : op.deps) {
      if (dep < 0 || dep >= i)
        throw PlanError(where + ": dep " + std::to_string(dep) + " is not an earlier op");
      info_[dep].last_use = std::max(info_[dep].last_use, i);
    }
    const bool rooted = op.kind == OpKind::gather || op.kind == OpKind::scatter ||
                        op.kind == OpKind::broadcast || op.kind == OpKind::send ||
                        op.kind == OpKind::recv;
    if (rooted && (op.root < 0 || op.root >= info.group_size))
      throw PlanError(where + ": root " + std::to_string(op.root) + " is outside its group of " +
                      std::to_string(info.group_size));
    if ((op.kind == OpKind::send || op.kind == OpKind::recv) &&
        (op.peer < 0 || op.peer >= info.group_size || op.peer == op.root))
      throw PlanError(where + ": peer " + std::to_string(op.peer) +
                      " is not another member of its group of " + std::to_string(info.group_size));

    // Which coordinates sizes depend on: the mesh dims along which a param's pieces differ.
    // Owner-dependent ops are evaluated per rank (or per instance).
    DimSet relevant;
    for (int p : op.params) {
      if (p < 0 || p >= nparams)
        throw PlanError(where + ": parameter " + std::to_string(p) + " is outside the model's " +
                        std::to_string(nparams));
      relevant = relevant | varying[p];
    }
    info.cacheable = !op.owned_only && op.kind != OpKind::all_to_all;
    if (info.cacheable) {
      // Collectives are sized once per instance (by its leader), compute ops per rank.
      const DimList& walk = info.collective ? info.outer : info.free;
      for (int k = 0; k < walk.n; ++k)
        if (relevant.contains(walk.dim[k])) info.key.add(mesh_, walk.dim[k]);
      std::int64_t m = 1;
      for (int k = info.key.n - 1; k >= 0; --k) {
        info.key_mult[info.key.dim[k]] = m;
        m *= info.key.size[k];
      }
    }
  }
  for (int i = 0; i < nops; ++i)
    if (info_[i].last_use > i) frees_at_[info_[i].last_use].push_back(i);
}

bool Replayer::contains(const OpInfo& info, int rank) const {
  const int* c = coords_.data() + static_cast<std::size_t>(rank) * nd_;
  for (const auto& [d, v] : info.fixed)
    if (c[d] != v) return false;
  return true;
}

std::int64_t Replayer::position(const OpInfo& info, int rank) const {
  const int* c = coords_.data() + static_cast<std::size_t>(rank) * nd_;
  std::int64_t pos = 0;
  for (int k = 0; k < info.free.n; ++k)
    pos += c[info.free.dim[k]] * info.position_mult[info.free.dim[k]];
  return pos;
}

std::int64_t Replayer::key_of(const OpInfo& info, int rank) const {
  const int* c = coords_.data() + static_cast<std::size_t>(rank) * nd_;
  std::int64_t key = 0;
  for (int k = 0; k < info.key.n; ++k) key += c[info.key.dim[k]] * info.key_mult[info.key.dim[k]];
  return key;
}

double Replayer::ready_at(const Op& op, int rank) const {
  double ready = stream_free_[static_cast<std::size_t>(rank) * ns_ + op.stream];
  for (int dep : op.deps) {
    const OpInfo& di = info_[dep];
    if (!contains(di, rank)) continue;  // a dep the rank does not take part in
    ready = std::max(ready, done_[dep][position(di, rank)]);
  }
  return ready;
}

void Replayer::push(int rank, double start, double end, bool comm) {
  RankState& st = ranks_[rank];
  if (!(end > start)) return;
  // Back-to-back work of one class (the common case on one stream) extends the last interval.
  if (!st.pending.empty()) {
    Interval& last = st.pending.back();
    if (last.comm == comm && start >= last.start && start <= last.end) {
      last.end = std::max(last.end, end);
      return;
    }
  }
  st.pending.push_back({start, end, comm});
  if (st.pending.size() < st.fold_at) return;
  // No later op of this rank starts before the free time of a stream that still has ops.
  double watermark = kInf;
  const std::size_t row = static_cast<std::size_t>(rank) * ns_;
  for (int s = 0; s < ns_; ++s)
    if (remaining_[row + s] > 0) watermark = std::min(watermark, stream_free_[row + s]);
  fold(st, watermark);
}

void Replayer::fold(RankState& st, double watermark) {
  scratch_.clear();
  std::size_t keep = 0;
  for (std::size_t i = 0; i < st.pending.size(); ++i) {
    const Interval iv = st.pending[i];
    if (iv.start >= watermark) {
      st.pending[keep++] = iv;
      continue;
    }
    const double end = std::min(iv.end, watermark);
    scratch_.push_back({iv.start, iv.comm ? 0 : 1, iv.comm ? 1 : 0});
    scratch_.push_back({end, iv.comm ? 0 : -1, iv.comm ? -1 : 0});
    if (iv.end > watermark) st.pending[keep++] = {watermark, iv.end, iv.comm};
  }
  st.pending.resize(keep);
  st.fold_at = std::max(kFoldMin, 2 * keep);
  std::sort(scratch_.begin(), scratch_.end(),
            [](const Event& a, const Event& b) { return a.t < b.t; });
  int n_compute = 0, n_comm = 0;
  double t = scratch_.empty() ? 0 : scratch_.front().t;
  for (const Event& e : scratch_) {
    const double dt = e.t - t;
    if (dt > 0) {
      if (n_compute > 0 || n_comm > 0) st.busy += dt;
      if (n_compute > 0) st.compute += dt;
      if (n_comm > 0) st.comm += dt;
      if (n_comm > 0 && n_compute == 0) st.exposed += dt;
    }
    t = e.t;
    n_compute += e.d_compute;
    n_comm += e.d_comm;
  }
}

double Replayer::compute_duration(const Op& op, const OpInfo& info, int rank,
                                  std::vector<double>& cache) {
  double* slot = nullptr;
  if (info.cacheable) {
    slot = &cache[key_of(info, rank)];
    if (!std::isnan(*slot)) return *slot;
  }
  const double t = compute_seconds(plan_, op, rank, cluster_);
  if (slot != nullptr) *slot = t;
  return t;
}

double Replayer::bytes_of(const Op& op, const OpInfo& info, int rank, std::vector<double>& cache) {
  if (op.kind == OpKind::barrier) return 0;
  double* slot = nullptr;
  if (info.cacheable) {
    slot = &cache[key_of(info, rank)];
    if (!std::isnan(*slot)) return *slot;
  }
  const double bytes = static_cast<double>(collective_bytes(plan_, op, rank));
  if (slot != nullptr) *slot = bytes;
  return bytes;
}

// A rank that takes no part in an op this step: it completes at its ready time, so ops that
// depend on it wait for what it waits for. Only active zero-time ops (alloc, release) occupy
// their stream.
void Replayer::pass_through(int index, int rank, bool occupies_stream) {
  const Op& op = plan_.ops[index];
  const OpInfo& info = info_[index];
  const double ready = ready_at(op, rank);
  const std::size_t slot = static_cast<std::size_t>(rank) * ns_ + op.stream;
  if (occupies_stream) stream_free_[slot] = ready;
  RankState& st = ranks_[rank];
  st.finish = std::max(st.finish, ready);
  if (info.last_use > index) done_[index][position(info, rank)] = ready;
}

StepEstimate Replayer::run(int step) {
  const int nops = static_cast<int>(plan_.ops.size());
  stream_free_.assign(static_cast<std::size_t>(nr_) * ns_, 0.0);
  remaining_.assign(static_cast<std::size_t>(nr_) * ns_, 0);
  done_.assign(nops, {});
  ranks_.assign(nr_, RankState{});

  for (int i = 0; i < nops; ++i) {
    const Op& op = plan_.ops[i];
    if (!plan_.active_in_step(op, step) || info_[i].memory) continue;
    for_each_rank(info_[i].base, info_[i].free,
                  [&](int r) { ++remaining_[static_cast<std::size_t>(r) * ns_ + op.stream]; });
  }

  std::vector<double> cache;
  for (int i = 0; i < nops; ++i) {
    const Op& op = plan_.ops[i];
    const OpInfo& info = info_[i];
    const bool active = plan_.active_in_step(op, step);
    std::vector<double>& done = done_[i];
    const bool keep_done = info.last_use > i;
    if (keep_done) done.assign(info.count, 0.0);
    const auto slot = [&](int r) -> double& {
      return stream_free_[static_cast<std::size_t>(r) * ns_ + op.stream];
    };
    const auto finish = [&](int r, double end) {
      RankState& st = ranks_[r];
      st.finish = std::max(st.finish, end);
      if (keep_done) done[position(info, r)] = end;
    };
    if (info.cacheable) cache.assign(info.key.count(), std::numeric_limits<double>::quiet_NaN());

    if (!active || info.memory) {
      for_each_rank(info.base, info.free, [&](int r) { pass_through(i, r, active); });
    } else if (info.compute) {
      for_each_rank(info.base, info.free, [&](int r) {
        const double ready = ready_at(op, r);
        const double end = ready + compute_duration(op, info, r, cache);
        slot(r) = end;
        --remaining_[static_cast<std::size_t>(r) * ns_ + op.stream];
        finish(r, end);
        push(r, ready, end, false);
      });
    } else {
      const bool pair = op.kind == OpKind::send || op.kind == OpKind::recv;
      ProfileBuilder builder(gpn_, nodes_per_leaf(cluster_));
      for_each_rank(info.base, info.outer, [&](int leader) {
        const auto complete = [&](int m, double start, double end) {
          slot(m) = end;
          --remaining_[static_cast<std::size_t>(m) * ns_ + op.stream];
          finish(m, end);
          push(m, start, end, true);
        };
        if (pair) {
          const int from = mesh_.group_member(leader, op.group, op.root);
          const int to = mesh_.group_member(leader, op.group, op.peer);
          const double start = std::max(ready_at(op, from), ready_at(op, to));
          builder.add(std::min(from, to));
          builder.add(std::max(from, to));
          const LinkParams link = link_from_profile(cluster_, gpn_, builder.finish(), op.kind);
          const double end =
              start + collective_time(op.kind, 2, bytes_of(op, info, from, cache), link);
          for_each_rank(leader, info.group, [&](int m) {
            if (m == from || m == to) {
              complete(m, start, end);
            } else {
              pass_through(i, m, false);
              --remaining_[static_cast<std::size_t>(m) * ns_ + op.stream];
            }
          });
          return;
        }
        double start = 0;
        for_each_rank(leader, info.group, [&](int m) {
          start = std::max(start, ready_at(op, m));
          builder.add(m);
        });
        const LinkParams link = link_from_profile(cluster_, gpn_, builder.finish(), op.kind);
        const double end = start + collective_time(op.kind, info.group_size,
                                                   bytes_of(op, info, leader, cache), link);
        for_each_rank(leader, info.group, [&](int m) { complete(m, start, end); });
      });
    }
    for (int j : frees_at_[i]) std::vector<double>().swap(done_[j]);
  }

  StepEstimate out;
  out.step = step;
  for (const RankState& st : ranks_) out.step_time_s = std::max(out.step_time_s, st.finish);
  out.ranks.resize(nr_);
  for (int r = 0; r < nr_; ++r) {
    RankState& st = ranks_[r];
    fold(st, kInf);
    RankTimes& t = out.ranks[r];
    t.compute_s = st.compute;
    t.communication_s = st.comm;
    t.exposed_comm_s = st.exposed;
    t.idle_s = std::max(0.0, out.step_time_s - st.busy);
    t.finish_s = st.finish;
  }
  return out;
}

// Steps of one hyper-period are replayed once per distinct set of active periods; at most
// kMaxSteps steps are counted (a hyper-period longer than that, which needs periods whose
// least common multiple exceeds a million, is averaged over its first kMaxSteps steps).
constexpr std::int64_t kMaxSteps = std::int64_t{1} << 20;

}  // namespace

StepEstimate estimate_step(const StepPlan& plan, const ClusterSpec& cluster, int step) {
  if (step < 0) throw PlanError("estimate_step: step " + std::to_string(step) + " is negative");
  return Replayer(plan, cluster).run(step);
}

EstimateSummary estimate(const StepPlan& plan, const ClusterSpec& cluster) {
  Replayer replayer(plan, cluster);
  std::vector<int> periods;
  for (const Op& op : plan.ops) periods.push_back(op.period);
  std::sort(periods.begin(), periods.end());
  periods.erase(std::unique(periods.begin(), periods.end()), periods.end());
  std::int64_t steps = 1;
  for (int p : periods) {
    if (p < 1) throw PlanError("estimate: an op has period " + std::to_string(p) + " (below 1)");
    steps = std::min(kMaxSteps, steps / std::gcd(steps, static_cast<std::int64_t>(p)) * p);
  }
  // Pattern of step k: which distinct periods divide k. Count the steps of each pattern.
  std::map<std::vector<bool>, std::pair<std::int64_t, int>> patterns;  // -> (count, first step)
  std::vector<bool> key(periods.size());
  for (std::int64_t k = 0; k < steps; ++k) {
    for (std::size_t i = 0; i < periods.size(); ++i) key[i] = k % periods[i] == 0;
    auto [it, inserted] = patterns.try_emplace(key, 0, static_cast<int>(k));
    ++it->second.first;
  }
  EstimateSummary out;
  double total = 0;
  bool first = true;
  for (const auto& [pattern, count_and_step] : patterns) {
    StepEstimate e = replayer.run(count_and_step.second);
    total += e.step_time_s * static_cast<double>(count_and_step.first);
    if (first || e.step_time_s > out.worst_step_s ||
        (e.step_time_s == out.worst_step_s && e.step < out.worst.step)) {
      out.worst_step_s = e.step_time_s;
      out.worst = std::move(e);
      first = false;
    }
  }
  out.average_step_s = total / static_cast<double>(steps);
  return out;
}

}  // namespace muonbed
