// Cluster profiles from YAML: strict parsing of experiments/clusters/*.yaml (and inline or
// overridden clusters inside experiments), the search for a cluster file by name, the GEMM
// efficiency curve, the measured Newton-Schulz table, and the emitter that writes a profile back
// as YAML for provenance.
#include "core/config/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
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

const std::vector<std::string> kNsEntryKeys = {"version", "shape", "steps", "ms", "source"};
const std::vector<std::string> kElementwiseEntryKeys = {"kernel", "numel", "ms", "source"};
const std::vector<std::string> kMeasurementKeys = {
    "op", "gpus", "size_bytes", "busbw_GBps", "time_us", "algorithm", "source"};
const std::vector<std::string> kMeasuredOps = {"all_gather", "reduce_scatter", "all_reduce",
                                               "all_to_all", "broadcast",      "gather",
                                               "scatter",    "sendrecv"};
const std::vector<std::string> kAlgorithms = {"ring", "nvls", "nvls_tree"};
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

namespace {

// ---- The cluster fields, one row each ------------------------------------------------------
// Every key of a cluster profile is one row: where it is, its type and range, whether a complete
// profile (a file, an inline cluster) needs it, what it means, what `muonbed calibrate` writes
// there, and how to reach it in a ClusterSpec. read_cluster_map, emit_cluster,
// cluster_schema_paths and the key reference (cluster_key_reference) all iterate this table, so
// a new field is one row.

enum class FieldType { text, integer, number, flag, custom };

struct ClusterField {
  std::string section;  // "" (top), "gpu", "intra_node", "nic", "network",
                        // "efficiency.intra_node", "efficiency.network", "launch_overhead_us",
                        // "calibration"
  std::string key;
  FieldType type = FieldType::number;
  double min = 0, max = 0;  // integer, number: the range [min, max]
  bool required = false;    // in a complete profile
  std::string example;      // "peak_tflops: 989", for the missing-key message
  std::string type_text;    // for the key reference
  std::string doc;          // meaning and unit
  std::string calibrated;   // what `muonbed calibrate` writes here ("" : nothing)
  std::function<std::string&(ClusterSpec&)> text;
  std::function<int&(ClusterSpec&)> integer;
  std::function<double&(ClusterSpec&)> number;
  std::function<bool&(ClusterSpec&)> flag;
  // custom: reads the field, and emits it (key and value) when emitted() says so
  std::function<void(const Context&, const Field&, ClusterSpec&)> read;
  std::function<void(YAML::Emitter&, const ClusterSpec&)> emit;
  std::function<bool(const ClusterSpec&)> emitted;  // null: always
};

// A section of the profile: a map at `path` (a flow map when `flow`), required in a complete
// profile (with `example`), and emitted when `emitted` says so (null: always).
struct ClusterSection {
  std::string path;
  bool flow = false;
  bool required = false;
  std::string example;
  std::function<bool(const ClusterSpec&)> emitted;
  std::string doc;
};

const std::vector<ClusterSection>& cluster_sections() {
  static const std::vector<ClusterSection> sections = {
      {"", false, true, "", nullptr, "the cluster profile"},
      {"gpu", false, true, "gpu: {name: H100, peak_tflops: 989, hbm_GBps: 3000, memory_GiB: 80}",
       nullptr, "one GPU (or one CPU rank of a calibrated CPU profile)"},
      {"intra_node", false, true,
       "intra_node: {kind: nvswitch, bandwidth_GBps: 450, latency_us: 2}", nullptr,
       "the links between the GPUs of a node"},
      {"nic", false, true, "nic: {count_per_node: 8, bandwidth_GBps: 48, latency_us: 5}", nullptr,
       "the network interfaces of a node"},
      {"network", false, true, "network: {topology: fat_tree}", nullptr,
       "the network between nodes"},
      {"efficiency", false, false, "", nullptr,
       "achievable fraction of a link class's bandwidth per collective class (NCCL's protocol "
       "overhead); 1 when absent"},
      {"efficiency.intra_node", true, false, "", nullptr, "on NVLink / PCIe"},
      {"efficiency.network", true, false, "", nullptr, "on NICs"},
      {"launch_overhead_us", true, false, "", nullptr,
       "fixed costs per call, paid once however large the call"},
      {"calibration", false, false, "", [](const ClusterSpec& s) { return !s.calibration.empty(); },
       "how a calibrated profile was made (free text; empty fields are not written)"},
  };
  return sections;
}

template <typename T>
using Ref = std::function<T&(ClusterSpec&)>;

ClusterField text_field(std::string section, std::string key, Ref<std::string> ref, std::string doc,
                        bool required = false, std::string example = "",
                        std::function<bool(const ClusterSpec&)> emitted = nullptr) {
  ClusterField f;
  f.section = std::move(section);
  f.key = std::move(key);
  f.type = FieldType::text;
  f.type_text = "text";
  f.text = std::move(ref);
  f.doc = std::move(doc);
  f.required = required;
  f.example = std::move(example);
  f.emitted = std::move(emitted);
  return f;
}

ClusterField number_field(std::string section, std::string key, Ref<double> ref, double min,
                          double max, std::string doc, bool required = false,
                          std::string example = "", std::string calibrated = "",
                          std::function<bool(const ClusterSpec&)> emitted = nullptr) {
  ClusterField f;
  f.section = std::move(section);
  f.key = std::move(key);
  f.type = FieldType::number;
  f.type_text = "number";
  f.min = min;
  f.max = max;
  f.number = std::move(ref);
  f.doc = std::move(doc);
  f.required = required;
  f.example = std::move(example);
  f.calibrated = std::move(calibrated);
  f.emitted = std::move(emitted);
  return f;
}

ClusterField integer_field(std::string section, std::string key, Ref<int> ref, double min,
                           double max, std::string doc, bool required = false,
                           std::string example = "") {
  ClusterField f;
  f.section = std::move(section);
  f.key = std::move(key);
  f.type = FieldType::integer;
  f.type_text = "integer";
  f.min = min;
  f.max = max;
  f.integer = std::move(ref);
  f.doc = std::move(doc);
  f.required = required;
  f.example = std::move(example);
  return f;
}

ClusterField flag_field(std::string section, std::string key, Ref<bool> ref, std::string doc,
                        std::function<bool(const ClusterSpec&)> emitted = nullptr) {
  ClusterField f;
  f.section = std::move(section);
  f.key = std::move(key);
  f.type = FieldType::flag;
  f.type_text = "true | false";
  f.flag = std::move(ref);
  f.doc = std::move(doc);
  f.emitted = std::move(emitted);
  return f;
}

ClusterField custom_field(std::string section, std::string key, std::string type_text,
                          std::function<void(const Context&, const Field&, ClusterSpec&)> read,
                          std::function<void(YAML::Emitter&, const ClusterSpec&)> emit,
                          std::string doc, bool required = false, std::string example = "",
                          std::string calibrated = "",
                          std::function<bool(const ClusterSpec&)> emitted = nullptr) {
  ClusterField f;
  f.section = std::move(section);
  f.key = std::move(key);
  f.type = FieldType::custom;
  f.type_text = std::move(type_text);
  f.read = std::move(read);
  f.emit = std::move(emit);
  f.doc = std::move(doc);
  f.required = required;
  f.example = std::move(example);
  f.calibrated = std::move(calibrated);
  f.emitted = std::move(emitted);
  return f;
}

void emit_number(YAML::Emitter& out, const std::string& key, double value) {
  out << YAML::Key << key << YAML::Value << format_number(value);
}

// The four collective classes of one link class's efficiency map.
void add_efficiency_rows(std::vector<ClusterField>& rows, const std::string& link,
                         LinkEfficiency EfficiencySpec::*member) {
  const std::vector<std::pair<std::string, double LinkEfficiency::*>> classes = {
      {"ring", &LinkEfficiency::ring},
      {"all_to_all", &LinkEfficiency::all_to_all},
      {"p2p", &LinkEfficiency::p2p},
      {"nvls", &LinkEfficiency::nvls}};
  // Plain pair members, not a structured binding: clang 14 (the fuzz build) cannot capture one.
  for (const auto& entry : classes) {
    const std::string& name = entry.first;
    const auto cls = entry.second;
    rows.push_back(number_field(
        "efficiency." + link, name,
        [member, cls](ClusterSpec& s) -> double& { return (s.efficiency.*member).*cls; },
        kMinEfficiency, 1,
        "fraction of the line rate " + name + " collectives achieve" +
            (name == "ring"   ? " (all_gather, reduce_scatter, ring all_reduce, broadcast)"
             : name == "p2p"  ? " (gather, scatter, send/recv)"
             : name == "nvls" ? " (NVLink SHARP all-reduce)"
                              : " (pairwise exchange)"),
        false, "", "calibrate (mpi): fit to the bench collective rows (intra_node)"));
  }
}

const std::vector<ClusterField>& cluster_fields() {
  static const std::vector<ClusterField> rows = [] {
    std::vector<ClusterField> r;
    const auto not_empty = [](std::string ClusterSpec::*m) {
      return [m](const ClusterSpec& s) { return !(s.*m).empty(); };
    };
    r.push_back(text_field(
        "", "name", [](ClusterSpec& s) -> std::string& { return s.name; },
        "the profile's name (result files and tables name it)", true, "name: my-cluster"));
    r.push_back(text_field(
        "", "source", [](ClusterSpec& s) -> std::string& { return s.source; },
        "where the numbers come from (citations), free text", false, "",
        not_empty(&ClusterSpec::source)));
    r.push_back(integer_field(
        "", "gpus_per_node", [](ClusterSpec& s) -> int& { return s.gpus_per_node; }, 1, 1024,
        "GPUs (ranks) per node", true, "gpus_per_node: 8"));
    r.push_back(integer_field(
        "", "nodes", [](ClusterSpec& s) -> int& { return s.nodes; }, 0, 1 << 16,
        "nodes; 0 = as many as the experiment's mesh needs"));
    // gpu
    r.push_back(text_field(
        "gpu", "name", [](ClusterSpec& s) -> std::string& { return s.gpu.name; },
        "the GPU's (or CPU rank's) name", true, "name: H100-SXM5-80GB"));
    r.push_back(number_field(
        "gpu", "peak_tflops", [](ClusterSpec& s) -> double& { return s.gpu.peak_tflops; },
        kMinPeakTflops, kMaxPeakTflops, "dense bf16 peak, TFLOP/s", true, "peak_tflops: 989",
        "calibrate (mpi): the fastest fp32 GEMM of one rank"));
    r.push_back(number_field(
        "gpu", "hbm_GBps", [](ClusterSpec& s) -> double& { return s.gpu.hbm_GBps; }, kMinHbmGBps,
        kMaxHbmGBps, "device memory bandwidth for memory-bound ops, GB/s", true, "hbm_GBps: 3000",
        "calibrate (mpi): least-squares fit of momentum and apply_update"));
    r.push_back(number_field(
        "gpu", "memory_GiB", [](ClusterSpec& s) -> double& { return s.gpu.memory_GiB; },
        kMinMemoryGiB, kMaxMemoryGiB,
        "memory of one GPU (or rank), GiB: the limit of the memory feasibility check", true,
        "memory_GiB: 80", "calibrate (mpi): the machine's memory over the ranks"));
    r.push_back(custom_field(
        "gpu", "gemm_efficiency", "map dim -> efficiency",
        [](const Context& c, const Field& f, ClusterSpec& s) { read_gemm_efficiency(c, f, s.gpu); },
        [](YAML::Emitter& out, const ClusterSpec& s) {
          out << YAML::Key << "gemm_efficiency" << YAML::Value << YAML::Flow << YAML::BeginMap;
          for (const EfficiencyPoint& p : s.gpu.gemm_efficiency)
            out << YAML::Key << format_number(p.dim) << YAML::Value << format_number(p.efficiency);
          out << YAML::EndMap;
        },
        "sustained fraction of peak by the smallest matrix dim (dims 1..2^24 increasing, "
        "efficiencies 0.001..1), linear in log2(dim); 1 when absent",
        false, "", "calibrate (mpi): each NS shape's GEMM rate over the peak",
        [](const ClusterSpec& s) { return !s.gpu.gemm_efficiency.empty(); }));
    r.push_back(custom_field(
        "gpu", "ns_table", "list of {version, shape, steps, ms, source}",
        [](const Context& c, const Field& f, ClusterSpec& s) { read_ns_table(c, f, s.gpu); },
        [](YAML::Emitter& out, const ClusterSpec& s) {
          out << YAML::Key << "ns_table" << YAML::Value << YAML::BeginSeq;
          for (const NsTiming& t : s.gpu.ns_table) {
            out << YAML::Flow << YAML::BeginMap;
            out << YAML::Key << "version" << YAML::Value << t.version;
            out << YAML::Key << "shape" << YAML::Value << YAML::Flow << YAML::BeginSeq;
            if (t.batch != 1) out << t.batch;
            out << t.rows << t.cols << YAML::EndSeq;
            out << YAML::Key << "steps" << YAML::Value << t.steps;
            emit_number(out, "ms", t.ms);
            if (!t.source.empty()) out << YAML::Key << "source" << YAML::Value << t.source;
            out << YAML::EndMap;
          }
          out << YAML::EndSeq;
        },
        "measured Newton-Schulz time per call by shape ([rows, cols] or [batch, rows, cols]) "
        "and kernel version, interpolated in FLOPs; past the table by more than 2x, the "
        "efficiency curve",
        false, "", "calibrate (mpi): the plans' NS shapes, median of timed rounds",
        [](const ClusterSpec& s) { return !s.gpu.ns_table.empty(); }));
    r.push_back(text_field(
        "gpu", "ns_kernel", [](ClusterSpec& s) -> std::string& { return s.gpu.ns_kernel; },
        "the ns_table version the model times NS with (default v2 when the table has it, else "
        "its first)",
        false, "", [](const ClusterSpec& s) { return !s.gpu.ns_kernel.empty(); }));
    r.push_back(custom_field(
        "gpu", "elementwise_table", "list of {kernel, numel, ms, source}",
        [](const Context& c, const Field& f, ClusterSpec& s) {
          read_elementwise_table(c, f, s.gpu);
        },
        [](YAML::Emitter& out, const ClusterSpec& s) {
          out << YAML::Key << "elementwise_table" << YAML::Value << YAML::BeginSeq;
          for (const ElementwiseTiming& t : s.gpu.elementwise_table) {
            out << YAML::Flow << YAML::BeginMap;
            out << YAML::Key << "kernel" << YAML::Value << t.kernel;
            out << YAML::Key << "numel" << YAML::Value << t.numel;
            emit_number(out, "ms", t.ms);
            if (!t.source.empty()) out << YAML::Key << "source" << YAML::Value << t.source;
            out << YAML::EndMap;
          }
          out << YAML::EndSeq;
        },
        "measured time of momentum, apply_update or adamw by the elements one rank touches; "
        "absent kernels take their bytes at hbm_GBps",
        false, "", "calibrate (mpi): at the plans' element counts",
        [](const ClusterSpec& s) { return !s.gpu.elementwise_table.empty(); }));
    r.push_back(number_field(
        "gpu", "host_comm_us_per_message",
        [](ClusterSpec& s) -> double& { return s.gpu.host_comm_us_per_message; }, 0, kMaxLatencyUs,
        "host work per message a rank sends or receives on its computing core, us (CPU ranks; "
        "0 on GPUs)",
        false, "", "calibrate (mpi): NS while exchanging messages, minus NS alone",
        [](const ClusterSpec& s) { return s.gpu.host_comm_us_per_message > 0; }));
    r.push_back(number_field(
        "gpu", "host_comm_ns_per_byte",
        [](ClusterSpec& s) -> double& { return s.gpu.host_comm_ns_per_byte; }, 0,
        kMaxHostCommNsPerByte, "the same per byte, ns", false, "",
        "calibrate (mpi): as host_comm_us_per_message",
        [](const ClusterSpec& s) { return s.gpu.host_comm_ns_per_byte > 0; }));
    r.push_back(number_field(
        "gpu", "training_efficiency",
        [](ClusterSpec& s) -> double& { return s.gpu.training_efficiency; }, 0, 1,
        "fraction of peak the training step's forward and backward sustain (matches published "
        "MFU); 0 = the GEMM-efficiency curve at each op's smallest GEMM dim",
        false, "", "", [](const ClusterSpec& s) { return s.gpu.training_efficiency > 0; }));
    r.push_back(text_field(
        "gpu", "training_efficiency_source",
        [](ClusterSpec& s) -> std::string& { return s.gpu.training_efficiency_source; },
        "where training_efficiency comes from (the measurement or publication, its setup)", false,
        "", [](const ClusterSpec& s) { return !s.gpu.training_efficiency_source.empty(); }));
    // intra_node
    r.push_back(custom_field(
        "intra_node", "kind", "nvswitch | pcie",
        [](const Context& c, const Field& f, ClusterSpec& s) {
          s.intra.kind = to_choice(c, f, {"nvswitch", "pcie"}) == "pcie" ? IntraNodeKind::pcie
                                                                         : IntraNodeKind::nvswitch;
        },
        [](YAML::Emitter& out, const ClusterSpec& s) {
          out << YAML::Key << "kind" << YAML::Value
              << (s.intra.kind == IntraNodeKind::pcie ? "pcie" : "nvswitch");
        },
        "NVLink through NVSwitch, or PCIe", true, "kind: nvswitch"));
    r.push_back(number_field(
        "intra_node", "bandwidth_GBps",
        [](ClusterSpec& s) -> double& { return s.intra.bandwidth_GBps; }, kMinBandwidthGBps,
        kMaxBandwidthGBps, "per GPU per direction (NVLink) or per PCIe link, GB/s", true,
        "bandwidth_GBps: 450", "calibrate (mpi): the best collective class's rate"));
    r.push_back(number_field(
        "intra_node", "latency_us", [](ClusterSpec& s) -> double& { return s.intra.latency_us; }, 0,
        kMaxLatencyUs, "per transfer, us", true, "latency_us: 2",
        "calibrate (mpi): fit to the bench collective rows"));
    r.push_back(custom_field(
        "intra_node", "pcie_switch_GBps", "number (0, or 0.01..100,000)",
        [](const Context& c, const Field& f, ClusterSpec& s) {
          // 0 means "not limiting"; anything else is a bandwidth in the usual range.
          s.intra.pcie_switch_GBps = to_double(c, f, 0, kMaxBandwidthGBps);
          if (s.intra.pcie_switch_GBps > 0 && s.intra.pcie_switch_GBps < kMinBandwidthGBps)
            fail(c, f, "'" + f.path + "' = " + f.value.Scalar() + " is out of range",
                 "use 0 (the host bridge does not limit) or a number >= " +
                     format_number(kMinBandwidthGBps) +
                     " and <= " + format_number(kMaxBandwidthGBps));
        },
        [](YAML::Emitter& out, const ClusterSpec& s) {
          emit_number(out, "pcie_switch_GBps", s.intra.pcie_switch_GBps);
        },
        "pcie only: the host bridge every GPU's traffic shares, both directions in one budget, "
        "GB/s; 0 = not limiting",
        false, "", "", [](const ClusterSpec& s) { return s.intra.kind == IntraNodeKind::pcie; }));
    r.push_back(flag_field(
        "intra_node", "nvls", [](ClusterSpec& s) -> bool& { return s.intra.nvls; },
        "nvswitch only: NVLink SHARP, all-reduce may run in the switch when faster",
        [](const ClusterSpec& s) { return s.intra.nvls; }));
    r.push_back(number_field(
        "intra_node", "nvls_latency_us",
        [](ClusterSpec& s) -> double& { return s.intra.nvls_latency_us; }, 0, kMaxLatencyUs,
        "NVLS's fixed cost per call, us (sets where the model switches from ring to NVLS)", false,
        "", "", [](const ClusterSpec& s) { return s.intra.nvls; }));
    // nic
    r.push_back(integer_field(
        "nic", "count_per_node", [](ClusterSpec& s) -> int& { return s.nic.count_per_node; }, 0,
        1024, "NICs per node (0: one node, no network)", true, "count_per_node: 8"));
    r.push_back(number_field(
        "nic", "bandwidth_GBps", [](ClusterSpec& s) -> double& { return s.nic.bandwidth_GBps; },
        kMinBandwidthGBps, kMaxBandwidthGBps, "per NIC per direction, GB/s", true,
        "bandwidth_GBps: 48"));
    r.push_back(number_field(
        "nic", "latency_us", [](ClusterSpec& s) -> double& { return s.nic.latency_us; }, 0,
        kMaxLatencyUs, "per transfer, us", true, "latency_us: 5"));
    r.push_back(flag_field(
        "nic", "rail_optimized", [](ClusterSpec& s) -> bool& { return s.nic.rail_optimized; },
        "one NIC per GPU, GPU i uses NIC i (needs count_per_node = gpus_per_node)"));
    // network
    r.push_back(custom_field(
        "network", "topology", "single_switch | fat_tree",
        [](const Context& c, const Field& f, ClusterSpec& s) {
          s.network.topology = to_choice(c, f, {"single_switch", "fat_tree"}) == "fat_tree"
                                   ? TopologyKind::fat_tree
                                   : TopologyKind::single_switch;
        },
        [](YAML::Emitter& out, const ClusterSpec& s) {
          out << YAML::Key << "topology" << YAML::Value
              << (s.network.topology == TopologyKind::fat_tree ? "fat_tree" : "single_switch");
        },
        "the inter-node topology", true, "topology: fat_tree"));
    r.push_back(integer_field(
        "network", "levels", [](ClusterSpec& s) -> int& { return s.network.levels; }, 2, 3,
        "fat_tree: switch levels"));
    r.push_back(integer_field(
        "network", "nodes_per_leaf",
        [](ClusterSpec& s) -> int& { return s.network.nodes_per_leaf; }, 1, 1 << 16,
        "fat_tree: nodes under one leaf switch"));
    r.push_back(number_field(
        "network", "oversubscription",
        [](ClusterSpec& s) -> double& { return s.network.oversubscription; }, 1,
        kMaxOversubscription, "fat_tree: leaf uplink oversubscription (1 = non-blocking)"));
    r.push_back(number_field(
        "network", "switch_latency_us",
        [](ClusterSpec& s) -> double& { return s.network.switch_latency_us; }, 0, kMaxLatencyUs,
        "per switch hop, us"));
    add_efficiency_rows(r, "intra_node", &EfficiencySpec::intra_node);
    add_efficiency_rows(r, "network", &EfficiencySpec::network);
    r.push_back(number_field(
        "launch_overhead_us", "collective",
        [](ClusterSpec& s) -> double& { return s.launch_overhead.collective_us; }, 0,
        kMaxLaunchOverheadUs,
        "per collective call (NCCL's base latency; the ring's per-step latencies come on top), us",
        false, "", "calibrate (mpi): fit to the bench collective rows"));
    r.push_back(number_field(
        "launch_overhead_us", "kernel",
        [](ClusterSpec& s) -> double& { return s.launch_overhead.kernel_us; }, 0,
        kMaxLaunchOverheadUs, "per compute kernel call, us", false, "",
        "calibrate (mpi): intercept of the elementwise fit"));
    r.push_back(custom_field(
        "", "measurements",
        "list of {op, gpus, size_bytes, busbw_GBps, time_us, algorithm, source}",
        [](const Context& c, const Field& f, ClusterSpec& s) { read_measurements(c, f, s); },
        [](YAML::Emitter& out, const ClusterSpec& s) {
          out << YAML::Key << "measurements" << YAML::Value << YAML::BeginSeq;
          for (const MeasuredCollective& m : s.measurements) {
            out << YAML::Flow << YAML::BeginMap;
            out << YAML::Key << "op" << YAML::Value << m.op;
            out << YAML::Key << "gpus" << YAML::Value << m.gpus;
            out << YAML::Key << "size_bytes" << YAML::Value << m.size_bytes;
            if (m.busbw_GBps > 0) emit_number(out, "busbw_GBps", m.busbw_GBps);
            if (m.time_us > 0) emit_number(out, "time_us", m.time_us);
            if (!m.algorithm.empty()) out << YAML::Key << "algorithm" << YAML::Value << m.algorithm;
            out << YAML::Key << "source" << YAML::Value << m.source;
            out << YAML::EndMap;
          }
          out << YAML::EndSeq;
        },
        "measured or published collective figures (nccl-tests' busbw) with their sources: the "
        "evidence a profile was calibrated from, checked by tests and by muonbed compare",
        false, "", "calibrate (mpi): the bench collective rows it fitted",
        [](const ClusterSpec& s) { return !s.measurements.empty(); }));
    const std::vector<std::pair<std::string, std::string CalibrationInfo::*>> info = {
        {"tool", &CalibrationInfo::tool},       {"date", &CalibrationInfo::date},
        {"host", &CalibrationInfo::host},       {"git_hash", &CalibrationInfo::git_hash},
        {"backend", &CalibrationInfo::backend}, {"command", &CalibrationInfo::command},
        {"notes", &CalibrationInfo::notes}};
    for (const auto& entry : info) {
      const std::string& key = entry.first;
      const auto member = entry.second;
      r.push_back(text_field(
          "calibration", key,
          [member](ClusterSpec& s) -> std::string& { return s.calibration.*member; },
          "calibration provenance: " + key +
              (key == "backend" ? " (mpi: the ranks are CPU ranks; tables call them ranks)" : ""),
          false, "", [member](const ClusterSpec& s) { return !(s.calibration.*member).empty(); }));
    }
    r.back().calibrated = "calibrate: written with the profile";
    return r;
  }();
  return rows;
}

// The keys allowed in the map at `section`: its fields' keys and its subsections' last names.
std::vector<std::string> section_keys(const std::string& section) {
  std::vector<std::string> keys;
  for (const ClusterField& f : cluster_fields())
    if (f.section == section) keys.push_back(f.key);
  for (const ClusterSection& s : cluster_sections()) {
    if (s.path.empty() || s.path == section) continue;
    const std::size_t dot = s.path.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : s.path.substr(0, dot);
    const std::string name = dot == std::string::npos ? s.path : s.path.substr(dot + 1);
    if (parent == section) keys.push_back(name);
  }
  return keys;
}

void read_field(const MapReader& map, const ClusterField& f, ClusterSpec& spec) {
  const Field* field = map.find(f.key);
  if (!field) return;
  const Context& ctx = map.context();
  switch (f.type) {
    case FieldType::text:
      f.text(spec) = to_string_value(ctx, *field);
      break;
    case FieldType::integer:
      f.integer(spec) = static_cast<int>(
          to_int(ctx, *field, static_cast<std::int64_t>(f.min), static_cast<std::int64_t>(f.max)));
      break;
    case FieldType::number:
      f.number(spec) = to_double(ctx, *field, f.min, f.max);
      break;
    case FieldType::flag:
      f.flag(spec) = to_bool(ctx, *field);
      break;
    case FieldType::custom:
      f.read(ctx, *field, spec);
      break;
  }
}

// Reads the map of `section` (a field already checked to be there) and its subsections.
void read_section(const Context& ctx, const MapReader& map, const std::string& section,
                  bool complete, ClusterSpec& spec) {
  if (complete) {
    for (const ClusterField& f : cluster_fields())
      if (f.section == section && f.required) map.require(f.key, f.example);
    for (const ClusterSection& s : cluster_sections())
      if (s.required && !s.path.empty() && s.path.find('.') == std::string::npos && section.empty())
        map.require(s.path, s.example);
  }
  for (const ClusterField& f : cluster_fields())
    if (f.section == section) read_field(map, f, spec);
  for (const ClusterSection& s : cluster_sections()) {
    const std::size_t dot = s.path.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : s.path.substr(0, dot);
    if (s.path.empty() || parent != section) continue;
    const std::string name = dot == std::string::npos ? s.path : s.path.substr(dot + 1);
    if (const Field* f = map.find(name))
      read_section(ctx, MapReader(ctx, *f, section_keys(s.path)), s.path, complete, spec);
  }
}

void emit_field(YAML::Emitter& out, const ClusterField& f, const ClusterSpec& spec) {
  if (f.emitted && !f.emitted(spec)) return;
  ClusterSpec& s = const_cast<ClusterSpec&>(spec);  // the accessors only read here
  switch (f.type) {
    case FieldType::text:
      out << YAML::Key << f.key << YAML::Value << f.text(s);
      break;
    case FieldType::integer:
      out << YAML::Key << f.key << YAML::Value << f.integer(s);
      break;
    case FieldType::number:
      emit_number(out, f.key, f.number(s));
      break;
    case FieldType::flag:
      out << YAML::Key << f.key << YAML::Value << f.flag(s);
      break;
    case FieldType::custom:
      f.emit(out, spec);
      break;
  }
}

// Emits the fields of `section` and its subsections, in table order (fields of a section before
// the subsections that follow them in cluster_sections(), as profiles are written).
void emit_section(YAML::Emitter& out, const std::string& section, const ClusterSpec& spec) {
  const auto subsection = [&](const ClusterSection& s) {
    const std::size_t dot = s.path.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : s.path.substr(0, dot);
    if (s.path.empty() || parent != section) return;
    if (s.emitted && !s.emitted(spec)) return;
    const std::string name = dot == std::string::npos ? s.path : s.path.substr(dot + 1);
    out << YAML::Key << name << YAML::Value;
    if (s.flow) out << YAML::Flow;
    out << YAML::BeginMap;
    emit_section(out, s.path, spec);
    out << YAML::EndMap;
  };
  // Top level: the scalars, then the sections in order, with measurements before calibration.
  for (const ClusterField& f : cluster_fields())
    if (f.section == section && !(section.empty() && f.key == "measurements"))
      emit_field(out, f, spec);
  for (const ClusterSection& s : cluster_sections()) {
    if (section.empty() && s.path == "calibration")
      for (const ClusterField& f : cluster_fields())
        if (f.section.empty() && f.key == "measurements") emit_field(out, f, spec);
    subsection(s);
  }
}

}  // namespace

