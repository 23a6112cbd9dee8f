// Measured beside predicted (core/results/compare.hpp): errors, phase breakdowns, Kendall's tau.
#include "core/results/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>
#include <sstream>

#include "core/base/errors.hpp"
#include "core/experiment/backends.hpp"

namespace muonbed {

namespace {

namespace fs = std::filesystem;

// The measured and the predicting backends (core/experiment/backends.hpp), each alphabetically;
// a measured backend whose ranks share one device comes after the others (a point measured both
// ways is compared on its real ranks).
std::vector<std::string> backends_that(bool measure) {
  std::vector<std::pair<bool, std::string>> names;
  for (const BackendFacts& b : known_backends())
    if (b.measures == measure) names.emplace_back(b.ranks_share_one_device, b.name);
  std::sort(names.begin(), names.end());
  std::vector<std::string> out;
  for (auto& [shared, name] : names) out.push_back(std::move(name));
  return out;
}
const std::vector<std::string> kMeasured = backends_that(true);
const std::vector<std::string> kPredicted = backends_that(false);

// printf into a string (core does not link fmt).
std::string strf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  char buffer[512];
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  return buffer;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The strategy part of a sweep label ("strategy.name=owner,mesh.dp_shard=2" -> "owner").
std::string strategy_label(const std::string& point, const ResultRecord& r) {
  std::string out;
  std::stringstream in(point);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.rfind("strategy.", 0) != 0) continue;
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(9, eq == std::string::npos ? std::string::npos : eq - 9);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    out += (out.empty() ? "" : ",") + (key == "name" ? value : key + "=" + value);
  }
  return out.empty() ? r.setup.strategy : out;
}

// The points a ranking compares differ only in the strategy: the sweep label without its
// strategy.* parts (mesh and model sizes), or the mesh and model without a sweep.
std::string group_label(const std::string& point, const ResultRecord& r) {
  std::string out;
  std::stringstream in(point);
  for (std::string item; std::getline(in, item, ',');)
    if (item.rfind("strategy.", 0) != 0 && item != "default")
      out += (out.empty() ? "" : ",") + item;
  return out.empty() ? "mesh " + r.setup.mesh + ", model " + r.setup.model : out;
}

ComparedBackend compared(const std::string& backend, const ResultRecord& r,
                         const std::string& path) {
  ComparedBackend c;
  c.backend = backend;
  c.path = path;
  c.step_s = compared_step_seconds(r);
  c.phases = mean_phases(r);
  if (const TrainingResult& t = r.training; t.present) {
    c.training.present = true;
    c.training.step_s = t.step_s;
    c.training.adamw_step_s = t.adamw_step_s;
    c.training.muon_overhead_pct = 100 * t.muon_overhead;
    c.training.overhead_pair_spread_pp = 100 * t.overhead_spread;
    c.training.optimizer_share_pct = t.step_s > 0 ? 100 * t.exposed_optimizer_s / t.step_s : 0;
  }
  return c;
}

}  // namespace

double kendall_tau(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size())
    throw Error("kendall_tau: series of " + std::to_string(a.size()) + " and " +
                std::to_string(b.size()) + " values");
  const std::size_t n = a.size();
  if (n < 2) return 1;
  double concordant = 0, discordant = 0, ties_a = 0, ties_b = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j) {
      const double da = a[i] - a[j], db = b[i] - b[j];
      if (da == 0) ties_a += 1;
      if (db == 0) ties_b += 1;
      if (da == 0 || db == 0) continue;
      ((da > 0) == (db > 0) ? concordant : discordant) += 1;
    }
  const double pairs = static_cast<double>(n * (n - 1) / 2);
  const double denom = std::sqrt((pairs - ties_a) * (pairs - ties_b));
  if (!(denom > 0)) return 1;
  return (concordant - discordant) / denom;
}

double error_percent(double predicted, double measured) {
  if (!(measured > 0))
    throw Error("error_percent: measured time " + std::to_string(measured) + " s is not positive");
  return (predicted - measured) / measured * 100;
}

double speed_probe_ratio(const ExecutionInfo& execution) {
  if (!execution.has_speed_probe()) return 0;
  return (execution.probe_before_s + execution.probe_after_s) / 2 / execution.probe_predicted_s;
}

double speed_probe_drift(const ExecutionInfo& execution) {
  if (!execution.has_speed_probe() || !(execution.probe_before_s > 0)) return 0;
  return execution.probe_after_s / execution.probe_before_s - 1;
}

