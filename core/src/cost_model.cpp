// Analytic step-time model: nccl-tests bus factors, the link a collective instance sees on a
// modelled cluster, alpha-beta closed forms per collective, compute at the GPU's sustained rate
// (or HBM bandwidth for memory-bound ops), and a replay of a plan on core/engine.hpp's execution
// engine with these durations on a virtual clock, which yields each rank's finish time and its
// busy, exposed-communication and idle time (see "The replay" below).
#include "core/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/engine.hpp"
#include "core/errors.hpp"
#include "core/results.hpp"
#include "core/split_ns.hpp"
#include "core/timeline.hpp"

namespace muonbed {

namespace {

constexpr double kGB = 1e9;
constexpr double kMicro = 1e-6;

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
// The replay: core/engine.hpp's semantics on a virtual clock.
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
  std::int64_t key_count = 1;
  std::int64_t starts = 0;  // compute: ranks of the box; collective: instances
  std::int64_t left = 0;    // starts left in this step; the cache goes at zero
  std::vector<double> cache;
};

class AnalyticReplay final : public OpHandler {
 public:
  AnalyticReplay(const StepPlan& plan, const ClusterSpec& cluster);
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
  double cached(int op, int rank, Eval eval);
  void due(int op, double t, int item);

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
};

AnalyticReplay::AnalyticReplay(const StepPlan& plan, const ClusterSpec& cluster)
    : plan_(plan),
      cluster_(cluster),
      index_(plan),
      timeline_(index_.world_size(), index_.num_ops(), 0),
      engine_(index_, *this, index_.all_ranks()),
      gpn_(physical_gpus_per_node(cluster, plan.mesh())) {
  const DeviceMesh& mesh = plan.mesh();
  const int nops = index_.num_ops();
  const int nparams = static_cast<int>(plan.model.params.size());
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
    for (int k = static_cast<int>(walk.size()) - 1; k >= 0; --k)
      if (relevant.contains(walk[k])) {
        c.key.emplace_back(walk[k], c.key_count);
        c.key_count *= mesh.size(walk[k]);
      }
  }
}

template <typename Eval>
double AnalyticReplay::cached(int op, int rank, Eval eval) {
  OpCost& c = cost_[op];
  if (!c.cacheable) return eval();
  if (c.cache.empty()) c.cache.assign(c.key_count, std::numeric_limits<double>::quiet_NaN());
  std::int64_t key = 0;
  for (const auto& [d, mult] : c.key) key += index_.coord(rank, d) * mult;
  double& slot = c.cache[key];
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
      cached(op, rank, [&] { return compute_seconds(plan_, o, rank, cluster_); });
  if (--cost_[op].left == 0) std::vector<double>().swap(cost_[op].cache);
  timeline_.begin(rank, Activity::compute, now_);
  due(op, now_ + seconds, rank);
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
  if (--cost_[op].left == 0) std::vector<double>().swap(cost_[op].cache);
  ProfileBuilder builder(gpn_, nodes_per_leaf(cluster_));
  if (index_.is_pair(op)) {
    builder.add(std::min(members[0], members[1]));
    builder.add(std::max(members[0], members[1]));
  } else {
    for (int m : members) builder.add(m);  // ascending
  }
  const LinkParams link = link_from_profile(cluster_, gpn_, builder.finish(), o.kind);
  // Split Newton-Schulz is compute with all-reduces inside (core/split_ns.hpp): its members
  // start together like a collective's, and its time counts as compute.
  const bool split = o.kind == OpKind::split_newton_schulz;
  const double seconds =
      split ? cached(op, instance.leader,
                     [&] { return split_ns_time(plan_, o, instance.leader, cluster_); })
            : collective_time(o.kind, static_cast<int>(members.size()), bytes, link);
  for (int m : members)
    timeline_.begin(m, split ? Activity::compute : Activity::communication, now_);
  if (instance.id >= static_cast<int>(members_.size())) members_.resize(instance.id + 1);
  members_[instance.id] = members;
  due(op, now_ + seconds, instance.id);
}

StepEstimate AnalyticReplay::run(int step) {
  timeline_.begin_step();
  heap_.clear();
  batches_.clear();
  free_batches_.clear();
  open_batch_.assign(index_.num_ops(), -1);
  seq_ = 0;
  now_ = 0;
  for (int i = 0; i < index_.num_ops(); ++i) {
    cost_[i].left = cost_[i].starts;
    cost_[i].cache.clear();
  }
  engine_.begin_step(step);
  while (!heap_.empty()) {
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
        timeline_.end(rank, Activity::compute, now_);
        timeline_.touch_finish(rank, now_);
        engine_.finish_compute(rank, op);
      }
    } else {
      const Activity activity = plan_.ops[op].kind == OpKind::split_newton_schulz
                                    ? Activity::compute
                                    : Activity::communication;
      for (int instance : done_) {
        for (int m : members_[instance]) {
          timeline_.end(m, activity, now_);
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
  out.ranks.resize(m.ranks.size());
  for (std::size_t r = 0; r < m.ranks.size(); ++r) {
    const TimeBreakdown& t = m.ranks[r];
    out.ranks[r] = {t.compute_s, t.communication_s, t.exposed_comm_s, t.idle_s, t.finish_s};
  }
  return out;
}

}  // namespace

StepEstimate estimate_step(const StepPlan& plan, const ClusterSpec& cluster, int step) {
  if (step < 0) throw PlanError("estimate_step: step " + std::to_string(step) + " is negative");
  return AnalyticReplay(plan, cluster).run(step);
}

EstimateSummary estimate(const StepPlan& plan, const ClusterSpec& cluster) {
  const std::vector<StepPatternSpec> patterns = step_patterns(plan);
  AnalyticReplay replay(plan, cluster);
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
