// The backend registry and the point runner (see core/results/run_point.hpp); the analytic
// backend's run function lives here, as core's own backend.
#include "core/results/run_point.hpp"

#include <chrono>
#include <filesystem>
#include <optional>

#include "core/base/errors.hpp"
#include "core/config/src/yaml_util.hpp"
#include "core/experiment/backends.hpp"
#include "core/plan/training.hpp"

namespace muonbed {

const char* const kDeterministicNote =
    "steps, repeats and seed (warm-up steps, timed steps and data of the measured backends) do "
    "not apply: a deterministic model computes each step pattern of the hyper-period once";

namespace {

PointRun run_analytic(const Experiment& experiment, const StepPlan& plan, const RunSettings&) {
  PointRun run;
  run.record = analytic_record(plan, experiment.cluster);
  run.record.provenance = make_provenance(&experiment, "");
  run.record.notes.push_back(kDeterministicNote);
  return run;
}

std::vector<BackendInfo>& registry() {
  static std::vector<BackendInfo> backends = {{*backend_facts("analytic"), &run_analytic}};
  return backends;
}

}  // namespace

void register_backend(const BackendInfo& backend) {
  if (backend.facts.name.empty() || backend.run == nullptr)
    throw Error("register_backend: a backend needs a name and a run function");
  add_backend_facts(backend.facts);
  for (BackendInfo& b : registry())
    if (b.facts.name == backend.facts.name) {
      b = backend;
      return;
    }
  registry().push_back(backend);
}

const BackendInfo* find_backend(const std::string& name) {
  for (const BackendInfo& b : registry())
    if (b.facts.name == name) return &b;
  return nullptr;
}

std::vector<std::string> registered_backends() {
  // Registrations run as static initializers, in an order the linker picks: list them in
  // known_backends' order instead, analytic (core's own) first.
  std::vector<std::string> names = {"analytic"};
  for (const BackendFacts& known : known_backends())
    if (known.name != "analytic" && find_backend(known.name) != nullptr)
      names.push_back(known.name);
  return names;
}

std::string backend_unavailable(const std::string& backend, const std::string& file) {
  const std::string predict = file.empty()
                                  ? "or use --backend sim or --backend analytic"
                                  : "or run the simulator and the analytic model: muonbed run " +
                                        file + " --backend sim --backend analytic";
  if (const BackendInfo* b = find_backend(backend)) {
    if (b->unavailable == nullptr) return "";
    const std::string why = b->unavailable();
    return why.empty() ? "" : why + "; " + predict;
  }
  const BackendFacts* facts = backend_facts(backend);
  if (facts == nullptr)
    return "no backend is named '" + backend + "' (this build runs " +
           yaml_util::join(registered_backends()) +
           "); fix: use one of: " + yaml_util::join(registered_backends());
  return "backend '" + backend + "' is not built into this muonbed: it was built without " +
         facts->needs + "; fix: " + facts->install + ", " + predict;
}

std::string backends_summary() {
  std::string out;
  for (const std::string& name : known_backend_names())
    out += (out.empty() ? "" : ", ") + name + (find_backend(name) ? "" : " (not built)");
  return out;
}

PointRun run_plan(const Experiment& experiment, const StepPlan& plan, const std::string& backend,
                  const RunSettings& settings) {
  const BackendInfo* b = find_backend(backend);
  if (b == nullptr)
    throw Error("run_plan: backend '" + backend + "' is not built into this muonbed (it has " +
                yaml_util::join(registered_backends()) +
                "); fix: use one of those, or register the backend before running it");
  // A training step is compared with the same step under AdamW for every parameter (issue 24):
  // the twin plan runs on the same backend (measured with the point when the backend pairs them,
  // else after it), and the record carries its step and the overhead.
  const bool has_twin = has_training_ops(plan) && experiment.training.enabled &&
                        !experiment.parallel.routing.everything_to_adamw;
  Experiment twin = experiment;
  std::optional<StepPlan> twin_plan;
  if (has_twin) {
    twin.parallel.routing.everything_to_adamw = true;
    twin.sharded = nullptr;  // routing changes the sharded model's optimizers
    twin_plan = plan_experiment(twin);
  }
  RunSettings with_twin = settings;
  with_twin.adamw_twin_plan = twin_plan ? &*twin_plan : nullptr;
  PointRun run = b->run(experiment, plan, with_twin);
  if (has_twin && run.record.training.present) {
    if (!run.adamw_twin) {
      RunSettings quiet = settings;
      quiet.trace_max_ranks = 0;
      run.adamw_twin = b->run(twin, *twin_plan, quiet).record;
    }
    TrainingResult& t = run.record.training;
    t.adamw_step_s = run.adamw_twin->comparable_step_s();
    t.muon_overhead = t.adamw_step_s > 0 ? run.record.comparable_step_s() / t.adamw_step_s - 1 : 0;
  }
  run.record.timestamp = utc_timestamp();
  return run;
}

PointRun run_point(const Experiment& experiment, const std::string& backend,
                   const RunSettings& settings) {
  const auto t0 = std::chrono::steady_clock::now();
  const StepPlan plan = plan_experiment(experiment);
  const double plan_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PointRun run = run_plan(experiment, plan, backend, settings);
  run.plan_wall_s = plan_s;
  return run;
}

std::string write_point(const Experiment& experiment, const PointRun& run) {
  const std::string path = result_path(experiment, run.record.backend);
  // The trace first, the result last: a result on disk marks the point done, and the trace
  // beside it is always this run's (or none: an older run's trace is removed, not kept).
  const std::filesystem::path trace_path =
      std::filesystem::path(path).replace_filename(run.record.backend + ".trace.json");
  if (!run.trace.empty()) {
    // chrome_trace's text ends with its newline already; a trace from elsewhere gets one
    if (run.trace.back() == '\n')
      write_file_atomically(trace_path.string(), run.trace);
    else
      write_file_atomically(trace_path.string(), run.trace + "\n");
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