std::vector<std::string> speed_probe_warnings(const ExecutionInfo& execution,
                                              const std::string& cluster) {
  std::vector<std::string> out;
  if (!execution.has_speed_probe()) return out;
  const auto ms = [](double s) { return strf("%.3f ms", s * 1e3); };
  const std::vector<std::int64_t>& v = execution.probe_shape;
  std::string shape;
  for (std::size_t i = (v.size() == 3 && v[0] == 1) ? 1 : 0; i < v.size(); ++i)
    shape += (shape.empty() ? "" : "x") + std::to_string(v[i]);
  const double ratio = speed_probe_ratio(execution);
  if (std::abs(ratio - 1) > kSpeedProbeTolerance)
    out.push_back("warning: this machine ran the speed probe (Newton-Schulz " + shape + ") in " +
                  ms((execution.probe_before_s + execution.probe_after_s) / 2) + ", " +
                  strf("%.2fx", ratio) + " the " + ms(execution.probe_predicted_s) +
                  " of cluster profile '" + cluster +
                  "': the profile describes another machine (or this one under other load), so "
                  "predictions made with it are off by about as much; fix: recalibrate here "
                  "(muonbed calibrate --backend mpi --experiment FILE --ranks N --out "
                  "PROFILE.yaml) and predict with that profile");
  const double drift = speed_probe_drift(execution);
  if (std::abs(drift) > kSpeedProbeTolerance)
    out.push_back(
        "warning: the machine's speed changed while the point ran: the speed probe took " +
        ms(execution.probe_before_s) + " before the steps and " + ms(execution.probe_after_s) +
        " after (" + strf("%+.1f %%)", drift * 100) +
        "; fix: rerun the point (muonbed run FILE --point LABEL --force) on a "
        "quiet machine");
  return out;
}

PhaseTimes mean_phases(const ResultRecord& record) {
  PhaseTimes p;
  if (record.ranks.empty()) return p;
  for (const RankResult& r : record.ranks) {
    p.compute_s += r.average.compute_s;
    p.communication_s += r.average.communication_s;
    p.exposed_s += r.average.exposed_comm_s;
    p.idle_s += r.average.idle_s;
  }
  const double n = static_cast<double>(record.ranks.size());
  p.compute_s /= n;
  p.communication_s /= n;
  p.exposed_s /= n;
  p.idle_s /= n;
  return p;
}

// Twice the timed steps' standard deviation over their median, in % (0 without timed steps).
double within_run_noise_pct(const ResultRecord& record) {
  const StepStatistics& s = record.step.measured;
  return s.timed_steps > 1 && s.median_s > 0 ? 2 * s.stddev_s / s.median_s * 100 : 0;
}

double compared_step_seconds(const ResultRecord& record) {
  return record.step.measured.timed_steps > 0 && record.step.measured.median_s > 0
             ? record.step.measured.median_s
             : record.step.average_s;
}

