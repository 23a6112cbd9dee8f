// The `mpi` backend (see backends/mpi/mpi_backend.hpp): its run function (a job started with
// backends/launch/'s mpirun, or led in the user-started world muonbed runs in), the job runner its
// ranks call (backends/ranks/jobs.hpp), the compute benchmark's jobs, and its registration.
#include "backends/mpi/mpi_backend.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "backends/launch/launch.hpp"
#include "backends/mpi/executor.hpp"
#include "backends/mpi/measure.hpp"
#include "backends/ranks/jobs.hpp"
#include "backends/ranks/world.hpp"
#include "core/base/errors.hpp"
#include "core/base/process.hpp"
#include "core/experiment/experiment.hpp"
#include "core/plan/plan_json.hpp"
#include "core/plan/program.hpp"
#include "core/results/calibration.hpp"
#include "core/results/compare.hpp"
#include "core/results/run_point.hpp"

namespace muonbed {

namespace {

namespace fs = std::filesystem;

// The compute benchmark of `muonbed calibrate` (job kind "compute", options: `plans`,
// `concurrent`) on every rank; rows on rank 0. A failure anywhere ends every rank.
std::vector<ComputeBenchRow> run_compute_job(const launch::Job& job) {
  try {
    mpi::set_blas_threads(job.blas_threads);
    std::vector<StepPlan> plans;
    for (const nlohmann::json& p : job.options.at("plans")) plans.push_back(plan_from_json(p));
    return mpi::compute_bench(plans, MPI_COMM_WORLD, job.warmup_steps, job.timed_steps,
                              job.timeout_s, job.options.at("concurrent").get<bool>());
  } catch (const std::exception& e) {
    std::string message = e.what();
    if (message.rfind("rank ", 0) != 0)
      message = "rank " + std::to_string(mpi::world_rank()) + ": " + message;
    if (mpi::world_size() == 1) throw Error(message);
    mpi::abort_world(message);
  }
}

void serve_compute_job(const launch::Job& job, MPI_Comm) {
  run_compute_job(job);
}

// The mpi backend's job runner: the MPI executor measured, bracketed by the speed probe.
std::optional<mpi::Measured> run_mpi_job(const StepPlan& plan, MPI_Comm world,
                                         const launch::Job& job,
                                         const mpi::MeasureSettings& settings) {
  mpi::ExecutorOptions options;
  options.seed = job.seed;
  options.timeout_s = job.timeout_s;
  options.fault = launch::parse_fault(job.fault);
  options.generic_exchange = job.options.value("generic_exchange", false);
  options.compute_mode = mpi::parse_compute_mode(job.options.value("compute_mode", "auto"));
  // The speed probe brackets the steps: the machine's speed before and after them, against the
  // profile's (compare flags a profile made on another machine, or drift during the point).
  const double predicted_s = job.options.value("probe_predicted_s", 0.0);
  const bool probe = predicted_s > 0 && job.options.contains("probe_plan");
  std::optional<StepPlan> probe_plan;
  if (probe) probe_plan = plan_from_json(job.options.at("probe_plan"));
  const double before = probe ? mpi::time_newton_schulz(*probe_plan, world, job.timeout_s) : 0;
  // A training point's AdamW twin, measured interleaved with it (launch::Job::twin_plan).
  std::optional<StepPlan> twin;
  if (!job.twin_plan.is_null()) twin = plan_from_json(job.twin_plan);
  std::optional<mpi::Measured> m =
      mpi::measure(plan, world, options, settings, twin ? &*twin : nullptr);
  const double after = probe ? mpi::time_newton_schulz(*probe_plan, world, job.timeout_s) : 0;
  if (m && probe) {
    ExecutionInfo& e = m->record.execution;
    e.probe_shape = job.options.at("probe_shape").get<std::vector<std::int64_t>>();
    e.probe_predicted_s = predicted_s;
    e.probe_before_s = before;
    e.probe_after_s = after;
    m->record.notes.push_back(
        "mpi: speed probe: one Newton-Schulz call of the plan's costliest shape timed as "
        "calibrate times gpu.ns_table, before and after the steps (execution.speed_probe), "
        "against cluster profile '" +
        job.cluster_name + "'");
    for (std::string& w : speed_probe_warnings(e, job.cluster_name))
      m->record.notes.push_back(std::move(w));
  }
  return m;
}

void register_mpi_jobs() {
  mpi::register_job_runner("mpi", &run_mpi_job);
  mpi::register_job_kind("compute", &serve_compute_job);
}

// The job of an mpi point: the common settings (launch::make_job) and the MPI executor's own
// from the environment (MUONBED_MPI_EXCHANGE, MUONBED_MPI_COMPUTE, MUONBED_MPI_SPEED_PROBE).
launch::Job make_mpi_job(const Experiment& experiment, const StepPlan& plan,
                         const RunSettings& settings) {
  launch::Job job = launch::make_job(experiment, plan, settings);
  job.backend = "mpi";
  if (settings.adamw_twin_plan != nullptr) job.twin_plan = plan_to_json(*settings.adamw_twin_plan);
  if (const auto mode = env_choice("MUONBED_MPI_EXCHANGE", {"alltoallv", "natural"}))
    job.options["generic_exchange"] = *mode == "alltoallv";
  if (const char* v = std::getenv("MUONBED_MPI_COMPUTE"); v != nullptr && *v != '\0') {
    try {
      job.options["compute_mode"] = std::string(mpi::to_string(mpi::parse_compute_mode(v)));
    } catch (const Error& e) {
      throw ConfigError(SourceLocation{"environment", 0, 0},
                        std::string("MUONBED_MPI_COMPUTE='") + v + "': " + e.what(),
                        "unset it, or use one of the modes above");
    }
  }
  if (env_choice("MUONBED_MPI_SPEED_PROBE", {"on", "off"}).value_or("on") == "on") {
    try {
      if (const std::optional<SpeedProbe> probe =
              speed_probe(plan, experiment.cluster, settings.speed_probe_from_profile)) {
        job.options["probe_plan"] = plan_to_json(probe->plan);
        job.options["probe_shape"] =
            std::vector<std::int64_t>{probe->shape.batch, probe->shape.rows, probe->shape.cols};
        job.options["probe_predicted_s"] = probe->predicted_s;
      }
    } catch (const PlanError&) {
      // A profile without a compute rate: nothing to check the machine against.
    }
  }
  return job;
}

// Before ranks start: the host memory the CPU executor's ranks of this plan hold at once (each
// rank's program in the plan's dtypes, as backends/cpu's RankStore holds it: its static tensors
// and its peak of live buffers, which is rank_memory; plus each process's own ~64 MiB, which also
// covers the handlers' fp32 working copies of small ops) against what this machine has available;
// a point that cannot fit is refused with the numbers instead of swapping or being killed
// halfway. A plan with more ranks than this machine has cores still counts all of them. A
// training point's AdamW twin (`twin`, or null) is held by the same ranks at the same time
// (measured interleaved), so its tensors count too.
void check_host_memory(const StepPlan& plan, const StepPlan* twin, const std::string& label) {
  const long long available = available_memory_bytes();
  if (available < 0) return;  // no /proc/meminfo: nothing to check against
  constexpr double kPerProcess = 64.0 * (1 << 20);
  double need = 0;
  const int ranks = plan.mesh().world_size();
  for (int r = 0; r < ranks; ++r) {
    need += static_cast<double>(rank_memory(plan, r).peak_bytes()) + kPerProcess;
    if (twin != nullptr) need += static_cast<double>(rank_memory(*twin, r).peak_bytes());
  }
  if (need <= static_cast<double>(available)) return;
  const double gib = 1024.0 * 1024 * 1024;
  char text[512];
  std::snprintf(text, sizeof text,
                "point '%s' needs about %.2f GiB of host memory in its %d ranks (the plan's "
                "tensors in their dtypes, rank_memory%s, plus ~64 MiB per process), but this "
                "machine has %.2f GiB available (MemAvailable)",
                label.c_str(), need / gib, ranks,
                twin != nullptr ? ", and its AdamW twin's, measured beside it" : "",
                static_cast<double>(available) / gib);
  throw Error(std::string(text) +
              "; fix: a smaller model or fewer ranks, free memory, or run it on a larger "
              "machine (the analytic and sim backends predict it without running it)");
}

PointRun run_mpi(const Experiment& experiment, const StepPlan& plan, const RunSettings& settings) {
  launch::Job job = make_mpi_job(experiment, plan, settings);
  const int ranks = plan.mesh().world_size();
  const launch::MpiEnvironment environment = launch::mpi_environment();
  PointRun run;
  if (environment.inside) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized || (!mpi::leading_world() && mpi::world_size() > 1))
      throw Error("this process runs under " + environment.launcher +
                  ", where the mpi backend runs only from `muonbed run`; fix: run this command "
                  "outside mpirun and it starts mpirun itself");
    if (mpi::world_size() != ranks)
      throw Error("point '" + job.label + "' needs " + std::to_string(ranks) + " ranks (mesh " +
                  plan.mesh().describe() + ") but this MPI world has " +
                  std::to_string(mpi::world_size()) + "; fix: start the job with " +
                  std::to_string(ranks) + " ranks (mpirun -np " + std::to_string(ranks) +
                  " / srun -n " + std::to_string(ranks) +
                  "), or run muonbed outside mpirun and it starts mpirun -np " +
                  std::to_string(ranks) + " for each point");
    job.launcher = environment.launcher;
    run = mpi::lead_job(job);
  } else {
    job.launcher = "mpirun (started by muonbed)";
    check_host_memory(plan, settings.adamw_twin_plan, job.label);  // every rank on this machine
    run = launch::launch_job(
        job, ranks,
        fs::path(result_path(experiment, "mpi")).replace_filename("mpi.failed.log").string());
  }
  run.record.provenance = make_provenance(&experiment, "");
  return run;
}

}  // namespace

std::vector<ComputeBenchRow> run_compute_bench(const std::vector<StepPlan>& plans, int warmup,
                                               int repeats, bool concurrent) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || (!mpi::leading_world() && mpi::world_size() > 1))
    throw Error(
        "the compute benchmark runs on the MPI world muonbed leads (rank 0 after "
        "mpi_command_begin); fix: start the command under mpirun, or let it start mpirun itself");
  launch::Job job;
  job.kind = "compute";
  job.options["plans"] = nlohmann::json::array();
  for (const StepPlan& p : plans) job.options["plans"].push_back(plan_to_json(p));
  job.options["concurrent"] = concurrent;
  job.warmup_steps = warmup;
  job.timed_steps = repeats;
  if (const auto threads = launch::env_blas_threads()) job.blas_threads = *threads;
  if (mpi::world_size() > 1) mpi::send_job(job);
  return run_compute_job(job);
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string out(text, strnlen(text, static_cast<std::size_t>(std::max(0, length))));
  const std::size_t newline = out.find_first_of("\r\n");
  if (newline != std::string::npos) out.resize(newline);
  return out;
}

void register_mpi_backend() {
  register_backend({*backend_facts("mpi"), &run_mpi});
  register_mpi_jobs();
}

}  // namespace muonbed
