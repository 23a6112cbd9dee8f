// The results schema's code: step patterns of a hyper-period, assembling a record from a
// backend's per-step measurements (the same aggregation for every backend, so analytic and
// simulated records differ only in what was measured), provenance, the analytic backend's record,
// and the JSON reader/writer with atomic file writes. See core/results/results.hpp for the schema.
#include "core/results/results.hpp"

#include "core/experiment/backends.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "core/base/errors.hpp"
#include "core/base/sha256.hpp"
#include "core/engine/bound.hpp"
#include "core/engine/cost_model.hpp"
#include "core/engine/engine.hpp"
#include "core/experiment/experiment.hpp"
#include "core/plan/split_ns.hpp"
#include "muonbed/config.hpp"

namespace muonbed {

// Generated at build time by cmake/build_info.cmake.
const char* build_git_hash();

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::int64_t kMaxPatternSteps = std::int64_t{1} << 20;  // as estimate() counts them

int physical_gpus_per_node(const ClusterSpec& cluster, const DeviceMesh& mesh) {
  return cluster.gpus_per_node > 0 ? cluster.gpus_per_node : std::max(1, mesh.gpus_per_node());
}

// Weighted mean of per-pattern values (weights: step counts).
template <typename F>
double weighted(const std::vector<StepMeasurement>& steps, F value) {
  double sum = 0, weight = 0;
  for (const auto& s : steps) {
    sum += value(s) * s.count;
    weight += s.count;
  }
  return weight > 0 ? sum / weight : 0;
}

double safe_div(double a, double b) {
  return b > 0 ? a / b : 0;
}

// The training step's breakdown from the measurements' phase accounting: weighted over the
// patterns, phases as means over ranks, the exposed optimizer as the step after the slowest
// rank's last non-optimizer op.
void fill_training(ResultRecord& record, const StepPlan& plan, const ClusterSpec& cluster,
                   const std::vector<StepMeasurement>& steps, double total_weight) {
  if (!has_training_ops(plan)) return;
  TrainingResult& t = record.training;
  const TrainingOptions& o = plan.settings.training;
  const TrainingShape shape = training_shape(plan.model, o);
  t.present = true;
  t.tokens_per_step = o.tokens_per_step;
  t.seq_len = o.seq_len;
  t.micro_batches = shape.micro_batches;
  t.micro_batch_groups = shape.groups;
  t.overlap = o.overlap;
  t.step_s = record.step.average_s;
  std::array<double, kStepPhases> busy{};
  double exposed = 0;
  for (const StepMeasurement& s : steps) {
    if (s.phase_busy_s.empty()) continue;
    const double f = s.count / total_weight;
    const double world = static_cast<double>(s.phase_busy_s.size());
    double last_training = 0;
    for (std::size_t r = 0; r < s.phase_busy_s.size(); ++r) {
      for (int p = 0; p < kStepPhases; ++p) busy[p] += f * s.phase_busy_s[r][p] / world;
      for (int p = 0; p < kStepPhases; ++p)
        if (p != static_cast<int>(StepPhase::optimizer))
          last_training = std::max(last_training, s.phase_end_s[r][p]);
    }
    exposed += f * std::max(0.0, s.time_s - last_training);
  }
  t.forward_s = busy[static_cast<int>(StepPhase::forward)];
  t.backward_s = busy[static_cast<int>(StepPhase::backward)];
  t.parameter_gather_s = busy[static_cast<int>(StepPhase::parameter_gather)];
  t.activation_comm_s = busy[static_cast<int>(StepPhase::activation_comm)];
  t.gradient_sync_s = busy[static_cast<int>(StepPhase::gradient_sync)];
  t.optimizer_s = busy[static_cast<int>(StepPhase::optimizer)];
  t.exposed_optimizer_s = exposed;
  double flops = 0;
  const int world = plan.mesh().world_size();
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
    for (int r : op.ranks.ranks(plan.mesh())) flops += op_flops(plan, op, r);
  }
  t.model_tflops = flops / 1e12;
  t.mfu = safe_div(flops, t.step_s * world * cluster.gpu.peak_tflops * 1e12);
}

std::string infeasible_note(const MemoryFeasibility& f, const std::string& device, int world) {
  return "warning: INFEASIBLE: training memory " + memory_feasibility_text(f, device, world) +
         "; this step time assumes memory the device does not have (shard more, use a larger "
         "device, or change memory: in the experiment)";
}

}  // namespace

// ---- Step patterns ------------------------------------------------------------------------------

std::vector<StepPatternSpec> step_patterns(const StepPlan& plan) {
  std::vector<int> periods;
  for (const Op& op : plan.ops) periods.push_back(op.period);
  std::sort(periods.begin(), periods.end());
  periods.erase(std::unique(periods.begin(), periods.end()), periods.end());
  std::int64_t steps = 1;
  for (int p : periods) {
    if (p < 1) throw PlanError("step_patterns: an op has period " + std::to_string(p));
    steps = std::min(kMaxPatternSteps, steps / std::gcd(steps, static_cast<std::int64_t>(p)) * p);
  }
  // Pattern of step k: which distinct periods divide k; patterns listed by their first step.
  std::map<std::vector<bool>, std::size_t> index;
  std::vector<StepPatternSpec> out;
  std::vector<bool> key(periods.size());
  for (std::int64_t k = 0; k < steps; ++k) {
    for (std::size_t i = 0; i < periods.size(); ++i) key[i] = k % periods[i] == 0;
    auto [it, inserted] = index.try_emplace(key, out.size());
    if (inserted) out.push_back({static_cast<int>(k), 0});
    ++out[it->second].count;
  }
  return out;
}

StepStatistics step_statistics(const std::vector<double>& times, int warmup_steps) {
  StepStatistics s;
  s.warmup_steps = warmup_steps;
  s.timed_steps = static_cast<int>(times.size());
  if (times.empty()) return s;
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  s.median_s = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  // Nearest rank: the smallest time with at least 95 % of the steps at or below it.
  const std::size_t rank = static_cast<std::size_t>(std::ceil(0.95 * static_cast<double>(n)));
  s.p95_s = sorted[std::max<std::size_t>(rank, 1) - 1];
  s.min_s = sorted.front();
  const double mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(n);
  double var = 0;
  for (double t : sorted) var += (t - mean) * (t - mean);
  s.stddev_s = std::sqrt(var / static_cast<double>(n));
  return s;
}

std::int64_t pattern_steps(const std::vector<StepPatternSpec>& patterns) {
  std::int64_t n = 0;
  for (const auto& p : patterns) n += p.count;
  return n;
}

