// Calibration (core/results/calibration.hpp): the workload of an experiment's plans, the compute
// benchmark's synthetic plan, and the fits that turn measured rows into a cluster profile.
#include "core/results/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>

#include <yaml-cpp/yaml.h>

#include "core/base/errors.hpp"
#include "core/base/output_files.hpp"
#include "core/config/cluster_fields.hpp"
#include "core/config/src/cluster_yaml.hpp"
#include "core/engine/cost_model.hpp"
#include "core/plan/strategy.hpp"

namespace muonbed {

namespace {

std::string bench_op_name(OpKind kind) {
  return kind == OpKind::send ? "sendrecv" : std::string(to_string(kind));
}

bool benched(OpKind kind) {
  switch (kind) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
    case OpKind::all_reduce:
    case OpKind::all_to_all:
    case OpKind::broadcast:
    case OpKind::gather:
    case OpKind::scatter:
    case OpKind::send:
      return true;
    default:
      return false;
  }
}

OpKind bench_kind(const std::string& op) {
  return op == "sendrecv" ? OpKind::send : op_kind_from_string(op);
}

// Factor-4 sizes from a power of two at or below `lo` (at least 1 KiB) until one reaches `hi`;
// at most 7 sizes (the factor grows when the range is wider).
std::vector<std::int64_t> bench_sizes(std::int64_t lo, std::int64_t hi) {
  std::int64_t start = 1024;
  while (start * 2 <= std::max<std::int64_t>(lo, 1024)) start *= 2;
  std::int64_t factor = 4;
  while (true) {
    int count = 1;
    for (std::int64_t s = start; s < hi; s *= factor) ++count;
    if (count <= 7) break;
    factor *= 2;
  }
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = start;; s *= factor) {
    sizes.push_back(s);
    if (s >= hi) break;
  }
  return sizes;
}

std::string mesh_key(const DeviceMesh& mesh, DimSet group) {
  std::string key;
  for (int d = 0; d < mesh.ndims(); ++d)
    key += std::to_string(mesh.size(d)) + (group.contains(d) ? "*" : "") + ",";
  return key;
}

// A number for a message: %.4g (enough to tell values apart, short enough to read).
std::string num(double v) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.4g", v);
  return buffer;
}

// A byte count for a message: whole numbers in full.
std::string bytes_text(double v) {
  if (v == std::floor(v) && std::abs(v) < 1e15) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.0f", v);
    return buffer;
  }
  return num(v);
}

// A fit of y = a + b x: the intercept and slope, what plain least squares gave, and which term
// it put below 0 (the fit is then non-negative least squares').
struct Line {
  double a = 0, b = 0;
  double free_a = 0, free_b = 0;
  bool a_clamped = false, b_clamped = false;
};

// Weighted least squares of y = a + b x (weights w) with a >= 0 and b >= 0: the plain solution
// when both terms are, else the best of the fits with one or both terms at 0 (non-negative least
// squares of two terms: the minimum lies on a face of the feasible quadrant). Without
// `slope_may_be_zero` (the slope is 1 / a bandwidth) only the face a = 0 is tried: a caller
// refuses a slope least squares puts at or below 0. Every x equal: a and b cannot be told apart,
// a = 0 and b through the origin (reported as clamped).
Line nonnegative_line(const std::vector<double>& x, const std::vector<double>& y,
                      const std::vector<double>& w, bool slope_may_be_zero) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sw += w[i];
    sx += w[i] * x[i];
    sy += w[i] * y[i];
    sxx += w[i] * x[i] * x[i];
    sxy += w[i] * x[i] * y[i];
  }
  const auto residual = [&](double a, double b) {
    double sum = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double e = a + b * x[i] - y[i];
      sum += w[i] * e * e;
    }
    return sum;
  };
  Line line;
  const double det = sw * sxx - sx * sx;
  if (det > 1e-12 * sw * sxx) {
    line.free_a = (sxx * sy - sx * sxy) / det;
    line.free_b = (sw * sxy - sx * sy) / det;
  } else {  // one size: the line through the origin
    line.free_a = 0;
    line.free_b = sxx > 0 ? sxy / sxx : 0;
    line.a_clamped = true;
  }
  line.a = line.free_a;
  line.b = line.free_b;
  if (line.a >= 0 && line.b >= 0) return line;
  // The faces: a = 0 (through the origin), b = 0 (a constant), and both 0.
  const double origin_b = sxx > 0 ? std::max(0.0, sxy / sxx) : 0;
  const double constant_a = sw > 0 ? std::max(0.0, sy / sw) : 0;
  const double r_origin = residual(0, origin_b), r_constant = residual(constant_a, 0);
  if (!slope_may_be_zero || r_origin <= r_constant) {
    line.a = 0;
    line.b = origin_b;
  } else {
    line.a = constant_a;
    line.b = 0;
  }
  line.a_clamped = line.a_clamped || line.free_a < 0;
  line.b_clamped = line.free_b < 0;
  return line;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The quality of a fit from its rows' (model, measured) pairs; `describe(i)` names row i.