CompareReport compare_points(const std::vector<PointRecords>& points) {
  CompareReport report;
  for (const PointRecords& p : points) {
    const std::string* measured = nullptr;
    for (const std::string& b : kMeasured)
      if (p.records.count(b)) {
        measured = &b;
        break;
      }
    if (measured == nullptr) {
      report.skipped.push_back(p.point + ": no measured result (mpi, nccl, cuda_loopback)");
      continue;
    }
    const ResultRecord& m = p.records.at(*measured);
    ComparedPoint c;
    c.point = p.point;
    c.strategy = strategy_label(p.point, m);
    c.mesh = m.setup.mesh;
    c.model = m.setup.model;
    c.group = group_label(p.point, m);
    c.ranks = m.setup.world_size;
    const auto path = [&](const std::string& b) {
      const auto it = p.paths.find(b);
      return it == p.paths.end() ? std::string() : it->second;
    };
    // The runs in folder order: this record, then those of the other results folders (none for
    // one run). The median run (the lower middle one for an even count) lends its phases, trace
    // and probe; the step is the median over the runs.
    std::vector<const ResultRecord*> runs = {&m};
    std::vector<std::string> run_paths = {path(*measured)}, run_traces = {""};
    if (const auto t = p.traces.find(*measured); t != p.traces.end()) run_traces[0] = t->second;
    for (std::size_t i = 0; i < p.more_runs.size(); ++i) {
      runs.push_back(&p.more_runs[i]);
      run_paths.push_back(i < p.more_run_paths.size() ? p.more_run_paths[i] : "");
      run_traces.push_back(i < p.more_run_traces.size() ? p.more_run_traces[i] : "");
    }
    std::vector<double> steps;
    for (const ResultRecord* r : runs) steps.push_back(compared_step_seconds(*r));
    std::vector<std::size_t> order(runs.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return steps[a] < steps[b]; });
    const std::size_t mid = order[(order.size() - 1) / 2];
    c.measured = compared(*measured, *runs[mid], run_paths[mid]);
    c.measured.step_s = median_of(steps);
    c.measured_trace = run_traces[mid];
    c.probe_ratio = speed_probe_ratio(runs[mid]->execution);
    c.probe_drift = speed_probe_drift(runs[mid]->execution);
    if (const BackendFacts* facts = backend_facts(*measured))
      c.one_device = facts->ranks_share_one_device && c.ranks > 1;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      c.oversubscribed = c.oversubscribed || runs[i]->execution.oversubscribed;
      for (const std::string& w : speed_probe_warnings(runs[i]->execution, m.setup.cluster))
        c.probe_warnings.push_back(runs.size() > 1 ? "run " + std::to_string(i + 1) + ": " + w : w);
    }
    if (runs.size() > 1) {
      c.runs_s = steps;
      const auto [lo, hi] = std::minmax_element(steps.begin(), steps.end());
      c.spread_pct = *lo > 0 ? (*hi - *lo) / *lo * 100 : 0;
      for (const ResultRecord* r : runs)
        if (r->training.present && r->training.adamw_step_s > 0)
          c.runs_overhead_pct.push_back(100 * r->training.muon_overhead);
      if (c.measured.training.present && !c.runs_overhead_pct.empty()) {
        c.measured.training.muon_overhead_pct = median_of(c.runs_overhead_pct);
        const auto [olo, ohi] =
            std::minmax_element(c.runs_overhead_pct.begin(), c.runs_overhead_pct.end());
        c.overhead_spread_pp = *ohi - *olo;
      }
    }
    c.noise_pct = runs.size() > 1 ? c.spread_pct : within_run_noise_pct(m);
    for (const std::string& b : kPredicted) {
      const auto it = p.records.find(b);
      if (it == p.records.end()) continue;
      ComparedBackend pb = compared(b, it->second, path(b));
      pb.error_pct = error_percent(pb.step_s, c.measured.step_s);
      if (pb.training.present && c.measured.training.present)
        pb.training.overhead_error_pp =
            pb.training.muon_overhead_pct - c.measured.training.muon_overhead_pct;
      c.predicted.push_back(pb);
      if (const auto t = p.traces.find(b); t != p.traces.end()) c.predicted_traces[b] = t->second;
    }
    if (c.predicted.empty())
      throw Error("point '" + p.point + "' has a measured result (" + *measured +
                  ") but no predicted one (analytic, sim) to compare it with; fix: add analytic "
                  "and/or sim to the experiment's backend list and run it again");
    report.points.push_back(std::move(c));
  }
  if (report.points.empty())
    throw Error("nothing to compare: no point has a measured result (mpi, nccl or cuda_loopback)" +
                std::string(points.empty() ? "" : " (" + report.skipped.front() + ")") +
                "; fix: add mpi to the experiment's backend list and run it (muonbed run FILE)");

  // Error summaries per predicted backend.
  // Scopes: every point; those whose ranks had cores of their own; of those, the ones whose
  // speed probe found the machine as the profile describes it, before and after the steps (only
  // when some point has a probe).
  bool any_probe = false, any_one_device = false;
  for (const ComparedPoint& c : report.points) {
    any_probe = any_probe || c.probe_ratio > 0;
    any_one_device = any_one_device || c.one_device;
  }
  enum class Scope { all, not_oversubscribed, steady };
  std::vector<Scope> scopes = {Scope::all, Scope::not_oversubscribed};
  if (any_probe) scopes.push_back(Scope::steady);
  for (const std::string& b : kPredicted)
    for (const Scope scope : scopes) {
      std::vector<double> abs_errors;
      double signed_sum = 0;
      for (const ComparedPoint& c : report.points) {
        if (scope != Scope::all && c.not_a_check()) continue;
        if (scope == Scope::steady && (!(c.probe_ratio > 0) || !c.probe_warnings.empty())) continue;
        for (const ComparedBackend& pb : c.predicted)
          if (pb.backend == b) {
            abs_errors.push_back(std::abs(pb.error_pct));
            signed_sum += pb.error_pct;
          }
      }
      if (abs_errors.empty()) continue;
      ErrorSummary s;
      s.predicted_backend = b;
      s.scope = scope == Scope::all ? "all points"
                : scope == Scope::not_oversubscribed
                    ? (any_one_device ? "not oversubscribed, not one device" : "not oversubscribed")
                    : "steady machine";
      s.points = static_cast<int>(abs_errors.size());
      s.median_abs_pct = median_of(abs_errors);
      s.max_abs_pct = *std::max_element(abs_errors.begin(), abs_errors.end());
      s.mean_signed_pct = signed_sum / static_cast<double>(abs_errors.size());
      report.summaries.push_back(s);
    }

  // Rankings per group and predicted backend.
  std::vector<std::string> groups;
  for (const ComparedPoint& c : report.points)
    if (std::find(groups.begin(), groups.end(), c.group) == groups.end()) groups.push_back(c.group);
  for (const std::string& g : groups)
    for (const std::string& b : kPredicted) {
      std::vector<const ComparedPoint*> members;
      std::vector<double> predicted;
      for (const ComparedPoint& c : report.points) {
        if (c.group != g) continue;
        for (const ComparedBackend& pb : c.predicted)
          if (pb.backend == b) {
            members.push_back(&c);
            predicted.push_back(pb.step_s);
          }
      }
      if (members.size() < 2) continue;
      std::vector<std::size_t> order(members.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
        return members[x]->measured.step_s < members[y]->measured.step_s;
      });
      RankingResult r;
      r.group = g;
      r.predicted_backend = b;
      for (std::size_t i : order) {
        r.strategies.push_back(members[i]->strategy);
        r.measured_s.push_back(members[i]->measured.step_s);
        r.predicted_s.push_back(predicted[i]);
        r.oversubscribed = r.oversubscribed || members[i]->oversubscribed;
        r.one_device = r.one_device || members[i]->one_device;
      }
      r.tau = kendall_tau(r.measured_s, r.predicted_s);
      r.preserved = r.tau >= 1 - 1e-12;
      for (std::size_t i = 0; i < r.strategies.size(); ++i)
        for (std::size_t k = i + 1; k < r.strategies.size(); ++k)
          if (r.measured_s[i] < r.measured_s[k] && r.predicted_s[i] > r.predicted_s[k]) {
            SwappedPair pair{r.strategies[i], r.strategies[k],
                             (r.measured_s[k] - r.measured_s[i]) / r.measured_s[i] * 100,
                             (r.predicted_s[i] - r.predicted_s[k]) / r.predicted_s[k] * 100};
            pair.noise_pct = std::max(members[order[i]]->noise_pct, members[order[k]]->noise_pct);
            pair.within_noise = pair.measured_gap_pct <= pair.noise_pct;
            r.preserved_within_noise = r.preserved_within_noise && pair.within_noise;
            r.swapped.push_back(pair);
          }
      report.rankings.push_back(std::move(r));
    }
  return report;
}