void read_cluster_map(const Context& ctx, const YAML::Node& node, const std::string& path,
                      bool complete, ClusterSpec& spec) {
  std::vector<std::string> keys = section_keys("");
  if (!complete) keys.push_back("preset");
  const MapReader top(ctx, node, path, keys);
  read_section(ctx, top, "", complete, spec);

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
  std::vector<std::string> paths;
  for (const ClusterSection& s : cluster_sections())
    if (!s.path.empty()) paths.push_back(s.path);
  for (const ClusterField& f : cluster_fields())
    paths.push_back(f.section.empty() ? f.key : f.section + "." + f.key);
  return paths;
}

void emit_cluster(YAML::Emitter& out, const ClusterSpec& spec) {
  out << YAML::BeginMap;
  emit_section(out, "", spec);
  out << YAML::EndMap;
}

std::vector<ClusterKeyDoc> cluster_key_docs() {
  std::vector<ClusterKeyDoc> docs;
  for (const ClusterSection& s : cluster_sections()) {
    if (s.path.empty()) continue;
    docs.push_back({s.path, "map", "", s.required, s.doc, ""});
    for (const ClusterField& f : cluster_fields()) {
      if (f.section != s.path) continue;
      std::string range;
      if (f.type == FieldType::integer || f.type == FieldType::number)
        range = format_number(f.min) + " .. " + format_number(f.max);
      docs.push_back({s.path + "." + f.key, f.type_text, range, f.required, f.doc, f.calibrated});
    }
  }
  // The top level's own fields first.
  std::vector<ClusterKeyDoc> top;
  for (const ClusterField& f : cluster_fields())
    if (f.section.empty()) {
      std::string range;
      if (f.type == FieldType::integer || f.type == FieldType::number)
        range = format_number(f.min) + " .. " + format_number(f.max);
      top.push_back({f.key, f.type_text, range, f.required, f.doc, f.calibrated});
    }
  docs.insert(docs.begin(), top.begin(), top.end());
  return docs;
}
}  // namespace yaml_util

std::vector<ClusterKeyDoc> cluster_key_reference() {
  return yaml_util::cluster_key_docs();
}

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