// ---- Assembling a record ------------------------------------------------------------------------

void fill_record(ResultRecord& record, const StepPlan& plan, const ClusterSpec& cluster,
                 const std::vector<StepMeasurement>& steps,
                 const std::vector<std::vector<CollectiveMeasurement>>& collectives) {
  if (steps.empty()) throw Error("fill_record: no step was measured");
  const DeviceMesh& mesh = plan.mesh();
  const int world = mesh.world_size();
  const int gpn = physical_gpus_per_node(cluster, mesh);

  SetupInfo& setup = record.setup;
  setup.strategy = plan.strategy;
  setup.cluster = cluster.name;
  setup.model = plan.model.model_name;
  setup.mesh = mesh.describe();
  setup.world_size = world;
  setup.gpus_per_node = gpn;
  setup.nodes = (world + gpn - 1) / gpn;
  setup.params = 0;
  for (const auto& p : plan.model.params) setup.params += p.numel();
  setup.muon_matrices = static_cast<int>(plan.model.muon_params().size());
  setup.hyper_period = plan.hyper_period();
  setup.rank_kind = cluster.calibration.backend == "mpi" ? "cpu" : "gpu";

  // Step times: average over the hyper-period, worst = the slowest pattern (first on ties).
  StepSummary& step = record.step;
  step.patterns.clear();
  std::size_t worst = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    step.patterns.push_back({steps[i].step, steps[i].count, steps[i].time_s});
    if (steps[i].time_s > steps[worst].time_s) worst = i;
  }
  step.average_s = weighted(steps, [](const StepMeasurement& s) { return s.time_s; });
  step.worst_s = steps[worst].time_s;
  step.worst_step = steps[worst].step;
  const StepMeasurement& w = steps[worst];

  // A measured run's cluster may have no link figures (the MPI executor on one host): then there
  // is no bound to report, and the record says why instead of failing the run.
  try {
    const StepBound sb = step_bound(plan, cluster);
    record.bound = {sb.bound_s,       safe_div(step.average_s, sb.bound_s),
                    sb.binding,       sb.ns_total_s,
                    sb.ns_balanced_s, sb.ns_longest_s,
                    sb.gather_s,      sb.scatter_s,
                    sb.owner_ranks,   sb.longest};
  } catch (const PlanError& e) {
    record.bound = BoundResult{};
    record.bound.binding = "none";
    record.notes.push_back(std::string("no T_bound: ") + e.what());
  }

  // Predicted records say where their Newton-Schulz times come from (a shape past the measured
  // table is timed from the efficiency curve, and the note names it).
  if (const BackendFacts* facts = backend_facts(record.backend); facts && !facts->measures)
    record.notes.push_back(ns_time_sources(plan, cluster).note);

  // Per rank: averages over patterns weighted by their step counts, and the worst step's values.
  record.ranks.assign(world, RankResult{});
  std::vector<TrainingMemory> memory(world);
  for (int r = 0; r < world; ++r) memory[r] = training_memory(plan, r);
  std::vector<double> mean_compute(steps.size()), mean_comm(steps.size()),
      mean_exposed(steps.size()), sent(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (static_cast<int>(steps[i].ranks.size()) != world)
      throw Error("fill_record: step " + std::to_string(steps[i].step) + " has " +
                  std::to_string(steps[i].ranks.size()) + " ranks, the mesh " +
                  std::to_string(world));
    for (int r = 0; r < world; ++r) {
      mean_compute[i] += steps[i].ranks[r].compute_s / world;
      mean_comm[i] += steps[i].ranks[r].communication_s / world;
      mean_exposed[i] += steps[i].ranks[r].exposed_comm_s / world;
      if (!steps[i].bytes_sent.empty()) sent[i] += steps[i].bytes_sent[r] / world;
    }
  }
  double total_weight = 0;
  for (const auto& s : steps) total_weight += s.count;
  for (int r = 0; r < world; ++r) {
    RankResult& rr = record.ranks[r];
    rr.rank = r;
    rr.node = r / gpn;
    TimeBreakdown avg;
    double bs = 0, br = 0;
    for (const auto& s : steps) {
      const double f = s.count / total_weight;
      avg.compute_s += f * s.ranks[r].compute_s;
      avg.communication_s += f * s.ranks[r].communication_s;
      avg.exposed_comm_s += f * s.ranks[r].exposed_comm_s;
      avg.idle_s += f * s.ranks[r].idle_s;
      avg.finish_s += f * s.ranks[r].finish_s;
      if (!s.bytes_sent.empty()) bs += f * s.bytes_sent[r];
      if (!s.bytes_received.empty()) br += f * s.bytes_received[r];
    }
    rr.average = avg;
    rr.worst = w.ranks[r];
    rr.bytes_sent = bs;
    rr.bytes_received = br;
    const RankMemory m = memory[r].optimizer_step();
    rr.memory = {m.static_bytes, m.peak_transient_bytes, m.peak_bytes()};
  }
  // The training state against the device's memory: every rank is checked.
  const auto limit = static_cast<std::int64_t>(cluster.gpu.memory_GiB * 1024.0 * 1024.0 * 1024.0);
  const MemoryFeasibility feasibility = memory_feasibility(memory, limit);
  record.memory.present = true;
  record.memory.limit_bytes = feasibility.limit_bytes;
  record.memory.peak_bytes = feasibility.peak_bytes;
  record.memory.peak_rank = feasibility.peak_rank;
  record.memory.over_ranks = feasibility.over_ranks;
  record.memory.feasible = feasibility.feasible();
  record.memory.breakdown = feasibility.peak;
  if (!feasibility.feasible())
    record.notes.push_back(infeasible_note(feasibility, cluster.gpu.name, world));

  // Seed 002's per-GPU throughput, average (hyper-period) and worst (the worst step).
  ThroughputResult& t = record.throughput;
  const double params = static_cast<double>(setup.params);
  const double peak = cluster.gpu.peak_tflops * 1e12;
  const double avg_time = step.average_s;
  const double avg_flops = weighted(steps, [](const StepMeasurement& s) { return s.flops; });
  const auto per_pattern = [&](const std::vector<double>& v) {
    double sum = 0;
    for (std::size_t i = 0; i < steps.size(); ++i) sum += v[i] * steps[i].count;
    return sum / total_weight;
  };
  t.params_per_s_per_gpu = {safe_div(params, avg_time * world), safe_div(params, w.time_s * world)};
  t.compute_time_s = {per_pattern(mean_compute), mean_compute[worst]};
  t.compute_tflops_per_gpu = {safe_div(avg_flops, avg_time * world) / 1e12,
                              safe_div(w.flops, w.time_s * world) / 1e12};
  const double useful = useful_step_flops(plan);
  t.useful_tflops_per_gpu = {safe_div(useful, avg_time * world) / 1e12,
                             safe_div(useful, w.time_s * world) / 1e12};
  t.compute_utilization = {safe_div(t.compute_tflops_per_gpu.average * 1e12, peak),
                           safe_div(t.compute_tflops_per_gpu.worst * 1e12, peak)};
  t.comm_time_s = {per_pattern(mean_comm), mean_comm[worst]};
  t.comm_exposed_time_s = {per_pattern(mean_exposed), mean_exposed[worst]};
  t.comm_GBps_per_gpu = {safe_div(per_pattern(sent), avg_time) / 1e9,
                         safe_div(sent[worst], w.time_s) / 1e9};

  record.traffic.intra_node_bytes = {
      weighted(steps, [](const StepMeasurement& s) { return s.intra_node_bytes; }),
      w.intra_node_bytes};
  record.traffic.network_bytes = {
      weighted(steps, [](const StepMeasurement& s) { return s.network_bytes; }), w.network_bytes};

  fill_training(record, plan, cluster, steps, total_weight);

  // Collectives: merge each op's measurements over the patterns it ran in.
  std::map<int, std::pair<CollectiveMeasurement, int>> merged;  // op -> (sums, steps)
  for (std::size_t i = 0; i < collectives.size() && i < steps.size(); ++i) {
    for (const auto& c : collectives[i]) {
      if (c.op < 0 || c.instances == 0) continue;
      auto [it, inserted] = merged.try_emplace(c.op, c, 0);
      auto& m = it->second.first;
      if (!inserted) {
        m.instances += c.instances;
        m.bytes_sum += c.bytes_sum;
        m.time_sum += c.time_sum;
        m.time_max = std::max(m.time_max, c.time_max);
        m.crosses_nodes = m.crosses_nodes || c.crosses_nodes;
      }
      it->second.second += steps[i].count;
    }
  }
  record.collectives.clear();
  for (const auto& [op_id, entry] : merged) {
    const auto& [m, nsteps] = entry;
    const Op& op = plan.ops.at(op_id);
    CollectiveResult c;
    c.op = op_id;
    c.label = op.label;
    c.kind = std::string(to_string(op.kind));
    c.group_size = m.group_size;
    const int id = op_id;  // clang < 16 cannot capture a structured binding
    const int patterns_seen = [&] {
      int n = 0;
      for (std::size_t i = 0; i < collectives.size() && i < steps.size(); ++i)
        for (const auto& x : collectives[i])
          if (x.op == id && x.instances > 0) ++n;
      return n;
    }();
    c.instances = m.instances / std::max(1, patterns_seen);
    c.steps = nsteps;
    c.bytes = safe_div(m.bytes_sum, m.instances);
    c.time_s = safe_div(m.time_sum, m.instances);
    c.max_time_s = m.time_max;
    c.algbw_GBps = safe_div(c.bytes, c.time_s) / 1e9;
    // A split Newton-Schulz's time is mostly compute: its row says how long it took and what it
    // all-reduced, without a bus bandwidth.
    c.busbw_GBps = m.group_size >= 1 && op.kind != OpKind::split_newton_schulz
                       ? c.algbw_GBps * bus_factor(op.kind, std::max(1, m.group_size))
                       : 0;
    c.crosses_nodes = m.crosses_nodes;
    record.collectives.push_back(std::move(c));
  }
}