FitQuality fit_quality(const std::string& name, const std::vector<double>& model,
                       const std::vector<double>& measured,
                       const std::function<std::string(std::size_t)>& describe) {
  FitQuality q;
  q.name = name;
  q.rows = static_cast<int>(measured.size());
  std::vector<double> errors;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < measured.size(); ++i) {
    const double m = measured[i];
    // A measured 0 cannot be reproduced relatively: any model value other than 0 misses it fully.
    const double e =
        m != 0 ? std::abs(model[i] - m) / std::abs(m) * 100 : (model[i] == 0 ? 0.0 : 100.0);
    errors.push_back(e);
    if (!(e <= errors[worst])) worst = i;  // NaN counts as the worst
  }
  if (errors.empty()) return q;
  q.max_error_pct = errors[worst];
  q.median_error_pct = median_of(errors);
  q.worst = describe(worst);
  return q;
}

[[noreturn]] void refuse(const std::string& quantity, const std::string& value,
                         const std::string& why, const std::string& rows) {
  throw Error("calibrate: the fit gives " + quantity + " = " + value + ", which is physically " +
              "impossible (" + why + "); it came from " + rows +
              "; no profile was written; fix: rerun calibrate on a quiet machine (nothing else "
              "running, --note saying so), with more --repeats and --iters (and --runs) so that "
              "noise averages out");
}

// Writes a measured or fitted number into its profile field through the cluster field table
// (core/config/cluster_fields.hpp): a value the profile loader would refuse (not finite, or outside
// the field's range) is refused here, naming the field, the value with its unit, the range and
// the rows it came from.
void set_number(ClusterSpec& profile, std::string_view path, double value,
                const std::string& rows) {
  const ClusterNumber& field = cluster_number(path);
  if (!field.allows(value))
    refuse(field.path,
           yaml_util::format_number(value) + (field.unit.empty() ? "" : " " + field.unit),
           "a profile's " + field.path + " is finite and within " + field.range_text(), rows);
  field.ref(profile) = value;
}

// Golden-section minimum of f on [lo, hi].
double golden_min(const std::function<double(double)>& f, double lo, double hi) {
  const double g = (std::sqrt(5.0) - 1) / 2;
  double a = lo, b = hi;
  double c = b - g * (b - a), d = a + g * (b - a);
  double fc = f(c), fd = f(d);
  for (int i = 0; i < 60; ++i) {
    if (fc < fd) {
      b = d;
      d = c;
      fd = fc;
      c = b - g * (b - a);
      fc = f(c);
    } else {
      a = c;
      c = d;
      fc = fd;
      d = a + g * (b - a);
      fd = f(d);
    }
  }
  return (a + b) / 2;
}

}  // namespace

CalibrationWorkload calibration_workload(const std::vector<Experiment>& points, int ranks) {
  CalibrationWorkload w;
  w.ranks = ranks;
  std::set<NsCallShape> shapes;
  std::set<std::int64_t> numels;
  std::map<std::string, CollectiveWorkload> collectives;
  bool any = false;
  std::string sizes_seen;
  for (const Experiment& point : points) {
    const int world = point.mesh.world_size();
    if (ranks != 0 && world != ranks) {
      if (sizes_seen.find(" " + std::to_string(world) + " ") == std::string::npos)
        sizes_seen += " " + std::to_string(world) + " ";
      continue;
    }
    if (!any) {
      w.optimizer = point.optimizer;
      w.ns_steps = point.optimizer.muon.ns_steps;
    }
    any = true;
    const StepPlan plan = plan_experiment(point);
    const DeviceMesh& mesh = plan.mesh();
    for (const Op& op : plan.ops) {
      if (op.kind == OpKind::momentum || op.kind == OpKind::apply_update ||
          op.kind == OpKind::adamw) {
        for (int r : op.ranks.ranks(mesh))
          if (const std::int64_t n = elementwise_numel(plan, op, r); n > 0) numels.insert(n);
        continue;
      }
      if (op.kind == OpKind::newton_schulz) {
        for (int r : op.ranks.ranks(mesh))
          for (const MatrixWork& m : ns_work(plan, op, r))
            if (m.flops > 0) shapes.insert({m.batch, m.rows, m.cols});
        continue;
      }
      if (!benched(op.kind) || op.kind == OpKind::recv) continue;
      int span = 0;
      for (int d = 0; d < mesh.ndims(); ++d) span += op.group.contains(d) ? 1 : 0;
      if (span < 1 || span > 2 || mesh.group_size(op.group) < 2) continue;
      std::int64_t lo = 0, hi = 0;
      for (int r : op.ranks.ranks(mesh)) {
        const std::int64_t b = collective_bytes(plan, op, r);
        if (b <= 0) continue;
        lo = lo == 0 ? b : std::min(lo, b);
        hi = std::max(hi, b);
      }
      if (hi == 0) continue;
      const std::string key = bench_op_name(op.kind) + "|" + mesh_key(mesh, op.group);
      auto [it, fresh] = collectives.try_emplace(key);
      CollectiveWorkload& c = it->second;
      if (fresh) {
        c.spec.op = bench_op_name(op.kind);
        c.spec.mesh = mesh;
        c.spec.group = op.group;
        c.spec.root = 0;
        c.spec.dtype = plan.settings.comm_dtype();
        c.min_bytes = lo;
        c.max_bytes = hi;
      }
      c.min_bytes = std::min(c.min_bytes, lo);
      c.max_bytes = std::max(c.max_bytes, hi);
    }
  }
  if (!any)
    throw ConfigError(SourceLocation{points.empty() ? "" : points.front().file, 0, 0},
                      "no point of the experiment has " + std::to_string(ranks) +
                          " ranks (its meshes have" + sizes_seen + "ranks)",
                      "calibrate with --ranks set to one of those sizes");
  w.ns_shapes.assign(shapes.begin(), shapes.end());
  // The smallest and largest size and sizes between them at least 2x apart: the table is
  // interpolated between its points.
  for (const std::int64_t n : numels)
    if (w.elementwise_numels.empty() || n >= 2 * w.elementwise_numels.back() ||
        n == *numels.rbegin())
      w.elementwise_numels.push_back(n);
  for (auto& [key, c] : collectives) {
    c.sizes = bench_sizes(c.min_bytes, c.max_bytes);
    w.collectives.push_back(std::move(c));
  }
  return w;
}

