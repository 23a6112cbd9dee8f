// Modelled clusters as data: GPUs, intra-node fabric, NICs and the inter-node topology. Loaded
// from YAML files under experiments/clusters/ (or inline in an experiment); used by the analytic
// cost model and by the SimGrid backend, which builds its platform from it.
//
// Units are in the key names: bandwidths in GB/s (10^9 bytes/s) per direction, latencies in
// microseconds, compute in TFLOP/s, kernel times in milliseconds.
//
// What the model takes from a profile, and what `muonbed calibrate` writes into one (a calibrated
// profile is a cluster YAML whose tables are measured, with a `calibration:` block saying how):
//   bandwidth_GBps        each link's line rate (or its achieved rate when no efficiency is given)
//   efficiency            the achievable fraction of a link class's bandwidth per collective class
//                         (NCCL's protocol overhead: ~0.8 of NVLink for SM-driven rings); 1 when
//                         absent
//   launch_overhead_us    fixed cost per collective call and per compute kernel call
//   intra_node.nvls       NVLink SHARP: all-reduce may run in the switch (NVLS inside a node, NVLS
//                         tree across nodes), chosen per call when it is faster, as NCCL's tuner
//                         does
//   gpu.ns_table          measured Newton-Schulz time per call by shape and kernel version,
//                         interpolated in FLOPs; peak x gemm_efficiency (plus the kernel launch
//                         overhead) only where the table has no entry for the chosen version
//   gpu.elementwise_table measured time of one elementwise op (momentum, apply_update, adamw) by
//                         the elements it touches, interpolated in elements; where the table has
//                         no entry for an op kind, its bytes at hbm_GBps (plus launch overhead).
//                         `muonbed calibrate` fills it at the sizes the plans' ops have: on CPU
//                         ranks these ops run at a few GB/s (AdamW is compute-bound there), far
//                         from the bandwidth a cache-resident microbenchmark shows
//   measurements          measured (or published) collective figures with their sources: the
//                         evidence a profile was calibrated from, checked by tests and by
//                         `muonbed compare`
//   calibration           provenance of a calibrated profile (tool, date, host, git hash, backend)
//
// Every key of a profile, with its type, unit, range, default and meaning, is one row of the
// cluster field table (core/config/cluster_fields.hpp) that the parser and the emitter read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/errors.hpp"

namespace YAML {
class Node;
}