std::vector<std::size_t> cross_check_point(std::vector<ResultRecord*> records) {
  std::vector<std::size_t> changed;
  const auto same = [](double a, double b) {
    return std::fabs(a - b) <= 1e-12 * std::max(std::fabs(a), std::fabs(b));
  };
  for (std::size_t i = 0; i < records.size(); ++i) {
    ResultRecord& mine = *records[i];
    std::vector<CrossCheck> checks;
    for (std::size_t j = 0; j < records.size(); ++j) {
      const ResultRecord& other = *records[j];
      if (j == i || other.backend == mine.backend ||
          other.provenance.experiment != mine.provenance.experiment ||
          other.provenance.point != mine.provenance.point)
        continue;
      const double a = mine.comparable_step_s(), b = other.comparable_step_s();
      if (!(a > 0 && b > 0)) continue;
      // Symmetric: two records agree or not whichever one is asked.
      checks.push_back({other.backend, other.fidelity, b, (a / b - 1) * 100,
                        std::max(a, b) / std::min(a, b) - 1 <= kCrossCheckTolerance + 1e-12});
    }
    std::sort(checks.begin(), checks.end(),
              [](const CrossCheck& x, const CrossCheck& y) { return x.backend < y.backend; });
    bool unchanged = checks.size() == mine.cross_check.size();
    for (std::size_t k = 0; unchanged && k < checks.size(); ++k) {
      const CrossCheck& x = checks[k];
      const CrossCheck& y = mine.cross_check[k];
      unchanged = x.backend == y.backend && x.fidelity == y.fidelity && x.agree == y.agree &&
                  same(x.step_s, y.step_s) && same(x.difference_pct, y.difference_pct);
    }
    if (unchanged) continue;
    mine.cross_check = std::move(checks);
    changed.push_back(i);
  }
  return changed;
}

// ---- Provenance ---------------------------------------------------------------------------------

namespace {

std::string host_name() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof buffer - 1) != 0) return "unknown";
  return buffer;
}

}  // namespace

