// The collective benchmark of core/results/collective_bench.hpp: size ranges, the synthetic plan of
// one size, one run through the point runner, and nccl-tests' row format.
#include "core/results/collective_bench.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "core/base/errors.hpp"
#include "core/engine/cost_model.hpp"
#include "core/plan/strategy.hpp"

namespace muonbed {

namespace {

ConfigError bench_error(const std::string& what, const std::string& fix) {
  return ConfigError(SourceLocation{"bench collective", 0, 0}, what, fix);
}

OpKind kind_of(const std::string& op) {
  if (op == "sendrecv") return OpKind::send;
  for (const std::string& name : collective_bench_ops())
    if (name == op) return op_kind_from_string(op);
  throw bench_error("unknown collective '" + op + "'",
                    "use one of: all_gather, reduce_scatter, all_reduce, all_to_all, broadcast, "
                    "gather, scatter, sendrecv");
}

bool sharded(OpKind kind) {
  return kind == OpKind::all_gather || kind == OpKind::reduce_scatter || kind == OpKind::gather ||
         kind == OpKind::scatter || kind == OpKind::all_to_all;
}

std::string type_name(DType dtype) {
  switch (dtype) {
    case DType::fp32:
      return "float";
    case DType::bf16:
      return "bfloat16";
    case DType::fp16:
      return "half";
  }
  return "?";
}

// nccl-tests' getFloatStr: as many decimals as fit the width.
std::string float_text(double value, int width) {
  int power = 0;
  for (std::uint64_t v = 1; value >= static_cast<double>(v) && power < 20; v *= 10) ++power;
  char buffer[64];
  if (power < width - 2)
    std::snprintf(buffer, sizeof buffer, "%*.2f", width, value);
  else if (power < width - 1)
    std::snprintf(buffer, sizeof buffer, "%*.1f", width, value);
  else if (power < width + 1)
    std::snprintf(buffer, sizeof buffer, "%*.0f", width, value);
  else
    std::snprintf(buffer, sizeof buffer, "%*.1e", width, value);
  return buffer;
}

// The group dims in mesh order, checked.
std::vector<int> group_dims(const CollectiveBenchSpec& spec) {
  std::vector<int> dims;
  for (int d = 0; d < spec.mesh.ndims(); ++d)
    if (spec.group.contains(d)) dims.push_back(d);
  if (dims.empty() || dims.size() > 2)
    throw bench_error(
        "the collective must span 1 or 2 mesh dims, not " + std::to_string(dims.size()),
        "name one or two dims of the mesh with --group");
  return dims;
}

// A tensor sharded over the group: each member holds `per_member` elements.
DistributedParam sharded_param(const DeviceMesh& mesh, const std::vector<int>& dims,
                               std::int64_t per_member, const std::string& name) {
  std::vector<Placement> placements(mesh.ndims(), Placement::replicate());
  std::vector<std::int64_t> shape;
  if (dims.size() == 1) {
    shape = {mesh.size(dims[0]), per_member};
    placements[dims[0]] = Placement::shard(0);
  } else {
    shape = {mesh.size(dims[0]), mesh.size(dims[1]) * per_member};
    placements[dims[0]] = Placement::shard(0);
    placements[dims[1]] = Placement::shard(1);
  }
  DistributedParam p;
  p.name = name;
  p.shape = shape;
  p.dtype = DType::bf16;
  p.layout = TensorLayout(mesh, shape, placements);
  return p;
}

DistributedParam replicated_param(const DeviceMesh& mesh, std::int64_t count,
                                  const std::string& name) {
  DistributedParam p;
  p.name = name;
  p.shape = {1, count};
  p.dtype = DType::bf16;
  p.layout =
      TensorLayout(mesh, p.shape, std::vector<Placement>(mesh.ndims(), Placement::replicate()));
  return p;
}

}  // namespace

const std::vector<std::string>& collective_bench_ops() {
  static const std::vector<std::string> ops = {"all_gather", "reduce_scatter", "all_reduce",
                                               "all_to_all", "broadcast",      "gather",
                                               "scatter",    "sendrecv"};
  return ops;
}

std::vector<std::int64_t> parse_size_range(const std::string& text) {
  const std::string fix =
      "write MIN:MAX (doubling, e.g. 1K:1G), MIN:MAX:FACTOR (e.g. 8:1G:4) or one size (64M); "
      "K, M and G are powers of 1024";
  const auto parse = [&](const std::string& part) -> std::int64_t {
    if (part.empty()) throw bench_error("bad size range '" + text + "'", fix);
    std::int64_t unit = 1;
    std::string digits = part;
    const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(part.back())));
    if (last == 'K' || last == 'M' || last == 'G') {
      unit = last == 'K' ? 1LL << 10 : last == 'M' ? 1LL << 20 : 1LL << 30;
      digits.pop_back();
    }
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(digits, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (digits.empty() || used != digits.size() || value < 1 || value > (1LL << 50) / unit)
      throw bench_error("bad size '" + part + "' in '" + text + "'", fix);
    return value * unit;
  };
  std::vector<std::string> parts;
  std::size_t at = 0;
  while (true) {
    const std::size_t colon = text.find(':', at);
    parts.push_back(text.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  if (parts.size() > 3) throw bench_error("bad size range '" + text + "'", fix);
  const std::int64_t lo = parse(parts[0]);
  const std::int64_t hi = parts.size() > 1 ? parse(parts[1]) : lo;
  std::int64_t factor = 2;
  if (parts.size() == 3) {
    std::size_t used = 0;
    try {
      factor = std::stoll(parts[2], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != parts[2].size() || factor < 2)
      throw bench_error("bad factor '" + parts[2] + "' in '" + text + "'",
                        "the factor is an integer of at least 2 (nccl-tests' -f)");
  }
  if (hi < lo)
    throw bench_error("size range '" + text + "' ends below its start",
                      "write the smaller size first, e.g. 1K:1G");
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = lo; s <= hi; s *= factor) {
    sizes.push_back(s);
    if (s > hi / factor) break;
  }
  return sizes;
}

StepPlan collective_bench_plan(const CollectiveBenchSpec& spec, std::int64_t size_bytes) {
  const OpKind kind = kind_of(spec.op);
  const DeviceMesh& mesh = spec.mesh;
  const std::vector<int> dims = group_dims(spec);
  const int n = mesh.group_size(spec.group);
  if (n < 2)
    throw bench_error("a collective over " + std::to_string(n) + " rank measures nothing",
                      "use --gpus 2 or more (or a larger group dim)");
  const bool rooted =
      kind == OpKind::broadcast || kind == OpKind::gather || kind == OpKind::scatter;
  if (rooted && (spec.root < 0 || spec.root >= n))
    throw bench_error(
        "root " + std::to_string(spec.root) + " is outside the group of " + std::to_string(n),
        "use --root 0.." + std::to_string(n - 1));
  const std::int64_t e = bytes_of(spec.dtype);
  if (size_bytes < 1)
    throw bench_error("size " + std::to_string(size_bytes) + " bytes", "use 1 or more");
  const std::int64_t per_member = std::max<std::int64_t>(1, size_bytes / (e * n));
  const std::int64_t count = std::max<std::int64_t>(1, size_bytes / e);

  std::vector<DistributedParam> params;
  Assignment assignment;
  if (kind == OpKind::all_to_all) {
    // Per group instance, one tensor owned by each member.
    for (int leader = 0; leader < mesh.world_size(); ++leader) {
      if (mesh.group_leader(leader, spec.group) != leader) continue;
      for (int j = 0; j < n; ++j) {
        params.push_back(sharded_param(mesh, dims, per_member,
                                       "t" + std::to_string(leader) + "_" + std::to_string(j)));
        assignment.owner.push_back(mesh.group_member(leader, spec.group, j));
      }
    }
  } else {
    params.push_back(sharded(kind) ? sharded_param(mesh, dims, per_member, "buffer")
                                   : replicated_param(mesh, count, "buffer"));
    assignment.owner.push_back(0);
  }
  ShardedModel model = shard_explicitly(mesh, "bench_" + spec.op, std::move(params));
  PlanSettings settings;
  settings.optimizer.comm_dtype = spec.dtype;
  PlanBuilder builder(model, assignment, settings);
  std::vector<int> all_params(builder.model().params.size());
  for (std::size_t i = 0; i < all_params.size(); ++i) all_params[i] = static_cast<int>(i);
  // Ops that move updates need them made first, or a real executor has nothing to send: a
  // momentum op turns the gradient the step starts with into the update (on each member's
  // pieces; on the whole tensor for roots that scatter or broadcast it). Reductions move the
  // gradient itself. The row reads the collective's instance time only, so this op is never in
  // it (and the predicting backends' times do not change).
  const bool whole = kind == OpKind::scatter || kind == OpKind::broadcast;
  std::vector<int> deps;
  if (kind != OpKind::reduce_scatter && kind != OpKind::all_reduce) {
    Op fill;
    fill.kind = OpKind::momentum;
    fill.stream = builder.stream("compute");
    fill.ranks = RankBox::everyone(mesh);
    fill.params = all_params;
    if (whole) fill.gathered = DimSet::all(mesh.ndims());
    fill.label = "make the updates";
    deps.push_back(builder.emit(fill));
  }
  if (kind == OpKind::send) {
    for (int k = 0; k < n; ++k) {
      Op op;
      op.kind = OpKind::send;
      op.stream = builder.stream("comm" + std::to_string(k));
      op.group = spec.group;
      op.root = k;
      op.peer = (k + 1) % n;
      op.params = {0};
      op.tensor = TensorRole::update;
      op.deps = deps;
      op.label = "sendrecv " + std::to_string(k) + "->" + std::to_string((k + 1) % n);
      builder.emit(op);
    }
  } else {
    Op op;
    op.kind = kind;
    op.stream = builder.stream("comm");
    op.group = spec.group;
    op.root = rooted ? spec.root : -1;
    op.params = all_params;
    if (whole) op.tensor = TensorRole::update;
    op.deps = deps;
    op.label = spec.op;
    builder.emit(op);
  }
  return builder.finish("bench_collective", "{\"op\": \"" + spec.op + "\"}");
}

CollectiveBenchRow run_collective_bench(const CollectiveBenchSpec& spec,
                                        const Experiment& experiment, std::int64_t size_bytes,
                                        const std::string& backend, const RunSettings& settings) {
  const OpKind kind = kind_of(spec.op);
  const StepPlan plan = collective_bench_plan(spec, size_bytes);
  const PointRun run = run_plan(experiment, plan, backend, settings);
  const ResultRecord& r = run.record;
  if (r.collectives.empty())
    throw Error("bench collective: backend '" + backend +
                "' reported no collective for the bench's plan; fix: check that the backend "
                "fills ResultRecord::collectives");
  // sendrecv: the slowest of the concurrent sends.
  const CollectiveResult* c = &r.collectives.front();
  for (const CollectiveResult& x : r.collectives)
    if (x.time_s > c->time_s) c = &x;
  const int n = spec.mesh.group_size(spec.group);
  const std::int64_t e = bytes_of(spec.dtype);
  CollectiveBenchRow row;
  row.op = spec.op;
  row.size_bytes = static_cast<std::int64_t>(std::llround(c->bytes));
  row.count = sharded(kind) ? row.size_bytes / (e * n) : row.size_bytes / e;
  row.type = type_name(spec.dtype);
  row.redop = kind == OpKind::all_reduce || kind == OpKind::reduce_scatter ? "sum" : "none";
  row.root = kind == OpKind::broadcast || kind == OpKind::gather || kind == OpKind::scatter
                 ? spec.root
                 : -1;
  row.gpus = spec.mesh.world_size();
  const int gpn = std::max(1, experiment.cluster.gpus_per_node);
  row.nodes = (row.gpus + gpn - 1) / gpn;
  row.group_size = n;
  row.instances = c->instances;
  row.time_us = c->time_s * 1e6;
  row.algbw_GBps = c->time_s > 0 ? c->bytes / c->time_s / 1e9 : 0;
  row.busbw_GBps = row.algbw_GBps * bus_factor(kind, n);
  row.wrong = run.wrong_elements;
  row.backend = r.backend;
  row.fidelity = r.fidelity;
  for (const double t : c->step_times_s) row.iteration_us.push_back(t * 1e6);
  const IterationSpread spread = iteration_spread(row.iteration_us);
  row.min_us = spread.min;
  row.median_us = spread.median;
  row.max_us = spread.max;
  if (const ExecutionInfo& x = r.execution; x.has_speed_probe() && x.probe_shape.size() == 3) {
    row.probe_shape = (x.probe_shape[0] > 1 ? std::to_string(x.probe_shape[0]) + "x" : "") +
                      std::to_string(x.probe_shape[1]) + "x" + std::to_string(x.probe_shape[2]);
    row.probe_predicted_s = x.probe_predicted_s;
    row.probe_before_s = x.probe_before_s;
    row.probe_after_s = x.probe_after_s;
  }
  return row;
}

IterationSpread iteration_spread(std::vector<double> times) {
  IterationSpread s;
  if (times.empty()) return s;
  std::sort(times.begin(), times.end());
  const std::size_t n = times.size();
  s.min = times.front();
  s.max = times.back();
  s.median = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  return s;
}

bool noisy(const CollectiveBenchRow& row) {
  if (row.iteration_us.empty()) return false;
  return row.min_us > 0 ? row.max_us / row.min_us > kNoisySpread : row.max_us > 0;
}

std::string collective_bench_header(bool measured) {
  if (!measured)
    return "#                                                              out-of-place\n"
           "#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
           "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       \n";
  return "#                                                              out-of-place"
         "          over the iterations\n"
         "#       size         count      type   redop    root     time   algbw   busbw #wrong"
         "      min   median      max\n"
         "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
         "     (us)     (us)     (us)\n";
}

std::string collective_bench_line(const CollectiveBenchRow& row) {
  char head[128];
  std::snprintf(head, sizeof head, "%12" PRId64 "  %12" PRId64 "  %8s  %6s  %6d", row.size_bytes,
                row.count, row.type.c_str(), row.redop.c_str(), row.root);
  std::string line = head;
  line += "  " + float_text(row.time_us, 7) + "  " + float_text(row.algbw_GBps, 6) + "  " +
          float_text(row.busbw_GBps, 6);
  if (row.wrong < 0) {
    line += "    N/A";
  } else {
    char wrong[32];
    std::snprintf(wrong, sizeof wrong, "  %6" PRId64, row.wrong);
    line += wrong;
  }
  if (!row.iteration_us.empty()) {
    line += "  " + float_text(row.min_us, 7) + "  " + float_text(row.median_us, 7) + "  " +
            float_text(row.max_us, 7);
    if (noisy(row)) {
      char ratio[64];
      std::snprintf(ratio, sizeof ratio, "%.2f", row.min_us > 0 ? row.max_us / row.min_us : 0.0);
      line += std::string("  noisy (max/min ") + (row.min_us > 0 ? ratio : "inf") +
              "): rerun on a quiet machine";
    }
  }
  return line;
}

nlohmann::ordered_json collective_bench_json(const CollectiveBenchRow& row) {
  nlohmann::ordered_json j{{"op", row.op},
                           {"size_bytes", row.size_bytes},
                           {"count", row.count},
                           {"type", row.type},
                           {"redop", row.redop},
                           {"root", row.root},
                           {"gpus", row.gpus},
                           {"nodes", row.nodes},
                           {"group_size", row.group_size},
                           {"instances", row.instances},
                           {"time_us", row.time_us},
                           {"algbw_GBps", row.algbw_GBps},
                           {"busbw_GBps", row.busbw_GBps}};
  j["wrong"] = row.wrong < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(row.wrong);
  j["backend"] = row.backend;
  j["fidelity"] = row.fidelity;
  if (!row.iteration_us.empty()) {
    j["min_time_us"] = row.min_us;
    j["median_time_us"] = row.median_us;
    j["max_time_us"] = row.max_us;
    j["iterations"] = row.iteration_us.size();
    j["noisy"] = noisy(row);
  }
  if (row.probe_predicted_s > 0)
    j["speed_probe"] = {{"shape", row.probe_shape},
                        {"predicted_s", row.probe_predicted_s},
                        {"before_s", row.probe_before_s},
                        {"after_s", row.probe_after_s}};
  return j;
}

}  // namespace muonbed
