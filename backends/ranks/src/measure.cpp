// Measured steps on a measured backend's ranks and the record rank 0 builds from every rank's
// intervals (see backends/ranks/measure.hpp).
#include "backends/ranks/measure.hpp"

#include <dlfcn.h>
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
  RanksPlacement placement{executor.host_of(), executor.hosts(), cores_of_host,
                           executor.compute_threads(), executor.compute_mode()};
  ExecutionInfo execution;
  execution.library =
      settings.library.empty() ? mpi_library() : settings.library + "; " + mpi_library();
  execution.mpi_standard = mpi_standard();
  const BlasInfo blas = set_blas_threads(0);
  execution.blas = blas.name.empty() ? "none (kernels' portable loops)" : blas.name;
  execution.blas_threads = blas.name.empty() ? 0 : blas.threads;
  Measured out = measured_record(plan, ranks, placement, settings, std::move(execution));
  add_run_cost(out, pool_peak, total_messages, start);
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