CalibrationWorkload default_calibration_workload(int ranks) {
  CalibrationWorkload w;
  w.ranks = ranks;
  w.ns_shapes = {{1, 256, 256}, {1, 256, 688}, {1, 512, 512}, {1, 1024, 1024}};
  w.elementwise_numels = {1 << 16, 1 << 20, 1 << 22};
  const DeviceMesh mesh({{"g", ranks, DimRole::replicate}}, std::max(8, ranks));
  for (const std::string& op : collective_bench_ops()) {
    CollectiveWorkload c;
    c.spec.op = op;
    c.spec.mesh = mesh;
    c.spec.group = DimSet::of({0});
    c.spec.dtype = DType::bf16;
    c.min_bytes = 4096;
    c.max_bytes = 16 << 20;
    c.sizes = bench_sizes(c.min_bytes, c.max_bytes);
    w.collectives.push_back(std::move(c));
  }
  return w;
}

CalibrationWorkload calibrate_workload(const std::vector<Experiment>& points, int ranks,
                                       const std::vector<NsCallShape>& table_shapes) {
  CalibrationWorkload w = points.empty() ? default_calibration_workload(std::max(ranks, 2))
                                         : calibration_workload(points, ranks);
  std::set<NsCallShape> shapes(w.ns_shapes.begin(), w.ns_shapes.end());
  shapes.insert(table_shapes.begin(), table_shapes.end());
  w.ns_shapes.assign(shapes.begin(), shapes.end());
  return w;
}

std::vector<StepPlan> calibration_bench_plans(const CalibrationWorkload& w,
                                              const DeviceMesh& mesh) {
  std::vector<StepPlan> plans;
  for (const NsCallShape& s : w.ns_shapes)
    plans.push_back(compute_bench_plan(mesh, s, w.optimizer));
  for (const std::int64_t n : w.elementwise_numels)
    plans.push_back(elementwise_bench_plan(mesh, n, w.optimizer));
  return plans;
}

std::vector<ComputeBenchRow> calibration_compute_rows(const CalibrationWorkload& w) {
  const DeviceMesh one({{"g", 1, DimRole::replicate}}, 8);
  std::vector<ComputeBenchRow> rows;
  const std::vector<StepPlan> plans = calibration_bench_plans(w, one);
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const StepPlan& plan = plans[i];
    const DistributedParam& p = plan.model.params.front();
    const bool elementwise = i >= w.ns_shapes.size();  // the elementwise_bench_plans come last
    // Ops 0, 1, 2: momentum, newton_schulz, apply_update; op 3: adamw (elementwise plans).
    const std::vector<int> ops =
        elementwise ? std::vector<int>{0, 2, 3} : std::vector<int>{0, 1, 2};
    for (const int j : ops) {
      const Op& op = plan.ops[static_cast<std::size_t>(j)];
      ComputeBenchRow r;
      r.kernel = std::string(to_string(op.kind));
      r.numel = p.numel();
      if (elementwise) {
        r.step_sized = true;
      } else {
        r.shape = {p.batch(), p.rows(), p.cols()};
      }
      if (op.kind == OpKind::newton_schulz)
        r.flops = op_flops(plan, op, 0);
      else
        r.model_bytes = op_memory_bytes(plan, op, 0);
      rows.push_back(r);
    }
  }
  return rows;
}

StepPlan compute_bench_plan(const DeviceMesh& mesh, const NsCallShape& shape,
                            const OptimizerConfig& optimizer) {
  DistributedParam p;
  p.name = "matrix";
  p.shape = shape.batch > 1 ? std::vector<std::int64_t>{shape.batch, shape.rows, shape.cols}
                            : std::vector<std::int64_t>{shape.rows, shape.cols};
  p.dtype = DType::bf16;
  p.optimizer = OptimizerKind::muon;
  p.layout =
      TensorLayout(mesh, p.shape, std::vector<Placement>(mesh.ndims(), Placement::replicate()));
  ShardedModel model = shard_explicitly(mesh, "calibrate", {p});
  Assignment assignment;
  assignment.owner = {0};
  PlanSettings settings;
  settings.optimizer = optimizer;
  PlanBuilder b(std::move(model), std::move(assignment), settings);
  const int compute = b.stream("compute");
  // One op of the chain on the one matrix, every rank, after `deps`.
  const auto emit = [&](OpKind kind, std::string label, std::vector<int> deps) {
    Op op;
    op.kind = kind;
    op.stream = compute;
    op.ranks = RankBox::everyone(b.mesh());
    op.params = {0};
    if (kind == OpKind::newton_schulz) op.ns_steps = settings.ns_steps();
    op.deps = std::move(deps);
    op.label = std::move(label);
    return b.emit(std::move(op));
  };
  const int m = emit(OpKind::momentum, "momentum", {});
  const int n = emit(OpKind::newton_schulz, "NS matrix", {m});
  emit(OpKind::apply_update, "apply", {n});
  return b.finish("calibrate_compute", "{}");
}