Provenance make_provenance(const Experiment* experiment, const std::string& simgrid_version) {
  Provenance p;
  p.muonbed_version = MUONBED_VERSION;
  p.git_hash = build_git_hash();
  p.simgrid_version = simgrid_version;
  p.host_name = host_name();
  if (experiment != nullptr) {
    p.experiment = experiment->name;
    p.experiment_file = experiment->file;
    p.point = experiment->point_label;
    p.resolved_config = experiment->resolved_yaml;
  }
  return p;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

// ---- The analytic backend -----------------------------------------------------------------------

namespace {

// Closed-form bytes the simulator's algorithms move for one instance, split by link class, and
// what each member sends. Ring collectives use node-contiguous rings with one channel per member
// on a node, so a channel crosses node boundaries once per node it visits (m edges of n when the
// group spans m > 1 nodes).
struct InstanceTraffic {
  double intra = 0;
  double network = 0;
};

InstanceTraffic closed_form_traffic(const StepPlan& plan, const Op& op,
                                    const std::vector<int>& members, int gpn,
                                    AllReduceAlgorithm algorithm, std::vector<double>& sent) {
  const int n = static_cast<int>(members.size());
  InstanceTraffic t;
  if (n < 2 || op.kind == OpKind::barrier) return t;
  std::vector<int> node_of(n);
  for (int i = 0; i < n; ++i) node_of[i] = members[i] / gpn;
  int nodes = 0;
  for (int i = 0; i < n; ++i)
    if (i == 0 || node_of[i] != node_of[i - 1]) ++nodes;
  const double ring_net = nodes > 1 ? static_cast<double>(nodes) / n : 0.0;
  const auto split = [&](double total, double net_fraction) {
    t.network += total * net_fraction;
    t.intra += total * (1 - net_fraction);
  };
  if (op.kind == OpKind::all_reduce && algorithm != AllReduceAlgorithm::ring) {
    // NVLS: each GPU moves S (g+1)/g over NVLink; NVLS tree adds 2(N-1)/N S/g over its NIC.
    const double s = static_cast<double>(collective_bytes(plan, op, members[0]));
    const double g = static_cast<double>(n) / nodes;
    const double intra = s * (g + 1) / g;
    const double net = nodes > 1 ? 2.0 * (nodes - 1) / nodes * s / g : 0.0;
    t.intra += n * intra;
    t.network += n * net;
    for (int i = 0; i < n; ++i) sent[members[i]] += intra + net;
    return t;
  }
  switch (op.kind) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
    case OpKind::all_reduce: {
      const double s = static_cast<double>(collective_bytes(plan, op, members[0]));
      const double factor = op.kind == OpKind::all_reduce ? 2.0 : 1.0;
      const double total = factor * (n - 1) * s;
      split(total, ring_net);
      for (int i = 0; i < n; ++i) sent[members[i]] += total / n;
      break;
    }
    case OpKind::broadcast: {
      const double s = static_cast<double>(piece_bytes(plan, op, members[0]));
      split((n - 1) * s, nodes > 1 ? static_cast<double>(nodes - 1) / (n - 1) : 0.0);
      // A chain from the root along the ring: every member but the one before the root sends.
      for (int i = 0; i < n; ++i)
        if (i != (op.root + n - 1) % n) sent[members[i]] += s;
      break;
    }
    case OpKind::gather:
    case OpKind::scatter: {
      const int root = op.root;
      for (int i = 0; i < n; ++i) {
        if (i == root) continue;
        const double b = static_cast<double>(piece_bytes(plan, op, members[i]));
        (node_of[i] == node_of[root] ? t.intra : t.network) += b;
        sent[op.kind == OpKind::gather ? members[i] : members[root]] += b;
      }
      break;
    }
    case OpKind::send:
    case OpKind::recv: {
      const double b = static_cast<double>(piece_bytes(plan, op, members[op.root]));
      (node_of[op.root] == node_of[op.peer] ? t.intra : t.network) += b;
      sent[members[op.root]] += b;
      break;
    }
    case OpKind::split_newton_schulz: {  // its all-reduces, on rings like all_reduce's
      double total = 0;
      for (int i = 0; i < n; ++i) {
        double out = 0;
        for (auto b : bytes_sent(plan, op, members[i])) out += static_cast<double>(b);
        sent[members[i]] += out;
        total += out;
      }
      split(total, ring_net);
      break;
    }
    case OpKind::all_to_all: {
      // Each member's send buffer minus its own part, spread evenly over its peers.
      for (int i = 0; i < n; ++i) {
        double out = 0;
        for (auto b : bytes_sent(plan, op, members[i])) out += static_cast<double>(b);
        int same_node = 0;
        for (int j = 0; j < n; ++j)
          if (j != i && node_of[j] == node_of[i]) ++same_node;
        const double net = static_cast<double>(n - 1 - same_node) / (n - 1);
        t.network += out * net;
        t.intra += out * (1 - net);
        sent[members[i]] += out;
      }
      break;
    }
    default:
      break;
  }
  return t;
}

}  // namespace

ResultRecord analytic_record(const StepPlan& plan, const ClusterSpec& cluster) {
  const DeviceMesh& mesh = plan.mesh();
  const int world = mesh.world_size();
  const int gpn = physical_gpus_per_node(cluster, mesh);
  const PlanIndex index(plan);
  std::vector<StepMeasurement> steps;
  std::vector<std::vector<CollectiveMeasurement>> collectives;
  for (const StepPatternSpec& pattern : step_patterns(plan)) {
    const StepEstimate e = estimate_step(plan, cluster, pattern.step);
    StepMeasurement m;
    m.step = pattern.step;
    m.count = pattern.count;
    m.time_s = e.step_time_s;
    m.ranks.resize(world);
    for (int r = 0; r < world; ++r) {
      const RankTimes& rt = e.ranks[r];
      m.ranks[r] = {rt.compute_s, rt.communication_s, rt.exposed_comm_s, rt.idle_s, rt.finish_s};
    }
    m.phase_busy_s = e.phase_busy_s;
    m.phase_end_s = e.phase_end_s;
    m.bytes_sent.assign(world, 0);
    m.bytes_received.assign(world, 0);
    std::vector<CollectiveMeasurement> per_op;
    for (const Op& op : plan.ops) {
      if (!plan.active_in_step(op, pattern.step)) continue;
      if (is_compute(op.kind)) {
        for (int r : op.ranks.ranks(mesh)) m.flops += op_flops(plan, op, r);
        continue;
      }
      if (!is_collective(op.kind)) continue;
      const bool split = op.kind == OpKind::split_newton_schulz;
      if (split)
        for (int r : op.ranks.ranks(mesh)) m.flops += op_flops(plan, op, r);
      CollectiveMeasurement c;
      c.op = op.id;
      index.for_each_instance(op.id, [&](int leader) {
        const std::vector<int> group = index.members(op.id, leader);
        const std::vector<int> members = index.participants(op.id, leader);
        const int sizer = members.size() == 2 && index.is_pair(op.id) ? members.front() : leader;
        const double bytes = static_cast<double>(collective_bytes(plan, op, sizer));
        c.group_size = static_cast<int>(members.size());
        c.bytes_sum += bytes;
        if (members.front() / gpn != members.back() / gpn) c.crosses_nodes = true;
        const AllReduceAlgorithm algorithm =
            op.kind == OpKind::all_reduce
                ? all_reduce_algorithm(static_cast<int>(members.size()), bytes,
                                       link_for_group(cluster, mesh, members, op.kind))
                : AllReduceAlgorithm::ring;
        const InstanceTraffic t =
            closed_form_traffic(plan, op, group, gpn, algorithm, m.bytes_sent);
        m.intra_node_bytes += t.intra;
        m.network_bytes += t.network;
      });
      // Times as the replay ran them (links shared with whatever was in flight).
      const InstanceTimes& times = e.collectives[op.id];
      c.instances = times.instances;
      c.time_sum = times.time_sum_s;
      c.time_max = times.time_max_s;
      per_op.push_back(c);
    }
    steps.push_back(std::move(m));
    collectives.push_back(std::move(per_op));
  }
  ResultRecord record;
  record.backend = "analytic";
  record.fidelity = "closed_form";
  record.traffic.model = "closed_form";
  fill_record(record, plan, cluster, steps, collectives);
  record.notes.push_back(
      "analytic: alpha-beta closed forms per collective instance (core/cost_model.hpp): link "
      "efficiencies per collective class, per-call launch overhead, NVLS all-reduce where the "
      "cluster has it; concurrent instances share the links they cross (GPU links, NIC links, "
      "PCIe host bridge, oversubscribed leaf uplinks) max-min fairly "
      "(core/engine/link_sharing.hpp)");
  return record;
}

