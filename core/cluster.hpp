// Modelled clusters as data: GPUs, intra-node fabric, NICs and the inter-node topology. Loaded
// from YAML files under experiments/clusters/ (or inline in an experiment); used by the analytic
// cost model and by the SimGrid backend, which builds its platform from it.
//
// Units are in the key names: bandwidths in GB/s (10^9 bytes/s) per direction, latencies in
// microseconds, compute in TFLOP/s.
#pragma once

#include <string>
#include <vector>

#include "core/errors.hpp"

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

struct GpuSpec {
  std::string name;
  double peak_tflops = 0;  // dense bf16
  double hbm_GBps = 0;     // device memory bandwidth, for memory-bound ops
  double memory_GiB = 0;
  std::vector<EfficiencyPoint> gemm_efficiency;  // empty = 1.0
  double efficiency(double dim) const;
  // Sustained FLOP/s for an op whose smallest matrix dim is `dim`.
  double sustained_flops(double dim) const { return peak_tflops * 1e12 * efficiency(dim); }
};

enum class IntraNodeKind { nvswitch, pcie };

struct IntraNodeSpec {
  IntraNodeKind kind = IntraNodeKind::nvswitch;
  double bandwidth_GBps = 0;  // per GPU, per direction (NVLink) or per PCIe link
  double latency_us = 0;
  double pcie_switch_GBps = 0;  // pcie: shared host bridge bandwidth (0 = not limiting)
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
  SourceLocation origin;  // the file it was loaded from
};

// Strict parsing: unknown keys, wrong types and out-of-range values throw ConfigError with the
// file:line:column, the value and the fix. `file` is used in messages only.
ClusterSpec parse_cluster(const YAML::Node& node, const std::string& file);
ClusterSpec load_cluster_file(const std::string& path);
// A name like "dgx-h100" resolves to <experiments dir>/clusters/dgx-h100.yaml.
std::string find_cluster_file(const std::string& name_or_path, const std::string& relative_to);

}  // namespace muonbed
