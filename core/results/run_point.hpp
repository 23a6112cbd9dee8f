// Running one experiment point on a backend, whatever the backend: build the point's plan, run it
// on the backend the name picks, and write its results. A registry maps backend names to run
// functions: core registers `analytic`; every other backend is one folder that registers itself
// (its facts, run function and availability check) from one registration file, an object that
// programs running experiments link whole (a static library would drop it): sim/ (`sim`),
// backends/mpi (`mpi`), backends/gpu (`nccl`). The CLI links every registration its build has
// (experiments/CMakeLists.txt, from the backends' MUONBED_BACKEND_REGISTRATIONS list). Tests
// call a backend library's register function (register_sim_backend, ...) instead.
//
//   PointRun r = run_point(experiment_point, "analytic");  // plan + run
//   write_point(experiment_point, r);                      // <output>/<point>/analytic.json
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/experiment/backends.hpp"
#include "core/experiment/experiment.hpp"
#include "core/plan/plan.hpp"
#include "core/results/results.hpp"

namespace muonbed {

// The note deterministic backends (analytic, sim) add to their records: the experiment's steps,
// repeats and seed are for measured backends.
extern const char* const kDeterministicNote;
// The start of the note a simulated record carries when its experiment left the fidelity to
// `auto`: which fidelity the rule picked and why (sim/src/fidelity.hpp); `muonbed run` prints it.
inline constexpr const char* kAutoFidelityNote = "sim.fidelity auto picked ";

// Settings of a run that are not part of the experiment.
struct RunSettings {
  int trace_max_ranks = 64;  // ranks (lowest first) in the Chrome trace of backends that trace
  // Real backends (mpi, nccl): untimed steps first, then timed steps whose instance times the
  // record reports (nccl-tests' -w and -n; `muonbed bench collective` passes its flags here).
  // Predicting backends (analytic, sim) are deterministic and ignore both.
  int warmup = 0;
  int iterations = 1;
  // Real backends: after the timed steps, one untimed step whose messages carry a known pattern,
  // checked by every receiver (nccl-tests' -c; PointRun::wrong_elements). `muonbed bench
  // collective` and `muonbed calibrate` set it; experiment points do not (the step's data are
  // checked by the equivalence tests instead).
  bool check_data = false;
  // Real backends: time the machine-speed probe even when the plan runs no Newton-Schulz (with a
  // shape of the profile's ns_table: core/results/calibration.hpp speed_probe). `muonbed bench
  // collective` sets it for its first and last sizes.
  bool speed_probe_from_profile = false;
  // Not empty: a backend whose run takes long (the simulator) shows a progress line named so on
  // stderr while it runs (core/base/progress.hpp).
  std::string progress_label;
  // A training point's AdamW twin (run_plan sets it; issue 24's muon_overhead). A backend that
  // can run it in the same job does so and returns its record in PointRun::adamw_twin: mpi
  // interleaves its steps with the point's, sim simulates it beside the point on another core.
  // Every other backend ignores it, and run_plan runs the twin after the point.
  const StepPlan* adamw_twin_plan = nullptr;
};

// What a run cost, for progress lines; not part of the results file (it is not deterministic).
struct RunCost {
  std::string what;           // what wall_s timed ("simulation"); empty: nothing to report
  double wall_s = 0;          // the backend's own run, in the process that ran it
  double peak_rss_bytes = 0;  // of that process
  std::int64_t messages = 0;  // transfers the backend modelled or sent ...
  std::string messages_what;  // ... named so ("SimGrid transfers")
};

struct PointRun {
  ResultRecord record;     // provenance with the experiment, timestamp set
  std::string trace;       // Chrome trace of the worst step, JSON text; empty when none
  RunCost cost;            // filled by backends that measure themselves
  double plan_wall_s = 0;  // time to build the plan (run_point)
  // Elements a real backend found wrong when it checked its results against the reference
  // (nccl-tests' #wrong); -1 when nothing was checked (predicting backends).
  std::int64_t wrong_elements = -1;
  // The AdamW twin's record when the backend measured it with the point (RunSettings::
  // adamw_twin_plan); run_plan takes training.adamw_step_s from it.
  std::optional<ResultRecord> adamw_twin;
};

// A backend's run function: the record (provenance included, timestamp left to run_plan) and,
// if it traces, the trace of `plan`, the plan of `experiment`.
using BackendRun = PointRun (*)(const Experiment& experiment, const StepPlan& plan,
                                const RunSettings& settings);

// Whether a registered backend can run on this machine: "" when it can, else why and the fix
// (nccl: no GPU). Asked before any work starts.
using BackendAvailability = std::string (*)();

struct BackendInfo {
  // Its name as experiments name it (backend: [...]), whether it measures, what a build needs
  // for it: core/experiment/backends.hpp (a shipped backend registers the table's entry).
  BackendFacts facts;
  BackendRun run = nullptr;
  BackendAvailability unavailable = nullptr;  // null: runs wherever it is built
};

// Adds a backend, or replaces the one of the same name (so registering twice is harmless), and
// its facts to known_backends (Error when they contradict the table of shipped backends).
void register_backend(const BackendInfo& backend);
// The registered backend of this name, or null.
const BackendInfo* find_backend(const std::string& name);
// Registered backends' names: analytic first, then in known_backends' order.
std::vector<std::string> registered_backends();
// "" when `backend` is registered and can run here; else why (not built: what the build needs
// and how to get it, core/experiment/backends.hpp; built but unusable: its availability check),
// ending in the fix. `file` names the experiment in the fix's example command ("": a command
// with a --backend option).
std::string backend_unavailable(const std::string& backend, const std::string& file);
// "sim, analytic, mpi (not built), nccl (not built)": the backends experiments may name, and
// which of them this build lacks.
std::string backends_summary();

// Runs an already built plan (sweeps reuse one plan for several backends) on a registered
// backend; throws Error naming the registered ones for any other name.
PointRun run_plan(const Experiment& experiment, const StepPlan& plan, const std::string& backend,
                  const RunSettings& settings = {});
// Builds the point's plan and runs it.
PointRun run_point(const Experiment& experiment, const std::string& backend,
                   const RunSettings& settings = {});

// Writes result_path(experiment, backend) and, when there is a trace, the trace next to it as
// <backend>.trace.json (both atomically; an older trace without a new one is removed). Returns the
// result file's path.
std::string write_point(const Experiment& experiment, const PointRun& run);

}  // namespace muonbed