// ---- JSON ---------------------------------------------------------------------------------------

namespace {

ojson aw(const AverageWorst& v) {
  return ojson{{"average", v.average}, {"worst", v.worst}};
}

ojson breakdown(const TimeBreakdown& t) {
  return ojson{{"compute_s", t.compute_s},
               {"communication_s", t.communication_s},
               {"exposed_comm_s", t.exposed_comm_s},
               {"idle_s", t.idle_s},
               {"finish_s", t.finish_s}};
}

AverageWorst read_aw(const nlohmann::json& j) {
  return {j.at("average").get<double>(), j.at("worst").get<double>()};
}

TimeBreakdown read_breakdown(const nlohmann::json& j) {
  TimeBreakdown t;
  t.compute_s = j.at("compute_s").get<double>();
  t.communication_s = j.at("communication_s").get<double>();
  t.exposed_comm_s = j.at("exposed_comm_s").get<double>();
  t.idle_s = j.at("idle_s").get<double>();
  t.finish_s = j.at("finish_s").get<double>();
  return t;
}

}  // namespace

namespace {

// A JSON path to every non-finite number, for the error message (nlohmann writes NaN as null,
// which no reader takes for a number).
void find_non_finite(const ojson& j, const std::string& path, std::vector<std::string>& out) {
  if (j.is_number_float() && !std::isfinite(j.get<double>())) out.push_back(path);
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      find_non_finite(it.value(), path.empty() ? it.key() : path + "." + it.key(), out);
  if (j.is_array())
    for (std::size_t i = 0; i < j.size(); ++i)
      find_non_finite(j[i], path + "[" + std::to_string(i) + "]", out);
}

constexpr std::string_view kChecksumField = "\"checksum\": \"";

}  // namespace