CompareReport compare_experiment(const std::string& experiment_file,
                                 const std::string& output_dir) {
  return compare_experiment(experiment_file, std::vector<std::string>{output_dir});
}

namespace {

// Step times a record may hold: positive, finite, at most a million seconds (11.6 days per
// optimizer step is beyond any plan muonbed makes), and a measured median among its own samples.
constexpr double kMaxStepSeconds = 1e6;

std::string implausible(const ResultRecord& r) {
  const auto bad = [](double v) { return !std::isfinite(v) || v <= 0 || v > kMaxStepSeconds; };
  const auto num = [](double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6g s", v);
    return std::string(text);
  };
  if (bad(r.step.average_s) || bad(r.step.worst_s))
    return "its step time (average " + num(r.step.average_s) + ", worst " + num(r.step.worst_s) +
           ") is outside (0, 1e6 s]";
  if (r.step.worst_s < r.step.average_s * (1 - 1e-9))
    return "its worst step " + num(r.step.worst_s) + " is shorter than its average " +
           num(r.step.average_s);
  const StepStatistics& m = r.step.measured;
  if (m.timed_steps > 0) {
    if (bad(m.median_s) || bad(m.min_s) || bad(m.p95_s) || !std::isfinite(m.stddev_s) ||
        m.stddev_s < 0)
      return "its measured statistics (median " + num(m.median_s) + ", min " + num(m.min_s) +
             ", p95 " + num(m.p95_s) + ") are outside (0, 1e6 s]";
    const double slack = 1e-9 * m.p95_s;
    if (m.min_s > m.median_s + slack || m.median_s > m.p95_s + slack)
      return "its median step " + num(m.median_s) + " lies outside its own samples (min " +
             num(m.min_s) + ", p95 " + num(m.p95_s) + ")";
  }
  return "";
}

// What tells two measured runs apart: their records' timestamps and step times. Two folders
// whose measured records all agree are one run copied, not two runs.
std::string run_signature(const std::vector<const ResultRecord*>& records) {
  std::string out;
  for (const ResultRecord* r : records) {
    char text[96];
    std::snprintf(text, sizeof text, "|%.17g,%.17g", r->step.average_s, r->step.measured.median_s);
    out += r->timestamp + text;
  }
  return out;
}

}  // namespace

