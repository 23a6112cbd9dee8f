// The "sim" backend of core/results/run_point.hpp's registry: SimOptions from the experiment and
// the run settings, simulate(), and the record's provenance with SimGrid's version.
#include "core/results/run_point.hpp"
#include "sim/simulate.hpp"

namespace muonbed {

namespace {

PointRun run_sim(const Experiment& experiment, const StepPlan& plan, const RunSettings& settings) {
  SimOptions options;
  options.fidelity = experiment.sim_fidelity;
  options.trace_max_ranks = settings.trace_max_ranks;
  options.progress_label = settings.progress_label;
  SimulationResult result = simulate(plan, experiment.cluster, options);
  PointRun run;
  run.record = std::move(result.record);
  run.record.provenance = make_provenance(&experiment, simgrid_version());
  run.record.notes.push_back(kDeterministicNote);
  run.trace = std::move(result.trace);
  run.cost.what = "simulation";
  run.cost.wall_s = result.stats.wall_s;
  run.cost.peak_rss_bytes = result.stats.peak_rss_bytes;
  run.cost.messages = result.stats.simgrid_transfers;
  run.cost.messages_what = "SimGrid transfers";
  return run;
}

}  // namespace

void register_sim_backend() {
  // No simgrid_version() here: it would load the SimGrid module in every command.
  register_backend({*backend_facts("sim"), &run_sim});
}

}  // namespace muonbed
