// The record of a measured run from every rank's timings (backends/ranks/record.hpp).
#include "backends/ranks/record.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "core/base/errors.hpp"
#include "core/engine/engine.hpp"
#include "core/engine/timeline.hpp"

namespace muonbed::mpi {

Measured measured_record(const StepPlan& plan, const std::vector<std::vector<StepTimings>>& ranks,
                         const RanksPlacement& placement, const MeasureSettings& settings,
                         ExecutionInfo execution) {
  const std::vector<int>& host_of = placement.host_of;
  const std::vector<std::string>& hosts = placement.hosts;
  const std::vector<int>& cores_of_host = placement.cores_of_host;
  const std::string& compute_mode = placement.compute_mode;
  const PlanIndex index(plan);
  const int world = index.world_size();
  const int timed = static_cast<int>(ranks.front().size());
  std::vector<int> per_host(hosts.size(), 0);
  for (int r = 0; r < world; ++r) ++per_host[host_of[r]];
  const int gpn = *std::max_element(per_host.begin(), per_host.end());
  const int traced = std::clamp(settings.trace_ranks, 0, world);

  StepTimeline timeline(world, index.num_ops(), traced);
  if (has_training_ops(plan)) timeline.track_phases(plan);
  std::vector<StepMeasurement> steps;
  std::vector<std::vector<CollectiveMeasurement>> collectives;
  std::vector<double> times;
  std::vector<TraceEvent> worst_events;
  int worst_step = 0;
  double worst_time = -1;
  double engine = 0, handlers = 0, mpi = 0, overhead = 0;
  Measured out;
  for (int i = 0; i < timed; ++i) {
    timeline.begin_step();
    // Instance durations: the last arriver's, the shortest post-to-completion of the members.
    std::map<std::pair<int, int>, double> duration;  // (op, leader)
    for (int r = 0; r < world; ++r)
      for (const OpTiming& t : ranks[r][i].ops) {
        if (index.op_class(t.op) != OpClass::collective) continue;
        const auto key = std::make_pair(t.op, index.leader(t.op, r));
        const auto [it, inserted] = duration.try_emplace(key, t.end - t.start);
        if (!inserted) it->second = std::min(it->second, t.end - t.start);
      }
    StepMeasurement extra;
    extra.bytes_sent.assign(world, 0);
    extra.bytes_received.assign(world, 0);
    double step_engine = 0, step_handlers = 0, step_mpi = 0, step_overhead = 0;
    for (int r = 0; r < world; ++r) {
      const StepTimings& st = ranks[r][i];
      // (time, 0 begin / 1 end, activity): a rank's changes in time order, as StepTimeline wants
      std::vector<std::tuple<double, int, Activity, int>> changes;  // ..., op
      for (const OpTiming& t : st.ops) {
        const int stream = index.stream(t.op);
        // alloc and release take no time of their own (an executor may still time them).
        if (index.op_class(t.op) == OpClass::memory) continue;
        if (index.op_class(t.op) == OpClass::compute) {
          changes.emplace_back(t.start, 0, Activity::compute, t.op);
          changes.emplace_back(t.end, 1, Activity::compute, t.op);
          timeline.add_flops(op_flops(plan, plan.ops[t.op], r));
          timeline.trace({r, stream, t.op, TraceKind::compute, t.start, t.end});
        } else {
          const double d = duration.at({t.op, index.leader(t.op, r)});
          const double begin = std::max(t.start, t.end - d);
          changes.emplace_back(begin, 0, Activity::communication, t.op);
          changes.emplace_back(t.end, 1, Activity::communication, t.op);
          if (begin > t.start) timeline.trace({r, stream, t.op, TraceKind::wait, t.start, begin});
          timeline.trace({r, stream, t.op, TraceKind::collective, begin, t.end});
        }
      }
      std::sort(changes.begin(), changes.end(), [](const auto& a, const auto& b) {
        return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) < std::get<0>(b)
                                                : std::get<1>(a) < std::get<1>(b);
      });
      for (const auto& [t, kind, activity, op] : changes) {
        if (kind == 0)
          timeline.begin(r, activity, t, op);
        else
          timeline.end(r, activity, t, op);
      }
      timeline.touch_finish(r, st.finish);
      extra.bytes_sent[r] = st.bytes_sent;
      extra.bytes_received[r] = st.bytes_received;
      extra.intra_node_bytes += st.intra_host_bytes;
      extra.network_bytes += st.network_bytes;
      step_engine = std::max(step_engine, st.engine_s);
      step_handlers = std::max(step_handlers, st.handlers_s);
      step_mpi = std::max(step_mpi, st.mpi_s);
      step_overhead = std::max(step_overhead, st.engine_s + st.handlers_s);
    }
    for (const auto& [key, d] : duration) {
      const auto [op, leader] = key;
      const std::vector<int> members = index.participants(op, leader);
      bool crosses = false;
      for (int m : members) crosses = crosses || host_of[m] != host_of[members.front()];
      timeline.collective(op, static_cast<int>(members.size()),
                          static_cast<double>(collective_bytes(plan, plan.ops[op], leader)), d,
                          crosses);
    }
    StepMeasurement m = timeline.measurement(ranks.front()[i].step, 1);
    m.bytes_sent = std::move(extra.bytes_sent);
    m.bytes_received = std::move(extra.bytes_received);
    m.intra_node_bytes = extra.intra_node_bytes;
    m.network_bytes = extra.network_bytes;
    times.push_back(m.time_s);
    if (m.time_s > worst_time) {
      worst_time = m.time_s;
      worst_step = m.step;
      worst_events = timeline.events();
    }
    steps.push_back(std::move(m));
    collectives.push_back(timeline.collectives());
    engine += step_engine / timed;
    handlers += step_handlers / timed;
    mpi += step_mpi / timed;
    overhead += step_overhead / timed;
  }