CompareReport compare_experiment(const std::string& experiment_file,
                                 const std::vector<std::string>& output_dirs) {
  const std::vector<std::string> dirs =
      output_dirs.empty() ? std::vector<std::string>{""} : output_dirs;
  for (std::size_t i = 0; i < dirs.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) {
      std::error_code ec;
      if (fs::weakly_canonical(dirs[i], ec) == fs::weakly_canonical(dirs[j], ec))
        throw Error("results folder '" + dirs[i] +
                    "' is given twice: one run would count twice in the median; fix: give each "
                    "run's folder once");
    }
  std::vector<Experiment> all = load_experiment(experiment_file);
  std::vector<PointRecords> points;
  std::vector<std::string> missing;
  std::string missing_fix;
  // One results file of a point, checked: present (else listed as missing), readable with its
  // checksum, and made for this configuration of the point.
  const auto read = [&](const Experiment& point, const std::string& label,
                        const std::string& backend,
                        const std::string& dir) -> std::optional<ResultRecord> {
    const std::string path = result_path(point, backend);
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      missing.push_back(path);
      if (missing_fix.empty() || !dir.empty())
        missing_fix = "muonbed run " + experiment_file + (dir.empty() ? "" : " --output " + dir);
      return std::nullopt;
    }
    ResultRecord r;
    try {
      r = read_result_file(path);
    } catch (const std::exception& e) {
      throw Error(path + ": " + e.what() + "; fix: muonbed run " + experiment_file +
                  (dir.empty() ? "" : " --output " + dir) + " --force --point '" + label +
                  "' makes it again");
    }
    const std::string want =
        point_identity(point.name, point.point_label, backend, point.resolved_yaml);
    if (r.backend != backend || r.provenance.point_id != want)
      throw Error(path + " was made for another configuration of point '" + label +
                  "' (its point id " + r.provenance.point_id + ", this experiment's " + want +
                  "): the experiment file, its cluster profile or the results folder changed "
                  "since; fix: muonbed run " +
                  experiment_file + (dir.empty() ? "" : " --output " + dir) +
                  " (it reruns the points whose configuration changed)");
    if (const std::string why = implausible(r); !why.empty())
      throw Error(path + ": " + why + "; the file was edited or is corrupt, and compare does " +
                  "not use it; fix: muonbed run " + experiment_file +
                  (dir.empty() ? "" : " --output " + dir) + " --force --point '" + label +
                  "' makes it again");
    return r;
  };
  const auto trace_of = [](const std::string& path, const std::string& backend) {
    const std::string trace = (fs::path(path).parent_path() / (backend + ".trace.json")).string();
    std::error_code ec;
    return fs::exists(trace, ec) ? trace : std::string();
  };
  for (Experiment point : all) {
    PointRecords pr;
    pr.point = point.point_label.empty() ? "default" : point.point_label;
    if (!dirs.front().empty()) point.output_dir = dirs.front();
    // The file's backends (a missing result is an error), and every other backend whose result
    // is there: `muonbed run FILE --backend nccl` measures a point whose file lists only the
    // predictions, and its result belongs in the comparison.
    std::vector<std::string> backends = point.backends;
    for (const std::vector<std::string>* names : {&kMeasured, &kPredicted})
      for (const std::string& b : *names) {
        std::error_code ec;
        if (std::find(backends.begin(), backends.end(), b) == backends.end() &&
            fs::exists(result_path(point, b), ec))
          backends.push_back(b);
      }
    for (const std::string& backend : backends) {
      std::optional<ResultRecord> r = read(point, pr.point, backend, dirs.front());
      if (!r) continue;
      const std::string path = result_path(point, backend);
      pr.records[backend] = std::move(*r);
      pr.paths[backend] = path;
      if (std::string trace = trace_of(path, backend); !trace.empty()) pr.traces[backend] = trace;
    }
    // The other runs: the measured backend compare_points will use (mpi before nccl).
    const auto measured = std::find_if(kMeasured.begin(), kMeasured.end(),
                                       [&](const auto& b) { return pr.records.count(b) > 0; });
    for (std::size_t d = 1; d < dirs.size() && measured != kMeasured.end(); ++d) {
      point.output_dir = dirs[d];
      std::optional<ResultRecord> r = read(point, pr.point, *measured, dirs[d]);
      if (!r) continue;
      const std::string path = result_path(point, *measured);
      pr.more_runs.push_back(std::move(*r));
      pr.more_run_paths.push_back(path);
      pr.more_run_traces.push_back(trace_of(path, *measured));
    }
    points.push_back(std::move(pr));
  }
  if (!missing.empty()) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 10; ++i) list += "\n  " + missing[i];
    if (missing.size() > 10) list += "\n  ... and " + std::to_string(missing.size() - 10) + " more";
    throw Error(std::to_string(missing.size()) + " result file" +
                (missing.size() == 1 ? " is" : "s are") + " missing for " + experiment_file + ":" +
                list + "\n  fix: " + missing_fix + " (it runs only what is missing)");
  }
  // A folder that is a copy of another (same records) would count one run twice in the median:
  // it is dropped, and the report says so.
  std::vector<std::string> notes;
  std::vector<std::string> used_dirs = {dirs.front()};
  if (dirs.size() > 1 && !points.empty()) {
    std::vector<std::string> signatures;
    std::vector<const ResultRecord*> first;
    for (const PointRecords& p : points)
      for (const std::string& b : kMeasured)
        if (const auto it = p.records.find(b); it != p.records.end()) {
          first.push_back(&it->second);
          break;
        }
    signatures.push_back(run_signature(first));
    std::vector<bool> keep(dirs.size(), true);
    for (std::size_t d = 1; d < dirs.size(); ++d) {
      std::vector<const ResultRecord*> run;
      for (const PointRecords& p : points)
        if (d - 1 < p.more_runs.size()) run.push_back(&p.more_runs[d - 1]);
      const std::string sig = run_signature(run);
      const auto same = static_cast<std::size_t>(
          std::find(signatures.begin(), signatures.end(), sig) - signatures.begin());
      signatures.push_back(sig);
      if (same < d && run.size() == first.size()) {
        keep[d] = false;
        notes.push_back("results folder '" + dirs[d] + "' holds the same measured results as '" +
                        dirs[same] + "' (a copy): counted as one run");
      } else {
        used_dirs.push_back(dirs[d]);
      }
    }
    for (PointRecords& p : points) {
      std::vector<ResultRecord> runs;
      std::vector<std::string> paths, traces;
      for (std::size_t d = 1; d < dirs.size(); ++d)
        if (keep[d] && d - 1 < p.more_runs.size()) {
          runs.push_back(std::move(p.more_runs[d - 1]));
          paths.push_back(p.more_run_paths[d - 1]);
          traces.push_back(p.more_run_traces[d - 1]);
        }
      p.more_runs = std::move(runs);
      p.more_run_paths = std::move(paths);
      p.more_run_traces = std::move(traces);
    }
  }
  CompareReport report = compare_points(points);
  report.notes = std::move(notes);
  report.file = experiment_file;
  report.experiment = all.empty() ? "" : all.front().name;
  report.output_dir =
      all.empty() ? "" : (dirs.front().empty() ? all.front().output_dir : dirs.front());
  for (const std::string& d : used_dirs)
    report.run_dirs.push_back(d.empty() && !all.empty() ? all.front().output_dir : d);
  return report;
}

