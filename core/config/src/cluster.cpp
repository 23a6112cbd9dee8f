// Cluster profiles from YAML: strict parsing of experiments/clusters/*.yaml (and inline or
// overridden clusters inside experiments), the search for a cluster file by name, the GEMM
// efficiency curve, the measured Newton-Schulz table, and the emitter that writes a profile back
// as YAML for provenance.
#include "core/config/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <map>

#include <yaml-cpp/yaml.h>

#include "core/config/src/yaml_util.hpp"
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

namespace {

// Per-step FLOPs of NS on one m x n matrix (m <= n): X X^T, A A, B X.
double ns_step_flops(double m, double n) {
  return 4 * m * m * n + 2 * m * m * m;
}

struct NsPoint {
  double flops;  // per matrix, all steps
  double seconds;
};

// Piecewise-linear interpolation of seconds in FLOPs (points sorted by FLOPs, distinct).
double interpolate_ns(const std::vector<NsPoint>& p, double flops) {
  if (p.size() == 1) return p[0].seconds * flops / p[0].flops;
  if (flops <= p.front().flops) {
    // The line through the two smallest points: its intercept is the per-call overhead.
    const double slope = (p[1].seconds - p[0].seconds) / (p[1].flops - p[0].flops);
    const double t = p[0].seconds + slope * (flops - p[0].flops);
    return t > 0 && slope > 0 ? t : p[0].seconds * flops / p[0].flops;
  }
  if (flops >= p.back().flops) return p.back().seconds * flops / p.back().flops;
  for (std::size_t i = 1; i < p.size(); ++i)
    if (flops <= p[i].flops) {
      const double t = (flops - p[i - 1].flops) / (p[i].flops - p[i - 1].flops);
      return p[i - 1].seconds + t * (p[i].seconds - p[i - 1].seconds);
    }
  return p.back().seconds;
}

}  // namespace

std::string_view to_string(NsTimeSource source) {
  switch (source) {
    case NsTimeSource::table:
      return "table";
    case NsTimeSource::interpolated:
      return "interpolated";
    case NsTimeSource::extrapolated:
      return "extrapolated";
    case NsTimeSource::curve:
      return "curve";
  }
  return "?";
}

double GpuSpec::ns_call_seconds(std::int64_t rows, std::int64_t cols, std::int64_t batch, int steps,
                                const std::string& version, NsTimeSource* source) const {
  NsTimeSource ignored;
  NsTimeSource& from = source ? *source : ignored;
  from = NsTimeSource::curve;
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  const double b = static_cast<double>(std::max<std::int64_t>(1, batch));
  std::vector<const NsTiming*> mine;
  for (const NsTiming& t : ns_table)
    if (t.version == version && t.ms > 0 && t.steps > 0) mine.push_back(&t);
  if (mine.empty()) return -1;
  // Same shape: the entry whose batch is nearest (in ratio), scaled.
  const NsTiming* same = nullptr;
  for (const NsTiming* t : mine) {
    if (std::min(t->rows, t->cols) != std::min(rows, cols) ||
        std::max(t->rows, t->cols) != std::max(rows, cols))
      continue;
    const auto distance = [&](const NsTiming* e) {
      return std::abs(std::log(static_cast<double>(e->batch) / b));
    };
    if (same == nullptr || distance(t) < distance(same)) same = t;
  }
  if (same != nullptr) {
    from = NsTimeSource::table;
    return same->ms * 1e-3 * (b / static_cast<double>(same->batch)) *
           (static_cast<double>(steps) / same->steps);
  }
  // Other shapes: per-matrix points of batched entries for a batched call (when there are any),
  // of single calls otherwise.
  const bool batched = batch > 1;
  bool any_kind = false;
  for (const NsTiming* t : mine) any_kind = any_kind || ((t->batch > 1) == batched);
  std::vector<NsPoint> points;
  for (const NsTiming* t : mine) {
    if (any_kind && (t->batch > 1) != batched) continue;
    const double tm = static_cast<double>(std::min(t->rows, t->cols));
    const double tn = static_cast<double>(std::max(t->rows, t->cols));
    points.push_back(
        {ns_step_flops(tm, tn) * t->steps, t->ms * 1e-3 / static_cast<double>(t->batch)});
  }
  std::sort(points.begin(), points.end(),
            [](const NsPoint& a, const NsPoint& c) { return a.flops < c.flops; });
  // Equal FLOPs (two shapes of one size): keep their mean.
  std::vector<NsPoint> distinct;
  std::vector<int> count;
  for (const NsPoint& q : points) {
    if (!distinct.empty() && distinct.back().flops == q.flops) {
      distinct.back().seconds += q.seconds;
      ++count.back();
    } else {
      distinct.push_back(q);
      count.push_back(1);
    }
  }
  for (std::size_t i = 0; i < distinct.size(); ++i) distinct[i].seconds /= count[i];
  const double flops = ns_step_flops(m, n) * steps;
  const double lo = distinct.front().flops, hi = distinct.back().flops;
  if (flops >= lo && flops <= hi) {
    from = NsTimeSource::interpolated;
  } else if (flops * kNsExtrapolationLimit >= lo && flops <= hi * kNsExtrapolationLimit) {
    from = NsTimeSource::extrapolated;
  } else {
    // Past the table by more than 2x: the work at the GEMM-efficiency curve's rate for the
    // matrix's smallest dimension, plus the per-call overhead the table measured (the intercept
    // of the line through its two smallest entries, when positive): never a far entry's rate.
    from = NsTimeSource::curve;
    const double rate = sustained_flops(m);
    if (!(rate > 0)) return -1;
    double overhead = 0;
    if (distinct.size() >= 2) {
      const NsPoint& p0 = distinct[0];
      const NsPoint& p1 = distinct[1];
      const double slope = (p1.seconds - p0.seconds) / (p1.flops - p0.flops);
      overhead = std::max(0.0, p0.seconds - slope * p0.flops);
    }
    return b * flops / rate + overhead;
  }
  return b * interpolate_ns(distinct, flops);
}

