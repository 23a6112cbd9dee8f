// Per-point runner, result writing, summaries and the seed-claims table (see sim/run_point.hpp).
#include "sim/run_point.hpp"

#include <chrono>
#include <filesystem>

#include "core/errors.hpp"

namespace muonbed {

PointRun run_plan(const Experiment& experiment, const StepPlan& plan, const std::string& backend,
                  const SimOptions& options) {
  PointRun run;
  if (backend == "sim") {
    SimOptions o = options;
    o.fidelity = experiment.sim_fidelity;
    SimulationResult r = simulate(plan, experiment.cluster, o);
    run.record = std::move(r.record);
    run.trace = std::move(r.trace);
    run.stats = r.stats;
    run.record.provenance = make_provenance(&experiment, simgrid_version());
  } else if (backend == "analytic") {
    run.record = analytic_record(plan, experiment.cluster);
    run.record.provenance = make_provenance(&experiment, "");
  } else {
    throw Error("run_point: backend '" + backend +
                "' is not run by the simulator; fix: use sim or analytic here (mpi and nccl run "
                "on the real backends)");
  }
  run.record.timestamp = utc_timestamp();
  return run;
}

PointRun run_point(const Experiment& experiment, const std::string& backend,
                   const SimOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const StepPlan plan = plan_experiment(experiment);
  const double plan_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PointRun run = run_plan(experiment, plan, backend, options);
  run.plan_wall_s = plan_s;
  return run;
}

std::string write_point(const Experiment& experiment, const PointRun& run) {
  const std::string path = result_path(experiment, run.record.backend);
  // The trace first, the result last: a result on disk marks the point done, and the trace
  // beside it is always this run's (or none: an older run's trace is removed, not kept).
  const std::filesystem::path trace_path =
      std::filesystem::path(path).replace_filename(run.record.backend + ".trace.json");
  if (!run.trace.is_null()) {
    write_file_atomically(trace_path.string(), run.trace.dump() + "\n");
  } else {
    std::error_code ec;
    std::filesystem::remove(trace_path, ec);
    if (ec)
      throw Error("cannot remove the previous run's trace " + trace_path.string() + ": " +
                  ec.message() + "; fix: check the output folder's permissions");
  }
  write_file_atomically(path, result_to_json(run.record));
  return path;
}

}  // namespace muonbed
