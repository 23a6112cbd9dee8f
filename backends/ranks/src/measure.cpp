// Measured steps on a measured backend's ranks and the record rank 0 builds from every rank's
// intervals (see backends/ranks/measure.hpp).
#include "backends/ranks/measure.hpp"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <tuple>

#include "backends/launch/launch.hpp"
#include "backends/ranks/world.hpp"
#include "core/base/errors.hpp"
#include "core/engine/engine.hpp"
#include "core/engine/timeline.hpp"

namespace muonbed::mpi {

namespace {

using Clock = std::chrono::steady_clock;

// Flat form of a rank's timed steps, for one MPI_Gatherv of doubles.
constexpr int kStepFields = 12;

std::vector<double> flatten(const std::vector<StepTimings>& steps) {
  std::vector<double> out;
  for (const StepTimings& s : steps) {
    out.insert(out.end(), {static_cast<double>(s.step), s.finish, s.bytes_sent, s.bytes_received,
                           s.intra_host_bytes, s.network_bytes, s.messages, s.engine_s,
                           s.handlers_s, s.mpi_s, s.idle_s, static_cast<double>(s.ops.size())});
    for (const OpTiming& t : s.ops)
      out.insert(out.end(), {static_cast<double>(t.op), t.start, t.end});
  }
  return out;
}

std::vector<StepTimings> unflatten(const double* data, std::size_t size) {
  std::vector<StepTimings> out;
  std::size_t i = 0;
  while (i + kStepFields <= size) {
    StepTimings s;
    s.step = static_cast<int>(data[i]);
    s.finish = data[i + 1];
    s.bytes_sent = data[i + 2];
    s.bytes_received = data[i + 3];
    s.intra_host_bytes = data[i + 4];
    s.network_bytes = data[i + 5];
    s.messages = data[i + 6];
    s.engine_s = data[i + 7];
    s.handlers_s = data[i + 8];
    s.mpi_s = data[i + 9];
    s.idle_s = data[i + 10];
    const auto n = static_cast<std::size_t>(data[i + 11]);
    i += kStepFields;
    if (i + 3 * n > size) throw ExecutionError("internal: truncated timings from a rank");
    for (std::size_t k = 0; k < n; ++k, i += 3)
      s.ops.push_back({static_cast<int>(data[i]), data[i + 1], data[i + 2]});
    out.push_back(std::move(s));
  }
  return out;
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string s(text, static_cast<std::size_t>(length));
  s = s.substr(0, s.find('\n'));
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string mpi_standard() {
  int version = 0, subversion = 0;
  MPI_Get_version(&version, &subversion);
  return "MPI " + std::to_string(version) + "." + std::to_string(subversion);
}

// The record of the timed steps, from every rank's timings (rank 0).
Measured build_record(const StepPlan& plan, const std::vector<std::vector<StepTimings>>& ranks,
                      const std::vector<int>& host_of, const std::vector<std::string>& hosts,
                      const std::vector<int>& cores_of_host, int compute_threads,
                      const std::string& compute_mode, const MeasureSettings& settings) {
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

  ExecutionInfo& e = record.execution;
  e.library = settings.library.empty() ? mpi_library() : settings.library + "; " + mpi_library();
  e.mpi_standard = mpi_standard();
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
  const BlasInfo blas = set_blas_threads(0);
  e.blas = blas.name.empty() ? "none (kernels' portable loops)" : blas.name;
  e.blas_threads = blas.name.empty() ? 0 : blas.threads;
  e.compute_threads = compute_threads;
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
      " timed steps; a step's time is its slowest rank's, from the barrier before it to the "
      "rank's last op, on the rank's own monotonic clock");
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
  out.trace = chrome_trace(
      plan, worst_events, traced, gpn, worst_step,
      "measured: ranks 0.." + std::to_string(traced - 1) + " of the slowest timed step (" +
          std::to_string(worst_step) +
          "); pid = host, tid = rank x streams + stream; times in microseconds from each rank's "
          "own start after the barrier (hosts' clocks are not aligned); a collective's span "
          "starts at its last member's arrival, the wait before it is this rank's");
  return out;
}

}  // namespace

BlasInfo set_blas_threads(int threads) {
  using SetFn = void (*)(int);
  using GetFn = int (*)();
  using ConfigFn = char* (*)();
  BlasInfo info;
  const auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  const auto get = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const auto config = reinterpret_cast<ConfigFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  if (get == nullptr) return info;
  if (threads > 0 && set != nullptr) set(threads);
  info.name = config != nullptr ? config() : "OpenBLAS";
  info.threads = get();
  return info;
}

std::vector<std::vector<StepTimings>> run_interleaved_steps(
    const std::vector<MeasuredRank*>& executors, int warmup, int timed,
    std::vector<double>& messages) {
  messages.assign(executors.size(), 0);
  std::vector<std::vector<StepTimings>> kept(executors.size());
  for (std::size_t e = 0; e < executors.size(); ++e)
    for (int k = 0; k < warmup; ++k) {
      executors[e]->run_step(k);
      messages[e] += executors[e]->timings().messages;
    }
  for (int k = warmup; k < warmup + timed; ++k)
    for (std::size_t e = 0; e < executors.size(); ++e) {
      executors[e]->run_step(k);
      messages[e] += executors[e]->timings().messages;
      kept[e].push_back(executors[e]->timings());
    }
  return kept;
}

std::vector<double> paired_overheads(const std::vector<double>& point_steps_s,
                                     const std::vector<double>& twin_steps_s) {
  if (point_steps_s.size() != twin_steps_s.size())
    throw Error("paired_overheads: " + std::to_string(point_steps_s.size()) +
                " steps of the point against " + std::to_string(twin_steps_s.size()) +
                " of its twin");
  std::vector<double> out;
  for (std::size_t i = 0; i < point_steps_s.size(); ++i) {
    if (!(twin_steps_s[i] > 0))
      throw Error("paired_overheads: the twin's timed step " + std::to_string(i) + " took " +
                  std::to_string(twin_steps_s[i]) + " s");
    out.push_back(point_steps_s[i] / twin_steps_s[i] - 1);
  }
  return out;
}

namespace {

// After the timed steps: the check step of `executor` when settings ask for it (summed on
// rank 0; -1: not checked).
long long run_check(MPI_Comm world, MeasuredRank& executor, double timeout_s,
                    const MeasureSettings& settings) {
  const int rank = executor.rank();
  const std::string where = "rank " + std::to_string(rank) + ", after the last step";
  // The untimed check step (nccl-tests' -c), last: it leaves the data meaningless.
  long long wrong = -1;
  if (settings.check_data) {
    executor.run_check_step(settings.warmup_steps + settings.timed_steps);
    long long mine = executor.timings().wrong_elements;
    wrong = 0;
    MPI_Request reduce = MPI_REQUEST_NULL;
    MUONBED_MPI_CHECK(MPI_Ireduce(&mine, &wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, world, &reduce));
    wait_for(reduce, timeout_s, where, "summing the check step's wrong elements");
  }

  return wrong;
}

// Collective: every rank's kept timings to rank 0, which builds the plan's record.
std::optional<Measured> gather_record(const StepPlan& plan, MPI_Comm world, MeasuredRank& executor,
                                      const std::vector<StepTimings>& kept, double messages,
                                      long long wrong, double timeout_s,
                                      const MeasureSettings& settings, Clock::time_point start) {
  const int rank = executor.rank();
  const int size = static_cast<int>(executor.host_of().size());
  const std::string where = "rank " + std::to_string(rank) + ", after the last step";
  // Every rank's timings to rank 0, the cores of each rank's host and its pool's peak (bytes, exact
  // in a double up to 2^53).
  constexpr int kTrailing = 3;
  std::vector<double> mine = flatten(kept);
  mine.push_back(messages);
  mine.push_back(static_cast<double>(launch::available_cores()));
  mine.push_back(static_cast<double>(executor.pool_peak_bytes()));
  const int count = static_cast<int>(mine.size());
  std::vector<int> counts(rank == 0 ? size : 0), displs(rank == 0 ? size : 0);
  MPI_Request request = MPI_REQUEST_NULL;
  MUONBED_MPI_CHECK(MPI_Igather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world, &request));
  wait_for(request, timeout_s, where, "gathering the timings");
  std::vector<double> all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = total;
      total += counts[r];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  MUONBED_MPI_CHECK(MPI_Igatherv(mine.data(), count, MPI_DOUBLE, all.data(), counts.data(),
                                 displs.data(), MPI_DOUBLE, 0, world, &request));
  wait_for(request, timeout_s, where, "gathering the timings");
  if (rank != 0) return std::nullopt;