std::optional<SpeedProbe> speed_probe(const StepPlan& plan, const ClusterSpec& cluster,
                                      bool from_profile) {
  const DeviceMesh& mesh = plan.mesh();
  std::optional<NsCallShape> costliest;
  double most = 0;
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::newton_schulz) continue;
    for (int r : op.ranks.ranks(mesh))
      for (const MatrixWork& m : ns_work(plan, op, r))
        if (m.flops > most) {
          most = m.flops;
          costliest = NsCallShape{m.batch, m.rows, m.cols};
        }
  }
  if (!costliest && from_profile) {
    const GpuSpec& gpu = cluster.gpu;
    const std::vector<std::string> versions = gpu.ns_versions();
    const std::string version =
        !gpu.ns_kernel.empty() ? gpu.ns_kernel : (versions.empty() ? "" : versions.front());
    constexpr double kProbeTargetMs = 10;
    double best = 0;
    for (const NsTiming& t : gpu.ns_table) {
      if (t.version != version || !(t.ms > 0)) continue;
      const double distance = std::abs(std::log(t.ms / kProbeTargetMs));
      if (!costliest || distance < best) {
        best = distance;
        costliest = NsCallShape{t.batch, t.rows, t.cols};
      }
    }
  }
  if (!costliest) return std::nullopt;
  SpeedProbe probe;
  probe.shape = *costliest;
  probe.plan = compute_bench_plan(mesh, probe.shape, plan.settings.optimizer);
  probe.predicted_s = compute_time(probe.plan, probe.plan.ops[1], 0, cluster);
  return probe;
}

StepPlan elementwise_bench_plan(const DeviceMesh& mesh, std::int64_t numel,
                                const OptimizerConfig& optimizer) {
  const StepPlan muon = compute_bench_plan(mesh, {1, 1, numel}, optimizer);
  std::vector<DistributedParam> params = muon.model.params;
  DistributedParam v;
  v.name = "vector";
  v.shape = {numel};
  v.dtype = DType::bf16;
  v.optimizer = OptimizerKind::adamw;
  v.layout =
      TensorLayout(mesh, v.shape, std::vector<Placement>(mesh.ndims(), Placement::replicate()));
  params.push_back(std::move(v));
  Assignment assignment;
  assignment.owner = {0, 0};
  PlanSettings settings = muon.settings;
  PlanBuilder b(shard_explicitly(mesh, "calibrate", std::move(params)), std::move(assignment),
                settings);
  b.stream("compute");
  for (Op op : muon.ops) b.emit(std::move(op));
  Op adamw;
  adamw.kind = OpKind::adamw;
  adamw.stream = 0;
  adamw.ranks = RankBox::everyone(b.mesh());
  adamw.params = {1};
  adamw.label = "adamw";
  b.emit(std::move(adamw));
  return b.finish("calibrate_elementwise", "{}");
}

double model_bench_seconds(const ClusterSpec& cluster, const CollectiveBenchRow& row) {
  const OpKind kind = bench_kind(row.op);
  const int n = kind == OpKind::send ? 2 : row.group_size;
  std::vector<int> members(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) members[static_cast<std::size_t>(i)] = i;
  const LinkParams link =
      link_for_group(cluster, std::max(1, cluster.gpus_per_node), members, kind);
  return collective_time(kind, n, static_cast<double>(row.size_bytes), link);
}

namespace {

std::string shape_text(const NsCallShape& s) {
  return (s.batch > 1 ? std::to_string(s.batch) + "x" : "") + std::to_string(s.rows) + "x" +
         std::to_string(s.cols);
}

std::string compute_row_text(const ComputeBenchRow& r) {
  std::string text = r.kernel + " ";
  text += r.numel > 0 && r.shape.rows == 0 ? std::to_string(r.numel) + " elements"
                                           : shape_text(r.shape);
  if (r.model_bytes > 0) text += " (" + bytes_text(r.model_bytes) + " B)";
  return text + ": " + num(r.seconds * 1e3) + " ms";
}

std::string collective_row_text(const CollectiveBenchRow& r) {
  return r.op + " " + std::to_string(r.size_bytes) + " B over " + std::to_string(r.group_size) +
         " ranks";
}

// "a, b, c" of up to `most` items, then "and N more".
std::string list_text(const std::vector<std::string>& items, std::size_t most = 8) {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < most; ++i) out += (i ? "; " : "") + items[i];
  if (items.size() > most) out += "; and " + std::to_string(items.size() - most) + " more";
  return out.empty() ? "no rows" : out;
}

