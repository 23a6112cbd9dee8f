// The "sim" backend of core/results/run_point.hpp's registry: SimOptions from the experiment and
// the run settings, simulate(), and the record's provenance with SimGrid's version.
#include "core/results/run_point.hpp"
#include "sim/simulate.hpp"

namespace muonbed {

namespace {

ResultRecord record_of(SimulationResult& result, const Experiment& experiment) {
  ResultRecord record = std::move(result.record);
  record.provenance = make_provenance(&experiment, simgrid_version());
  record.notes.push_back(kDeterministicNote);
  return record;
}

PointRun run_sim(const Experiment& experiment, const StepPlan& plan, const RunSettings& settings) {
  SimOptions options;
  options.fidelity = experiment.sim_fidelity;
  options.trace_max_ranks = settings.trace_max_ranks;
  options.progress_label = settings.progress_label;
  // A training point's AdamW twin is an independent simulation of the same cluster: it runs
  // beside the point, on a core of its own where there is one, untraced and without a progress
  // line (the point's line speaks for both).
  std::vector<const StepPlan*> plans{&plan};
  std::vector<SimOptions> each{options};
  if (settings.adamw_twin_plan != nullptr) {
    SimOptions twin = options;
    twin.trace_max_ranks = 0;
    twin.progress_label.clear();
    plans.push_back(settings.adamw_twin_plan);
    each.push_back(twin);
  }
  std::vector<SimulationResult> results = simulate_each(plans, experiment.cluster, each);
  SimulationResult& result = results.front();
  PointRun run;
  run.cost.what = "simulation";
  run.cost.wall_s = result.stats.wall_s;
  run.cost.peak_rss_bytes = result.stats.peak_rss_bytes;
  run.cost.messages = result.stats.simgrid_transfers;
  run.cost.messages_what = "SimGrid transfers";
  run.trace = std::move(result.trace);
  run.record = record_of(result, experiment);
  // The twin's experiment differs from the point's only in its optimizer routing (run_plan).
  if (results.size() > 1) run.adamw_twin = record_of(results.back(), experiment);
  return run;
}

}  // namespace

void register_sim_backend() {
  // No simgrid_version() here: it would load the SimGrid module in every command.
  register_backend({*backend_facts("sim"), &run_sim});
}

}  // namespace muonbed
