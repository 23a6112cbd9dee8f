// Cluster profiles from YAML: the one table of cluster fields (cluster_fields() below;
// core/config/cluster_fields.hpp), the strict parsing of experiments/clusters/*.yaml (and inline or
// overridden clusters inside experiments) and the emitter that writes a profile back as YAML for
// provenance, both driven by that table; the readers of the fields that are tables (NS,
// elementwise, GEMM curve, measurements); and the search for a cluster file by name. The timing a
// profile gives (NS and elementwise interpolation, the efficiency curve) is cluster_timing.cpp's.
#include "core/config/cluster.hpp"
#include "core/config/cluster_fields.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include <yaml-cpp/yaml.h>

#include "core/config/src/cluster_yaml.hpp"
#include "core/config/src/yaml_util.hpp"
#include "muonbed/config.hpp"

namespace muonbed {

namespace fs = std::filesystem;
using namespace yaml_util;

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

// ---- The cluster fields, one row each ------------------------------------------------------
// Every key of a cluster profile is one row: its dotted path, where it lives in a ClusterSpec
// (a scalar's C++ type is the field's type), its range and unit, whether a complete profile (a
// file, an inline cluster) needs it, what it means and what `muonbed calibrate` writes there. Its
// default is the ClusterSpec member's initializer. read_cluster_map (with the range checks),
// emit_cluster, cluster_schema_paths, the key reference and cluster_number (calibrate's writes)
// all iterate this table, so a new scalar field is one row. Fields that are not one scalar (the
// NS and elementwise tables, the GEMM curve, the choices that are enums, the measurements) give
// their own reader and writer.

template <typename T>
using Ref = std::function<T&(ClusterSpec&)>;
// Where a scalar field lives; monostate for a field with its own reader and writer.
using Place = std::variant<std::monostate, Ref<std::string>, Ref<int>, Ref<double>, Ref<bool>>;

// The place of a member of ClusterSpec, or of a member of one of its parts.
template <typename T>
Ref<T> member(T ClusterSpec::*m) {
  return [m](ClusterSpec& s) -> T& { return s.*m; };
}
template <typename Part, typename T>
Ref<T> member(Part ClusterSpec::*part, T Part::*m) {
  return [part, m](ClusterSpec& s) -> T& { return (s.*part).*m; };
}

struct ClusterField {
  std::string path;  // "gpu.peak_tflops": its section is what comes before the last dot
  Place place;
  double min = 0, max = 0;  // integer, number: the range [min, max]
  std::string unit;         // of a number ("GB/s", "us"); "" for counts and fractions
  bool required = false;    // in a complete profile
  std::string example;      // "peak_tflops: 989", for the missing-key message
  std::string doc;          // what it means
  std::string calibrated;   // what `muonbed calibrate` writes here ("" : nothing)
  // Emitted only when it differs from its default (0, "", false), or only when `emitted` says
  // so; always otherwise.
  bool emit_when_set = false;
  std::function<bool(const ClusterSpec&)> emitted;
  // A field that is not one scalar: its type for the key reference, its reader and its writer
  // (the key and the value).
  std::string custom_type;
  std::function<void(const Context&, const Field&, ClusterSpec&)> read;
  std::function<void(YAML::Emitter&, const ClusterSpec&)> emit;
};

std::string section_of(const std::string& path) {
  const std::size_t dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

std::string key_of(const std::string& path) {
  const std::size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

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

void emit_number(YAML::Emitter& out, const std::string& key, double value) {
  out << YAML::Key << key << YAML::Value << format_number(value);
}

// The four collective classes of one link class's efficiency map.
void add_efficiency_rows(std::vector<ClusterField>& rows, const std::string& link,
                         LinkEfficiency EfficiencySpec::*member, const std::string& calibrated) {
  const std::vector<std::pair<std::string, double LinkEfficiency::*>> classes = {
      {"ring", &LinkEfficiency::ring},
      {"all_to_all", &LinkEfficiency::all_to_all},
      {"p2p", &LinkEfficiency::p2p},
      {"nvls", &LinkEfficiency::nvls}};
  // Plain pair members, not a structured binding: clang 14 (the fuzz build) cannot capture one.
  for (const auto& entry : classes) {
    const std::string& name = entry.first;
    const auto cls = entry.second;
    rows.push_back({
        .path = "efficiency." + link + "." + name,
        .place = Ref<double>(
            [member, cls](ClusterSpec& s) -> double& { return (s.efficiency.*member).*cls; }),
        .min = kMinEfficiency,
        .max = 1,
        .doc = "fraction of the line rate " + name + " collectives achieve" +
               (name == "ring"   ? " (all_gather, reduce_scatter, ring all_reduce, broadcast)"
                : name == "p2p"  ? " (gather, scatter, send/recv)"
                : name == "nvls" ? " (NVLink SHARP all-reduce)"
                                 : " (pairwise exchange)"),
        .calibrated = name == "nvls" && !calibrated.empty()
                          ? "calibrate (mpi): 1 (CPU ranks have no NVLink SHARP)"
                          : calibrated,
    });
  }
}

// One line per NS timing, flow maps in a block list.
void emit_ns_table(YAML::Emitter& out, const ClusterSpec& s) {
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
}

void emit_elementwise_table(YAML::Emitter& out, const ClusterSpec& s) {
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
}

void emit_measurements(YAML::Emitter& out, const ClusterSpec& s) {
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
}

const std::vector<ClusterField>& cluster_fields() {
  static const std::vector<ClusterField> rows = [] {
    const std::string fit_collectives = "calibrate (mpi): fitted with intra_node.bandwidth_GBps";
    std::vector<ClusterField> r = {
        {.path = "name",
         .place = member(&ClusterSpec::name),
         .required = true,
         .example = "name: my-cluster",
         .doc = "the profile's name (result files and tables name it)"},
        {.path = "source",
         .place = member(&ClusterSpec::source),
         .doc = "where the numbers come from (citations), free text",
         .emit_when_set = true},
        {.path = "gpus_per_node",
         .place = member(&ClusterSpec::gpus_per_node),
         .min = 1,
         .max = 1024,
         .required = true,
         .example = "gpus_per_node: 8",
         .doc = "GPUs (ranks) per node"},
        {.path = "nodes",
         .place = member(&ClusterSpec::nodes),
         .min = 0,
         .max = 1 << 16,
         .doc = "nodes; 0 = as many as the experiment's mesh needs"},
        // gpu
        {.path = "gpu.name",
         .place = member(&ClusterSpec::gpu, &GpuSpec::name),
         .required = true,
         .example = "name: H100-SXM5-80GB",
         .doc = "the GPU's (or CPU rank's) name"},
        {.path = "gpu.peak_tflops",
         .place = member(&ClusterSpec::gpu, &GpuSpec::peak_tflops),
         .min = kMinPeakTflops,
         .max = kMaxPeakTflops,
         .unit = "TFLOP/s",
         .required = true,
         .example = "peak_tflops: 989",
         .doc = "dense bf16 peak",
         .calibrated =
             "calibrate (mpi): the fastest fp32 GEMM (X X^T at the NS shapes) of one rank"},
        {.path = "gpu.hbm_GBps",
         .place = member(&ClusterSpec::gpu, &GpuSpec::hbm_GBps),
         .min = kMinHbmGBps,
         .max = kMaxHbmGBps,
         .unit = "GB/s",
         .required = true,
         .example = "hbm_GBps: 3000",
         .doc = "device memory bandwidth for memory-bound ops",
         .calibrated = "calibrate (mpi): least-squares fit of momentum and apply_update times at "
                       "the NS shapes to kernel + model bytes / hbm (core/plan/plan.hpp's "
                       "op_memory_bytes); calibrate (nccl): the same fit to the CUDA momentum and "
                       "apply_update kernels' times on one GPU"},
        {.path = "gpu.memory_GiB",
         .place = member(&ClusterSpec::gpu, &GpuSpec::memory_GiB),
         .min = kMinMemoryGiB,
         .max = kMaxMemoryGiB,
         .unit = "GiB",
         .required = true,
         .example = "memory_GiB: 80",
         .doc = "memory of one GPU (or rank): the limit of the memory feasibility check",
         .calibrated = "calibrate (mpi): the machine's memory over the ranks"},
        {.path = "gpu.gemm_efficiency",
         .doc = "sustained fraction of peak by the smallest matrix dim (dims 1..2^24 increasing, "
                "efficiencies 0.001..1), linear in log2(dim); 1 when absent",
         .calibrated =
             "calibrate (mpi): each NS shape's GEMM rate over peak_tflops, by its smallest dim",
         .emitted = [](const ClusterSpec& s) { return !s.gpu.gemm_efficiency.empty(); },
         .custom_type = "map dim -> efficiency",
         .read = [](const Context& c, const Field& f,
                    ClusterSpec& s) { read_gemm_efficiency(c, f, s.gpu); },
         .emit =
             [](YAML::Emitter& out, const ClusterSpec& s) {
               out << YAML::Key << "gemm_efficiency" << YAML::Value << YAML::Flow << YAML::BeginMap;
               for (const EfficiencyPoint& p : s.gpu.gemm_efficiency)
                 out << YAML::Key << format_number(p.dim) << YAML::Value
                     << format_number(p.efficiency);
               out << YAML::EndMap;
             }},
        {.path = "gpu.ns_table",
         .doc = "measured Newton-Schulz time per call by shape ([rows, cols] or [batch, rows, "
                "cols]) and kernel version, interpolated in FLOPs; past the table by more than "
                "2x, the efficiency curve",
         .calibrated =
             "calibrate (mpi): version cpu-fp32, the CPU handler's Newton-Schulz (fp32, as "
             "the mpi executor runs it) at each shape the plans use, per call; calibrate "
             "(nccl): the GPU executor's CUDA kernel version (bench ns's timing: L2 flushed, "
             "inputs rotated, the median) at each shape the plans use and bench ns's default "
             "GPU shapes, replacing the base profile's entries of that version",
         .emitted = [](const ClusterSpec& s) { return !s.gpu.ns_table.empty(); },
         .custom_type = "list of {version, shape, steps, ms, source}",
         .read = [](const Context& c, const Field& f,
                    ClusterSpec& s) { read_ns_table(c, f, s.gpu); },
         .emit = emit_ns_table},
        {.path = "gpu.ns_kernel",
         .place = member(&ClusterSpec::gpu, &GpuSpec::ns_kernel),
         .doc = "the ns_table version the model times NS with (default v2 when the table has it, "
                "else its first)",
         .calibrated = "calibrate (nccl): the kernel version it measured",
         .emit_when_set = true},
        {.path = "gpu.elementwise_table",
         .doc = "measured time of momentum, apply_update or adamw by the elements one rank "
                "touches; absent kernels take their bytes at hbm_GBps",
         .calibrated = "calibrate (mpi): momentum, apply_update and adamw timed at the numbers of "
                       "elements the plans' ops touch on one rank (the model uses these times, "
                       "not hbm_GBps, for those ops); calibrate (nccl): the CUDA kernels the GPU "
                       "executor runs, at the same sizes",
         .emitted = [](const ClusterSpec& s) { return !s.gpu.elementwise_table.empty(); },
         .custom_type = "list of {kernel, numel, ms, source}",
         .read = [](const Context& c, const Field& f,
                    ClusterSpec& s) { read_elementwise_table(c, f, s.gpu); },
         .emit = emit_elementwise_table},
        {.path = "gpu.host_comm_us_per_message",
         .place = member(&ClusterSpec::gpu, &GpuSpec::host_comm_us_per_message),
         .min = 0,
         .max = kMaxLatencyUs,
         .unit = "us",
         .doc = "host work per message a rank sends or receives on its computing core (CPU "
                "ranks; 0 on GPUs)",
         .calibrated =
             "calibrate (mpi): Newton-Schulz back to back while exchanging 16 KiB to 4 MiB "
             "messages with a partner at its progress points, minus Newton-Schulz "
             "alone, per exchange: half the intercept of a line through the medians "
             "over the NS shapes against the bytes",
         .emit_when_set = true},
        {.path = "gpu.host_comm_ns_per_byte",
         .place = member(&ClusterSpec::gpu, &GpuSpec::host_comm_ns_per_byte),
         .min = 0,
         .max = kMaxHostCommNsPerByte,
         .unit = "ns",
         .doc = "the same per byte",
         .calibrated = "calibrate (mpi): the slope of host_comm_us_per_message's line",
         .emit_when_set = true},
        {.path = "gpu.training_efficiency",
         .place = member(&ClusterSpec::gpu, &GpuSpec::training_efficiency),
         .min = 0,
         .max = 1,
         .doc = "fraction of peak the training step's forward and backward sustain (matches "
                "published MFU); 0 = the GEMM-efficiency curve at each op's smallest GEMM dim",
         .emit_when_set = true},
        {.path = "gpu.training_efficiency_source",
         .place = member(&ClusterSpec::gpu, &GpuSpec::training_efficiency_source),
         .doc = "where training_efficiency comes from (the measurement or publication, its "
                "setup)",
         .emit_when_set = true},
        // intra_node
        {.path = "intra_node.kind",
         .required = true,
         .example = "kind: nvswitch",
         .doc = "NVLink through NVSwitch, or PCIe",
         .custom_type = "nvswitch | pcie",
         .read =
             [](const Context& c, const Field& f, ClusterSpec& s) {
               s.intra.kind = to_choice(c, f, {"nvswitch", "pcie"}) == "pcie"
                                  ? IntraNodeKind::pcie
                                  : IntraNodeKind::nvswitch;
             },
         .emit =
             [](YAML::Emitter& out, const ClusterSpec& s) {
               out << YAML::Key << "kind" << YAML::Value
                   << (s.intra.kind == IntraNodeKind::pcie ? "pcie" : "nvswitch");
             }},
        {.path = "intra_node.bandwidth_GBps",
         .place = member(&ClusterSpec::intra, &IntraNodeSpec::bandwidth_GBps),
         .min = kMinBandwidthGBps,
         .max = kMaxBandwidthGBps,
         .unit = "GB/s",
         .required = true,
         .example = "bandwidth_GBps: 450",
         .doc = "per GPU per direction (NVLink) or per PCIe link",
         .calibrated =
             "calibrate (mpi): the best collective class's rate in the fit of the model's "
             "closed form (cost_model.hpp collective_time) to the bench collective rows "
             "(measurements)"},
        {.path = "intra_node.latency_us",
         .place = member(&ClusterSpec::intra, &IntraNodeSpec::latency_us),
         .min = 0,
         .max = kMaxLatencyUs,
         .unit = "us",
         .required = true,
         .example = "latency_us: 2",
         .doc = "per transfer",
         .calibrated = fit_collectives},
        {.path = "intra_node.pcie_switch_GBps",
         .doc = "pcie only: the host bridge every GPU's traffic shares, both directions in one "
                "budget, GB/s; 0 = not limiting",
         .emitted = [](const ClusterSpec& s) { return s.intra.kind == IntraNodeKind::pcie; },
         .custom_type = "number (0, or 0.01..100,000)",
         .read =
             [](const Context& c, const Field& f, ClusterSpec& s) {
               // 0 means "not limiting"; anything else is a bandwidth in the usual range.
               s.intra.pcie_switch_GBps = to_double(c, f, 0, kMaxBandwidthGBps);
               if (s.intra.pcie_switch_GBps > 0 && s.intra.pcie_switch_GBps < kMinBandwidthGBps)
                 fail(c, f, "'" + f.path + "' = " + f.value.Scalar() + " is out of range",
                      "use 0 (the host bridge does not limit) or a number >= " +
                          format_number(kMinBandwidthGBps) +
                          " and <= " + format_number(kMaxBandwidthGBps));
             },
         .emit =
             [](YAML::Emitter& out, const ClusterSpec& s) {
               emit_number(out, "pcie_switch_GBps", s.intra.pcie_switch_GBps);
             }},
        {.path = "intra_node.nvls",
         .place = member(&ClusterSpec::intra, &IntraNodeSpec::nvls),
         .doc = "nvswitch only: NVLink SHARP, all-reduce may run in the switch when faster",
         .emit_when_set = true},
        {.path = "intra_node.nvls_latency_us",
         .place = member(&ClusterSpec::intra, &IntraNodeSpec::nvls_latency_us),
         .min = 0,
         .max = kMaxLatencyUs,
         .unit = "us",
         .doc = "NVLS's fixed cost per call (sets where the model switches from ring to NVLS)",
         .emitted = [](const ClusterSpec& s) { return s.intra.nvls; }},
        // nic
        {.path = "nic.count_per_node",
         .place = member(&ClusterSpec::nic, &NicSpec::count_per_node),
         .min = 0,
         .max = 1024,
         .required = true,
         .example = "count_per_node: 8",
         .doc = "NICs per node (0: one node, no network)"},
        {.path = "nic.bandwidth_GBps",
         .place = member(&ClusterSpec::nic, &NicSpec::bandwidth_GBps),
         .min = kMinBandwidthGBps,
         .max = kMaxBandwidthGBps,
         .unit = "GB/s",
         .required = true,
         .example = "bandwidth_GBps: 48",
         .doc = "per NIC per direction"},
        {.path = "nic.latency_us",
         .place = member(&ClusterSpec::nic, &NicSpec::latency_us),
         .min = 0,
         .max = kMaxLatencyUs,
         .unit = "us",
         .required = true,
         .example = "latency_us: 5",
         .doc = "per transfer"},
        {.path = "nic.rail_optimized",
         .place = member(&ClusterSpec::nic, &NicSpec::rail_optimized),
         .doc = "one NIC per GPU, GPU i uses NIC i (needs count_per_node = gpus_per_node)"},
        // network
        {.path = "network.topology",
         .required = true,
         .example = "topology: fat_tree",
         .doc = "the inter-node topology",
         .custom_type = "single_switch | fat_tree",
         .read =
             [](const Context& c, const Field& f, ClusterSpec& s) {
               s.network.topology = to_choice(c, f, {"single_switch", "fat_tree"}) == "fat_tree"
                                        ? TopologyKind::fat_tree
                                        : TopologyKind::single_switch;
             },
         .emit =
             [](YAML::Emitter& out, const ClusterSpec& s) {
               out << YAML::Key << "topology" << YAML::Value
                   << (s.network.topology == TopologyKind::fat_tree ? "fat_tree" : "single_switch");
             }},
        {.path = "network.levels",
         .place = member(&ClusterSpec::network, &NetworkSpec::levels),
         .min = 2,
         .max = 3,
         .doc = "fat_tree: switch levels"},
        {.path = "network.nodes_per_leaf",
         .place = member(&ClusterSpec::network, &NetworkSpec::nodes_per_leaf),
         .min = 1,
         .max = 1 << 16,
         .doc = "fat_tree: nodes under one leaf switch"},
        {.path = "network.oversubscription",
         .place = member(&ClusterSpec::network, &NetworkSpec::oversubscription),
         .min = 1,
         .max = kMaxOversubscription,
         .doc = "fat_tree: leaf uplink oversubscription (1 = non-blocking)"},
        {.path = "network.switch_latency_us",
         .place = member(&ClusterSpec::network, &NetworkSpec::switch_latency_us),
         .min = 0,
         .max = kMaxLatencyUs,
         .unit = "us",
         .doc = "per switch hop"},
    };
    add_efficiency_rows(r, "intra_node", &EfficiencySpec::intra_node,
                        "calibrate (mpi): the class's rate in the intra_node.bandwidth_GBps fit "
                        "over the best class's");
    add_efficiency_rows(r, "network", &EfficiencySpec::network, "");
    r.push_back({.path = "launch_overhead_us.collective",
                 .place = member(&ClusterSpec::launch_overhead, &LaunchOverheadSpec::collective_us),
                 .min = 0,
                 .max = kMaxLaunchOverheadUs,
                 .unit = "us",
                 .doc = "per collective call (NCCL's base latency; the ring's per-step latencies "
                        "come on top)",
                 .calibrated = fit_collectives});
    r.push_back({.path = "launch_overhead_us.kernel",
                 .place = member(&ClusterSpec::launch_overhead, &LaunchOverheadSpec::kernel_us),
                 .min = 0,
                 .max = kMaxLaunchOverheadUs,
                 .unit = "us",
                 .doc = "per compute kernel call",
                 .calibrated = "calibrate (mpi): the intercept of the gpu.hbm_GBps fit; "
                               "calibrate (nccl): the intercept of the gpu.hbm_GBps fit"});
    r.push_back(
        {.path = "measurements",
         .doc = "measured or published collective figures (nccl-tests' busbw) with their "
                "sources: the evidence a profile was calibrated from, checked by tests "
                "and by muonbed compare",
         .calibrated = "calibrate (mpi): the bench collective rows it fitted",
         .emitted = [](const ClusterSpec& s) { return !s.measurements.empty(); },
         .custom_type = "list of {op, gpus, size_bytes, busbw_GBps, time_us, algorithm, source}",
         .read = read_measurements,
         .emit = emit_measurements});
    for (const auto& [key, text] :
         std::vector<std::pair<std::string, std::string CalibrationInfo::*>>{
             {"tool", &CalibrationInfo::tool},
             {"date", &CalibrationInfo::date},
             {"host", &CalibrationInfo::host},
             {"git_hash", &CalibrationInfo::git_hash},
             {"backend", &CalibrationInfo::backend},
             {"command", &CalibrationInfo::command},
             {"notes", &CalibrationInfo::notes}})
      r.push_back({.path = "calibration." + key,
                   .place = member(&ClusterSpec::calibration, text),
                   .doc = "calibration provenance: " + key +
                          (key == "backend" ? " (mpi: the ranks are CPU ranks; tables call them "
                                              "ranks)"
                                            : ""),
                   .emit_when_set = true});
    r.back().calibrated = "calibrate: written with the profile";
    return r;
  }();
  return rows;
}

// The field's value in a default ClusterSpec equals its value in `spec`.
bool at_default(const ClusterField& f, const ClusterSpec& spec) {
  static ClusterSpec defaults;  // never changed: the accessors only read here
  ClusterSpec& s = const_cast<ClusterSpec&>(spec);
  return std::visit(
      [&](const auto& ref) {
        if constexpr (std::is_same_v<std::decay_t<decltype(ref)>, std::monostate>)
          return false;
        else
          return ref(s) == ref(defaults);
      },
      f.place);
}

// The reference's type and default text of a field.
std::string type_text(const ClusterField& f) {
  switch (f.place.index()) {
    case 1:
      return "text";
    case 2:
      return "integer";
    case 3:
      return "number";
    case 4:
      return "true | false";
  }
  return f.custom_type;
}

std::string default_text(const ClusterField& f) {
  ClusterSpec defaults;
  if (const auto* text = std::get_if<Ref<std::string>>(&f.place)) return (*text)(defaults);
  if (const auto* integer = std::get_if<Ref<int>>(&f.place))
    return std::to_string((*integer)(defaults));
  if (const auto* number = std::get_if<Ref<double>>(&f.place))
    return format_number((*number)(defaults));
  if (const auto* flag = std::get_if<Ref<bool>>(&f.place))
    return (*flag)(defaults) ? "true" : "false";
  return "";
}

std::string range_text(double min, double max, const std::string& unit) {
  return format_number(min) + " .. " + format_number(max) + (unit.empty() ? "" : " " + unit);
}

// The keys allowed in the map at `section`: its fields' keys and its subsections' last names.
std::vector<std::string> section_keys(const std::string& section) {
  std::vector<std::string> keys;
  for (const ClusterField& f : cluster_fields())
    if (section_of(f.path) == section) keys.push_back(key_of(f.path));
  for (const ClusterSection& s : cluster_sections())
    if (!s.path.empty() && s.path != section && section_of(s.path) == section)
      keys.push_back(key_of(s.path));
  return keys;
}

void read_field(const MapReader& map, const ClusterField& f, ClusterSpec& spec) {
  const Field* field = map.find(key_of(f.path));
  if (!field) return;
  const Context& ctx = map.context();
  if (f.read) {
    f.read(ctx, *field, spec);
  } else if (const auto* text = std::get_if<Ref<std::string>>(&f.place)) {
    (*text)(spec) = to_string_value(ctx, *field);
  } else if (const auto* integer = std::get_if<Ref<int>>(&f.place)) {
    (*integer)(spec) = static_cast<int>(
        to_int(ctx, *field, static_cast<std::int64_t>(f.min), static_cast<std::int64_t>(f.max)));
  } else if (const auto* number = std::get_if<Ref<double>>(&f.place)) {
    (*number)(spec) = to_double(ctx, *field, f.min, f.max);
  } else if (const auto* flag = std::get_if<Ref<bool>>(&f.place)) {
    (*flag)(spec) = to_bool(ctx, *field);
  }
}

// Reads the map of `section` (a field already checked to be there) and its subsections.
void read_section(const Context& ctx, const MapReader& map, const std::string& section,
                  bool complete, ClusterSpec& spec) {
  if (complete) {
    for (const ClusterField& f : cluster_fields())
      if (section_of(f.path) == section && f.required) map.require(key_of(f.path), f.example);
    for (const ClusterSection& s : cluster_sections())
      if (s.required && !s.path.empty() && s.path.find('.') == std::string::npos && section.empty())
        map.require(s.path, s.example);
  }
  for (const ClusterField& f : cluster_fields())
    if (section_of(f.path) == section) read_field(map, f, spec);
  for (const ClusterSection& s : cluster_sections()) {
    if (s.path.empty() || section_of(s.path) != section) continue;
    if (const Field* f = map.find(key_of(s.path)))
      read_section(ctx, MapReader(ctx, *f, section_keys(s.path)), s.path, complete, spec);
  }
}

void emit_field(YAML::Emitter& out, const ClusterField& f, const ClusterSpec& spec) {
  if (f.emitted && !f.emitted(spec)) return;
  if (f.emit_when_set && at_default(f, spec)) return;
  if (f.emit) return f.emit(out, spec);
  ClusterSpec& s = const_cast<ClusterSpec&>(spec);  // the accessors only read here
  const std::string key = key_of(f.path);
  if (const auto* text = std::get_if<Ref<std::string>>(&f.place))
    out << YAML::Key << key << YAML::Value << (*text)(s);
  else if (const auto* integer = std::get_if<Ref<int>>(&f.place))
    out << YAML::Key << key << YAML::Value << (*integer)(s);
  else if (const auto* number = std::get_if<Ref<double>>(&f.place))
    emit_number(out, key, (*number)(s));
  else if (const auto* flag = std::get_if<Ref<bool>>(&f.place))
    out << YAML::Key << key << YAML::Value << (*flag)(s);
}

// Emits the fields of `section` and its subsections, in table order (fields of a section before
// the subsections that follow them in cluster_sections(), as profiles are written).
void emit_section(YAML::Emitter& out, const std::string& section, const ClusterSpec& spec) {
  const auto subsection = [&](const ClusterSection& s) {
    if (s.path.empty() || section_of(s.path) != section) return;
    if (s.emitted && !s.emitted(spec)) return;
    out << YAML::Key << key_of(s.path) << YAML::Value;
    if (s.flow) out << YAML::Flow;
    out << YAML::BeginMap;
    emit_section(out, s.path, spec);
    out << YAML::EndMap;
  };
  // Top level: the scalars, then the sections in order, with measurements before calibration.
  for (const ClusterField& f : cluster_fields())
    if (section_of(f.path) == section && f.path != "measurements") emit_field(out, f, spec);
  for (const ClusterSection& s : cluster_sections()) {
    if (section.empty() && s.path == "calibration")
      for (const ClusterField& f : cluster_fields())
        if (f.path == "measurements") emit_field(out, f, spec);
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
  for (const ClusterField& f : cluster_fields()) paths.push_back(f.path);
  return paths;
}

void emit_cluster(YAML::Emitter& out, const ClusterSpec& spec) {
  out << YAML::BeginMap;
  emit_section(out, "", spec);
  out << YAML::EndMap;
}

std::vector<ClusterKeyDoc> cluster_key_reference() {
  const auto doc_of = [](const ClusterField& f) {
    std::string range;
    if (std::holds_alternative<Ref<int>>(f.place))
      range = range_text(f.min, f.max, "");
    else if (std::holds_alternative<Ref<double>>(f.place))
      range = range_text(f.min, f.max, f.unit);
    return ClusterKeyDoc{f.path, type_text(f), range, f.required, f.required ? "" : default_text(f),
                         f.doc,  f.calibrated};
  };
  std::vector<ClusterKeyDoc> docs;
  // The top level's own fields first, then each section's map and its fields.
  for (const ClusterField& f : cluster_fields())
    if (section_of(f.path).empty()) docs.push_back(doc_of(f));
  for (const ClusterSection& s : cluster_sections()) {
    if (s.path.empty()) continue;
    docs.push_back({s.path, "map", "", s.required, "", s.doc, ""});
    for (const ClusterField& f : cluster_fields())
      if (section_of(f.path) == s.path) docs.push_back(doc_of(f));
  }
  return docs;
}

bool ClusterNumber::allows(double value) const {
  return std::isfinite(value) && value >= min && value <= max;
}

std::string ClusterNumber::range_text() const {
  return muonbed::range_text(min, max, unit);
}

const ClusterNumber& cluster_number(std::string_view path) {
  static const std::map<std::string, ClusterNumber, std::less<>> numbers = [] {
    std::map<std::string, ClusterNumber, std::less<>> out;
    for (const ClusterField& f : cluster_fields())
      if (const auto* number = std::get_if<Ref<double>>(&f.place))
        out.emplace(f.path, ClusterNumber{f.path, f.unit, f.min, f.max, *number});
    return out;
  }();
  const auto it = numbers.find(path);
  if (it == numbers.end())
    throw std::logic_error("the cluster field table (core/config/src/cluster.cpp) has no number '" +
                           std::string(path) + "'");
  return it->second;
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