double GpuSpec::elementwise_seconds(std::string_view kernel, std::int64_t numel) const {
  std::vector<std::pair<double, double>> points;  // (elements, seconds)
  for (const ElementwiseTiming& t : elementwise_table)
    if (t.kernel == kernel && t.numel > 0 && t.ms > 0)
      points.emplace_back(static_cast<double>(t.numel), t.ms * 1e-3);
  if (points.empty()) return -1;
  std::sort(points.begin(), points.end());
  const double n = static_cast<double>(std::max<std::int64_t>(0, numel));
  if (n <= points.front().first) return points.front().second * n / points.front().first;
  for (std::size_t i = 1; i < points.size(); ++i)
    if (n <= points[i].first) {
      const auto& [n0, t0] = points[i - 1];
      const auto& [n1, t1] = points[i];
      return n1 == n0 ? std::max(t0, t1) : t0 + (n - n0) / (n1 - n0) * (t1 - t0);
    }
  return points.back().second * n / points.back().first;
}

const std::vector<std::string>& elementwise_table_kernels() {
  static const std::vector<std::string> kinds = {"momentum", "apply_update", "adamw"};
  return kinds;
}

std::vector<std::string> GpuSpec::ns_versions() const {
  std::vector<std::string> out;
  for (const NsTiming& t : ns_table)
    if (std::find(out.begin(), out.end(), t.version) == out.end()) out.push_back(t.version);
  return out;
}

std::string_view to_string(CollectiveClass cls) {
  switch (cls) {
    case CollectiveClass::ring:
      return "ring";
    case CollectiveClass::all_to_all:
      return "all_to_all";
    case CollectiveClass::p2p:
      return "p2p";
    case CollectiveClass::nvls:
      return "nvls";
  }
  return "?";
}

double LinkEfficiency::of(CollectiveClass cls) const {
  switch (cls) {
    case CollectiveClass::ring:
      return ring;
    case CollectiveClass::all_to_all:
      return all_to_all;
    case CollectiveClass::p2p:
      return p2p;
    case CollectiveClass::nvls:
      return nvls;
  }
  return 1.0;
}

