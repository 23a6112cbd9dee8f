// `muonbed run EXP.yaml`: the main job. Runs every sweep point of an experiment on its backends
// (the simulator by default), writes each point's result file as soon as it completes
// (atomically: a killed sweep never leaves a half-written file), resumes a sweep by skipping the
// points whose results already exist for the same resolved configuration, prints one summary line
// per point plus seed 000's claims table when the sweep holds its configurations, and finally
// draws the plots with analysis/plot.py when matplotlib is available.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "core/base/errors.hpp"
#include "core/base/process.hpp"
#include "core/experiment/backends.hpp"
#include "core/experiment/experiment.hpp"
#include "core/results/results.hpp"
#include "core/results/run_point.hpp"
#include "experiments/cli/backends.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/format.hpp"
#include "muonbed/config.hpp"

#if MUONBED_HAVE_MPI
#include "backends/mpi/mpi_backend.hpp"
#endif

namespace muonbed::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct RunOptions {
  std::string file;
  std::vector<std::string> backends;
  std::vector<std::string> points;
  std::string output;
  std::string fidelity;
  std::string shard;  // --shard I/N
  int trace_ranks = 64;
  bool force = false;
  bool force_replace = false;
  bool no_plots = false;
  std::string timelines = "first";  // analysis/plot.py --timelines: none | first | all
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Applies --fidelity to a point and to its resolved configuration (which the result file records
// as provenance and resume compares). --output is applied as the file is parsed
// (ExperimentOverrides): re-reading and re-writing every point's configuration for it took 0.2 s
// of each `muonbed run --point` of a 54-point file.
void apply_overrides(Experiment& point, const RunOptions& o) {
  if (o.fidelity.empty()) return;
  YAML::Node root = YAML::Load(point.resolved_yaml);
  point.sim_fidelity = o.fidelity;
  root["sim"]["fidelity"] = o.fidelity;
  YAML::Emitter out;
  out << root;
  point.resolved_yaml = std::string(out.c_str()) + "\n";
}

// Whether `record` is a finished result for this point and backend with the same configuration,
// made by this muonbed (same version and git commit: another build may simulate differently).
// `other_build` is set when it was passed over for that reason alone.
bool is_completed(const ResultRecord& record, const Experiment& point, const std::string& backend,
                  const Provenance& build, bool& other_build) {
  other_build = false;
  if (record.schema_version != kResultsSchemaVersion || record.backend != backend) return false;
  if (record.provenance.point_id !=
      point_identity(point.name, point.point_label, backend, point.resolved_yaml))
    return false;
  if (record.provenance.muonbed_version != build.muonbed_version ||
      record.provenance.git_hash != build.git_hash) {
    other_build = true;
    return false;
  }
  return true;
}

// A finished result for this point and backend, if one exists (is_completed).
std::optional<ResultRecord> completed_result(const Experiment& point, const std::string& backend,
                                             const Provenance& build, bool& other_build) {
  other_build = false;
  const std::string path = result_path(point, backend);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    ResultRecord record = read_result_file(path);
    if (!is_completed(record, point, backend, build, other_build)) return std::nullopt;
    return record;
  } catch (const std::exception&) {
    return std::nullopt;  // unreadable or from another version: run the point again
  }
}

// completed_result for the manifests, which read every result of the sweep twice per manifest
// written (before and after a run): each file is parsed once while it stays the same file (same
// device, inode, size and times: a result is replaced by a rename, never rewritten in place), or
// not at all when this process wrote it, and kept without its per-rank and per-collective lists,
// which a manifest does not read (a 1,024-GPU point's result is ~3 MB; parsing it took 0.14 s,
// twice after every run). Records round-trip through their JSON exactly (tests/core).
class ListedResults {
 public:
  std::optional<ResultRecord> get(const Experiment& point, const std::string& backend,
                                  const Provenance& build) {
    const std::string path = result_path(point, backend);
    const std::optional<Stamp> stamp = stamp_of(path);
    if (!stamp) {
      parsed_.erase(path);
      return std::nullopt;
    }
    Parsed& known = parsed_[path];
    if (known.stamp != *stamp) {  // (a new entry's stamp is all zeros: no file's)
      known.stamp = *stamp;
      try {
        known.record = trimmed(read_result_file(path));
      } catch (const std::exception&) {
        known.record.reset();  // unreadable: not listed
      }
    }
    bool other_build = false;
    if (!known.record || !is_completed(*known.record, point, backend, build, other_build))
      return std::nullopt;
    return known.record;
  }

  // The record this process just wrote to `path` (write_point), as read back: with the point id
  // the writer fills in.
  void wrote(const std::string& path, const ResultRecord& record) {
    const std::optional<Stamp> stamp = stamp_of(path);
    if (!stamp) return;
    ResultRecord written = trimmed(record);
    const Provenance& p = written.provenance;
    written.provenance.point_id =
        point_identity(p.experiment, p.point, written.backend, p.resolved_config);
    parsed_[path] = {*stamp, std::move(written)};
  }