// The compute fits of every backend (calibrate_profile, calibrate_compute) into result.profile:
// gpu.ns_table rows of `ns_version`, gpu.ns_kernel, gpu.elementwise_table, gpu.hbm_GBps and
// launch_overhead_us.kernel; from the mpi ranks' gemm and host_comm rows also gpu.peak_tflops,
// gpu.gemm_efficiency and the host-comm costs (without them the profile's values stay).
void fit_compute(const std::vector<ComputeBenchRow>& compute, const std::string& ns_version,
                 int ns_steps, CalibrationResult& result) {
  ClusterSpec& c = result.profile;
  int ns_rows = 0;
  const std::string noisy_fix =
      "rerun on a quiet machine with more --repeats (and --iters, --runs) if that is not expected";

  // Compute: the NS table, GEMM peak and efficiency curve, elementwise bandwidth and launch.
  std::map<double, double> gemm_rate;  // min dim -> best FLOP/s
  double peak = 0;
  std::vector<const ComputeBenchRow*> line_rows;  // momentum and apply_update at the NS shapes
  std::map<double, std::vector<double>> host_exchange;  // bytes per exchange -> extra seconds
  for (const ComputeBenchRow& r : compute) {
    if (r.kernel == "host_comm") {  // may be <= 0 by noise: medians over shapes decide
      if (!std::isfinite(r.seconds))
        refuse("gpu.host_comm_us_per_message and host_comm_ns_per_byte",
               "a line through " + num(r.seconds * 1e6) + " us", "a time must be finite",
               "the row " + compute_row_text(r));
      if (r.model_bytes > 0) host_exchange[r.model_bytes].push_back(r.seconds);
      continue;
    }
    if (!(r.seconds > 0)) continue;
    if (r.kernel == "newton_schulz") {
      if (!std::isfinite(r.seconds))
        refuse("gpu.ns_table (" + shape_text(r.shape) + ")", num(r.seconds * 1e3) + " ms",
               "a time must be finite", "the row " + compute_row_text(r));
      NsTiming t;
      t.version = ns_version;
      t.batch = r.shape.batch;
      t.rows = r.shape.rows;
      t.cols = r.shape.cols;
      t.steps = ns_steps;
      ++ns_rows;
      t.ms = r.seconds * 1e3;
      c.gpu.ns_table.push_back(t);
    } else if (r.kernel == "gemm") {
      const double rate = r.flops / r.seconds;
      if (!std::isfinite(rate) || !(rate > 0))
        refuse("a GEMM rate (gpu.peak_tflops, gpu.gemm_efficiency)", num(rate / 1e12) + " TFLOP/s",
               "a rate must be finite and above 0", "the row " + compute_row_text(r));
      const double dim = static_cast<double>(std::min(r.shape.rows, r.shape.cols));
      gemm_rate[dim] = std::max(gemm_rate[dim], rate);
      peak = std::max(peak, rate);
    } else if (r.step_sized) {
      if (!std::isfinite(r.seconds))
        refuse("gpu.elementwise_table (" + r.kernel + ", " + std::to_string(r.numel) + ")",
               num(r.seconds * 1e3) + " ms", "a time must be finite",
               "the row " + compute_row_text(r));
      c.gpu.elementwise_table.push_back({r.kernel, r.numel, r.seconds * 1e3, ""});
    } else if (r.kernel == "momentum" || r.kernel == "apply_update") {
      line_rows.push_back(&r);
    }
  }
  if (ns_rows == 0)
    throw Error("calibrate: no Newton-Schulz timing was measured; fix: give shapes to time");
  c.gpu.ns_kernel = ns_version;
  if (!host_exchange.empty()) {
    // A line through the median extra time per exchange (two messages: one sent, one received)
    // against its bytes: the intercept is the cost of two messages, the slope the cost per byte.
    std::vector<double> x, y;
    std::vector<std::string> rows;
    for (auto& [b, extra] : host_exchange) {
      x.push_back(b);
      y.push_back(median_of(extra));
      rows.push_back(bytes_text(b) + " B: " + num(y.back() * 1e6) + " us (median of " +
                     std::to_string(extra.size()) + ")");
    }
    const std::string from =
        "the median extra Newton-Schulz time per exchange of messages (host_comm rows) at " +
        list_text(rows);
    const Line line = nonnegative_line(x, y, std::vector<double>(x.size(), 1.0), true);
    const std::string refit =
        "; refitted by non-negative least squares (every term >= 0): " + num(line.a / 2 * 1e6) +
        " us per message + " + num(line.b * 1e9) + " ns per byte; " + noisy_fix;
    if (line.a_clamped)
      result.clamped.push_back("gpu.host_comm_us_per_message: least squares gave " +
                               num(line.free_a / 2 * 1e6) + " us per message" +
                               (line.free_a >= 0 ? " (one size: no intercept)" : "") + " from " +
                               from + refit);
    if (line.b_clamped)
      result.clamped.push_back("gpu.host_comm_ns_per_byte: least squares gave " +
                               num(line.free_b * 1e9) + " ns per byte from " + from + refit);
    set_number(c, "gpu.host_comm_us_per_message", line.a / 2 * 1e6, from);
    set_number(c, "gpu.host_comm_ns_per_byte", line.b * 1e9, from);
    std::vector<double> model;
    for (double b : x) model.push_back(line.a + line.b * b);
    result.fits.push_back(fit_quality(
        "gpu.host_comm_us_per_message + host_comm_ns_per_byte (line through the median extra "
        "time per exchange)",
        model, y, [&](std::size_t i) {
          return bytes_text(x[i]) + " B per exchange: model " + num(model[i] * 1e6) +
                 " us, measured " + num(y[i] * 1e6) + " us";
        }));
  }
  // Without GEMM rows (a GPU timer) the base profile's peak and efficiency curve stay.
  if (!(peak > 0) && !(c.gpu.peak_tflops > 0))
    throw Error("calibrate: no GEMM rate was measured; fix: check the compute benchmark");
  if (peak > 0) {
    set_number(c, "gpu.peak_tflops", peak / 1e12, "the fastest GEMM row");
    c.gpu.gemm_efficiency.clear();
    for (const auto& [dim, rate] : gemm_rate)
      c.gpu.gemm_efficiency.push_back({dim, std::clamp(rate / peak, 0.001, 1.0)});
  }
  if (line_rows.size() >= 2) {
    // Least squares of t = kernel + bytes / hbm, weighted by 1 / t^2 (relative errors).
    std::vector<double> x, y, w;
    std::vector<std::string> rows;
    for (const ComputeBenchRow* r : line_rows) {
      x.push_back(r->model_bytes);
      y.push_back(r->seconds);
      w.push_back(1.0 / (r->seconds * r->seconds));
      rows.push_back(compute_row_text(*r));
    }
    const std::string from = std::to_string(rows.size()) +
                             " momentum and apply_update rows at the NS shapes: " + list_text(rows);
    for (std::size_t i = 0; i < y.size(); ++i)
      if (!std::isfinite(y[i]) || !std::isfinite(x[i]))
        refuse("gpu.hbm_GBps and launch_overhead_us.kernel",
               "a line through " + num(y[i] * 1e6) + " us at " + num(x[i]) + " B",
               "times and bytes must be finite", from);
    const Line line = nonnegative_line(x, y, w, false);
    if (!(line.free_b > 0) || !(line.b > 0))
      refuse("gpu.hbm_GBps", line.free_b != 0 ? num(1.0 / line.free_b / 1e9) + " GB/s" : "infinite",
             "least squares gives " + num(line.free_b * 1e9) +
                 " ns per byte: the elementwise times do not grow with the bytes, and a "
                 "bandwidth must be finite and above 0",
             from);
    if (line.a_clamped)
      result.clamped.push_back(
          "launch_overhead_us.kernel: least squares gave " + num(line.free_a * 1e6) +
          " us per kernel" + (line.free_a >= 0 ? " (one size: no intercept)" : "") + " from " +
          from + "; refitted by non-negative least squares with it at 0: hbm_GBps " +
          num(1.0 / line.b / 1e9) + "; " + noisy_fix);
    set_number(c, "gpu.hbm_GBps", 1.0 / line.b / 1e9, from);
    set_number(c, "launch_overhead_us.kernel", line.a * 1e6, from);
    std::vector<double> model;
    for (double b : x) model.push_back(line.a + line.b * b);
    result.fits.push_back(fit_quality(
        "gpu.hbm_GBps + launch_overhead_us.kernel (line through momentum and apply_update "
        "times)",
        model, y, [&](std::size_t i) {
          return line_rows[i]->kernel + " " + shape_text(line_rows[i]->shape) + " (" +
                 bytes_text(x[i]) + " B): model " + num(model[i] * 1e6) + " us, measured " +
                 num(y[i] * 1e6) + " us";
        }));
  } else if (!(c.gpu.hbm_GBps > 0)) {  // a base profile's value stays
    set_number(c, "gpu.hbm_GBps", 10,
               "a placeholder: fewer than two momentum and apply_update rows");
  }
}

}  // namespace

