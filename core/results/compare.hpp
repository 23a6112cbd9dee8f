// `muonbed compare` as a library: an experiment's measured results (mpi, nccl, cuda_loopback)
// beside its predicted ones (sim, analytic), point by point, and whether the predictions rank the
// strategies as the measurements do. Reads the results with core/results/results.hpp's reader
// (checksums verified) and refuses results made for another configuration (point identity) or
// missing ones, naming the file and the fix.
//
//   error %        (predicted - measured) / measured x 100, step time: the measured record's
//                  median over its timed steps (robust to a stray slow step on a shared machine),
//                  the predicted record's average step
//   phases         mean over ranks of the average step's compute / communication / exposed
//                  communication / idle time (core/engine/timeline.hpp's rules, the same for every
//                  backend)
//   machine        the measured record's speed probe (core/results/calibration.hpp speed_probe):
//                  Newton-Schulz on this machine over the profile's time, before and after the
//                  point; outside 1 +- kSpeedProbeTolerance the errors measure the profile's
//                  machine against this one, not the model, and compare warns with the fix
//   runs           with several results folders of the same experiment, the measured step is
//                  the median over the runs and the table shows their spread
//   training       points with a training step (core/plan/training.hpp): the training section's
//                  step, the same step with AdamW for every parameter, Muon's overhead (step /
//                  AdamW step - 1) and the optimizer's share (exposed optimizer time over the
//                  step), measured beside each prediction; the overhead's error in percentage
//                  points (predicted - measured), beside the point's noise_pct
//   ranking        per group of points that differ only in the strategy (the sweep label without
//                  its strategy.* parts: the same mesh and model sizes): Kendall's tau-b between
//                  measured and predicted step times (1 = same order); each swapped pair
//                  beside the measurement's own noise (runs' spread, or within one run twice
//                  the steps' standard deviation): a swap inside it is "within noise"
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/experiment/experiment.hpp"
#include "core/results/results.hpp"