 private:
  using Stamp = std::array<std::int64_t, 7>;
  struct Parsed {
    Stamp stamp{};
    std::optional<ResultRecord> record;  // nullopt: unreadable
  };
  static std::optional<Stamp> stamp_of(const std::string& path) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) return std::nullopt;
    return Stamp{static_cast<std::int64_t>(info.st_dev),
                 static_cast<std::int64_t>(info.st_ino),
                 static_cast<std::int64_t>(info.st_size),
                 static_cast<std::int64_t>(info.st_mtim.tv_sec),
                 static_cast<std::int64_t>(info.st_mtim.tv_nsec),
                 static_cast<std::int64_t>(info.st_ctim.tv_sec),
                 static_cast<std::int64_t>(info.st_ctim.tv_nsec)};
  }
  static ResultRecord trimmed(ResultRecord record) {
    record.ranks = {};
    record.collectives = {};
    return record;
  }
  std::map<std::string, Parsed> parsed_;
};

ListedResults& listed_results() {
  static ListedResults results;
  return results;
}

struct PointOutcome {
  ResultRecord record;
  std::string detail;  // wall times and simulation statistics
  std::string path;
};

PointOutcome run_one(const Experiment& point, const StepPlan& plan, const std::string& backend,
                     const RunOptions& options) {
  PointOutcome outcome;
  const auto start = Clock::now();
  RunSettings settings;
  settings.trace_max_ranks = options.trace_ranks;
  settings.progress_label =
      (point.point_label.empty() ? point.name : point.point_label) + " [" + backend + "]";
  PointRun run = run_plan(point, plan, backend, settings);
  outcome.path = write_point(point, run);
  listed_results().wrote(outcome.path, run.record);
  outcome.detail = fmt::format("{} {}", backend, human_seconds(seconds_since(start)));
  if (!run.cost.what.empty())
    outcome.detail += fmt::format(" ({} {}, peak RSS {:.0f} MB, {} {})", run.cost.what,
                                  human_seconds(run.cost.wall_s), run.cost.peak_rss_bytes / 1e6,
                                  run.cost.messages, run.cost.messages_what);
  outcome.record = std::move(run.record);
  return outcome;
}