CalibrationResult calibrate_profile(const CalibrationInput& in) {
  CalibrationResult result;
  ClusterSpec& c = result.profile;
  c.name = in.name;
  c.gpus_per_node = std::max(8, in.ranks);
  c.nodes = 1;
  c.gpu.name = "cpu-rank";
  set_number(c, "gpu.memory_GiB", in.memory_GiB, "the machine's memory over the ranks");
  c.intra.kind = IntraNodeKind::pcie;
  c.intra.pcie_switch_GBps = 0;
  // One machine: the NIC is a placeholder the single-node model never uses (10 GbE).
  c.nic.count_per_node = 1;
  c.nic.bandwidth_GBps = 1.25;
  c.nic.latency_us = 20;
  c.network.topology = TopologyKind::single_switch;
  c.calibration = in.info;
  fit_compute(in.compute, in.ns_version, in.ns_steps, result);

  // Collectives: bandwidth per class, one latency, one launch overhead.
  std::vector<CollectiveBenchRow> rows;
  for (const CollectiveBenchRow& r : in.collectives)
    if (r.time_us > 0 && r.size_bytes > 0) {
      if (!std::isfinite(r.time_us) || !std::isfinite(r.algbw_GBps))
        refuse("the collective fit (intra_node.*)", "a fit through " + num(r.time_us) + " us",
               "a time must be finite", "the bench row " + collective_row_text(r));
      rows.push_back(r);
    }
  std::map<CollectiveClass, double> bw;  // GB/s
  for (const CollectiveBenchRow& r : rows) {
    const CollectiveClass cls = collective_class(bench_kind(r.op));
    bw[cls] = std::max(bw[cls], r.algbw_GBps);
  }
  if (bw.empty()) {
    const std::string none = "a placeholder: no bench collective rows";
    set_number(c, "intra_node.bandwidth_GBps", 5, none);
    set_number(c, "intra_node.latency_us", 1, none);
    return result;
  }
  double latency_us = 1, launch_us = 5;
  const auto apply = [&](ClusterSpec& s) {
    s.intra.latency_us = latency_us;
    s.launch_overhead.collective_us = launch_us;
    s.intra.bandwidth_GBps = 1;
    const auto eff = [&](CollectiveClass cls) {
      const auto it = bw.find(cls);
      return it == bw.end() ? 1.0 : it->second;
    };
    s.efficiency.intra_node.ring = eff(CollectiveClass::ring);
    s.efficiency.intra_node.all_to_all = eff(CollectiveClass::all_to_all);
    s.efficiency.intra_node.p2p = eff(CollectiveClass::p2p);
    s.efficiency.intra_node.nvls = 1;
  };
  const auto loss = [&]() {
    ClusterSpec s = c;
    apply(s);
    double sum = 0;
    for (const CollectiveBenchRow& r : rows) {
      const double e = std::log(model_bench_seconds(s, r) / (r.time_us * 1e-6));
      sum += e * e;
    }
    return sum;
  };
  for (int sweep = 0; sweep < 6; ++sweep) {
    launch_us = std::exp(golden_min(
                    [&](double x) {
                      launch_us = std::exp(x) - 0.01;
                      return loss();
                    },
                    std::log(0.01), std::log(10000.0))) -
                0.01;
    latency_us = std::exp(golden_min(
                     [&](double x) {
                       latency_us = std::exp(x) - 0.01;
                       return loss();
                     },
                     std::log(0.01), std::log(1000.0))) -
                 0.01;
    for (auto& [cls, value] : bw) {
      double& v = value;
      v = std::exp(golden_min(
          [&](double x) {
            v = std::exp(x);
            return loss();
          },
          std::log(0.01), std::log(10000.0)));
    }
  }
  // The parametrization keeps both at or above 0 (exp(x) - 0.01 with x >= log(0.01)); rounding
  // may leave -1e-18.
  latency_us = std::max(0.0, latency_us);
  launch_us = std::max(0.0, launch_us);
  double line = 0;
  for (const auto& [cls, value] : bw) line = std::max(line, value);
  {
    std::vector<std::string> texts;
    for (const CollectiveBenchRow& r : rows) texts.push_back(collective_row_text(r));
    const std::string from =
        std::to_string(rows.size()) + " bench collective rows: " + list_text(texts);
    if (!std::isfinite(line) || !(line > 0))
      refuse("intra_node.bandwidth_GBps", num(line), "a bandwidth must be finite and above 0",
             from);
    if (!std::isfinite(latency_us))
      refuse("intra_node.latency_us", num(latency_us), "a latency must be finite and >= 0", from);
    if (!std::isfinite(launch_us))
      refuse("launch_overhead_us.collective", num(launch_us), "a cost must be finite and >= 0",
             from);
    set_number(c, "intra_node.bandwidth_GBps", line, from);
    set_number(c, "intra_node.latency_us", latency_us, from);
    set_number(c, "launch_overhead_us.collective", launch_us, from);
    for (const auto& [cls, name] : {std::pair{CollectiveClass::ring, "ring"},
                                    {CollectiveClass::all_to_all, "all_to_all"},
                                    {CollectiveClass::p2p, "p2p"}}) {
      const auto it = bw.find(cls);
      set_number(c, std::string("efficiency.intra_node.") + name,
                 it == bw.end() ? 1.0 : std::clamp(it->second / line, 0.001, 1.0), from);
    }
    set_number(c, "efficiency.intra_node.nvls", 1, "a constant: CPU ranks have no NVLink SHARP");
  }

  // How well the fitted closed form reproduces the rows, per collective.
  std::vector<std::string> ops;
  for (const CollectiveBenchRow& r : rows)
    if (std::find(ops.begin(), ops.end(), r.op) == ops.end()) ops.push_back(r.op);
  for (const std::string& op : ops) {
    std::vector<const CollectiveBenchRow*> mine;
    std::vector<double> model, measured;
    for (const CollectiveBenchRow& r : rows)
      if (r.op == op) {
        mine.push_back(&r);
        model.push_back(model_bench_seconds(c, r) * 1e6);
        measured.push_back(r.time_us);
      }
    result.fits.push_back(
        fit_quality("collective closed form (intra_node.*, launch_overhead_us.collective, "
                    "efficiency.intra_node) on " +
                        op,
                    model, measured, [&](std::size_t i) {
                      return collective_row_text(*mine[i]) + ": model " + num(model[i]) +
                             " us, measured " + num(measured[i]) + " us";
                    }));
  }

  for (const CollectiveBenchRow& r : rows) {
    if (r.instances != 1 || r.group_size != r.gpus) continue;  // measurements: one group of all
    MeasuredCollective m;
    m.op = r.op;
    m.gpus = r.gpus;
    m.size_bytes = r.size_bytes;
    m.busbw_GBps = r.busbw_GBps;
    m.time_us = r.time_us;
    m.source = "muonbed calibrate: bench collective --backend " + r.backend;
    c.measurements.push_back(m);
  }
  return result;
}

