// The experiment runner's entry points for one sweep point: plan it, run it on a backend
// ("sim" or "analytic"), and write its results. The CLI's `muonbed run` calls these per point
// and backend.
//
//   PointRun r = run_point(experiment_point, "sim");      // plan + simulate (child process)
//   write_point(experiment_point, r);                     // <output>/<point>/sim.json (+ trace)
//
// Also the seed-claims comparison: given the records of experiments/seed_claims.yaml's sweep
// (sequential, owner without prefetch, owner with prefetch 2 on one 8-GPU node), a table of the
// speedups seed 000 claims beside the ones each backend predicts.
#pragma once

#include <string>
#include <vector>

#include "core/experiment.hpp"
#include "core/results.hpp"
#include "sim/simulate.hpp"

namespace muonbed {

struct PointRun {
  ResultRecord record;     // provenance with the experiment, timestamp set
  nlohmann::json trace;    // sim: Chrome trace of the worst step; null otherwise
  SimulationStats stats;   // sim only (wall time and RSS of the simulation)
  double plan_wall_s = 0;  // time to build the plan
};

// Builds the point's plan and runs it. `backend` is "sim" (fidelity from the experiment's
// sim.fidelity, other settings from `options`) or "analytic". Throws Error for other backends
// (mpi and nccl are executed by the real backends, not here).
PointRun run_point(const Experiment& experiment, const std::string& backend,
                   const SimOptions& options = {});
// Same for an already built plan (sweeps that reuse one plan for several backends).
PointRun run_plan(const Experiment& experiment, const StepPlan& plan, const std::string& backend,
                  const SimOptions& options = {});

// Writes result_path(experiment, backend) and, when there is a trace, the trace next to it as
// <backend>.trace.json (both atomically). Returns the result file's path.
std::string write_point(const Experiment& experiment, const PointRun& run);

}  // namespace muonbed
