// `muonbed presets`: everything an experiment file can name: model presets (with parameter and
// Muon matrix counts), the Hugging Face model types hf_config reads, cluster profiles
// (experiments/clusters/), strategies, assignment policies and backends.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "core/config/cluster.hpp"
#include "core/model/hf_config.hpp"
#include "core/model/model.hpp"
#include "core/plan/assignment.hpp"
#include "core/plan/strategy.hpp"
#include "core/results/run_point.hpp"
#include "experiments/cli/backends.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/format.hpp"
#include "muonbed/config.hpp"

namespace muonbed::cli {

namespace {

int run_presets() {
  std::cout << "Model presets (model: {preset: NAME}):\n";
  Table models({"name", "parameters", "layers", "Muon matrices", "largest Muon matrix"});
  for (const std::string& name : preset_names()) {
    const Model m = *find_preset(name);
    std::int64_t matrices = 0, largest_rows = 0, largest_cols = 0;
    for (const Parameter& p : m.params) {
      if (route(p, RoutingRules{}) != OptimizerKind::muon) continue;
      matrices += p.batch();
      if (p.rows() * p.cols() > largest_rows * largest_cols) {
        largest_rows = p.rows();
        largest_cols = p.cols();
      }
    }
    models.add({name, human_count(static_cast<double>(m.numel())), std::to_string(m.num_layers),
                std::to_string(matrices), fmt::format("{} x {}", largest_rows, largest_cols)});
  }
  models.print(std::cout);
  std::cout
      << "\nHugging Face config.json (model: {hf_config: path/to/config.json}), by model_type:\n";
  for (const std::string& family : hf_family_descriptions()) std::cout << "  " << family << "\n";

  std::cout << "\nClusters (cluster: NAME; files in " MUONBED_SOURCE_DIR
               "/experiments/clusters):\n";
  Table clusters(
      {"name", "GPUs/node", "GPU", "bf16 TFLOP/s", "HBM GB/s", "intra-node GB/s", "NICs x GB/s"});
  const std::filesystem::path dir =
      std::filesystem::path(MUONBED_SOURCE_DIR) / "experiments" / "clusters";
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    const ClusterSpec c = load_cluster_file(file.string());
    clusters.add({file.stem().string(), std::to_string(c.gpus_per_node), c.gpu.name,
                  fmt::format("{:g}", c.gpu.peak_tflops), fmt::format("{:g}", c.gpu.hbm_GBps),
                  fmt::format("{:g} ({})", c.intra.bandwidth_GBps,
                              c.intra.kind == IntraNodeKind::nvswitch ? "NVSwitch" : "PCIe"),
                  fmt::format("{} x {:g}", c.nic.count_per_node, c.nic.bandwidth_GBps)});
  }
  clusters.print(std::cout);

  std::cout << "\nStrategies (strategy: {name: ...}):   " << join(strategy_names()) << "\n";
  std::cout << "Assign policies (strategy: {assign: ...}): " << join(assign_policy_names()) << "\n";
  std::cout << "Strategy presets (strategy: {preset: ...}): " << join(strategy_preset_names())
            << "\n";
  std::cout << "Backends (backend: ...):             " << backends_summary() << "\n";
  std::cout << "\nnext: muonbed validate experiments/quickstart.yaml\n";
  return 0;
}

}  // namespace

void add_presets_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "presets", "List model presets, cluster profiles, strategies, assign policies, backends");
  cmd->footer(R"(Example:
  muonbed presets
Use the names in an experiment file: model: {preset: llama-7b}, cluster: dgx-h100,
strategy: {name: owner, assign: flop_balanced}. A cluster may also be a path to your own YAML.)");
  cmd->callback([&exit_code] { exit_code = run_presets(); });
}

}  // namespace muonbed::cli