nlohmann::ordered_json compare_json(const CompareReport& report) {
  using J = nlohmann::ordered_json;
  const auto phases = [](const PhaseTimes& p) {
    return J{{"compute_s", p.compute_s},
             {"communication_s", p.communication_s},
             {"exposed_s", p.exposed_s},
             {"idle_s", p.idle_s}};
  };
  const auto backend = [&](const ComparedBackend& b, bool predicted) {
    J j{{"backend", b.backend}, {"path", b.path}, {"step_s", b.step_s}};
    if (predicted) j["error_pct"] = b.error_pct;
    j["phases"] = phases(b.phases);
    if (const ComparedTraining& t = b.training; t.present) {
      j["training"] = J{{"step_s", t.step_s},
                        {"adamw_step_s", t.adamw_step_s},
                        {"muon_overhead_pct", t.muon_overhead_pct},
                        {"optimizer_share_pct", t.optimizer_share_pct}};
      if (t.overhead_pair_spread_pp > 0)
        j["training"]["overhead_pair_spread_pp"] = t.overhead_pair_spread_pp;
      if (predicted) j["training"]["overhead_error_pp"] = t.overhead_error_pp;
    }
    return j;
  };
  J out;
  out["experiment"] = report.experiment;
  out["file"] = report.file;
  out["output"] = report.output_dir;
  out["runs"] =
      report.run_dirs.empty() ? std::vector<std::string>{report.output_dir} : report.run_dirs;
  out["step_time"] =
      "measured: median of the timed steps; predicted: average step; error_pct = (predicted - "
      "measured) / measured x 100";
  J points = J::array();
  for (const ComparedPoint& c : report.points) {
    J p{{"point", c.point},
        {"group", c.group},
        {"strategy", c.strategy},
        {"mesh", c.mesh},
        {"model", c.model},
        {"ranks", c.ranks},
        {"oversubscribed", c.oversubscribed},
        {"one_device", c.one_device}};
    p["measured"] = backend(c.measured, false);
    if (c.probe_ratio > 0) {
      p["measured"]["speed_probe_ratio"] = c.probe_ratio;
      p["measured"]["speed_probe_drift"] = c.probe_drift;
    }
    p["measured"]["warnings"] = c.probe_warnings;
    p["measured"]["noise_pct"] = c.noise_pct;
    if (!c.runs_s.empty()) {
      p["measured"]["runs_s"] = c.runs_s;
      p["measured"]["spread_pct"] = c.spread_pct;
    }
    if (!c.runs_overhead_pct.empty()) {
      p["measured"]["training"]["runs_muon_overhead_pct"] = c.runs_overhead_pct;
      p["measured"]["training"]["overhead_spread_pp"] = c.overhead_spread_pp;
    }
    p["measured"]["trace"] = c.measured_trace;
    J pred = J::array();
    for (const ComparedBackend& b : c.predicted) {
      J j = backend(b, true);
      const auto t = c.predicted_traces.find(b.backend);
      j["trace"] = t == c.predicted_traces.end() ? "" : t->second;
      pred.push_back(j);
    }
    p["predicted"] = pred;
    points.push_back(p);
  }
  out["points"] = points;
  J summaries = J::array();
  for (const ErrorSummary& s : report.summaries)
    summaries.push_back({{"backend", s.predicted_backend},
                         {"scope", s.scope},
                         {"points", s.points},
                         {"median_abs_error_pct", s.median_abs_pct},
                         {"max_abs_error_pct", s.max_abs_pct},
                         {"mean_error_pct", s.mean_signed_pct}});
  out["summary"] = summaries;
  J rankings = J::array();
  for (const RankingResult& r : report.rankings) {
    nlohmann::json swapped = nlohmann::json::array();
    for (const SwappedPair& p : r.swapped)
      swapped.push_back({{"measured_faster", p.measured_faster},
                         {"measured_slower", p.measured_slower},
                         {"measured_gap_pct", p.measured_gap_pct},
                         {"predicted_gap_pct", p.predicted_gap_pct},
                         {"noise_pct", p.noise_pct},
                         {"within_noise", p.within_noise}});
    rankings.push_back({{"group", r.group},
                        {"backend", r.predicted_backend},
                        {"strategies", r.strategies},
                        {"measured_s", r.measured_s},
                        {"predicted_s", r.predicted_s},
                        {"kendall_tau", r.tau},
                        {"preserved", r.preserved},
                        {"preserved_within_noise", r.preserved_within_noise},
                        {"swapped", swapped},
                        {"oversubscribed", r.oversubscribed},
                        {"one_device", r.one_device}});
  }
  out["rankings"] = rankings;
  out["skipped"] = report.skipped;
  out["notes"] = report.notes;
  return out;
}

