// Calibration (core/results/calibration.hpp): the workload of an experiment's plans, the compute
// benchmark's synthetic plan, and the fits that turn measured rows into a cluster profile.
#include "core/results/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <yaml-cpp/yaml.h>

#include "core/engine/cost_model.hpp"
#include "core/base/errors.hpp"
#include "core/config/src/yaml_util.hpp"
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

// Least squares of t = a + b x with weights w (here 1/t^2: relative error); a >= 0.
std::pair<double, double> weighted_line(const std::vector<double>& x,
                                        const std::vector<double>& t) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (t[i] * t[i]);
    sw += w;
    sx += w * x[i];
    sy += w * t[i];
    sxx += w * x[i] * x[i];
    sxy += w * x[i] * t[i];
  }
  const double det = sw * sxx - sx * sx;
  double a = 0, b = 0;
  if (det > 0) {
    a = (sxx * sy - sx * sxy) / det;
    b = (sw * sxy - sx * sy) / det;
  }
  if (!(a >= 0) || !(b > 0)) {  // through the origin
    a = 0;
    b = sxx > 0 ? sxy / sxx : 0;
  }
  return {a, b};
}

// Least squares y = a + b x with a, b >= 0 (a cost per call and per byte; noise may make a
// measured point <= 0): a negative slope becomes a constant, a negative intercept a line through
// the origin.
std::pair<double, double> host_comm_line(const std::vector<double>& x,
                                         const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  const double det = n * sxx - sx * sx;
  double a = n > 0 ? sy / n : 0, b = 0;
  if (det > 0) {
    b = (n * sxy - sx * sy) / det;
    a = (sy - b * sx) / n;
  }
  if (b < 0) {
    b = 0;
    a = n > 0 ? sy / n : 0;
  }
  if (a < 0) {
    a = 0;
    b = sxx > 0 ? std::max(0.0, sxy / sxx) : 0;
  }
  return {std::max(0.0, a), b};
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
    if (world != ranks) {
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
  Op momentum;
  momentum.kind = OpKind::momentum;
  momentum.stream = compute;
  momentum.ranks = RankBox::everyone(b.mesh());
  momentum.params = {0};
  momentum.label = "momentum";
  const int m = b.emit(std::move(momentum));
  Op ns;
  ns.kind = OpKind::newton_schulz;
  ns.stream = compute;
  ns.ranks = RankBox::everyone(b.mesh());
  ns.params = {0};
  ns.ns_steps = settings.ns_steps();
  ns.deps = {m};
  ns.label = "NS matrix";
  const int n = b.emit(std::move(ns));
  Op apply;
  apply.kind = OpKind::apply_update;
  apply.stream = compute;
  apply.ranks = RankBox::everyone(b.mesh());
  apply.params = {0};
  apply.deps = {n};
  apply.label = "apply";
  b.emit(std::move(apply));
  return b.finish("calibrate_compute", "{}");
}

std::optional<SpeedProbe> speed_probe(const StepPlan& plan, const ClusterSpec& cluster) {
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

ClusterSpec calibrated_profile(const CalibrationInput& in) {
  ClusterSpec c;
  c.name = in.name;
  c.gpus_per_node = std::max(8, in.ranks);
  c.nodes = 1;
  c.gpu.name = "cpu-rank";
  c.gpu.memory_GiB = in.memory_GiB;
  c.intra.kind = IntraNodeKind::pcie;
  c.intra.pcie_switch_GBps = 0;
  // One machine: the NIC is a placeholder the single-node model never uses (10 GbE).
  c.nic.count_per_node = 1;
  c.nic.bandwidth_GBps = 1.25;
  c.nic.latency_us = 20;
  c.network.topology = TopologyKind::single_switch;
  c.calibration = in.info;

  // Compute: the NS table, GEMM peak and efficiency curve, elementwise bandwidth and launch.
  std::map<double, double> gemm_rate;  // min dim -> best FLOP/s
  double peak = 0;
  std::vector<double> bytes, secs;
  std::map<double, std::vector<double>> host_exchange;  // bytes per exchange -> extra seconds
  for (const ComputeBenchRow& r : in.compute) {
    if (r.kernel == "host_comm") {  // may be <= 0 by noise: medians over shapes decide
      if (r.model_bytes > 0) host_exchange[r.model_bytes].push_back(r.seconds);
      continue;
    }
    if (!(r.seconds > 0)) continue;
    if (r.kernel == "newton_schulz") {
      NsTiming t;
      t.version = "cpu-fp32";
      t.batch = r.shape.batch;
      t.rows = r.shape.rows;
      t.cols = r.shape.cols;
      t.steps = in.ns_steps;
      t.ms = r.seconds * 1e3;
      c.gpu.ns_table.push_back(t);
    } else if (r.kernel == "gemm") {
      const double rate = r.flops / r.seconds;
      const double dim = static_cast<double>(std::min(r.shape.rows, r.shape.cols));
      gemm_rate[dim] = std::max(gemm_rate[dim], rate);
      peak = std::max(peak, rate);
    } else if (r.step_sized) {
      c.gpu.elementwise_table.push_back({r.kernel, r.numel, r.seconds * 1e3, ""});
    } else if (r.kernel == "momentum" || r.kernel == "apply_update") {
      bytes.push_back(r.model_bytes);
      secs.push_back(r.seconds);
    }
  }
  if (c.gpu.ns_table.empty())
    throw Error("calibrate: no Newton-Schulz timing was measured; fix: give shapes to time");
  c.gpu.ns_kernel = "cpu-fp32";
  if (!host_exchange.empty()) {
    // A line through the median extra time per exchange (two messages: one sent, one received)
    // against its bytes: the intercept is the cost of two messages, the slope the cost per byte.
    std::vector<double> x, y;
    for (auto& [b, extra] : host_exchange) {
      std::sort(extra.begin(), extra.end());
      const std::size_t n = extra.size();
      x.push_back(b);
      y.push_back(n % 2 ? extra[n / 2] : (extra[n / 2 - 1] + extra[n / 2]) / 2);
    }
    const auto [per_exchange, per_byte] = host_comm_line(x, y);
    c.gpu.host_comm_us_per_message = per_exchange / 2 * 1e6;
    c.gpu.host_comm_ns_per_byte = per_byte * 1e9;
  }
  if (!(peak > 0))
    throw Error("calibrate: no GEMM rate was measured; fix: check the compute benchmark");
  c.gpu.peak_tflops = peak / 1e12;
  for (const auto& [dim, rate] : gemm_rate)
    c.gpu.gemm_efficiency.push_back({dim, std::clamp(rate / peak, 0.001, 1.0)});
  if (bytes.size() >= 2) {
    const auto [kernel_s, s_per_byte] = weighted_line(bytes, secs);
    c.gpu.hbm_GBps = s_per_byte > 0 ? 1.0 / s_per_byte / 1e9 : 10;
    c.launch_overhead.kernel_us = kernel_s * 1e6;
  } else {
    c.gpu.hbm_GBps = 10;
  }

  // Collectives: bandwidth per class, one latency, one launch overhead.
  std::vector<CollectiveBenchRow> rows;
  for (const CollectiveBenchRow& r : in.collectives)
    if (r.time_us > 0 && r.size_bytes > 0) rows.push_back(r);
  std::map<CollectiveClass, double> bw;  // GB/s
  for (const CollectiveBenchRow& r : rows) {
    const CollectiveClass cls = collective_class(bench_kind(r.op));
    bw[cls] = std::max(bw[cls], r.algbw_GBps);
  }
  if (bw.empty()) {
    c.intra.bandwidth_GBps = 5;
    c.intra.latency_us = 1;
    return c;
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
  latency_us = std::max(0.0, latency_us);
  launch_us = std::max(0.0, launch_us);
  double line = 0;
  for (const auto& [cls, value] : bw) line = std::max(line, value);
  c.intra.bandwidth_GBps = line;
  c.intra.latency_us = latency_us;
  c.launch_overhead.collective_us = launch_us;
  const auto eff = [&](CollectiveClass cls) {
    const auto it = bw.find(cls);
    return it == bw.end() ? 1.0 : std::clamp(it->second / line, 0.001, 1.0);
  };
  c.efficiency.intra_node.ring = eff(CollectiveClass::ring);
  c.efficiency.intra_node.all_to_all = eff(CollectiveClass::all_to_all);
  c.efficiency.intra_node.p2p = eff(CollectiveClass::p2p);
  c.efficiency.intra_node.nvls = 1;

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
  return c;
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
  yaml_util::emit_cluster(e, cluster);
  out += e.c_str();
  out += "\n";
  return out;
}

}  // namespace muonbed
