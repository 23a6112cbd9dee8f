// Cluster profiles from YAML: strict parsing of experiments/clusters/*.yaml (and inline or
// overridden clusters inside experiments), the search for a cluster file by name, the GEMM
// efficiency curve, and the emitter that writes a profile back as YAML for provenance.
#include "core/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include <yaml-cpp/yaml.h>

#include "core/src/yaml_util.hpp"
#include "muonbed/config.hpp"

namespace muonbed {

namespace fs = std::filesystem;
using namespace yaml_util;

double GpuSpec::efficiency(double dim) const {
  if (gemm_efficiency.empty()) return 1.0;
  const auto& points = gemm_efficiency;
  if (!(dim > points.front().dim)) return points.front().efficiency;
  if (dim >= points.back().dim) return points.back().efficiency;
  for (std::size_t i = 1; i < points.size(); ++i) {
    if (dim <= points[i].dim) {
      // Linear in log2(dim): GEMM efficiency grows with the matrix size roughly per doubling.
      const double x0 = std::log2(points[i - 1].dim), x1 = std::log2(points[i].dim);
      const double t = (std::log2(dim) - x0) / (x1 - x0);
      return points[i - 1].efficiency + t * (points[i].efficiency - points[i - 1].efficiency);
    }
  }
  return points.back().efficiency;
}

namespace yaml_util {

namespace {

const std::vector<std::string> kClusterKeys = {"name", "source",     "gpus_per_node", "nodes",
                                               "gpu",  "intra_node", "nic",           "network"};
const std::vector<std::string> kGpuKeys = {"name", "peak_tflops", "hbm_GBps", "memory_GiB",
                                           "gemm_efficiency"};
const std::vector<std::string> kIntraKeys = {"kind", "bandwidth_GBps", "latency_us",
                                             "pcie_switch_GBps"};
const std::vector<std::string> kNicKeys = {"count_per_node", "bandwidth_GBps", "latency_us",
                                           "rail_optimized"};
const std::vector<std::string> kNetworkKeys = {"topology", "levels", "nodes_per_leaf",
                                               "oversubscription", "switch_latency_us"};
// Physical ranges of the cluster numbers (README "Limits"): wide enough for a laptop CPU rank
// (experiments/clusters/local-cpu.yaml) and for hardware generations to come, narrow enough that
// every simulated time stays a finite number SimGrid can schedule (bandwidths of 1e308 B/s or
// rates near zero overflow or stall its solver).
constexpr double kMinBandwidthGBps = 0.01, kMaxBandwidthGBps = 1e5;  // 10 MB/s .. 100 TB/s
constexpr double kMaxLatencyUs = 1e5;                                // 0.1 s
constexpr double kMinPeakTflops = 1e-3, kMaxPeakTflops = 1e5;        // 1 GFLOP/s .. 100 PFLOP/s
constexpr double kMinHbmGBps = 0.1, kMaxHbmGBps = 1e6;
constexpr double kMinMemoryGiB = 1e-3, kMaxMemoryGiB = 1e6;
constexpr double kMinEfficiency = 1e-3;
constexpr double kMaxEfficiencyDim = 16777216;  // the largest tensor dim (2^24)
constexpr double kMaxOversubscription = 1000;

std::string sub(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

void read_gemm_efficiency(const Context& ctx, const Field& field, GpuSpec& gpu) {
  const std::string example = "gemm_efficiency: {1024: 0.45, 4096: 0.78, 8192: 0.8}";
  if (!field.value.IsDefined() || field.value.IsNull() || !field.value.IsMap() ||
      field.value.size() == 0)
    fail(ctx, field,
         "'" + field.path + "' must be a non-empty map from matrix dim to efficiency, got " +
             kind_of(field.value) + " " + show(field.value),
         "write " + example);
  std::vector<EfficiencyPoint> points;
  for (const auto& entry : field.value) {
    const Field dim_field{entry.first, entry.first, field.path + " key"};
    const Field eff_field{entry.first, entry.second, field.path + "." + entry.first.Scalar()};
    const double dim = to_double(ctx, dim_field, 1, kMaxEfficiencyDim);
    const double efficiency = to_double(ctx, eff_field, kMinEfficiency, 1);
    if (!points.empty() && dim <= points.back().dim)
      fail(ctx, dim_field,
           "matrix dims in '" + field.path + "' must increase: " + format_number(dim) +
               " follows " + format_number(points.back().dim),
           "list the points in increasing dim order, e.g. " + example);
    points.push_back({dim, efficiency});
  }
  gpu.gemm_efficiency = std::move(points);
}

}  // namespace

void read_cluster_map(const Context& ctx, const YAML::Node& node, const std::string& path,
                      bool complete, ClusterSpec& spec) {
  std::vector<std::string> keys = kClusterKeys;
  if (!complete) keys.push_back("preset");
  const MapReader top(ctx, node, path, keys);
  if (complete) {
    top.require("name", "name: my-cluster");
    top.require("gpus_per_node", "gpus_per_node: 8");
    top.require("gpu", "gpu: {name: H100, peak_tflops: 989, hbm_GBps: 3000, memory_GiB: 80}");
    top.require("intra_node", "intra_node: {kind: nvswitch, bandwidth_GBps: 450, latency_us: 2}");
    top.require("nic", "nic: {count_per_node: 8, bandwidth_GBps: 48, latency_us: 5}");
    top.require("network", "network: {topology: fat_tree}");
  }
  top.read("name", spec.name);
  top.read("source", spec.source);
  top.read("gpus_per_node", spec.gpus_per_node, 1, 1024);
  top.read("nodes", spec.nodes, 0, 1 << 16);

  if (const Field* f = top.find("gpu")) {
    const MapReader gpu(ctx, *f, kGpuKeys);
    if (complete) {
      gpu.require("name", "name: H100-SXM5-80GB");
      gpu.require("peak_tflops", "peak_tflops: 989");
      gpu.require("hbm_GBps", "hbm_GBps: 3000");
      gpu.require("memory_GiB", "memory_GiB: 80");
    }
    gpu.read("name", spec.gpu.name);
    gpu.read("peak_tflops", spec.gpu.peak_tflops, kMinPeakTflops, kMaxPeakTflops);
    gpu.read("hbm_GBps", spec.gpu.hbm_GBps, kMinHbmGBps, kMaxHbmGBps);
    gpu.read("memory_GiB", spec.gpu.memory_GiB, kMinMemoryGiB, kMaxMemoryGiB);
    if (const Field* e = gpu.find("gemm_efficiency")) read_gemm_efficiency(ctx, *e, spec.gpu);
  }

  if (const Field* f = top.find("intra_node")) {
    const MapReader intra(ctx, *f, kIntraKeys);
    if (complete) {
      intra.require("kind", "kind: nvswitch");
      intra.require("bandwidth_GBps", "bandwidth_GBps: 450");
      intra.require("latency_us", "latency_us: 2");
    }
    std::string kind;
    if (intra.read_choice("kind", kind, {"nvswitch", "pcie"}))
      spec.intra.kind = kind == "pcie" ? IntraNodeKind::pcie : IntraNodeKind::nvswitch;
    intra.read("bandwidth_GBps", spec.intra.bandwidth_GBps, kMinBandwidthGBps, kMaxBandwidthGBps);
    intra.read("latency_us", spec.intra.latency_us, 0, kMaxLatencyUs);
    if (const Field* pcie = intra.find("pcie_switch_GBps")) {
      // 0 means "not limiting"; anything else is a bandwidth in the usual range.
      spec.intra.pcie_switch_GBps = to_double(ctx, *pcie, 0, kMaxBandwidthGBps);
      if (spec.intra.pcie_switch_GBps > 0 && spec.intra.pcie_switch_GBps < kMinBandwidthGBps)
        fail(ctx, *pcie, "'" + pcie->path + "' = " + pcie->value.Scalar() + " is out of range",
             "use 0 (the host bridge does not limit) or a number >= " +
                 format_number(kMinBandwidthGBps) + " and <= " + format_number(kMaxBandwidthGBps));
    }
  }

  if (const Field* f = top.find("nic")) {
    const MapReader nic(ctx, *f, kNicKeys);
    if (complete) {
      nic.require("count_per_node", "count_per_node: 8");
      nic.require("bandwidth_GBps", "bandwidth_GBps: 48");
      nic.require("latency_us", "latency_us: 5");
    }
    nic.read("count_per_node", spec.nic.count_per_node, 0, 1024);
    nic.read("bandwidth_GBps", spec.nic.bandwidth_GBps, kMinBandwidthGBps, kMaxBandwidthGBps);
    nic.read("latency_us", spec.nic.latency_us, 0, kMaxLatencyUs);
    nic.read("rail_optimized", spec.nic.rail_optimized);
  }

  if (const Field* f = top.find("network")) {
    const MapReader net(ctx, *f, kNetworkKeys);
    if (complete) net.require("topology", "topology: fat_tree");
    std::string topology;
    if (net.read_choice("topology", topology, {"single_switch", "fat_tree"}))
      spec.network.topology =
          topology == "fat_tree" ? TopologyKind::fat_tree : TopologyKind::single_switch;
    if (const Field* levels = net.find("levels")) {
      spec.network.levels = static_cast<int>(to_int(ctx, *levels, 2, 3));
    }
    net.read("nodes_per_leaf", spec.network.nodes_per_leaf, 1, 1 << 16);
    net.read("oversubscription", spec.network.oversubscription, 1, kMaxOversubscription);
    net.read("switch_latency_us", spec.network.switch_latency_us, 0, kMaxLatencyUs);
  }

  // Rules across fields, checked on the result (a preset plus overrides, or a complete map).
  auto at = [&](const char* section, const char* key) -> Field {
    if (const Field* s = top.find(section)) {
      if (s->value.IsMap())
        for (const auto& entry : s->value)
          if (entry.first.Scalar() == key)
            return Field{entry.first, entry.second, sub(sub(path, section), key)};
      return *s;
    }
    return Field{YAML::Node(YAML::NodeType::Undefined), node, sub(path, section)};
  };
  if (spec.nic.rail_optimized && spec.nic.count_per_node != spec.gpus_per_node)
    fail(ctx, at("nic", "rail_optimized"),
         "rail_optimized needs one NIC per GPU, but nic.count_per_node is " +
             std::to_string(spec.nic.count_per_node) + " and gpus_per_node is " +
             std::to_string(spec.gpus_per_node),
         "set nic.count_per_node: " + std::to_string(spec.gpus_per_node) +
             " or rail_optimized: false");
  if (spec.nic.count_per_node == 0 && spec.nodes != 1)
    fail(
        ctx, at("nic", "count_per_node"),
        "a cluster without NICs (nic.count_per_node: 0) must have exactly one node, but nodes is " +
            std::to_string(spec.nodes) + (spec.nodes == 0 ? " (as many as the mesh needs)" : ""),
        "set nodes: 1 or give each node at least one NIC");
  if (spec.intra.kind == IntraNodeKind::nvswitch && spec.intra.pcie_switch_GBps > 0)
    fail(ctx, at("intra_node", "pcie_switch_GBps"),
         "pcie_switch_GBps applies only to intra_node.kind: pcie, but the kind is nvswitch",
         "remove pcie_switch_GBps or set kind: pcie");
}

std::string resolve_cluster_file(const std::string& name_or_path, const std::string& relative_to) {
  std::error_code ec;
  fs::path base = relative_to.empty() ? fs::path(".") : fs::path(relative_to);
  if (!fs::is_directory(base, ec)) base = base.parent_path();
  if (base.empty()) base = ".";
  const fs::path given(name_or_path);
  const bool path_like = name_or_path.find('/') != std::string::npos ||
                         given.extension() == ".yaml" || given.extension() == ".yml";
  if (path_like) {
    if (given.is_absolute()) return fs::is_regular_file(given, ec) ? given.string() : "";
    for (const fs::path& candidate : {base / given, given})
      if (fs::is_regular_file(candidate, ec)) return candidate.lexically_normal().string();
    return "";
  }
  // A bare name is looked up in clusters/ folders only (never beside the experiment, where a
  // name could match another experiment file).
  for (const fs::path& dir :
       {base / "clusters", fs::path(MUONBED_SOURCE_DIR) / "experiments" / "clusters"}) {
    const fs::path candidate = dir / (name_or_path + ".yaml");
    if (fs::is_regular_file(candidate, ec)) return candidate.lexically_normal().string();
  }
  return "";
}

std::vector<std::string> cluster_names(const std::string& relative_to) {
  std::error_code ec;
  fs::path base = relative_to.empty() ? fs::path(".") : fs::path(relative_to);
  if (!fs::is_directory(base, ec)) base = base.parent_path();
  if (base.empty()) base = ".";
  std::vector<std::string> names;
  for (const fs::path& dir :
       {base / "clusters", fs::path(MUONBED_SOURCE_DIR) / "experiments" / "clusters"}) {
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.path().extension() == ".yaml") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::vector<std::string> cluster_schema_paths() {
  std::vector<std::string> paths = kClusterKeys;
  for (const std::string& k : kGpuKeys) paths.push_back("gpu." + k);
  for (const std::string& k : kIntraKeys) paths.push_back("intra_node." + k);
  for (const std::string& k : kNicKeys) paths.push_back("nic." + k);
  for (const std::string& k : kNetworkKeys) paths.push_back("network." + k);
  return paths;
}

void emit_cluster(YAML::Emitter& out, const ClusterSpec& spec) {
  auto number = [&](const char* key, double value) {
    out << YAML::Key << key << YAML::Value << format_number(value);
  };
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << spec.name;
  if (!spec.source.empty()) out << YAML::Key << "source" << YAML::Value << spec.source;
  out << YAML::Key << "gpus_per_node" << YAML::Value << spec.gpus_per_node;
  out << YAML::Key << "nodes" << YAML::Value << spec.nodes;

  out << YAML::Key << "gpu" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << spec.gpu.name;
  number("peak_tflops", spec.gpu.peak_tflops);
  number("hbm_GBps", spec.gpu.hbm_GBps);
  number("memory_GiB", spec.gpu.memory_GiB);
  if (!spec.gpu.gemm_efficiency.empty()) {
    out << YAML::Key << "gemm_efficiency" << YAML::Value << YAML::Flow << YAML::BeginMap;
    for (const EfficiencyPoint& p : spec.gpu.gemm_efficiency)
      out << YAML::Key << format_number(p.dim) << YAML::Value << format_number(p.efficiency);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  out << YAML::Key << "intra_node" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "kind" << YAML::Value
      << (spec.intra.kind == IntraNodeKind::pcie ? "pcie" : "nvswitch");
  number("bandwidth_GBps", spec.intra.bandwidth_GBps);
  number("latency_us", spec.intra.latency_us);
  if (spec.intra.kind == IntraNodeKind::pcie)
    number("pcie_switch_GBps", spec.intra.pcie_switch_GBps);
  out << YAML::EndMap;

  out << YAML::Key << "nic" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "count_per_node" << YAML::Value << spec.nic.count_per_node;
  number("bandwidth_GBps", spec.nic.bandwidth_GBps);
  number("latency_us", spec.nic.latency_us);
  out << YAML::Key << "rail_optimized" << YAML::Value << spec.nic.rail_optimized;
  out << YAML::EndMap;

  out << YAML::Key << "network" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "topology" << YAML::Value
      << (spec.network.topology == TopologyKind::fat_tree ? "fat_tree" : "single_switch");
  out << YAML::Key << "levels" << YAML::Value << spec.network.levels;
  out << YAML::Key << "nodes_per_leaf" << YAML::Value << spec.network.nodes_per_leaf;
  number("oversubscription", spec.network.oversubscription);
  number("switch_latency_us", spec.network.switch_latency_us);
  out << YAML::EndMap;
  out << YAML::EndMap;
}

}  // namespace yaml_util

ClusterSpec parse_cluster(const YAML::Node& node, const std::string& file) {
  const Context ctx{file, ""};
  ClusterSpec spec;
  read_cluster_map(ctx, node, "", true, spec);
  spec.origin = location_of(node, file);
  return spec;
}

ClusterSpec load_cluster_file(const std::string& path) {
  const std::string text = read_text_file(path, "cluster file");
  return parse_cluster(load_yaml(text, path), path);
}

std::string find_cluster_file(const std::string& name_or_path, const std::string& relative_to) {
  std::string found = resolve_cluster_file(name_or_path, relative_to);
  if (!found.empty()) return found;
  throw ConfigError(
      SourceLocation{relative_to, 0, 0},
      "cluster '" + name_or_path + "' not found" +
          did_you_mean(name_or_path, cluster_names(relative_to)),
      "use one of: " + join(cluster_names(relative_to)) + ", or a path to a cluster YAML file");
}

}  // namespace muonbed