namespace muonbed {

// Kendall's tau-b of two equally long series: (concordant - discordant) pairs over
// sqrt((pairs - ties in a) (pairs - ties in b)); 1 when fewer than two values or when either
// series is constant throughout (no order to disagree with). Throws Error on different lengths.
double kendall_tau(const std::vector<double>& a, const std::vector<double>& b);
// (predicted - measured) / measured x 100.
double error_percent(double predicted, double measured);

// How far a probe may stray before its measurement no longer checks the model: the validation's
// own error band (+-10 %).
inline constexpr double kSpeedProbeTolerance = 0.10;
// A measured record's probe: measured (the mean of before and after) over predicted; 0 when the
// record has no probe.
double speed_probe_ratio(const ExecutionInfo& execution);
// after / before - 1: how much the machine's speed changed while the point ran; 0 without probe.
double speed_probe_drift(const ExecutionInfo& execution);
// "warning: ..." lines (empty when none or no probe) when the ratio or the drift is outside the
// tolerance: the profile `cluster` does not describe the machine the steps ran on (or it ran
// under other load), with the fix.
std::vector<std::string> speed_probe_warnings(const ExecutionInfo& execution,
                                              const std::string& cluster);

struct PhaseTimes {
  double compute_s = 0;
  double communication_s = 0;
  double exposed_s = 0;
  double idle_s = 0;
};
PhaseTimes mean_phases(const ResultRecord& record);
// The step time compare uses: the median of the timed steps for measured records, else the
// average step.
double compared_step_seconds(const ResultRecord& record);

// A record's training section as compare shows it (absent: present false).
struct ComparedTraining {
  bool present = false;
  double step_s = 0;             // TrainingResult::step_s (the average step)
  double adamw_step_s = 0;       // 0: the AdamW twin did not run
  double muon_overhead_pct = 0;  // 100 x (step / AdamW step - 1)
  // A twin measured interleaved with the point's steps: the standard deviation of the per-pair
  // overheads, in percentage points (TrainingResult::overhead_spread; 0: not paired).
  double overhead_pair_spread_pp = 0;
  double optimizer_share_pct = 0;  // 100 x exposed_optimizer_s / step_s
  // Predicted backends: predicted - measured overhead, in percentage points.
  double overhead_error_pp = 0;
};

struct ComparedBackend {
  std::string backend;
  std::string path;
  double step_s = 0;
  double error_pct = 0;  // predicted backends: against the measured one
  PhaseTimes phases;
  ComparedTraining training;
};

struct ComparedPoint {
  std::string point;  // sweep label ("default" without a sweep)
  std::string group;  // the label without strategy.* parts: a group differs only in the strategy
  std::string strategy;
  std::string mesh;
  std::string model;
  int ranks = 0;
  bool oversubscribed = false;  // the measured run shared cores: functional timings only
  // The measured backend ran the point's ranks (more than one) on ONE device (cuda_loopback,
  // BackendFacts::ranks_share_one_device): the sum of their work, not the N-device step the
  // predictions are for. Shown, marked, and kept out of the checked scope like oversubscribed.
  bool one_device = false;
  bool not_a_check() const { return oversubscribed || one_device; }
  // The measured record's speed probe: ratio to the profile and drift during the point (0: no
  // probe), and speed_probe_warnings' lines.
  double probe_ratio = 0;
  double probe_drift = 0;
  std::vector<std::string> probe_warnings;
  // Several runs of the experiment combined (compare_experiment with more than one results
  // folder): each run's measured step in folder order, and their spread, (max - min) / min x 100.
  // measured.step_s is then the median over runs; phases, trace and probe are the median run's.
  std::vector<double> runs_s;
  double spread_pct = 0;
  // A training point over several runs: each run's measured Muon overhead (in folder order, in
  // %), whose median is then measured.training.muon_overhead_pct (each run's overhead is its own
  // ratio, paired where the backend interleaves the twin; the median run's overhead would mix
  // one run's step with another's noise), and their spread, max - min in percentage points.
  std::vector<double> runs_overhead_pct;
  double overhead_spread_pp = 0;
  // How far apart two measurements of this point may land by chance, in %: the runs' spread
  // when runs are combined, else twice the timed steps' standard deviation over their median
  // (within one run: it misses drift between runs, so it is a lower bound).
  double noise_pct = 0;
  ComparedBackend measured;
  std::vector<ComparedBackend> predicted;
  std::string measured_trace;  // <backend>.trace.json beside the results, "" when absent
  std::map<std::string, std::string> predicted_traces;
};

// Two strategies the prediction orders the other way round: how far apart the measurement puts
// them and how far the prediction puts them in the opposite order, in % of the faster one's time
// (a swap of points a fraction of a percent apart is within any machine's run-to-run noise).
struct SwappedPair {
  std::string measured_faster, measured_slower;
  double measured_gap_pct = 0;   // (slower - faster) / faster, measured
  double predicted_gap_pct = 0;  // (faster - slower) / slower, predicted: > 0, the other way
  // The larger noise_pct of the two points, and whether the measured gap is inside it: then the
  // measurement itself cannot order the pair, and the swap is no evidence against the model.
  double noise_pct = 0;
  bool within_noise = false;
};

struct RankingResult {
  std::string group;
  std::string predicted_backend;
  std::vector<std::string> strategies;  // in measured order, fastest first
  std::vector<double> measured_s, predicted_s;
  double tau = 1;
  bool preserved = true;               // the predicted order equals the measured one (tau == 1)
  std::vector<SwappedPair> swapped;    // every discordant pair, in measured order
  bool preserved_within_noise = true;  // every swapped pair is within_noise
  bool oversubscribed = false;         // some member's measured run shared cores
  bool one_device = false;             // some member ran its ranks on one device (not a check)
};

struct ErrorSummary {
  std::string predicted_backend;
  // "all points", "not oversubscribed" (also without points measured on one device, and then
  // named "not oversubscribed, not one device"), or "steady machine": of those, the speed probe
  // within tolerance before and after (present when some point has a probe)
  std::string scope;
  int points = 0;
  double median_abs_pct = 0;
  double max_abs_pct = 0;
  double mean_signed_pct = 0;
};

struct CompareReport {
  std::string experiment;
  std::string file;
  std::string output_dir;
  std::vector<ComparedPoint> points;
  std::vector<RankingResult> rankings;
  std::vector<ErrorSummary> summaries;
  std::vector<std::string> skipped;   // points without a measured backend, with the reason
  std::vector<std::string> run_dirs;  // the results folders combined (output_dir first)
  std::vector<std::string> notes;     // e.g. a results folder that is a copy of another
};

// A point's records by backend, for compare_points (tests build these by hand).
struct PointRecords {
  std::string point;
  std::map<std::string, ResultRecord> records;  // backend -> record
  std::map<std::string, std::string> paths;     // backend -> results file ("" in tests)
  std::map<std::string, std::string> traces;    // backend -> trace file when present
  // Measured records of the same point from other runs of the experiment (same measured
  // backend), with their files and traces ("" when absent): see ComparedPoint::runs_s.
  std::vector<ResultRecord> more_runs;
  std::vector<std::string> more_run_paths;
  std::vector<std::string> more_run_traces;
};

// The comparison of points whose records are already read. Every point needs one measured record
// (mpi, else nccl) and at least one predicted one (sim, analytic); throws Error otherwise.
CompareReport compare_points(const std::vector<PointRecords>& points);

// Reads every point's results of `experiment_file` (output folder `output_dir`, "" = the file's)
// and compares them. Throws Error naming the file and the fix when a result is missing, fails its
// checksum, or was made for another configuration of the point, and when no point has a measured
// backend.
CompareReport compare_experiment(const std::string& experiment_file,
                                 const std::string& output_dir = "");
// The same over several runs of the experiment, one results folder each (the first holds the
// predicted results and receives compare.json): every point's measured step is the median over
// the runs, with their spread (a machine's run-to-run noise, beside the model's error). Every
// folder needs every point's measured result; predicted ones are read from the first only
// (they are deterministic).
CompareReport compare_experiment(const std::string& experiment_file,
                                 const std::vector<std::string>& output_dirs);

// The report as JSON (what analysis/compare.py plots) and as text tables.
nlohmann::ordered_json compare_json(const CompareReport& report);
std::string compare_table(const CompareReport& report);

}  // namespace muonbed