ClusterSpec calibrated_profile(const CalibrationInput& in) {
  return calibrate_profile(in).profile;
}

CalibrationResult calibrate_compute(const ClusterSpec& base,
                                    const std::vector<ComputeBenchRow>& rows,
                                    const std::string& ns_version, int ns_steps,
                                    const std::string& name, const CalibrationInfo& info) {
  CalibrationResult result;
  ClusterSpec& c = result.profile;
  c = base;
  c.name = name;
  c.calibration = info;
  // The measured version's entries are replaced; the base's other versions (v1, pytorch) stay.
  std::erase_if(c.gpu.ns_table, [&](const NsTiming& t) { return t.version == ns_version; });
  if (std::any_of(rows.begin(), rows.end(), [](const ComputeBenchRow& r) { return r.step_sized; }))
    c.gpu.elementwise_table.clear();
  fit_compute(rows, ns_version, ns_steps, result);
  const std::string source = "muonbed calibrate --backend " +
                             (info.backend.empty() ? std::string("?") : info.backend) + ", " +
                             info.date;
  for (NsTiming& t : c.gpu.ns_table)
    if (t.version == ns_version && t.source.empty()) t.source = source;
  for (ElementwiseTiming& t : c.gpu.elementwise_table)
    if (t.source.empty()) t.source = source;
  return result;
}