bool verify_checksum(const std::string& text) {
  // The field is the last one: `"checksum": "<64 hex>"` then only the closing brace and spaces.
  const std::size_t at = text.rfind(kChecksumField);
  if (at == std::string::npos) return false;
  const std::size_t begin = at + kChecksumField.size();
  if (text.size() < begin + 65 || text[begin + 64] != '"') return false;
  const std::string digest = text.substr(begin, 64);
  if (digest.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  if (text.find_first_not_of("} \n\r\t", begin + 65) != std::string::npos) return false;
  return sha256_hex(text.substr(0, begin) + text.substr(begin + 64)) == digest;
}

std::string result_identity(const std::string& resolved_yaml, const std::string& backend) {
  YAML::Node root = YAML::Load(resolved_yaml);
  if (root.IsMap()) {
    root.remove("backend");
    root.remove("output");
    if (backend != "sim") root.remove("sim");
    // The measured backends' warm-up and timed steps and data seed do not change a
    // deterministic model's result.
    if (const BackendFacts* facts = backend_facts(backend); facts && !facts->measures)
      for (const char* key : {"steps", "repeats", "seed"}) root.remove(key);
  }
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

std::string point_identity(const std::string& experiment, const std::string& point,
                           const std::string& backend, const std::string& resolved_yaml) {
  const std::string text = "muonbed point\n" + experiment + "\n" + point + "\n" + backend + "\n" +
                           result_identity(resolved_yaml, backend);
  return sha256_hex(text).substr(0, 16);
}

std::string result_to_json(const ResultRecord& r) {
  ojson j;
  j["schema_version"] = r.schema_version;
  j["backend"] = r.backend;
  j["fidelity"] = r.fidelity;
  j["timestamp"] = r.timestamp;
  const Provenance& p = r.provenance;
  j["provenance"] =
      ojson{{"muonbed_version", p.muonbed_version},
            {"git_hash", p.git_hash},
            {"simgrid_version", p.simgrid_version},
            {"host_name", p.host_name},
            {"experiment", p.experiment},
            {"experiment_file", p.experiment_file},
            {"point", p.point},
            {"resolved_config", p.resolved_config},
            {"point_id", point_identity(p.experiment, p.point, r.backend, p.resolved_config)}};
  const SetupInfo& s = r.setup;
  j["setup"] = ojson{{"strategy", s.strategy},
                     {"cluster", s.cluster},
                     {"model", s.model},
                     {"mesh", s.mesh},
                     {"world_size", s.world_size},
                     {"nodes", s.nodes},
                     {"gpus_per_node", s.gpus_per_node},
                     {"params", s.params},
                     {"muon_matrices", s.muon_matrices},
                     {"hyper_period", s.hyper_period},
                     {"rank_kind", s.rank_kind}};
  ojson patterns = ojson::array();
  for (const auto& pt : r.step.patterns)
    patterns.push_back(ojson{{"step", pt.step}, {"count", pt.count}, {"time_s", pt.time_s}});
  j["step"] = ojson{{"average_s", r.step.average_s},
                    {"worst_s", r.step.worst_s},
                    {"worst_step", r.step.worst_step},
                    {"patterns", patterns}};
  if (const StepStatistics& m = r.step.measured; m.timed_steps > 0) {
    j["step"]["warmup_steps"] = m.warmup_steps;
    j["step"]["timed_steps"] = m.timed_steps;
    j["step"]["median_s"] = m.median_s;
    j["step"]["p95_s"] = m.p95_s;
    j["step"]["stddev_s"] = m.stddev_s;
    j["step"]["min_s"] = m.min_s;
  }
  const BoundResult& b = r.bound;
  j["bound"] = ojson{{"step_s", b.step_s},
                     {"ratio", b.ratio},
                     {"binding", b.binding},
                     {"ns_total_s", b.ns_total_s},
                     {"ns_balanced_s", b.ns_balanced_s},
                     {"ns_longest_s", b.ns_longest_s},
                     {"gather_s", b.gather_s},
                     {"scatter_s", b.scatter_s},
                     {"owner_ranks", b.owner_ranks},
                     {"longest", b.longest}};
  const ThroughputResult& t = r.throughput;
  j["throughput"] =
      ojson{{"params_per_s_per_gpu", aw(t.params_per_s_per_gpu)},
            {"computation", ojson{{"time_s", aw(t.compute_time_s)},
                                  {"tflops_per_gpu", aw(t.compute_tflops_per_gpu)},
                                  {"useful_tflops_per_gpu", aw(t.useful_tflops_per_gpu)},
                                  {"utilization", aw(t.compute_utilization)}}},
            {"communication", ojson{{"time_s", aw(t.comm_time_s)},
                                    {"exposed_time_s", aw(t.comm_exposed_time_s)},
                                    {"GBps_per_gpu", aw(t.comm_GBps_per_gpu)}}}};
  j["traffic"] = ojson{{"model", r.traffic.model},
                       {"intra_node_bytes", aw(r.traffic.intra_node_bytes)},
                       {"network_bytes", aw(r.traffic.network_bytes)}};
  ojson colls = ojson::array();
  for (const auto& c : r.collectives) {
    colls.push_back(ojson{{"op", c.op},
                          {"label", c.label},
                          {"kind", c.kind},
                          {"group_size", c.group_size},
                          {"instances", c.instances},
                          {"steps", c.steps},
                          {"bytes", c.bytes},
                          {"time_s", c.time_s},
                          {"max_time_s", c.max_time_s},
                          {"algbw_GBps", c.algbw_GBps},
                          {"busbw_GBps", c.busbw_GBps},
                          {"crosses_nodes", c.crosses_nodes}});
    if (!c.step_times_s.empty()) colls.back()["step_times_s"] = c.step_times_s;
  }
  j["collectives"] = std::move(colls);
  ojson ranks = ojson::array();
  for (const auto& rr : r.ranks) {
    ojson memory{{"static_bytes", rr.memory.static_bytes},
                 {"peak_transient_bytes", rr.memory.peak_transient_bytes},
                 {"peak_bytes", rr.memory.peak_bytes}};
    if (rr.memory.measured_peak_bytes >= 0)  // measured backends only
      memory["measured_peak_bytes"] = rr.memory.measured_peak_bytes;
    ranks.push_back(ojson{{"rank", rr.rank},
                          {"node", rr.node},
                          {"average", breakdown(rr.average)},
                          {"worst", breakdown(rr.worst)},
                          {"bytes_sent", rr.bytes_sent},
                          {"bytes_received", rr.bytes_received},
                          {"memory", std::move(memory)}});
  }
  j["ranks"] = std::move(ranks);
  if (const TrainingResult& t = r.training; t.present)
    j["training"] = ojson{{"tokens_per_step", t.tokens_per_step},
                          {"seq_len", t.seq_len},
                          {"micro_batches", t.micro_batches},
                          {"micro_batch_groups", t.micro_batch_groups},
                          {"overlap", t.overlap},
                          {"step_s", t.step_s},
                          {"forward_s", t.forward_s},
                          {"backward_s", t.backward_s},
                          {"parameter_gather_s", t.parameter_gather_s},
                          {"activation_comm_s", t.activation_comm_s},
                          {"gradient_sync_s", t.gradient_sync_s},
                          {"optimizer_s", t.optimizer_s},
                          {"exposed_optimizer_s", t.exposed_optimizer_s},
                          {"model_tflops", t.model_tflops},
                          {"mfu", t.mfu},
                          {"adamw_step_s", t.adamw_step_s},
                          {"muon_overhead", t.muon_overhead}};
  if (const MemoryFeasibilityResult& m = r.memory; m.present) {
    const TrainingMemory& b = m.breakdown;
    j["memory"] = ojson{{"model", m.model},
                        {"limit_bytes", m.limit_bytes},
                        {"peak_bytes", m.peak_bytes},
                        {"peak_rank", m.peak_rank},
                        {"over_ranks", m.over_ranks},
                        {"feasible", m.feasible},
                        {"breakdown", ojson{{"parameters", b.parameters},
                                            {"master_weights", b.master_weights},
                                            {"gradients", b.gradients},
                                            {"optimizer_state", b.optimizer_state},
                                            {"transients", b.transients()},
                                            {"activations", b.activations},
                                            {"reserved", b.reserved}}}};
  }
  if (const ExecutionInfo& e = r.execution; !e.library.empty())
    j["execution"] = ojson{{"library", e.library},
                           {"mpi_standard", e.mpi_standard},
                           {"launcher", e.launcher},
                           {"hosts", e.hosts},
                           {"ranks_per_host", e.ranks_per_host},
                           {"oversubscribed", e.oversubscribed},
                           {"blas", e.blas},
                           {"blas_threads", e.blas_threads},
                           {"compute_threads", e.compute_threads},
                           {"compute_mode", e.compute_mode},
                           {"engine_s", e.engine_s},
                           {"handlers_s", e.handlers_s},
                           {"mpi_s", e.mpi_s},
                           {"overhead_fraction", e.overhead_fraction}};
  if (const ExecutionInfo& e = r.execution; !e.library.empty() && e.has_speed_probe())
    j["execution"]["speed_probe"] = ojson{{"shape", e.probe_shape},
                                          {"predicted_s", e.probe_predicted_s},
                                          {"before_s", e.probe_before_s},
                                          {"after_s", e.probe_after_s}};
  j["notes"] = r.notes;
  if (!r.cross_check.empty()) {
    ojson checks = ojson::array();
    for (const CrossCheck& c : r.cross_check)
      checks.push_back(ojson{{"backend", c.backend},
                             {"fidelity", c.fidelity},
                             {"step_s", c.step_s},
                             {"difference_pct", c.difference_pct},
                             {"agree", c.agree}});
    j["cross_check"] = std::move(checks);
  }
  std::vector<std::string> bad;
  find_non_finite(j, "", bad);
  if (!bad.empty())
    throw Error(
        "results: the " + r.backend + " backend produced a non-finite number (NaN or " +
        "infinity) for " + bad.front() +
        (bad.size() > 1 ? " and " + std::to_string(bad.size() - 1) + " more field(s)" : "") +
        "; nothing was written. fix: check the cluster's numbers (README, 'Limits'); if "
        "they are in range, this is a muonbed bug: please report it with the experiment");
  // The checksum covers the whole text with its own value empty; it is the last key.
  j["checksum"] = "";
  std::string text = j.dump(1) + "\n";
  const std::size_t at = text.rfind(kChecksumField);
  text.insert(at + kChecksumField.size(), sha256_hex(text));
  return text;
}

ResultRecord result_from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    ResultRecord r;
    r.schema_version = j.at("schema_version").get<int>();
    if (r.schema_version != kResultsSchemaVersion)
      throw Error("results: schema_version " + std::to_string(r.schema_version) +
                  " is not the supported " + std::to_string(kResultsSchemaVersion) +
                  "; fix: rerun the experiment with this build");
    if (!verify_checksum(text))
      throw Error(
          "results: the checksum does not match the file's content (the file was edited or "
          "damaged after muonbed wrote it); fix: rerun the point (muonbed run EXP --point LABEL "
          "--force), never edit result files by hand");
    r.checksum = j.at("checksum").get<std::string>();
    r.backend = j.at("backend").get<std::string>();
    r.fidelity = j.at("fidelity").get<std::string>();
    r.timestamp = j.at("timestamp").get<std::string>();
    const auto& p = j.at("provenance");
    r.provenance = {
        p.at("muonbed_version").get<std::string>(), p.at("git_hash").get<std::string>(),
        p.at("simgrid_version").get<std::string>(), p.at("host_name").get<std::string>(),
        p.at("experiment").get<std::string>(),      p.at("experiment_file").get<std::string>(),
        p.at("point").get<std::string>(),           p.at("resolved_config").get<std::string>(),
        p.at("point_id").get<std::string>()};
    const auto& s = j.at("setup");
    r.setup.strategy = s.at("strategy").get<std::string>();
    r.setup.cluster = s.at("cluster").get<std::string>();
    r.setup.model = s.at("model").get<std::string>();
    r.setup.mesh = s.at("mesh").get<std::string>();
    r.setup.world_size = s.at("world_size").get<int>();
    r.setup.nodes = s.at("nodes").get<int>();
    r.setup.gpus_per_node = s.at("gpus_per_node").get<int>();
    r.setup.params = s.at("params").get<std::int64_t>();
    r.setup.muon_matrices = s.at("muon_matrices").get<int>();
    r.setup.hyper_period = s.at("hyper_period").get<int>();
    r.setup.rank_kind = s.value("rank_kind", r.backend == "mpi" ? "cpu" : "gpu");
    const auto& st = j.at("step");
    r.step.average_s = st.at("average_s").get<double>();
    r.step.worst_s = st.at("worst_s").get<double>();
    r.step.worst_step = st.at("worst_step").get<int>();
    for (const auto& pt : st.at("patterns"))
      r.step.patterns.push_back(
          {pt.at("step").get<int>(), pt.at("count").get<int>(), pt.at("time_s").get<double>()});
    if (st.contains("timed_steps")) {  // measured backends only
      StepStatistics& m = r.step.measured;
      m.warmup_steps = st.at("warmup_steps").get<int>();
      m.timed_steps = st.at("timed_steps").get<int>();
      m.median_s = st.at("median_s").get<double>();
      m.p95_s = st.at("p95_s").get<double>();
      m.stddev_s = st.at("stddev_s").get<double>();
      m.min_s = st.at("min_s").get<double>();
    }
    if (j.contains("bound")) {  // records written before the bound existed have none
      const auto& b = j.at("bound");
      r.bound.step_s = b.at("step_s").get<double>();
      r.bound.ratio = b.at("ratio").get<double>();
      r.bound.binding = b.at("binding").get<std::string>();
      r.bound.ns_total_s = b.at("ns_total_s").get<double>();
      r.bound.ns_balanced_s = b.at("ns_balanced_s").get<double>();
      r.bound.ns_longest_s = b.at("ns_longest_s").get<double>();
      r.bound.gather_s = b.at("gather_s").get<double>();
      r.bound.scatter_s = b.at("scatter_s").get<double>();
      r.bound.owner_ranks = b.at("owner_ranks").get<int>();
      r.bound.longest = b.at("longest").get<std::string>();
    }
    const auto& t = j.at("throughput");
    r.throughput.params_per_s_per_gpu = read_aw(t.at("params_per_s_per_gpu"));
    r.throughput.compute_time_s = read_aw(t.at("computation").at("time_s"));
    r.throughput.compute_tflops_per_gpu = read_aw(t.at("computation").at("tflops_per_gpu"));
    if (t.at("computation").contains("useful_tflops_per_gpu"))
      r.throughput.useful_tflops_per_gpu = read_aw(t.at("computation").at("useful_tflops_per_gpu"));
    r.throughput.compute_utilization = read_aw(t.at("computation").at("utilization"));
    r.throughput.comm_time_s = read_aw(t.at("communication").at("time_s"));
    r.throughput.comm_exposed_time_s = read_aw(t.at("communication").at("exposed_time_s"));
    r.throughput.comm_GBps_per_gpu = read_aw(t.at("communication").at("GBps_per_gpu"));
    const auto& tr = j.at("traffic");
    r.traffic.model = tr.at("model").get<std::string>();
    r.traffic.intra_node_bytes = read_aw(tr.at("intra_node_bytes"));
    r.traffic.network_bytes = read_aw(tr.at("network_bytes"));
    for (const auto& c : j.at("collectives")) {
      CollectiveResult x;
      x.op = c.at("op").get<int>();
      x.label = c.at("label").get<std::string>();
      x.kind = c.at("kind").get<std::string>();
      x.group_size = c.at("group_size").get<int>();
      x.instances = c.at("instances").get<int>();
      x.steps = c.at("steps").get<int>();
      x.bytes = c.at("bytes").get<double>();
      x.time_s = c.at("time_s").get<double>();
      x.max_time_s = c.at("max_time_s").get<double>();
      x.algbw_GBps = c.at("algbw_GBps").get<double>();
      x.busbw_GBps = c.at("busbw_GBps").get<double>();
      x.crosses_nodes = c.at("crosses_nodes").get<bool>();
      if (c.contains("step_times_s"))
        x.step_times_s = c.at("step_times_s").get<std::vector<double>>();
      r.collectives.push_back(std::move(x));
    }
    for (const auto& rr : j.at("ranks")) {
      RankResult x;
      x.rank = rr.at("rank").get<int>();
      x.node = rr.at("node").get<int>();
      x.average = read_breakdown(rr.at("average"));
      x.worst = read_breakdown(rr.at("worst"));
      x.bytes_sent = rr.at("bytes_sent").get<double>();
      x.bytes_received = rr.at("bytes_received").get<double>();
      const auto& m = rr.at("memory");
      x.memory = {
          m.at("static_bytes").get<std::int64_t>(),
          m.at("peak_transient_bytes").get<std::int64_t>(), m.at("peak_bytes").get<std::int64_t>(),
          m.contains("measured_peak_bytes") ? m.at("measured_peak_bytes").get<std::int64_t>()
                                            : std::int64_t{-1}};
      r.ranks.push_back(x);
    }
    if (j.contains("execution")) {  // measured backends only
      const auto& e = j.at("execution");
      ExecutionInfo& x = r.execution;
      x.library = e.at("library").get<std::string>();
      x.mpi_standard = e.at("mpi_standard").get<std::string>();
      x.launcher = e.at("launcher").get<std::string>();
      x.hosts = e.at("hosts").get<std::vector<std::string>>();
      x.ranks_per_host = e.at("ranks_per_host").get<std::vector<int>>();
      x.oversubscribed = e.at("oversubscribed").get<bool>();
      x.blas = e.at("blas").get<std::string>();
      x.blas_threads = e.at("blas_threads").get<int>();
      x.compute_threads = e.at("compute_threads").get<int>();
      x.compute_mode = e.value("compute_mode", std::string());
      x.engine_s = e.at("engine_s").get<double>();
      x.handlers_s = e.at("handlers_s").get<double>();
      x.mpi_s = e.at("mpi_s").get<double>();
      x.overhead_fraction = e.at("overhead_fraction").get<double>();
      if (e.contains("speed_probe")) {
        const auto& p = e.at("speed_probe");
        x.probe_shape = p.at("shape").get<std::vector<std::int64_t>>();
        x.probe_predicted_s = p.at("predicted_s").get<double>();
        x.probe_before_s = p.at("before_s").get<double>();
        x.probe_after_s = p.at("after_s").get<double>();
      }
    }
    if (j.contains("training")) {  // training steps only
      const auto& x = j.at("training");
      TrainingResult& t = r.training;
      t.present = true;
      t.tokens_per_step = x.at("tokens_per_step").get<std::int64_t>();
      t.seq_len = x.at("seq_len").get<std::int64_t>();
      t.micro_batches = x.at("micro_batches").get<std::int64_t>();
      t.micro_batch_groups = x.at("micro_batch_groups").get<int>();
      t.overlap = x.at("overlap").get<std::string>();
      t.step_s = x.at("step_s").get<double>();
      t.forward_s = x.at("forward_s").get<double>();
      t.backward_s = x.at("backward_s").get<double>();
      t.parameter_gather_s = x.at("parameter_gather_s").get<double>();
      t.activation_comm_s = x.at("activation_comm_s").get<double>();
      t.gradient_sync_s = x.at("gradient_sync_s").get<double>();
      t.optimizer_s = x.at("optimizer_s").get<double>();
      t.exposed_optimizer_s = x.at("exposed_optimizer_s").get<double>();
      t.model_tflops = x.at("model_tflops").get<double>();
      t.mfu = x.at("mfu").get<double>();
      t.adamw_step_s = x.at("adamw_step_s").get<double>();
      t.muon_overhead = x.at("muon_overhead").get<double>();
    }
    if (j.contains("memory")) {  // files written before the feasibility check have none
      const auto& m = j.at("memory");
      MemoryFeasibilityResult& x = r.memory;
      x.present = true;
      x.model = m.at("model").get<std::string>();
      x.limit_bytes = m.at("limit_bytes").get<std::int64_t>();
      x.peak_bytes = m.at("peak_bytes").get<std::int64_t>();
      x.peak_rank = m.at("peak_rank").get<int>();
      x.over_ranks = m.at("over_ranks").get<int>();
      x.feasible = m.at("feasible").get<bool>();
      const auto& b = m.at("breakdown");
      x.breakdown.parameters = b.at("parameters").get<std::int64_t>();
      x.breakdown.master_weights = b.at("master_weights").get<std::int64_t>();
      x.breakdown.gradients = b.at("gradients").get<std::int64_t>();
      x.breakdown.optimizer_state = b.at("optimizer_state").get<std::int64_t>();
      // The file gives transients as one figure (step buffers + NS scratch).
      x.breakdown.step_buffers = b.at("transients").get<std::int64_t>();
      x.breakdown.activations = b.at("activations").get<std::int64_t>();
      x.breakdown.reserved = b.at("reserved").get<std::int64_t>();
    }
    for (const auto& n : j.at("notes")) r.notes.push_back(n.get<std::string>());
    if (j.contains("cross_check"))
      for (const auto& c : j.at("cross_check"))
        r.cross_check.push_back({c.at("backend").get<std::string>(),
                                 c.at("fidelity").get<std::string>(), c.at("step_s").get<double>(),
                                 c.at("difference_pct").get<double>(), c.at("agree").get<bool>()});
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("results: malformed result JSON (") + e.what() +
                "); fix: regenerate the file with `muonbed run`");
  }
}