namespace yaml_util {

namespace {

const std::vector<std::string> kClusterKeys = {
    "name",         "source",     "gpus_per_node", "nodes",      "gpu",
    "intra_node",   "nic",        "network",       "efficiency", "launch_overhead_us",
    "measurements", "calibration"};
const std::vector<std::string> kGpuKeys = {"name",
                                           "peak_tflops",
                                           "hbm_GBps",
                                           "memory_GiB",
                                           "gemm_efficiency",
                                           "ns_table",
                                           "ns_kernel",
                                           "elementwise_table",
                                           "host_comm_us_per_message",
                                           "host_comm_ns_per_byte"};
const std::vector<std::string> kIntraKeys = {
    "kind", "bandwidth_GBps", "latency_us", "pcie_switch_GBps", "nvls", "nvls_latency_us"};
const std::vector<std::string> kLinkClassKeys = {"intra_node", "network"};
const std::vector<std::string> kCollectiveClassKeys = {"ring", "all_to_all", "p2p", "nvls"};
const std::vector<std::string> kLaunchKeys = {"collective", "kernel"};
const std::vector<std::string> kNsEntryKeys = {"version", "shape", "steps", "ms", "source"};
const std::vector<std::string> kElementwiseEntryKeys = {"kernel", "numel", "ms", "source"};
const std::vector<std::string> kMeasurementKeys = {
    "op", "gpus", "size_bytes", "busbw_GBps", "time_us", "algorithm", "source"};
const std::vector<std::string> kMeasuredOps = {"all_gather", "reduce_scatter", "all_reduce",
                                               "all_to_all", "broadcast",      "gather",
                                               "scatter",    "sendrecv"};
const std::vector<std::string> kAlgorithms = {"ring", "nvls", "nvls_tree"};
const std::vector<std::string> kCalibrationKeys = {"tool",    "date",    "host", "git_hash",
                                                   "backend", "command", "notes"};
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
constexpr double kMaxHostCommNsPerByte = 1e4;  // 0.1 MB/s: slower is a typo
constexpr double kMinMemoryGiB = 1e-3, kMaxMemoryGiB = 1e6;
constexpr double kMinEfficiency = 1e-3;
constexpr double kMaxEfficiencyDim = 16777216;  // the largest tensor dim (2^24)
constexpr double kMaxOversubscription = 1000;
constexpr double kMaxMeasuredMs = 1e7;        // a measured kernel or collective: under 3 hours
constexpr double kMaxLaunchOverheadUs = 1e5;  // 0.1 s

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

void read_link_efficiency(const Context& ctx, const Field& field, LinkEfficiency& out) {
  const MapReader m(ctx, field, kCollectiveClassKeys);
  m.read("ring", out.ring, kMinEfficiency, 1);
  m.read("all_to_all", out.all_to_all, kMinEfficiency, 1);
  m.read("p2p", out.p2p, kMinEfficiency, 1);
  m.read("nvls", out.nvls, kMinEfficiency, 1);
}

void read_ns_table(const Context& ctx, const Field& field, GpuSpec& gpu) {
  const std::string example =
      "ns_table: [{version: v2, shape: [4096, 4096], ms: 2.749}, {version: v2, shape: [128, "
      "4096, 4096], ms: 333.8}]";
  std::vector<NsTiming> table;
  std::map<std::string, std::string> seen;  // entry identity -> the item that gave it
  for (const Field& item : list_items(ctx, field)) {
    const MapReader e(ctx, item, kNsEntryKeys);
    e.require("version", example);
    const Field& shape = e.require("shape", example);
    e.require("ms", example);
    NsTiming t;
    e.read("version", t.version);
    if (t.version.empty())
      fail(ctx, *e.find("version"), "'" + item.path + ".version' is empty",
           "name the kernel version, e.g. v1, v2 or pytorch");
    std::vector<std::int64_t> dims;
    for (const Field& d : list_items(ctx, shape)) dims.push_back(to_int(ctx, d, 1, 1 << 24));
    if (dims.size() != 2 && dims.size() != 3)
      fail(ctx, shape,
           "'" + shape.path + "' must list [rows, cols] or [batch, rows, cols], got " +
               std::to_string(dims.size()) + " numbers",
           "write e.g. shape: [4096, 11008] or shape: [32, 4096, 11008]");
    t.batch = dims.size() == 3 ? dims[0] : 1;
    t.rows = dims[dims.size() - 2];
    t.cols = dims.back();
    e.read("steps", t.steps, 1, 1000);
    e.read("ms", t.ms, 0, kMaxMeasuredMs, true);
    e.read("source", t.source);
    // Two times for one call would leave the model to pick one silently.
    const std::string key = t.version + " " + std::to_string(t.batch) + "x" +
                            std::to_string(t.rows) + "x" + std::to_string(t.cols) + " " +
                            std::to_string(t.steps);
    if (const auto [at, fresh] = seen.emplace(key, item.path); !fresh)
      fail(ctx, item,
           "'" + item.path + "' repeats the entry of " + at->second + " (version " + t.version +
               ", shape " + (t.batch > 1 ? std::to_string(t.batch) + "x" : "") +
               std::to_string(t.rows) + "x" + std::to_string(t.cols) + ", " +
               std::to_string(t.steps) + " steps)",
           "keep one time per version, shape and steps (the median of your measurements)");
    table.push_back(std::move(t));
  }
  gpu.ns_table = std::move(table);
}

// Every key of a list entry that must be there, each refused with the same example.
void require_each(const MapReader& entry, std::initializer_list<const char*> keys,
                  const std::string& example) {
  for (const char* key : keys) entry.require(key, example);
}

void read_elementwise_table(const Context& ctx, const Field& field, GpuSpec& gpu) {
  const std::string example =
      "elementwise_table: [{kernel: adamw, numel: 1048576, ms: 4.1}, {kernel: momentum, numel: "
      "1048576, ms: 1.2}]";
  std::vector<ElementwiseTiming> table;
  std::map<std::string, std::string> seen;
  for (const Field& item : list_items(ctx, field)) {
    const MapReader e(ctx, item, kElementwiseEntryKeys);
    require_each(e, {"kernel", "numel", "ms"}, example);
    ElementwiseTiming t;
    e.read_choice("kernel", t.kernel, elementwise_table_kernels());
    e.read("numel", t.numel, 1, std::int64_t{1} << 40);
    e.read("ms", t.ms, 0, kMaxMeasuredMs, true);
    e.read("source", t.source);
    if (const auto [at, fresh] = seen.emplace(t.kernel + " " + std::to_string(t.numel), item.path);
        !fresh)
      fail(ctx, item,
           "'" + item.path + "' repeats the entry of " + at->second + " (kernel " + t.kernel +
               ", numel " + std::to_string(t.numel) + ")",
           "keep one time per kernel and numel (the median of your measurements)");
    table.push_back(std::move(t));
  }
  gpu.elementwise_table = std::move(table);
}

void read_measurements(const Context& ctx, const Field& field, ClusterSpec& spec) {
  const std::string example =
      "measurements: [{op: all_gather, gpus: 8, size_bytes: 1073741824, busbw_GBps: 350, "
      "source: \"NVIDIA/nccl#1281\"}]";
  std::vector<MeasuredCollective> out;
  for (const Field& item : list_items(ctx, field)) {
    const MapReader e(ctx, item, kMeasurementKeys);
    require_each(e, {"op", "gpus", "size_bytes", "source"}, example);
    MeasuredCollective m;
    e.read_choice("op", m.op, kMeasuredOps);
    e.read("gpus", m.gpus, 1, 1 << 24);
    e.read("size_bytes", m.size_bytes, 1);
    e.read("busbw_GBps", m.busbw_GBps, 0, kMaxBandwidthGBps, true);
    e.read("time_us", m.time_us, 0, 1e3 * kMaxMeasuredMs, true);
    e.read_choice("algorithm", m.algorithm, kAlgorithms);
    e.read("source", m.source);
    if (!(m.busbw_GBps > 0) && !(m.time_us > 0))
      fail(ctx, item, "'" + item.path + "' gives neither busbw_GBps nor time_us",
           "give the measured bus bandwidth (busbw_GBps) or time (time_us), or both");
    out.push_back(std::move(m));
  }
  spec.measurements = std::move(out);
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
    if (const Field* t = gpu.find("ns_table")) read_ns_table(ctx, *t, spec.gpu);
    gpu.read("ns_kernel", spec.gpu.ns_kernel);
    if (const Field* t = gpu.find("elementwise_table")) read_elementwise_table(ctx, *t, spec.gpu);
    gpu.read("host_comm_us_per_message", spec.gpu.host_comm_us_per_message, 0, kMaxLatencyUs);
    gpu.read("host_comm_ns_per_byte", spec.gpu.host_comm_ns_per_byte, 0, kMaxHostCommNsPerByte);
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
    intra.read("nvls", spec.intra.nvls);
    intra.read("nvls_latency_us", spec.intra.nvls_latency_us, 0, kMaxLatencyUs);
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

  if (const Field* f = top.find("efficiency")) {
    const MapReader eff(ctx, *f, kLinkClassKeys);
    if (const Field* e = eff.find("intra_node"))
      read_link_efficiency(ctx, *e, spec.efficiency.intra_node);
    if (const Field* e = eff.find("network"))
      read_link_efficiency(ctx, *e, spec.efficiency.network);
  }
  if (const Field* f = top.find("launch_overhead_us")) {
    const MapReader launch(ctx, *f, kLaunchKeys);
    launch.read("collective", spec.launch_overhead.collective_us, 0, kMaxLaunchOverheadUs);
    launch.read("kernel", spec.launch_overhead.kernel_us, 0, kMaxLaunchOverheadUs);
  }
  if (const Field* f = top.find("measurements")) read_measurements(ctx, *f, spec);
  if (const Field* f = top.find("calibration")) {
    const MapReader cal(ctx, *f, kCalibrationKeys);
    CalibrationInfo& c = spec.calibration;
    cal.read("tool", c.tool);
    cal.read("date", c.date);
    cal.read("host", c.host);
    cal.read("git_hash", c.git_hash);
    cal.read("backend", c.backend);
    cal.read("command", c.command);
    cal.read("notes", c.notes);
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
  if (spec.intra.kind == IntraNodeKind::pcie && spec.intra.nvls)
    fail(ctx, at("intra_node", "nvls"),
         "intra_node.nvls (NVLink SHARP) needs NVSwitch, but the kind is pcie",
         "remove nvls or set kind: nvswitch");
  // The NS kernel version: the one named, else v2 when the table has it, else the table's first.
  const std::vector<std::string> versions = spec.gpu.ns_versions();
  if (spec.gpu.ns_kernel.empty() && !versions.empty())
    spec.gpu.ns_kernel =
        std::find(versions.begin(), versions.end(), "v2") != versions.end() ? "v2" : versions[0];
  if (!spec.gpu.ns_kernel.empty() &&
      std::find(versions.begin(), versions.end(), spec.gpu.ns_kernel) == versions.end())
    fail(ctx, at("gpu", "ns_kernel"),
         "gpu.ns_kernel '" + spec.gpu.ns_kernel + "' has no entries in gpu.ns_table" +
             (versions.empty() ? " (the table is empty)" : " (it has " + join(versions) + ")"),
         versions.empty() ? "remove ns_kernel, or give gpu.ns_table measured timings of it"
                          : "use one of: " + join(versions));
}

// Where names and relative paths are looked up: the folder of `relative_to` (an experiment file
// or a folder), "." without one.
static fs::path lookup_folder(const std::string& relative_to) {
  std::error_code ec;
  fs::path base = relative_to.empty() ? fs::path(".") : fs::path(relative_to);
  if (!fs::is_directory(base, ec)) base = base.parent_path();
  return base.empty() ? fs::path(".") : base;
}

std::string resolve_cluster_file(const std::string& name_or_path, const std::string& relative_to) {
  std::error_code ec;
  const fs::path base = lookup_folder(relative_to);
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

std::string cluster_folder_at(const std::string& name_or_path, const std::string& relative_to) {
  std::error_code ec;
  const fs::path base = lookup_folder(relative_to);
  const fs::path given(name_or_path);
  for (const fs::path& candidate : {base / given, given})
    if (!name_or_path.empty() && fs::is_directory(candidate, ec))
      return candidate.lexically_normal().string();
  return "";
}

std::vector<std::string> cluster_names(const std::string& relative_to) {
  std::error_code ec;
  const fs::path base = lookup_folder(relative_to);
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
  for (const std::string& link : kLinkClassKeys) {
    paths.push_back("efficiency." + link);
    for (const std::string& k : kCollectiveClassKeys)
      paths.push_back("efficiency." + link + "." + k);
  }
  for (const std::string& k : kLaunchKeys) paths.push_back("launch_overhead_us." + k);
  for (const std::string& k : kCalibrationKeys) paths.push_back("calibration." + k);
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
  if (!spec.gpu.ns_table.empty()) {
    out << YAML::Key << "ns_table" << YAML::Value << YAML::BeginSeq;
    for (const NsTiming& t : spec.gpu.ns_table) {
      out << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "version" << YAML::Value << t.version;
      out << YAML::Key << "shape" << YAML::Value << YAML::Flow << YAML::BeginSeq;
      if (t.batch != 1) out << t.batch;
      out << t.rows << t.cols << YAML::EndSeq;
      out << YAML::Key << "steps" << YAML::Value << t.steps;
      number("ms", t.ms);
      if (!t.source.empty()) out << YAML::Key << "source" << YAML::Value << t.source;
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (!spec.gpu.ns_kernel.empty())
    out << YAML::Key << "ns_kernel" << YAML::Value << spec.gpu.ns_kernel;
  if (!spec.gpu.elementwise_table.empty()) {
    out << YAML::Key << "elementwise_table" << YAML::Value << YAML::BeginSeq;
    for (const ElementwiseTiming& t : spec.gpu.elementwise_table) {
      out << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "kernel" << YAML::Value << t.kernel;
      out << YAML::Key << "numel" << YAML::Value << t.numel;
      number("ms", t.ms);
      if (!t.source.empty()) out << YAML::Key << "source" << YAML::Value << t.source;
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (spec.gpu.host_comm_us_per_message > 0)
    number("host_comm_us_per_message", spec.gpu.host_comm_us_per_message);
  if (spec.gpu.host_comm_ns_per_byte > 0)
    number("host_comm_ns_per_byte", spec.gpu.host_comm_ns_per_byte);
  out << YAML::EndMap;

  out << YAML::Key << "intra_node" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "kind" << YAML::Value
      << (spec.intra.kind == IntraNodeKind::pcie ? "pcie" : "nvswitch");
  number("bandwidth_GBps", spec.intra.bandwidth_GBps);
  number("latency_us", spec.intra.latency_us);
  if (spec.intra.kind == IntraNodeKind::pcie)
    number("pcie_switch_GBps", spec.intra.pcie_switch_GBps);
  if (spec.intra.nvls) {
    out << YAML::Key << "nvls" << YAML::Value << true;
    number("nvls_latency_us", spec.intra.nvls_latency_us);
  }
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

  const auto link = [&](const char* key, const LinkEfficiency& e) {
    out << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginMap;
    number("ring", e.ring);
    number("all_to_all", e.all_to_all);
    number("p2p", e.p2p);
    number("nvls", e.nvls);
    out << YAML::EndMap;
  };
  out << YAML::Key << "efficiency" << YAML::Value << YAML::BeginMap;
  link("intra_node", spec.efficiency.intra_node);
  link("network", spec.efficiency.network);
  out << YAML::EndMap;
  out << YAML::Key << "launch_overhead_us" << YAML::Value << YAML::Flow << YAML::BeginMap;
  number("collective", spec.launch_overhead.collective_us);
  number("kernel", spec.launch_overhead.kernel_us);
  out << YAML::EndMap;
  if (!spec.measurements.empty()) {
    out << YAML::Key << "measurements" << YAML::Value << YAML::BeginSeq;
    for (const MeasuredCollective& m : spec.measurements) {
      out << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "op" << YAML::Value << m.op;
      out << YAML::Key << "gpus" << YAML::Value << m.gpus;
      out << YAML::Key << "size_bytes" << YAML::Value << m.size_bytes;
      if (m.busbw_GBps > 0) number("busbw_GBps", m.busbw_GBps);
      if (m.time_us > 0) number("time_us", m.time_us);
      if (!m.algorithm.empty()) out << YAML::Key << "algorithm" << YAML::Value << m.algorithm;
      out << YAML::Key << "source" << YAML::Value << m.source;
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (!spec.calibration.empty()) {
    const CalibrationInfo& c = spec.calibration;
    out << YAML::Key << "calibration" << YAML::Value << YAML::BeginMap;
    const auto text = [&](const char* key, const std::string& v) {
      if (!v.empty()) out << YAML::Key << key << YAML::Value << v;
    };
    text("tool", c.tool);
    text("date", c.date);
    text("host", c.host);
    text("git_hash", c.git_hash);
    text("backend", c.backend);
    text("command", c.command);
    text("notes", c.notes);
    out << YAML::EndMap;
  }
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
  if (const std::string folder = cluster_folder_at(name_or_path, relative_to); !folder.empty())
    throw ConfigError(
        SourceLocation{relative_to, 0, 0},
        "cluster '" + name_or_path + "' is a folder ('" + folder + "'), not a cluster YAML file",
        "give the profile's file, e.g. " + (fs::path(name_or_path) / "NAME.yaml").string());
  throw ConfigError(
      SourceLocation{relative_to, 0, 0},
      "cluster '" + name_or_path + "' not found" +
          did_you_mean(name_or_path, cluster_names(relative_to)),
      "use one of: " + join(cluster_names(relative_to)) + ", or a path to a cluster YAML file");
}

}  // namespace muonbed