ClusterSpec write_calibrated_profile(const std::string& path, CalibrationResult& fitted,
                                     std::vector<std::string> header,
                                     const std::vector<std::string>& after_fields,
                                     const std::string& backend, double max_fit_error) {
  ClusterSpec& profile = fitted.profile;
  const std::vector<std::string> fit_warnings = fit_error_warnings(fitted, max_fit_error);
  if (!fit_warnings.empty() || !fitted.clamped.empty())
    profile.source +=
        "; WARNING: " +
        (fit_warnings.empty() ? std::string()
                              : std::to_string(fit_warnings.size()) +
                                    " fit(s) above --max-fit-error " + num(max_fit_error) + " %") +
        (!fit_warnings.empty() && !fitted.clamped.empty() ? ", " : "") +
        (fitted.clamped.empty() ? std::string()
                                : std::to_string(fitted.clamped.size()) + " term(s) clamped at 0") +
        " (see the header)";
  // From the cluster field table, as the key reference (docs/KEYS.md) says it.
  for (const std::string& line : calibrated_fields_header(backend)) header.push_back(line);
  for (const std::string& line : after_fields) header.push_back(line);
  header.push_back("");
  for (const std::string& line : fit_quality_header(fitted, max_fit_error)) header.push_back(line);
  // The new profile replaces an old one only after the loader users run has read it back.
  ClusterSpec back;
  WriteOptions write;
  write.what = "cluster profile";
  write.validate = [&back](const std::string& temp) { back = load_cluster_file(temp); };
  write_output_file(path, calibrated_profile_yaml(profile, header), write);
  return back;
}

std::vector<std::string> fit_error_warnings(const CalibrationResult& result, double max_pct) {
  std::vector<std::string> out;
  for (const FitQuality& f : result.fits)
    if (!(f.max_error_pct <= max_pct))
      out.push_back("fit error " + num(f.max_error_pct) + " % is above --max-fit-error " +
                    num(max_pct) + " %: " + f.name + ": |error| median " + num(f.median_error_pct) +
                    " %, max " + num(f.max_error_pct) + " % over " + std::to_string(f.rows) +
                    " rows; worst " + f.worst +
                    " (the model does not reproduce its own calibration rows: rerun on a quiet "
                    "machine with more --repeats / --iters, or use this profile knowing that)");
  return out;
}

std::vector<std::string> fit_quality_header(const CalibrationResult& result, double max_pct) {
  std::vector<std::string> out;
  out.push_back(
      "fit quality (|model - measured| / |measured| over the rows each fit was made "
      "from; --max-fit-error " +
      num(max_pct) + " %):");
  for (const FitQuality& f : result.fits)
    out.push_back("  " + f.name + ": |error| median " + num(f.median_error_pct) + " %, max " +
                  num(f.max_error_pct) + " % over " + std::to_string(f.rows) + " rows" +
                  (f.worst.empty() ? "" : " (worst " + f.worst + ")"));
  if (result.fits.empty()) out.push_back("  (no fitted quantity: every number is measured)");
  for (const std::string& w : fit_error_warnings(result, max_pct)) out.push_back("WARNING: " + w);
  for (const std::string& c : result.clamped) out.push_back("CLAMPED: " + c);
  return out;
}

std::vector<std::string> calibrated_fields_header(const std::string& backend) {
  constexpr std::size_t kIndent = 28, kWidth = 100;
  // A field's calibrated text has one part per backend: "calibrate (mpi): ...; calibrate
  // (nccl): ...".
  const std::string prefix = "calibrate (" + backend + "): ";
  std::vector<std::string> out;
  for (const ClusterKeyDoc& d : cluster_key_reference()) {
    const std::size_t at = d.calibrated.find(prefix);
    if (at == std::string::npos) continue;
    const std::size_t next = d.calibrated.find("; calibrate (", at + prefix.size());
    const std::string text = d.calibrated.substr(
        at + prefix.size(),
        next == std::string::npos ? std::string::npos : next - at - prefix.size());
    std::string line = "  " + d.path;
    line += std::string(line.size() + 1 < kIndent ? kIndent - line.size() : 1, ' ');
    bool first = true;
    std::istringstream words(text);
    for (std::string word; words >> word; first = false) {
      if (!first && line.size() + 1 + word.size() > kWidth) {
        out.push_back(line);
        line = std::string(kIndent, ' ') + word;
      } else {
        line += (first ? "" : " ") + word;
      }
    }
    out.push_back(line);
  }
  return out;
}

namespace {

std::string fmt_hex_escape(unsigned char u) {
  static constexpr char kHex[] = "0123456789abcdef";
  return std::string("\\x") + kHex[u >> 4] + kHex[u & 15];
}

}  // namespace

std::string calibrated_profile_yaml(const ClusterSpec& cluster,
                                    const std::vector<std::string>& header) {
  std::string out;
  // A header line holds free text (--note, host names): a line break in it would end the comment
  // and put whatever follows into the profile, so control characters are written as escapes.
  for (const std::string& line : header) {
    std::string text;
    for (const char c : line) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '\n')
        text += "\\n";
      else if (c == '\r')
        text += "\\r";
      else if (u < 0x20 || u == 0x7f)
        text += fmt_hex_escape(u);
      else
        text += c;
    }
    out += (text.empty() ? "#" : "# " + text) + "\n";
  }
  YAML::Emitter e;
  emit_cluster(e, cluster);
  out += e.c_str();
  out += "\n";
  return out;
}

}  // namespace muonbed
