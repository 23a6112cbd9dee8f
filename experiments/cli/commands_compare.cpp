// `muonbed compare EXP`: an experiment's measured results (mpi, nccl, cuda_loopback) beside its
// predicted ones (analytic, sim), per point and per mesh (core/results/compare.hpp), as a table, as
// JSON
// (<output>/compare.json, and --json FILE) and as plots (analysis/compare.py: predicted vs
// measured scatter with y = x and +-10 % bands, per-point bars, a measured-over-predicted
// timeline of one point).
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/base/process.hpp"
#include "core/experiment/experiment.hpp"
#include "core/results/compare.hpp"
#include "core/results/results.hpp"
#include "experiments/cli/commands.hpp"
#include "muonbed/config.hpp"

namespace muonbed::cli {

namespace {

namespace fs = std::filesystem;

struct CompareOptions {
  std::string file;
  std::vector<std::string> outputs;  // results folders, one per run (none: the experiment's)
  std::string json;                  // also write the JSON here
  std::string plots;                 // plots folder ("" = <output>/compare)
  std::string timeline;  // point of the timeline overlay ("" = the first not oversubscribed)
  bool no_plots = false;
};

int run_compare(const CompareOptions& o) {
  // Checked before any work: a plots folder that is a file (or anything but a folder).
  std::error_code ec;
  if (!o.plots.empty() && fs::exists(o.plots, ec) && !fs::is_directory(o.plots, ec))
    throw ConfigError(SourceLocation{"compare", 0, 0},
                      "--plots '" + o.plots + "' is a file, not a folder",
                      "give a folder for the figures, e.g. --plots compare-plots");
  if (!o.json.empty()) {
    (void)load_experiment(o.file);  // its file is then an input that --json may not replace
    check_output_file(o.json, "--json");
  }
  const CompareReport report = compare_experiment(o.file, o.outputs);
  std::cout << compare_table(report);
  const std::string text = compare_json(report).dump(1) + "\n";
  const fs::path results(report.output_dir);
  const std::string main_json = (results / "compare.json").string();
  write_file_atomically(main_json, text);
  std::cout << "\nwrote " << main_json << "\n";
  if (!o.json.empty()) {
    if (fs::is_directory(o.json))
      throw ConfigError(SourceLocation{"compare", 0, 0}, "--json '" + o.json + "' is a folder",
                        "give a file name, e.g. --json compare.json");
    write_file_atomically(o.json, text);
    std::cout << "wrote " << o.json << "\n";
  }
  if (o.no_plots) return 0;
  const fs::path script = fs::path(MUONBED_SOURCE_DIR) / "analysis" / "compare.py";
  if (!fs::exists(script)) {
    std::cout << "plots: skipped (" << script.string() << " not found)\n";
    return 0;
  }
  if (std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") != 0) {
    std::cout << "plots: skipped: matplotlib is missing for /usr/bin/python3 (install "
                 "python3-matplotlib, then: /usr/bin/python3 "
              << script.string() << " " << main_json << ")\n";
    return 0;
  }
  const std::string plots = o.plots.empty() ? (results / "compare").string() : o.plots;
  std::string command = "/usr/bin/python3 " + shell_quote(script.string()) + " " +
                        shell_quote(main_json) + " --out " + shell_quote(plots);
  if (!o.timeline.empty()) command += " --timeline " + shell_quote(o.timeline);
  std::cout << std::flush;
  if (std::system(command.c_str()) != 0)
    throw Error("plotting failed: '" + command + "' exited with an error (its message is above)");
  return 0;
}

}  // namespace

void add_compare_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<CompareOptions>();
  CLI::App* cmd = app.add_subcommand("compare",
                                     "Measured (mpi, nccl, cuda_loopback) beside predicted "
                                     "(analytic, sim): error, phases, ranking");
  cmd->add_option("experiment", o->file, "experiment YAML file whose results to compare")
      ->required();
  cmd->add_option("--output", o->outputs,
                  "results folder (default: the file's output); repeat it to combine runs of "
                  "the experiment: the measured step is then the median over the runs, with "
                  "their spread")
      ->type_name("DIR");
  cmd->add_option("--json", o->json, "also write the comparison as JSON to this file");
  cmd->add_option("--plots", o->plots, "plots folder (default: <results>/compare)");
  cmd->add_option("--timeline", o->timeline,
                  "point (sweep label) of the measured-over-predicted timeline (default: the "
                  "first point that is not oversubscribed)");
  cmd->add_flag("--no-plots", o->no_plots, "do not call analysis/compare.py");
  cmd->footer(R"(Examples:
  muonbed run experiments/validate_cpu.yaml && muonbed compare experiments/validate_cpu.yaml
  muonbed compare experiments/mpi_quickstart.yaml --json cmp.json --no-plots
  for i in 1 2 3; do muonbed run experiments/validate_cpu.yaml --output results/v$i; done
  muonbed compare experiments/validate_cpu.yaml --output results/v1 --output results/v2 --output results/v3
Step time: the measured median over timed steps against the predicted average step; error % =
(predicted - measured) / measured. Ranking: Kendall's tau between measured and predicted step
times of the points that differ only in the strategy (same mesh and model). Results are read
with their checksums verified; a missing result or one made for another configuration is an
error naming the file and the fix.)");
  cmd->callback([o, &exit_code] { exit_code = run_compare(*o); });
}

}  // namespace muonbed::cli