  std::vector<std::vector<StepTimings>> ranks(size);
  std::vector<int> cores_of_host(executor.hosts().size(), 1 << 30);
  std::vector<std::int64_t> pool_peak(static_cast<std::size_t>(size), -1);
  std::int64_t total_messages = 0;
  for (int r = 0; r < size; ++r) {
    const double* d = all.data() + displs[r];
    const double* trailing = d + counts[r] - kTrailing;
    ranks[r] = unflatten(d, static_cast<std::size_t>(counts[r] - kTrailing));
    total_messages += static_cast<std::int64_t>(trailing[0]);
    int& cores = cores_of_host[executor.host_of()[r]];
    cores = std::min(cores, static_cast<int>(trailing[1]));
    pool_peak[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(trailing[2]);
  }
  Measured out = build_record(plan, ranks, executor.host_of(), executor.hosts(), cores_of_host,
                              executor.compute_threads(), executor.compute_mode(), settings);
  for (RankResult& rr : out.record.ranks)
    if (rr.rank >= 0 && rr.rank < size)
      rr.memory.measured_peak_bytes = pool_peak[static_cast<std::size_t>(rr.rank)];
  out.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  out.peak_rss_bytes = static_cast<double>(usage.ru_maxrss) * 1024.0;
  out.messages = total_messages;
  out.messages_what = settings.messages_what;
  out.wrong_elements = wrong;
  return out;
}

}  // namespace

std::optional<Measured> measure_rank(const StepPlan& plan, MPI_Comm world, MeasuredRank& executor,
                                     double timeout_s, const MeasureSettings& settings) {
  const auto start = Clock::now();
  if (settings.timed_steps < 1)
    throw Error(settings.backend + ": at least one timed step (repeats >= 1)");
  std::vector<double> messages;
  const std::vector<std::vector<StepTimings>> kept =
      run_interleaved_steps({&executor}, settings.warmup_steps, settings.timed_steps, messages);
  const long long wrong = run_check(world, executor, timeout_s, settings);
  return gather_record(plan, world, executor, kept[0], messages[0], wrong, timeout_s, settings,
                       start);
}

std::optional<Measured> measure_paired(const StepPlan& plan, const StepPlan& twin_plan,
                                       MPI_Comm world, MeasuredRank& executor,
                                       MeasuredRank& twin_executor, double timeout_s,
                                       const MeasureSettings& settings) {
  const auto start = Clock::now();
  if (settings.timed_steps < 1)
    throw Error(settings.backend + ": at least one timed step (repeats >= 1)");
  std::vector<double> messages;
  const std::vector<std::vector<StepTimings>> kept = run_interleaved_steps(
      {&executor, &twin_executor}, settings.warmup_steps, settings.timed_steps, messages);
  const long long wrong = run_check(world, executor, timeout_s, settings);
  std::optional<Measured> out =
      gather_record(plan, world, executor, kept[0], messages[0], wrong, timeout_s, settings, start);
  MeasureSettings twin_settings = settings;
  twin_settings.trace_ranks = 0;  // the point's trace is the one kept
  std::optional<Measured> twin = gather_record(twin_plan, world, twin_executor, kept[1],
                                               messages[1], -1, timeout_s, twin_settings, start);
  if (!out) return std::nullopt;
  const std::vector<double> pairs = paired_overheads(out->step_times_s, twin->step_times_s);
  // The same statistics as the steps' (median, population standard deviation, minimum).
  const StepStatistics stats = step_statistics(pairs, settings.warmup_steps);
  TrainingResult& t = out->record.training;
  t.overhead_pairs = static_cast<int>(pairs.size());
  t.overhead_spread = stats.stddev_s;
  const double highest = *std::max_element(pairs.begin(), pairs.end());
  char text[640];
  std::snprintf(text, sizeof text,
                "%s: the AdamW twin (training.adamw_step_s) was measured interleaved in the same "
                "job and world: its executor beside this one, both warmed up, then the timed "
                "steps alternated point, twin, point, twin, ... (each after its barrier); the %d "
                "per-pair overheads (step i / twin step i - 1) have median %+.1f %%, range "
                "%+.1f .. %+.1f %%, standard deviation %.1f pp (training.overhead_spread)",
                settings.backend.c_str(), t.overhead_pairs, 100 * stats.median_s, 100 * stats.min_s,
                100 * highest, 100 * t.overhead_spread);
  out->record.notes.push_back(text);
  out->twin = std::move(twin->record);
  out->wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  out->messages += twin->messages;
  return out;
}

}  // namespace muonbed::mpi