ResultRecord read_result_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    throw Error("cannot read result file '" + path + "': " + std::strerror(error) +
                "; fix: " + path_error_fix(error));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return result_from_json(buffer.str());
}

// Percent-encoding of every byte outside a small safe set ('%' itself included) is injective:
// distinct labels give distinct folder names, whatever characters sweep values hold. Names too
// long for a file system (255 bytes) keep a readable prefix and a hash of the whole label.
std::string point_slug(const std::string& point_label) {
  if (point_label.empty()) return "default";
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : point_label) {
    const auto u = static_cast<unsigned char>(c);
    const bool safe = std::isalnum(u) || c == '.' || c == '_' || c == '=' || c == '-' || c == ',';
    if (safe) {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  constexpr std::size_t kMaxSlug = 200;
  if (out.size() > kMaxSlug) {
    std::uint64_t hash = 1469598103934665603ull;  // FNV-1a 64 of the label
    for (const char c : point_label) {
      hash ^= static_cast<unsigned char>(c);
      hash *= 1099511628211ull;
    }
    std::size_t cut = 150;
    while (cut > 0 && out[cut - 1] == '%') --cut;  // never split an escape
    if (cut >= 2 && out[cut - 2] == '%') cut -= 2;
    char tail[24];
    std::snprintf(tail, sizeof tail, "~%016llx", static_cast<unsigned long long>(hash));
    out = out.substr(0, cut) + tail;
  }
  return out;
}

std::string result_path(const Experiment& experiment, const std::string& backend) {
  return (std::filesystem::path(experiment.output_dir) / point_slug(experiment.point_label) /
          (backend + ".json"))
      .string();
}

}  // namespace muonbed
