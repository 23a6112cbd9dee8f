// Assembling a result record from a backend's per-step measurements: the same aggregation for
// every backend (so analytic, simulated and measured records differ only in what was measured),
// the statistics of measured steps, and the cross-check of a point's records against each other.
// See core/results/results.hpp for the schema.
#include "core/results/results.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/base/errors.hpp"
#include "core/engine/bound.hpp"
#include "core/engine/cost_model.hpp"
#include "core/experiment/backends.hpp"
#include "core/results/src/record_internal.hpp"

namespace muonbed {

namespace {

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
  TrainingCosts costs(plan);
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
    for (int r : op.ranks.ranks(plan.mesh())) flops += costs.flops(op, r);
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

// ---- Assembling a record ------------------------------------------------------------------------

PlanFigures plan_figures(const StepPlan& plan, const ClusterSpec& cluster) {
  PlanFigures figures;
  // A measured run's cluster may have no link figures (the MPI executor on one host): then there
  // is no bound to report, and the record says why instead of failing the run.
  try {
    const StepBound sb = step_bound(plan, cluster);
    figures.bound = {sb.bound_s,      0,           sb.binding,   sb.ns_total_s,  sb.ns_balanced_s,
                     sb.ns_longest_s, sb.gather_s, sb.scatter_s, sb.owner_ranks, sb.longest};
  } catch (const PlanError& e) {
    figures.bound = BoundResult{};
    figures.bound.binding = "none";
    figures.no_bound = e.what();
  }
  // Once per class of ranks holding the same (core/plan/plan.hpp training_memories), not per rank.
  figures.memory = training_memories(plan);
  return figures;
}

void fill_record(ResultRecord& record, const StepPlan& plan, const ClusterSpec& cluster,
                 const std::vector<StepMeasurement>& steps,
                 const std::vector<std::vector<CollectiveMeasurement>>& collectives,
                 const PlanFigures* figures) {
  if (steps.empty()) throw Error("fill_record: no step was measured");
  PlanFigures made_here;
  if (figures == nullptr) {
    made_here = plan_figures(plan, cluster);
    figures = &made_here;
  }
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

  record.bound = figures->bound;
  if (figures->no_bound.empty())
    record.bound.ratio = safe_div(step.average_s, record.bound.step_s);
  else
    record.notes.push_back("no T_bound: " + figures->no_bound);

  // Predicted records say where their Newton-Schulz times come from (a shape past the measured
  // table is timed from the efficiency curve, and the note names it).
  if (const BackendFacts* facts = backend_facts(record.backend); facts && !facts->measures)
    record.notes.push_back(ns_time_sources(plan, cluster).note);

  // Per rank: averages over patterns weighted by their step counts, and the worst step's values.
  record.ranks.assign(world, RankResult{});
  const std::vector<TrainingMemory>& memory = figures->memory;
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

}  // namespace muonbed