namespace {

// Points with a training step: measured beside predicted step, AdamW step, Muon's overhead and
// the optimizer's share, and the overhead's error in percentage points beside the noise.
std::string training_table(const CompareReport& report) {
  const bool any = std::any_of(report.points.begin(), report.points.end(),
                               [](const ComparedPoint& c) { return c.measured.training.present; });
  if (!any) return "";
  const auto ms = [](double s) { return s > 0 ? strf("%.2f", s * 1e3) : std::string("-"); };
  bool any_runs = false;
  for (const ComparedPoint& c : report.points) any_runs = any_runs || !c.runs_overhead_pct.empty();
  std::string out =
      "\ntraining step (step and AdamW step in ms, average step; Muon +: step / AdamW step - 1, "
      "median steps" +
      std::string(any_runs ? "; measured over several runs: the median of the runs' Muon +" : "") +
      "; opt share: exposed optimizer / step; error: predicted - measured Muon +, in percentage "
      "points; noise: the measured step's, as above; Muon +/-: the overhead's noise, " +
      (any_runs ? "max - min of the runs' Muon +, or for one run " : "") +
      "the standard deviation of its per-pair overheads where the AdamW twin ran interleaved "
      "with the step, in pp; -: not measured):\n";
  out += strf("  %-40s %-9s %9s %9s %8s %9s %8s %7s %8s\n", "point", "backend", "step", "AdamW",
              "Muon +", "opt share", "error", "noise", "Muon +/-");
  const auto row = [&](const std::string& point, const ComparedBackend& b, bool predicted,
                       double noise, double overhead_noise) {
    const ComparedTraining& t = b.training;
    const std::string label = point.size() > 40 ? point.substr(0, 37) + "..." : point;
    return strf("  %-40s %-9s %9s %9s %7.1f%% %8.1f%% %8s %7s %8s\n", label.c_str(),
                b.backend.c_str(), ms(t.step_s).c_str(), ms(t.adamw_step_s).c_str(),
                t.muon_overhead_pct, t.optimizer_share_pct,
                predicted ? strf("%+.1f pp", t.overhead_error_pp).c_str() : "",
                predicted ? "" : strf("%.1f%%", noise).c_str(),
                predicted            ? ""
                : overhead_noise > 0 ? strf("%.1f pp", overhead_noise).c_str()
                                     : "-");
  };
  for (const ComparedPoint& c : report.points) {
    if (!c.measured.training.present) continue;
    out += row(c.point, c.measured, false, c.noise_pct,
               c.runs_overhead_pct.empty() ? c.measured.training.overhead_pair_spread_pp
                                           : c.overhead_spread_pp);
    for (const ComparedBackend& b : c.predicted)
      if (b.training.present) out += row("", b, true, 0, 0);
  }
  return out;
}

}  // namespace