// Checks that this build can run every requested backend before any work starts.
void check_backends(const std::vector<Experiment>& points, const RunOptions& o) {
  for (std::size_t i = 0; i < o.backends.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (o.backends[i] == o.backends[j])
        throw Error("--backend " + o.backends[i] +
                    " is given twice (each backend runs a point once); fix: give each backend "
                    "once");
  for (std::size_t i = 0; i < o.points.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (o.points[i] == o.points[j])
        throw Error("--point '" + o.points[i] + "' is given twice; fix: give each point once");
  for (const Experiment& point : points)
    for (const std::string& backend : point.backends) require_backend(backend, o.file);
}

// Every folder the run writes must be usable before any work starts: each output folder (the
// manifest goes there for every point of the file) writable, and no point's results folder a
// file. Otherwise a sweep would fail point after point, or end without a manifest.
// A results folder belongs to one experiment: its manifest (muonbed-run.json) names the
// experiment and file whose results it holds. Running another experiment there, or another file
// of the same name whose points would replace results of the same labels, is refused unless
// --force-replace says to replace them.
void check_folder_owner(const std::string& folder, const std::vector<Experiment>& points,
                        bool force_replace) {
  const fs::path manifest_path = fs::path(folder) / "muonbed-run.json";
  std::error_code ec;
  if (force_replace || !fs::is_regular_file(manifest_path, ec)) return;
  nlohmann::json manifest;
  try {
    std::ifstream in(manifest_path);
    manifest = nlohmann::json::parse(in);
  } catch (const std::exception&) {
    return;  // unreadable: write_manifests replaces it with this run's
  }
  const Experiment& first = points.front();
  const std::string name = manifest.value("experiment", std::string());
  const std::string file = manifest.value("experiment_file", std::string());
  const std::string fix =
      "; fix: give this run its own folder (--output DIR), or add --force-replace to replace "
      "them";
  if (!name.empty() && name != first.name)
    throw Error("the results folder '" + folder + "' holds the results of experiment '" + name +
                "'" + (file.empty() ? "" : " (" + file + ")") + ", not of '" + first.name +
                "': running it there would overwrite that experiment's manifest and any result "
                "of a point label both share" +
                fix);
  if (file.empty() || fs::weakly_canonical(file, ec) == fs::weakly_canonical(first.file, ec))
    return;
  // Same name, another file: refused when one of its results has a label of ours but was made
  // for another configuration (it would be replaced by this run's).
  if (!manifest.contains("results") || !manifest["results"].is_array()) return;
  for (const auto& entry : manifest["results"]) {
    const std::string label = entry.value("point", std::string());
    const std::string backend = entry.value("backend", std::string());
    const std::string id = entry.value("point_id", std::string());
    for (const Experiment& point : points)
      if (point.point_label == label &&
          std::find(point.backends.begin(), point.backends.end(), backend) !=
              point.backends.end() &&
          point_identity(point.name, point.point_label, backend, point.resolved_yaml) != id)
        throw Error("the results folder '" + folder +
                    "' holds results of another file of "
                    "experiment '" +
                    name + "' (" + file + "), whose point '" +
                    (label.empty() ? std::string("default") : label) + "' [" + backend +
                    "] has another configuration than in " + first.file +
                    ": running it there would replace that result" + fix);
  }
}

void check_output_folders(const std::vector<Experiment>& all,
                          const std::vector<Experiment>& selected, bool force_replace) {
  std::vector<std::string> checked;
  for (const Experiment& point : all)
    if (std::find(checked.begin(), checked.end(), point.output_dir) == checked.end()) {
      if (invalid_utf8_at(point.output_dir) != std::string::npos)
        throw Error("the output folder '" + point.output_dir + "'" +
                    " is not UTF-8 text (muonbed writes paths into its JSON results); fix: "
                    "choose a folder whose name is UTF-8 (--output DIR)");
      check_writable_folder(point.output_dir);
      std::vector<Experiment> in_folder;
      for (const Experiment& p : all)
        if (p.output_dir == point.output_dir) in_folder.push_back(p);
      check_folder_owner(point.output_dir, in_folder, force_replace);
      checked.push_back(point.output_dir);
    }
  for (const Experiment& point : selected) {
    const fs::path folder = fs::path(result_path(point, "x")).parent_path();
    std::error_code ec;
    const fs::file_status status = fs::status(folder, ec);
    if (ec && ec != std::errc::no_such_file_or_directory)
      throw Error("cannot use the results folder '" + folder.string() + "' of point " +
                  (point.point_label.empty() ? point.name : point.point_label) + ": " +
                  ec.message() + "; fix: " + path_error_fix(ec.value(), true));
    if (fs::exists(status) && !fs::is_directory(status))
      throw Error("the results folder '" + folder.string() + "' of point " +
                  (point.point_label.empty() ? point.name : point.point_label) +
                  " is a file; fix: move that file away, or choose another output folder "
                  "(--output DIR)");
  }
}

// Progress on stderr: a bar redrawn in place on a terminal, nothing otherwise (the summary lines
// on stdout already say which point finished).
class Progress {
 public:
  Progress(std::size_t total, bool enabled) : total_(total), enabled_(enabled) {}
  void show(std::size_t done, const std::string& current) {
    if (!enabled_) return;
    const double elapsed = seconds_since(start_);
    const int width = 24;
    const int filled = static_cast<int>(width * done / std::max<std::size_t>(total_, 1));
    std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    std::string eta;
    if (done > 0 && done < total_)
      eta = ", ~" + human_seconds(elapsed / done * (total_ - done)) + " left";
    std::string line = fmt::format("[{}] {}/{} runs, {}{}: {}", bar, done, total_,
                                   human_seconds(elapsed), eta, current);
    if (line.size() > 110) line = line.substr(0, 107) + "...";
    std::cerr << "\r\033[K" << line << std::flush;
  }
  void clear() {
    if (enabled_) std::cerr << "\r\033[K" << std::flush;
  }

 private:
  std::size_t total_;
  bool enabled_;
  Clock::time_point start_ = Clock::now();
};

std::string backend_text(const ResultRecord& r) {
  return backend_label(r.backend, r.fidelity);
}

// The training step of each point that has one (core/plan/training.hpp): the step beside the
// same step with AdamW for every parameter, Muon's overhead, and where the step's time goes.
void print_training_table(const std::vector<const ResultRecord*>& ordered) {
  const bool any = std::any_of(ordered.begin(), ordered.end(),
                               [](const ResultRecord* r) { return r->training.present; });
  if (!any) return;
  Table table({"point", "backend", "step", "AdamW step", "Muon +", "forward", "backward",
               "FSDP gather", "act comm", "grad sync", "optimizer", "exposed opt", "MFU"},
              2);
  for (const ResultRecord* r : ordered) {
    if (!r->training.present) continue;
    const TrainingResult& t = r->training;
    table.add({r->provenance.point.empty() ? r->provenance.experiment : r->provenance.point,
               backend_text(*r), human_seconds(t.step_s),
               t.adamw_step_s > 0 ? human_seconds(t.adamw_step_s) : "-",
               t.adamw_step_s <= 0    ? "-"
               : t.overhead_pairs > 0 ? fmt::format("{:+.1f} % (sd {:.1f} pp)",
                                                    100 * t.muon_overhead, 100 * t.overhead_spread)
                                      : fmt::format("{:+.1f} %", 100 * t.muon_overhead),
               human_seconds(t.forward_s), human_seconds(t.backward_s),
               human_seconds(t.parameter_gather_s), human_seconds(t.activation_comm_s),
               human_seconds(t.gradient_sync_s), human_seconds(t.optimizer_s),
               human_seconds(t.exposed_optimizer_s), fmt::format("{:.1f} %", 100 * t.mfu)});
  }
  std::cout << "\ntraining step per point (core/plan/training.hpp; AdamW step: the same step with "
               "AdamW for every parameter; Muon +: step / AdamW step - 1 of the median steps, and "
               "where the AdamW step ran interleaved with the step (mpi) the standard deviation "
               "of the per-pair overheads; phases: means over "
               "ranks of the time an op of the phase ran, so they overlap; exposed opt: the step "
               "after every rank's last forward, backward, gather and sync; MFU: forward and "
               "backward FLOPs / (step x ranks x peak))\n";
  table.print(std::cout);
}

// Every finished run, in sweep order, with its speedup over the first point of the sweep on the
// same backend and the same number of ranks (the baseline the experiment lists first, e.g. the
// sequential strategy; points at other scales are not compared with it), whatever fidelity
// each point was simulated at.
void print_results_table(const std::vector<ResultRecord>& records,
                         const std::vector<Experiment>& points) {
  std::vector<const ResultRecord*> ordered;
  for (const Experiment& point : points)
    for (const ResultRecord& r : records)
      if (r.provenance.point == point.point_label) ordered.push_back(&r);
  // (backend, ranks) -> the first point's average step
  std::map<std::pair<std::string, int>, double> baseline;
  bool cpu_ranks = false, gpus = false, infeasible = false;
  for (const ResultRecord* r : ordered) {
    baseline.try_emplace({r->backend, r->setup.world_size}, r->step.average_s);
    (r->setup.rank_kind == "cpu" ? cpu_ranks : gpus) = true;
    infeasible = infeasible || (r->memory.present && !r->memory.feasible);
  }
  // CPU ranks are ranks; GPUs are GPUs; a table of both says ranks.
  const std::string unit = cpu_ranks ? "rank" : "GPU";
  const bool sweep = points.size() > 1;
  Table table({"point", "backend", unit + "s", "step avg", "worst", "T_bound", "/bound", "compute",
               "comm", "exposed", "params/s/" + unit, "peak mem", sweep ? "speedup" : ""},
              2);
  for (const ResultRecord* r : ordered) {
    const double base = baseline[{r->backend, r->setup.world_size}];
    const bool over = r->memory.present && !r->memory.feasible;
    std::string memory = "-";
    if (r->memory.present)
      memory = gib(static_cast<double>(r->memory.peak_bytes)) + " GiB" + (over ? " OOM" : "");
    const bool bound = r->bound.step_s > 0;
    table.add(
        {r->provenance.point.empty() ? r->provenance.experiment : r->provenance.point,
         backend_text(*r), std::to_string(r->setup.world_size),
         human_seconds(r->step.average_s) + (over ? " *" : ""), human_seconds(r->step.worst_s),
         bound ? human_seconds(r->bound.step_s) : "-",
         bound ? fmt::format("{:.2f}", r->bound.ratio) : "-",
         human_seconds(r->throughput.compute_time_s.average),
         human_seconds(r->throughput.comm_time_s.average),
         human_seconds(r->throughput.comm_exposed_time_s.average),
         human_count(r->throughput.params_per_s_per_gpu.average), memory,
         sweep && r->step.average_s > 0 ? fmt::format("{:.2f}x", base / r->step.average_s) : ""});
  }
  std::cout << "\nstep time per point (T_bound: the step's lower bound, core/engine/bound.hpp, and "
               "/bound the average step over it; compute, comm, exposed: means over "
            << unit << "s of busy time; exposed = comm not hidden by compute; peak mem: the "
            << "fullest " << unit << "'s training state (core/plan/plan.hpp training_memory)"
            << (sweep ? "; speedup vs the first point with as many " + unit + "s" : "")
            << (gpus && cpu_ranks ? "; ranks are GPUs or CPU ranks as each profile says" : "")
            << ")\n";
  table.print(std::cout);
  print_training_table(ordered);
  if (infeasible)
    std::cout << "OOM       * the point's training state does not fit the device's memory: its "
                 "step time assumes memory that is not there (the result's memory section and "
                 "the warning under its run line say by how much)\n";
  // Said out loud, never left to the reader: two backends of one point whose steps differ by
  // more than 10 % (each record's cross_check), and Newton-Schulz times that are not from the
  // measured table.
  for (const ResultRecord* r : ordered) {
    const std::string point =
        r->provenance.point.empty() ? r->provenance.experiment : r->provenance.point;
    const bool measured = r->step.measured.timed_steps > 0;
    for (const CrossCheck& c : r->cross_check) {
      // Each pair once: from the measured side, else from the alphabetically first backend.
      const bool other_measured = is_measured_backend(c.backend);
      if (c.agree || (!measured && (other_measured || c.backend < r->backend))) continue;
      const std::string other = backend_label(c.backend, c.fidelity);
      if (measured)
        std::cout << fmt::format(
            "DIFFERS   {}: measured {} {} vs {} {} ({:+.1f} %): muonbed compare says why and "
            "how far from the machine's noise\n",
            point, r->backend, human_seconds(r->comparable_step_s()), other,
            human_seconds(c.step_s), c.difference_pct);
      else
        std::cout << fmt::format(
            "DISAGREE  {}: {} {} vs {} {} ({:+.1f} %): the two models differ by more than 10 % "
            "here; use the simulator's figure (README \"What each backend models\")\n",
            point, backend_text(*r), human_seconds(r->step.average_s), other,
            human_seconds(c.step_s), c.difference_pct);
    }
    if (r->backend != "analytic") continue;
    for (const std::string& note : r->notes)
      if (note.rfind("NS times (gpu.ns_table", 0) == 0 &&
          (note.find("curve") != std::string::npos ||
           note.find("extrapolated") != std::string::npos))
        std::cout << "note      " << point << ": " << note << "\n";
  }
}

// Each point's records checked against each other (cross_check) once its backends have run; a
// record whose check changed is written again (same result, same timestamp, new checksum).
void cross_check_records(const Experiment& point, std::vector<ResultRecord>& records,
                         std::size_t first) {
  std::vector<ResultRecord*> mine;
  for (std::size_t i = first; i < records.size(); ++i) mine.push_back(&records[i]);
  for (std::size_t i : cross_check_point(mine))
    write_file_atomically(result_path(point, mine[i]->backend), result_to_json(*mine[i]));
}

// A run killed while writing leaves "<file>.muonbed-tmp-<pid>" (write_output_file). Remove those
// whose writer is no live muonbed process, and only where muonbed writes and for the names it
// writes: the manifest in each output folder (unless `manifests` is false) and the result and
// trace files in each point's folder. Nothing else is touched, however it is named; a live writer
// (a concurrent run) keeps its own. A shard passes only its own points and no manifests: a
// writer on another host sharing the folder is no process here, yet alive.
int remove_stale_temp_files(const std::vector<Experiment>& points, bool manifests) {
  std::map<fs::path, std::vector<std::string>> names;  // folder -> file names muonbed writes
  for (const Experiment& point : points) {
    if (manifests) names[fs::path(point.output_dir)].push_back("muonbed-run.json");
    const fs::path folder = fs::path(result_path(point, "x")).parent_path();
    for (const std::string& backend : known_backend_names()) {
      names[folder].push_back(backend + ".json");
      names[folder].push_back(backend + ".trace.json");
    }
  }
  int removed = 0;
  for (const auto& [folder, known] : names) {
    std::error_code ec;
    if (!fs::is_directory(folder, ec)) continue;
    std::vector<fs::path> stale;
    for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      std::string target;
      long pid = 0;
      if (!parse_temp_file_name(it->path().filename().string(), target, pid)) continue;
      if (std::find(known.begin(), known.end(), target) == known.end()) continue;
      if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
      // Its writer is gone, or the pid now belongs to another program: a leftover either way.
      if (!is_live_muonbed_process(pid)) stale.push_back(it->path());
    }
    for (const fs::path& path : stale)
      if (fs::remove(path, ec)) ++removed;
  }
  return removed;
}

// <output>/muonbed-run.json: the result files (and traces) of the experiment's current sweep,
// every point of the file, whichever run made them, as long as each is a result of this build
// for the point's current configuration (completed_result, through ListedResults). Each entry names
// the point's identity (point_id), which analysis/plot.py matches against the file: a file replaced
// later by another configuration's result is flagged, never plotted as this sweep's. Written before
// a run starts (so a killed rerun of an edited experiment never leaves the old list behind) and
// after it ends. build_manifests makes them (folder -> text) from the files present, with the
// (point label, backend) of every result they list; write_manifests writes them.
struct Manifests {
  std::map<std::string, std::string> text;
  std::set<std::pair<std::string, std::string>> listed;
};

Manifests build_manifests(const std::vector<Experiment>& points, const Provenance& build) {
  Manifests out;
  std::map<std::string, nlohmann::json> manifests;
  std::map<std::string, std::vector<ResultRecord>> listed;  // output folder -> its records
  for (const Experiment& point : points) {
    nlohmann::json& m = manifests[point.output_dir];
    if (m.is_null())
      m = {{"experiment", point.name},
           {"experiment_file", point.file},
           {"schema_version", kResultsSchemaVersion},
           {"results", nlohmann::json::array()},
           {"traces", nlohmann::json::array()}};
    for (const std::string& backend : known_backend_names()) {
      const std::optional<ResultRecord> record = listed_results().get(point, backend, build);
      if (!record) continue;
      const fs::path path = result_path(point, backend);
      const fs::path dir(point.output_dir);
      m["results"].push_back({{"path", path.lexically_relative(dir).generic_string()},
                              {"backend", backend},
                              {"point", point.point_label},
                              {"point_id", record->provenance.point_id}});
      listed[point.output_dir].push_back(*record);
      out.listed.emplace(point.point_label, backend);
      const fs::path trace = fs::path(path).replace_filename(std::string(backend) + ".trace.json");
      std::error_code ec;
      if (fs::exists(trace, ec))
        m["traces"].push_back(trace.lexically_relative(dir).generic_string());
    }
  }
  // Seed 000's claims, classified here once (core/results/results.hpp seed_claims): plot.py draws
  // these rows with the ratios of the records it verified.
  for (auto& [dir, manifest] : manifests) {
    nlohmann::json rows = nlohmann::json::array();
    for (const SeedClaimRow& row : seed_claims(listed[dir]))
      rows.push_back(
          {{"claim", row.claim},
           {"claimed", row.claimed},
           {"low", row.low},
           {"high", row.high},
           {"backend", row.backend},
           {"baseline", row.baseline},
           {"target", row.target},
           {"baseline_point_id",
            row.baseline_record ? row.baseline_record->provenance.point_id : ""},
           {"target_point_id", row.target_record ? row.target_record->provenance.point_id : ""}});
    manifest["seed_claims"] = std::move(rows);
    out.text[dir] = manifest.dump(1) + "\n";
  }
  return out;
}

// Shards of one sweep (--shard) write the manifest too, at the same time and maybe from several
// hosts. Each rebuilds it from the files present, and after replacing it reads the files again,
// writing again until what it wrote is what it finds: a writer that replaced a newer manifest
// with its older view sees the results it missed and corrects it, so the last manifest written
// lists every result finished before it. (On NFS a host may see another's new files late: after
// the shards, one plain `muonbed run` rebuilds the manifest from every file; README "Splitting a
// sweep".) Returns the (point label, backend) pairs the manifests list. `pause_ms` (tests only)
// waits between reading the folder and replacing the manifest.
std::set<std::pair<std::string, std::string>> write_manifests(const std::vector<Experiment>& points,
                                                              const Provenance& build,
                                                              double pause_ms = 0) {
  constexpr int kMaxRounds = 100;  // each round needs another writer's new result: never reached
  Manifests written = build_manifests(points, build);
  for (int round = 0;; ++round) {
    if (pause_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(pause_ms));
    for (const auto& [dir, text] : written.text)
      write_file_atomically((fs::path(dir) / "muonbed-run.json").string(), text);
    Manifests found = build_manifests(points, build);
    if (found.text == written.text || round == kMaxRounds) return found.listed;
    written = std::move(found);
  }
}

bool matplotlib_available() {
  return std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0;
}

void make_plots(const std::vector<std::string>& output_dirs, const std::string& timelines) {
  const fs::path script = fs::path(MUONBED_SOURCE_DIR) / "analysis" / "plot.py";
  if (!fs::exists(script)) {
    std::cout << "\nplots: skipped (" << script.string() << " not found)\n";
    return;
  }
  if (!matplotlib_available()) {
    std::cout << "\nplots: skipped: matplotlib is missing for /usr/bin/python3 (install "
                 "python3-matplotlib, then: /usr/bin/python3 "
              << script.string() << " RESULTS_DIR)\n";
    return;
  }
  for (const std::string& dir : output_dirs) {
    std::cout << "\n" << std::flush;
    const std::string command = "/usr/bin/python3 " + shell_quote(script.string()) + " " +
                                shell_quote(dir) + " --timelines " + shell_quote(timelines);
    if (std::system(command.c_str()) != 0)
      throw Error("plotting failed: '" + command + "' exited with an error (its message is above)");
  }
}

int run_command(RunOptions& o) {
#if MUONBED_HAVE_MPI
  // Started under mpirun or srun: ranks other than 0 serve rank 0's mpi points and end here.
  if (const int code = mpi_command_begin(); code >= 0) return code;
  struct EndMpi {
    ~EndMpi() { mpi_command_end(); }
  } end_mpi;
#endif
  std::vector<Experiment> all = load_experiment(o.file, ExperimentOverrides{o.output});
  for (Experiment& point : all) apply_overrides(point, o);
  std::optional<Shard> shard;
  if (!o.shard.empty()) shard = parse_shard(o.shard);
  // The selection (--point), and the points this run runs: all of them, or its shard's.
  const std::vector<std::size_t> selected = select_points(all, o.points, o.file);
  std::vector<Experiment> selection, points;
  for (std::size_t i : selected) {
    selection.push_back(all[i]);
    if (!o.backends.empty()) selection.back().backends = o.backends;
  }
  for (std::size_t i : shard ? shard_points(selected, *shard) : selected) {
    points.push_back(all[i]);
    if (!o.backends.empty()) points.back().backends = o.backends;
  }
  if (points.empty()) {
    std::cout << fmt::format(
        "{}: shard {}/{} has no points (the selection has {}; shards past it have none)\n",
        all.front().name, shard->index, shard->count, selection.size());
    return 0;
  }
  check_backends(points, o);
  check_output_folders(all, points, o.force_replace);

  std::size_t total = 0;
  for (const Experiment& point : points) total += point.backends.size();
  const Experiment& first = points.front();
  std::cout << fmt::format("{}: {}{} point{} x backends = {} run{}; results in {}\n", first.name,
                           shard ? fmt::format("shard {}/{}: ", shard->index, shard->count) : "",
                           shard ? fmt::format("{} of {}", points.size(), selection.size())
                                 : std::to_string(points.size()),
                           selection.size() == 1 ? "" : "s", total, total == 1 ? "" : "s",
                           first.output_dir);

  std::vector<std::string> output_dirs;
  for (const Experiment& point : points)
    if (std::find(output_dirs.begin(), output_dirs.end(), point.output_dir) == output_dirs.end())
      output_dirs.push_back(point.output_dir);
  if (const int removed = remove_stale_temp_files(shard ? points : all, !shard); removed > 0)
    std::cout << fmt::format("removed {} unfinished temporary file{} of an interrupted run\n",
                             removed, removed == 1 ? "" : "s");
  const Provenance build = make_provenance(nullptr, "");
  write_manifests(all, build);
  // From here on Ctrl-C (or SIGTERM) stops the sweep cleanly: child processes are stopped, the
  // point in progress stays not run, the manifest lists what finished (core/base/process.hpp).
  install_interrupt_handlers();
  Progress progress(total, isatty(STDERR_FILENO) != 0);
  std::vector<ResultRecord> records;
  std::size_t done = 0, resumed = 0, stale = 0, failures = 0;
  const auto start = Clock::now();
  std::string interrupted_at;
  for (std::size_t i = 0; i < points.size() && !interrupted(); ++i) {
    const Experiment& point = points[i];
    const std::string label = point.point_label.empty() ? point.name : point.point_label;
    std::optional<StepPlan> plan;  // built once per point, when a backend first needs it
    double plan_s = 0;
    const std::size_t first_record = records.size();
    for (const std::string& backend : point.backends) {
      if (interrupted()) break;
      if (!o.force) {
        bool other_build = false;
        if (std::optional<ResultRecord> record =
                completed_result(point, backend, build, other_build)) {
          ++done;
          ++resumed;
          records.push_back(std::move(*record));
          continue;
        }
        if (other_build) ++stale;
      }
      progress.show(done, label + " [" + backend + "]");
      try {
        if (!plan) {
          const auto plan_start = Clock::now();
          plan = plan_experiment(point);
          plan_s = seconds_since(plan_start);
        }
        PointOutcome outcome = run_one(point, *plan, backend, o);
        progress.clear();
        std::cout << fmt::format(
            "[{:>{}}/{}] {} [{}]: step {} avg, {} worst; plan {}, {}\n", done + 1,
            std::to_string(total).size(), total, label, backend_text(outcome.record),
            human_seconds(outcome.record.step.average_s),
            human_seconds(outcome.record.step.worst_s), human_seconds(plan_s), outcome.detail);
        for (const std::string& note : outcome.record.notes)
          if (note.rfind("warning:", 0) == 0 || note.rfind(kAutoFidelityNote, 0) == 0)
            std::cout << "    " << note << "\n";
        std::cout << std::flush;
        records.push_back(std::move(outcome.record));
      } catch (const ConfigError&) {
        throw;  // bad input is the same for every point
      } catch (const Interrupted&) {
        progress.clear();
        interrupted_at = label + " [" + backend + "]";
        break;
      } catch (const Error& e) {
        progress.clear();
        if (interrupted()) {  // its child process died of the interrupt: not a failure
          interrupted_at = label + " [" + backend + "]";
          break;
        }
        // One point that cannot run (e.g. a mesh larger than the cluster) does not stop the rest.
        ++failures;
        std::cerr << "muonbed: error: " << label << " [" << backend << "]: " << e.what() << "\n";
      }
      ++done;
    }
    cross_check_records(point, records, first_record);
  }
  progress.clear();
  if (interrupted()) {
    write_manifests(all, build);
    std::cerr << fmt::format(
        "muonbed: interrupted (signal {}){}: {} of {} runs finished and are kept (the manifest "
        "lists them); run the same command again to resume\n",
        interrupt_signal(), interrupted_at.empty() ? "" : " during " + interrupted_at + ", not run",
        done, total);
    return 128 + interrupt_signal();
  }
  if (resumed > 0) {
    std::cout << fmt::format(
        "resumed: {} of {} runs already had results for the same configuration and were not "
        "run again (--force reruns them)\n",
        resumed, total);
  }
  if (stale > 0)
    std::cout << fmt::format(
        "rerun: {} run{} had results for the same configuration from another muonbed build "
        "(version or git commit differs)\n",
        stale, stale == 1 ? "" : "s");
  std::cout << fmt::format("{} run{} in {}\n", total - resumed, total - resumed == 1 ? "" : "s",
                           human_seconds(seconds_since(start)));
  if (!records.empty()) print_results_table(records, points);

  const std::string claims = seed_claims_table(records);
  if (!claims.empty()) std::cout << "\n" << claims;

  // Tests only: a pause before the last manifest replaces the one in the folder, so that other
  // shards' results land in between (tests/experiments/shard_cli_test.sh).
  const double pause_ms =
      env_number("MUONBED_TEST_MANIFEST_DELAY_MS", 0, 10000, true, "200").value_or(0);
  const auto listed = write_manifests(all, build, pause_ms);
  if (failures > 0) {
    std::cerr << fmt::format("muonbed: error: {} of {} runs failed (messages above)\n", failures,
                             total);
    return 1;
  }
  if (o.no_plots) return 0;
  // A shard plots when the manifest it wrote lists every run of the sweep (it finished last);
  // before that the figures would show part of it.
  std::size_t runs = 0, present = 0;
  for (const Experiment& point : selection)
    for (const std::string& backend : point.backends) {
      ++runs;
      present += listed.count({point.point_label, backend});
    }
  if (shard && present < runs) {
    std::cout << fmt::format(
        "\nplots: not yet: the results folder has {} of the sweep's {} runs; the shard that "
        "finishes the sweep draws them, or run the same command without --shard once every "
        "shard has ended (it runs what is missing, merges the manifest and plots)\n",
        present, runs);
    return 0;
  }
  make_plots(output_dirs, o.timelines);
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run every sweep point on the experiment's backends (the simulator by default), write "
      "results as points finish, resume an interrupted sweep, and plot");
  cmd->add_option("experiment", options->file, "experiment YAML file")->required();
  cmd->add_option("--backend", options->backends,
                  "run these backends instead of the file's (this build has: " +
                      join(registered_backends()) + "; repeatable)");
  cmd->add_option("--point", options->points,
                  "only points whose label is LABEL or includes every key=value of it "
                  "(repeatable)");
  cmd->add_option("--output", options->output, "results folder (default: the file's output)");
  cmd->add_option("--fidelity", options->fidelity,
                  "simulator fidelity instead of the file's sim.fidelity")
      ->check(CLI::IsMember({"step", "flow", "auto"}));
  cmd->add_option("--shard", options->shard,
                  "run only shard I of N: the selected points at positions I, I+N, I+2N, ... "
                  "(1-based), into the same results folder as the other shards (Slurm job "
                  "arrays, GNU parallel, hosts sharing a file system; README \"Splitting a "
                  "sweep\")")
      ->type_name("I/N");
  cmd->add_option("--trace-ranks", options->trace_ranks,
                  "ranks in the Chrome trace of the sim and mpi backends (0: no trace)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--force", options->force, "rerun points that already have results");
  cmd->add_flag("--force-replace", options->force_replace,
                "write into a results folder that holds another experiment's results (or another "
                "file's of the same name), replacing those it shares point labels with");
  cmd->add_flag("--no-plots", options->no_plots, "do not call analysis/plot.py");
  cmd->add_option("--timelines", options->timelines,
                  "step timelines the plots draw from the traces: none, the first point's of "
                  "each backend, or all (analysis/plot.py --timelines)")
      ->check(CLI::IsMember({"none", "first", "all"}))
      ->capture_default_str();
  cmd->footer(R"(Examples:
  muonbed run experiments/quickstart.yaml            simulate every strategy on one DGX H100 node
  muonbed run experiments/scaling.yaml --point mesh.dp_shard=128   one point of a sweep
  muonbed run experiments/scaling.yaml --shard 2/4   every 4th point from the 2nd (job arrays);
                                                     then without --shard: merge and plot
  muonbed run experiments/quickstart.yaml --backend analytic --output results/qs-analytic
  muonbed run experiments/mpi_quickstart.yaml        measure real steps, one MPI process per rank
  mpirun -np 2 muonbed run experiments/mpi_quickstart.yaml   the same in a world you started
                                                     (or srun -n 2 ...: every rank runs muonbed)
Results: <output>/<point>/<backend>.json (schema in core/results/results.hpp) and <backend>.trace.json
(Chrome/Perfetto trace of the worst step: open in ui.perfetto.dev). Rerunning skips finished
points; a killed sweep resumes where it stopped.)");
  cmd->callback([options, &exit_code] { exit_code = run_command(*options); });
}

}  // namespace muonbed::cli