  ResultRecord& record = out.record;
  record.backend = settings.backend;
  record.fidelity = "measured";
  record.traffic.model = "messages";
  ClusterSpec cluster;
  cluster.name = settings.cluster_name;
  cluster.gpus_per_node = gpn;
  cluster.gpu.peak_tflops = settings.peak_tflops;
  fill_record(record, plan, cluster, steps, collectives);
  // The spread behind each collective's mean: its mean instance time in every timed step.
  for (CollectiveResult& c : record.collectives)
    for (const std::vector<CollectiveMeasurement>& step : collectives)
      for (const CollectiveMeasurement& m : step)
        if (m.op == c.op && m.instances > 0) c.step_times_s.push_back(m.time_sum / m.instances);
  record.setup.nodes = static_cast<int>(hosts.size());
  for (int r = 0; r < world; ++r) record.ranks[r].node = host_of[r];
  record.step.measured = step_statistics(times, settings.warmup_steps);

  record.execution = std::move(execution);
  ExecutionInfo& e = record.execution;
  e.launcher = settings.launcher;
  e.hosts = hosts;
  e.ranks_per_host = per_host;
  std::string crowded;
  for (std::size_t h = 0; h < hosts.size(); ++h)
    if (per_host[h] > cores_of_host[h]) {
      e.oversubscribed = true;
      crowded += (crowded.empty() ? "" : ", ") + std::to_string(per_host[h]) + " ranks on " +
                 std::to_string(cores_of_host[h]) + " cores of " + hosts[h];
    }
  e.compute_threads = placement.compute_threads;
  e.compute_mode = compute_mode;
  e.engine_s = engine;
  e.handlers_s = handlers;
  e.mpi_s = mpi;
  e.overhead_fraction = record.step.average_s > 0 ? overhead / record.step.average_s : 0;

  const std::string& b = settings.backend;
  record.notes.push_back(
      b + ": measured, " + std::to_string(world) + " ranks on " + std::to_string(hosts.size()) +
      " host" + (hosts.size() == 1 ? "" : "s") + ", " + std::to_string(settings.warmup_steps) +
      " warm-up and " + std::to_string(timed) +
      " timed steps; a step's time is its slowest rank's, " + settings.step_clock);
  record.notes.push_back(
      b +
      ": collective time_s runs from the last member's arrival to completion (the shortest "
      "of the members' post-to-completion times), waiting excluded as in the simulator; traffic "
      "counts the program's messages per rank, not the MPI library's internal transfers");
  if (has_training_ops(plan))
    record.notes.push_back(
        b +
        ": training step: forward and backward ran as fp32 GEMMs of each rank's matrix pieces "
        "over the op's tokens against seeded activations (core/plan/program.hpp "
        "TrainingGemmTask), FSDP gathers and activation collectives as real messages of the "
        "plan's sizes; the weight gradients went to scratch, the gradient sync and the optimizer "
        "ran on the step's seeded gradients (so the optimizer matches the reference)");
  for (const std::string& note : settings.notes) record.notes.push_back(note);
  if (compute_mode == "progress_points")
    record.notes.push_back(
        b +
        ": compute ran on each rank's MPI thread, which tested its requests at the kernels' "
        "progress points (fewer cores than a worker thread per rank needs; "
        "MUONBED_MPI_COMPUTE=threads forces workers)");
  if (e.oversubscribed)
    record.notes.push_back("warning: oversubscribed (" + crowded +
                           "): ranks share cores, so these timings are functional only, not a "
                           "benchmark");

  out.step_times_s = times;
  out.messages_what = settings.messages_what;
  out.trace = chrome_trace(
      plan, worst_events, traced, gpn, worst_step,
      "measured: ranks 0.." + std::to_string(traced - 1) + " of the slowest timed step (" +
          std::to_string(worst_step) +
          "); pid = host, tid = rank x streams + stream; times in microseconds " +
          settings.trace_clock +
          "; a collective's span starts at its last member's arrival, the wait before it is "
          "this rank's");
  return out;
}

void add_run_cost(Measured& m, const std::vector<std::int64_t>& pool_peak_bytes,
                  std::int64_t messages, std::chrono::steady_clock::time_point start) {
  for (RankResult& rr : m.record.ranks)
    if (rr.rank >= 0 && rr.rank < static_cast<int>(pool_peak_bytes.size()))
      rr.memory.measured_peak_bytes = pool_peak_bytes[static_cast<std::size_t>(rr.rank)];
  m.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  m.peak_rss_bytes = static_cast<double>(usage.ru_maxrss) * 1024.0;
  m.messages = messages;
}

MeasureSettings measure_settings(const launch::Job& job) {
  MeasureSettings settings;
  settings.warmup_steps = job.warmup_steps;
  settings.timed_steps = job.timed_steps;
  settings.trace_ranks = job.trace_ranks;
  settings.cluster_name = job.cluster_name;
  settings.peak_tflops = job.peak_tflops;
  settings.launcher = job.launcher;
  settings.blas_threads = job.blas_threads;
  settings.check_data = job.check_data;
  settings.backend = job.backend;
  return settings;
}

PointRun point_run(Measured m) {
  PointRun run;
  run.record = std::move(m.record);
  run.trace = std::move(m.trace);
  run.cost.what = "execution";
  run.cost.wall_s = m.wall_s;
  run.cost.peak_rss_bytes = m.peak_rss_bytes;
  run.cost.messages = m.messages;
  run.cost.messages_what = m.messages_what;
  run.wrong_elements = m.wrong_elements;
  run.adamw_twin = std::move(m.twin);
  return run;
}

}  // namespace muonbed::mpi