std::string compare_table(const CompareReport& report) {
  const auto ms = [](double s) { return strf("%.2f", s * 1e3); };
  std::string out;
  const std::size_t runs = std::max<std::size_t>(1, report.run_dirs.size());
  bool any_runs = false;
  for (const ComparedPoint& c : report.points) any_runs = any_runs || c.runs_s.size() > 1;
  out += report.experiment + ": measured (median step" +
         (any_runs ? ", median over " + std::to_string(runs) + " runs" : std::string()) +
         ") beside predicted (average step), ms\n";
  bool any_probe = false;
  for (const ComparedPoint& c : report.points) any_probe = any_probe || c.probe_ratio > 0;
  out += strf("  %-48s %5s %9s", "point", "ranks", "measured");
  if (any_runs) out += strf(" %7s", "spread");
  if (any_probe) out += strf(" %7s", "machine");
  std::vector<std::string> backends;
  for (const ComparedPoint& c : report.points)
    for (const ComparedBackend& b : c.predicted)
      if (std::find(backends.begin(), backends.end(), b.backend) == backends.end())
        backends.push_back(b.backend);
  for (const std::string& b : backends) out += strf(" %9s %7s", b.c_str(), "error");
  out += "   phases measured | " + (backends.empty() ? std::string() : backends.front()) +
         ": compute/comm/exposed/idle\n";
  for (const ComparedPoint& c : report.points) {
    const std::string label = c.point.size() > 48 ? c.point.substr(0, 45) + "..." : c.point;
    out += strf("  %-48s %4d%s %9s", label.c_str(), c.ranks,
                c.oversubscribed ? "*"
                : c.one_device   ? "+"
                                 : " ",
                ms(c.measured.step_s).c_str());
    if (any_runs) out += c.runs_s.size() > 1 ? strf(" %6.1f%%", c.spread_pct) : strf(" %7s", "-");
    if (any_probe)
      out += c.probe_ratio > 0
                 ? strf(" %6.2fx%s", c.probe_ratio, c.probe_warnings.empty() ? " " : "!")
                 : strf(" %7s", "-");
    for (const std::string& b : backends) {
      const auto it = std::find_if(c.predicted.begin(), c.predicted.end(),
                                   [&](const ComparedBackend& x) { return x.backend == b; });
      if (it == c.predicted.end())
        out += strf(" %9s %7s", "-", "-");
      else
        out += strf(" %9s %+6.1f%%", ms(it->step_s).c_str(), it->error_pct);
    }
    const PhaseTimes& m = c.measured.phases;
    out += "   " + ms(m.compute_s) + "/" + ms(m.communication_s) + "/" + ms(m.exposed_s) + "/" +
           ms(m.idle_s);
    if (!c.predicted.empty()) {
      const PhaseTimes& p = c.predicted.front().phases;
      out += " | " + ms(p.compute_s) + "/" + ms(p.communication_s) + "/" + ms(p.exposed_s) + "/" +
             ms(p.idle_s);
    }
    out += "\n";
  }
  bool any_over = false;
  for (const ComparedPoint& c : report.points) any_over = any_over || c.oversubscribed;
  if (any_over)
    out += "  * oversubscribed (more ranks than cores): functional timings only, not a check\n";
  for (const ComparedPoint& c : report.points)
    if (c.one_device) {
      out += "  + every rank on ONE device (" + c.measured.backend +
             "): the sum of the ranks' work, its messages device copies, not the N-device step "
             "the predictions are for; shown, not a check\n";
      break;
    }
  if (any_runs) {
    std::vector<double> spreads;
    for (const ComparedPoint& c : report.points)
      if (c.runs_s.size() > 1 && !c.oversubscribed) spreads.push_back(c.spread_pct);
    if (!spreads.empty())
      out += strf(
          "  spread: (slowest - fastest run) / fastest, the machine's run-to-run noise: median "
          "%.1f %%, max %.1f %% over %zu points not oversubscribed\n",
          median_of(spreads), *std::max_element(spreads.begin(), spreads.end()), spreads.size());
  }
  if (any_probe) {
    // One verdict on whether the profile describes the machine the steps ran on: without it the
    // errors below may measure two machines against each other, not the model.
    double lo = 0, hi = 0;
    int probed = 0, off = 0;
    for (const ComparedPoint& c : report.points) {
      off += c.probe_warnings.empty() ? 0 : 1;  // of any run, when runs are combined
      if (!(c.probe_ratio > 0)) continue;
      lo = probed == 0 ? c.probe_ratio : std::min(lo, c.probe_ratio);
      hi = probed == 0 ? c.probe_ratio : std::max(hi, c.probe_ratio);
      ++probed;
    }
    out += strf(
        "  machine: speed probe, this machine's Newton-Schulz time over the profile's "
        "(before and after each point): %.2fx to %.2fx over %d point%s\n",
        lo, hi, probed, probed == 1 ? "" : "s");
    if (off > 0) {
      out += strf("  ! %d point%s outside 1 +- %.0f %%:\n", off, off == 1 ? "" : "s",
                  kSpeedProbeTolerance * 100);
      // A profile from another machine puts every point off: its warning is shown for the first
      // point only. Drift during a point is that point's own and is shown for each.
      bool machine_shown = false;
      for (const ComparedPoint& c : report.points)
        for (const std::string& w : c.probe_warnings) {
          const bool machine = w.find("warning: this machine") != std::string::npos;
          if (machine && machine_shown) continue;
          machine_shown = machine_shown || machine;
          out += "    " + c.point + ": " + w + "\n";
        }
    }
  }
  out += training_table(report);
  out += "\nerror |predicted - measured| / measured:\n";
  for (const ErrorSummary& s : report.summaries)
    out += strf("  %-9s %-19s %3d points: median %.1f %%, max %.1f %%, mean signed %+.1f %%\n",
                s.predicted_backend.c_str(), s.scope.c_str(), s.points, s.median_abs_pct,
                s.max_abs_pct, s.mean_signed_pct);
  if (!report.rankings.empty()) {
    out += "\nranking of strategies (Kendall tau, measured vs predicted; fastest first):\n";
    for (const RankingResult& r : report.rankings) {
      std::string order;
      for (const std::string& s : r.strategies) order += (order.empty() ? "" : " < ") + s;
      const std::string group = r.group.size() > 46 ? r.group.substr(0, 43) + "..." : r.group;
      out += strf("  %-9s %-46s tau %+.2f %s%s  measured: ", r.predicted_backend.c_str(),
                  group.c_str(), r.tau,
                  r.preserved                ? "preserved"
                  : r.preserved_within_noise ? "DIFFERS within noise"
                                             : "DIFFERS",
                  r.oversubscribed ? " *"
                  : r.one_device   ? " +"
                                   : "") +
             order + "\n";
      for (const SwappedPair& p : r.swapped)
        out += strf(
            "  %-9s %-46s   swapped: %s < %s measured %.1f %% apart, predicted %.1f %% the "
            "other way; noise %.1f %%%s\n",
            "", "", p.measured_faster.c_str(), p.measured_slower.c_str(), p.measured_gap_pct,
            p.predicted_gap_pct, p.noise_pct,
            p.within_noise ? ": within it, the measurement cannot order them" : "");
    }
  }
  for (const std::string& s : report.skipped) out += "  skipped: " + s + "\n";
  for (const std::string& n : report.notes) out += "  note: " + n + "\n";
  return out;
}

}  // namespace muonbed