namespace muonbed {

// Sustained fraction of peak for a GEMM-like op whose smallest matrix dimension is `dim`;
// interpolated linearly in log2(dim) between points, clamped at the ends.
struct EfficiencyPoint {
  double dim = 0;
  double efficiency = 1.0;
};

// One measured Newton-Schulz call: `batch` matrices of rows x cols (a batched call when batch >
// 1), `steps` iterations, median `ms` per call, with the kernel version it belongs to ("v1",
// "v2": muonbed's kernels, kernels/BENCHMARKS.md; "pytorch": torch.optim.Muon's).
struct NsTiming {
  std::string version;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t batch = 1;
  int steps = 5;
  double ms = 0;
  std::string source;
};

// One measured elementwise op: `kernel` (momentum, apply_update or adamw) over `numel` elements
// of one rank, `ms` per call.
struct ElementwiseTiming {
  std::string kernel;
  std::int64_t numel = 0;
  double ms = 0;
  std::string source;
};

// Where a Newton-Schulz time comes from (GpuSpec::ns_call_seconds).
enum class NsTimeSource { table, interpolated, extrapolated, curve };
std::string_view to_string(NsTimeSource source);
// Past the table's FLOPs by more than this factor, NS times come from the efficiency curve.
inline constexpr double kNsExtrapolationLimit = 2.0;

struct GpuSpec {
  std::string name;
  double peak_tflops = 0;  // dense bf16
  double hbm_GBps = 0;     // device memory bandwidth, for memory-bound ops
  double memory_GiB = 0;
  std::vector<EfficiencyPoint> gemm_efficiency;  // empty = 1.0
  std::vector<NsTiming> ns_table;                // measured NS calls (see ns_call_seconds)
  std::string ns_kernel;  // the kernel version the model times NS with; "" = none chosen
  std::vector<ElementwiseTiming> elementwise_table;  // see elementwise_seconds
  // Ranks that handle their own messages on the core that computes (CPU ranks: the MPI
  // executor's progress points pack, copy and unpack messages between pieces of the compute):
  // that host work per message a rank sends or receives (us) and per byte of them (ns). It fills
  // the rank's idle time first and lengthens its next compute op by the rest (cost_model.hpp
  // HostCommCharge). 0 and 0: the device has its own engines for communication (GPUs).
  double host_comm_us_per_message = 0;
  double host_comm_ns_per_byte = 0;
  // The training step's forward and backward (core/plan/training.hpp): the fraction of peak they
  // sustain, a figure to match published MFU with its source; 0 = the GEMM-efficiency curve at
  // each op's smallest GEMM dim (an upper bound: attention kernels, norms and activations run
  // slower than GEMMs).
  double training_efficiency = 0;
  std::string training_efficiency_source;
  double efficiency(double dim) const;
  // Sustained FLOP/s for an op whose smallest matrix dim is `dim`.
  double sustained_flops(double dim) const { return peak_tflops * 1e12 * efficiency(dim); }
  // Seconds of one NS call of `batch` rows x cols matrices with `steps` iterations on kernel
  // version `version`, from ns_table; negative when the table has no entry of that version.
  // Orientation does not matter (NS works on the transpose of a tall matrix). An entry of the
  // same shape is scaled by batch and steps (the one whose batch is nearest); other shapes are
  // interpolated piecewise linearly in FLOPs per matrix between the version's entries (batched
  // entries for batched calls when there are any, single calls otherwise), below the smallest
  // entry along the line through the two smallest (its intercept is the per-call overhead), and
  // above the largest at the largest entry's FLOP rate.
  //
  // Where the time comes from is told through `source` (when given): table (an entry of the
  // same shape), interpolated (between entries), extrapolated (past the smallest or largest
  // entry by at most 2x in FLOPs per matrix) or curve: past the table by more than 2x, where a
  // line through large shapes would time a small one at a large one's rate (a [128, 768, 2048]
  // expert stack at the rate of [128, 4096, 4096]), so the call is timed from the GEMM-efficiency
  // curve (its FLOPs at sustained_flops of its smallest dimension) plus the per-call overhead
  // the table measured (the intercept of the line through its two smallest entries, when
  // positive); negative when the GPU has no compute rate.
  double ns_call_seconds(std::int64_t rows, std::int64_t cols, std::int64_t batch, int steps,
                         const std::string& version, NsTimeSource* source = nullptr) const;
  // The versions ns_table has entries for, in the order they first appear.
  std::vector<std::string> ns_versions() const;
  // Seconds of one `kernel` op over `numel` elements from elementwise_table: piecewise linear in
  // elements between the kernel's entries, at the nearest entry's rate (seconds per element)
  // outside them; negative when the table has no entry of that kernel.
  double elementwise_seconds(std::string_view kernel, std::int64_t numel) const;
};

// The op kinds elementwise_table may time.
const std::vector<std::string>& elementwise_table_kernels();

enum class IntraNodeKind { nvswitch, pcie };

struct IntraNodeSpec {
  IntraNodeKind kind = IntraNodeKind::nvswitch;
  double bandwidth_GBps = 0;  // per GPU, per direction (NVLink) or per PCIe link
  double latency_us = 0;
  double pcie_switch_GBps = 0;  // pcie: shared host bridge bandwidth (0 = not limiting)
  // NVLink SHARP (nvswitch only): all-reduce can reduce inside the switch. Its fixed cost per
  // call replaces the ring's per-step latencies (NCCL's tuner switches from ring to NVLS at a
  // few MiB; this latency sets where the model switches).
  bool nvls = false;
  double nvls_latency_us = 0;
};

// Collective classes, whose achievable share of a link differs (NCCL's protocols and kernels):
//   ring        all_gather, reduce_scatter, ring all_reduce, the broadcast chain
//   all_to_all  pairwise exchange (NCCL's grouped send/recv to every peer)
//   p2p         direct transfers: gather, scatter, send/recv
//   nvls        NVLink SHARP all-reduce traffic on NVLink; across nodes, the NIC traffic of the
//               NVLS tree all-reduce
enum class CollectiveClass { ring, all_to_all, p2p, nvls };
std::string_view to_string(CollectiveClass cls);

// Achievable fraction of one link class's bandwidth per collective class; 1 = the line rate.
struct LinkEfficiency {
  double ring = 1.0;
  double all_to_all = 1.0;
  double p2p = 1.0;
  double nvls = 1.0;
  double of(CollectiveClass cls) const;
};

struct EfficiencySpec {
  LinkEfficiency intra_node;  // NVLink / PCIe
  LinkEfficiency network;     // NICs
};

// Fixed costs per call, paid once however large the call: a collective's launch and
// synchronization (NCCL's base latency; the ring's per-step latencies come on top), and a compute
// kernel's launch (per parameter an elementwise op touches, per NS call timed by peak x
// efficiency; NS calls timed from gpu.ns_table include theirs).
struct LaunchOverheadSpec {
  double collective_us = 0;
  double kernel_us = 0;
};

// A measured (or published) collective figure: nccl-tests' busbw of `op` on `gpus` GPUs (the
// first `gpus` ranks of the cluster, so gpus / gpus_per_node nodes) at `size_bytes` (nccl-tests'
// S), and where it comes from. `algorithm` names NCCL's algorithm when the source does ("ring",
// "nvls", "nvls_tree"; "" = NCCL's default).
struct MeasuredCollective {
  std::string op;
  int gpus = 0;
  std::int64_t size_bytes = 0;
  double busbw_GBps = 0;
  double time_us = 0;  // 0 = not given (busbw_GBps is)
  std::string algorithm;
  std::string source;
};

// How a calibrated profile was made (free text; empty fields are not written).
struct CalibrationInfo {
  std::string tool;
  std::string date;
  std::string host;
  std::string git_hash;
  std::string backend;
  std::string command;
  std::string notes;
  bool empty() const {
    return tool.empty() && date.empty() && host.empty() && git_hash.empty() && backend.empty() &&
           command.empty() && notes.empty();
  }
};

struct NicSpec {
  int count_per_node = 1;
  double bandwidth_GBps = 0;  // per NIC, per direction
  double latency_us = 0;
  bool rail_optimized = false;  // one NIC per GPU, GPU i uses NIC i
};

enum class TopologyKind { single_switch, fat_tree };

struct NetworkSpec {
  TopologyKind topology = TopologyKind::single_switch;
  int levels = 2;               // fat_tree: 2 or 3
  int nodes_per_leaf = 16;      // fat_tree: downward ports of a leaf switch used by nodes
  double oversubscription = 1;  // fat_tree: 1 = non-blocking
  double switch_latency_us = 0;
};

struct ClusterSpec {
  std::string name;
  std::string source;  // where the numbers come from (citations), free text
  int gpus_per_node = 8;
  int nodes = 1;  // 0 = as many as the experiment's mesh needs
  GpuSpec gpu;
  IntraNodeSpec intra;
  NicSpec nic;
  NetworkSpec network;
  EfficiencySpec efficiency;
  LaunchOverheadSpec launch_overhead;
  std::vector<MeasuredCollective> measurements;
  CalibrationInfo calibration;
  SourceLocation origin;  // the file it was loaded from
};

// Strict parsing: unknown keys, wrong types and out-of-range values throw ConfigError with the
// file:line:column, the value and the fix. `file` is used in messages only.
ClusterSpec parse_cluster(const YAML::Node& node, const std::string& file);
ClusterSpec load_cluster_file(const std::string& path);
// A name like "dgx-h100" resolves to <experiments dir>/clusters/dgx-h100.yaml.
std::string find_cluster_file(const std::string& name_or_path, const std::string& relative_to);

// Switches a message between nodes node_a and node_b passes (the route up to the lowest switch
// level both sit under, and down): 0 on one node; 1 under a single switch or one leaf; 3 through
// a 2-level tree's spine or, in a 3-level tree, the aggregation switch of one pod; 5 across pods
// through the core. A leaf holds nodes_per_leaf nodes, a pod nodes_per_leaf leaves (a leaf's
// radix of uplinks: non-blocking), numbered in node order. network.switch_latency_us is paid
// once per switch: the simulator's paths and the analytic model's latencies both count with this
// (core/config/src/network_paths.cpp).
int switch_hops_between(const ClusterSpec& cluster, int node_a, int node_b);
// The leaf and the pod of a node (0 for every node where the network has no such level).
int fat_tree_leaf(const ClusterSpec& cluster, int node);
int fat_tree_pod(const ClusterSpec& cluster, int node);

}  // namespace muonbed
