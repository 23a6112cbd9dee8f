// `muonbed validate EXP.yaml`: parses an experiment file strictly, expands its sweep, lays every
// point's model out on its mesh, and prints one OK line per point with the model size, the mesh
// and the strategy, and a shapes summary of each distinct model (per shape, role and optimizer:
// how many tensors and parameters). --params lists the parameters (names for tp_dim_per_param,
// force_adamw and explicit_owners); --resolved prints each point's complete resolved
// configuration.
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "core/experiment/experiment.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/format.hpp"

namespace muonbed::cli {

namespace {

struct ValidateOptions {
  std::string file;
  bool params = false;
  bool resolved = false;
};

void print_params(const ShardedModel& model) {
  Table table({"#", "name", "shape", "role", "optimizer", "layout"}, 6);
  for (const DistributedParam& p : model.params) {
    std::string shape;
    for (std::int64_t s : p.shape) shape += (shape.empty() ? "" : "x") + std::to_string(s);
    std::string layout;
    for (int d = 0; d < model.mesh.ndims(); ++d)
      layout += (layout.empty() ? "" : " ") + model.mesh.dim(d).name + ":" +
                p.layout.placements()[d].to_string();
    table.add({std::to_string(p.index), p.name, shape, std::string(to_string(p.role)),
               p.optimizer == OptimizerKind::muon ? "muon" : "adamw", layout});
  }
  table.print(std::cout);
}

// What every plan of the point holds at least (core/plan/plan.hpp training_memory_floor),
// against the device's memory: a point over it fits under no strategy. `muonbed plan` checks the
// whole training state of the chosen strategy.
// Points of a sweep share their sharded model: the floor is computed once per model and memory
// setting (a 10,000-point sweep of a 16,384-rank mesh computes it once).
struct FloorCache {
  const ShardedModel* model = nullptr;
  TrainingMemoryOptions memory;
  DType comm = DType::bf16;
  std::vector<TrainingMemory> ranks;
};

void print_memory_floor(const Experiment& e, const ShardedModel& sharded, FloorCache& cache) {
  const PlanSettings settings = e.plan_settings();
  if (cache.model != &sharded || !(cache.memory == settings.training_memory) ||
      cache.comm != settings.comm_dtype()) {
    const int world = e.mesh.world_size();
    cache.ranks.clear();
    cache.ranks.reserve(world);
    for (int r = 0; r < world; ++r)
      cache.ranks.push_back(training_memory_floor(sharded, settings, r));
    cache.model = &sharded;
    cache.memory = settings.training_memory;
    cache.comm = settings.comm_dtype();
  }
  const int world = e.mesh.world_size();
  const auto limit = static_cast<std::int64_t>(e.cluster.gpu.memory_GiB * 1024.0 * 1024.0 * 1024.0);
  const MemoryFeasibility floor = memory_feasibility(cache.ranks, limit);
  std::cout << fmt::format(
      "    {}at least {}{}\n", floor.feasible() ? "memory    " : "INFEASIBLE ",
      memory_feasibility_text(floor, e.cluster.gpu.name, world),
      floor.feasible()
          ? " (before optimizer state and buffers: muonbed plan checks the whole step)"
          : ": no strategy can fit; shard more (fsdp, tp, pp), use a larger device, or change "
            "memory: in the experiment");
}

// 30532122624 -> "30,532,122,624": the summary's counts are exact, to compare with model cards.
std::string with_commas(std::int64_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The model's parameters grouped by shape, role and optimizer (Muon or AdamW by the point's
// routing rules), largest group first, with the totals: what a model card's count is made of.
void print_shapes(const Model& model, const RoutingRules& routing) {
  struct Group {
    std::int64_t tensors = 0, params = 0;
  };
  using Key = std::tuple<std::vector<std::int64_t>, ParamRole, OptimizerKind>;
  std::map<Key, Group> groups;
  std::int64_t muon = 0, adamw = 0;
  for (const Parameter& p : model.params) {
    const OptimizerKind kind = route(p, routing);
    Group& g = groups[{p.shape, p.role, kind}];
    ++g.tensors;
    g.params += p.numel();
    (kind == OptimizerKind::muon ? muon : adamw) += p.numel();
  }
  std::vector<std::pair<Key, Group>> rows(groups.begin(), groups.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.params > b.second.params; });
  std::cout << fmt::format(
      "    shapes    of model {} ({} layers; optimizer by optimizer.routing)\n", model.name,
      model.num_layers);
  Table table({"shape", "role", "optimizer", "tensors", "parameters"}, 3);
  for (const auto& [key, g] : rows) {
    std::string shape;
    for (std::int64_t s : std::get<0>(key)) shape += (shape.empty() ? "" : "x") + std::to_string(s);
    table.add({shape, std::string(to_string(std::get<1>(key))),
               std::get<2>(key) == OptimizerKind::muon ? "muon" : "adamw",
               std::to_string(g.tensors), with_commas(g.params)});
  }
  table.add_separator();
  table.add({"total", "", "", std::to_string(model.params.size()), with_commas(model.numel())});
  table.print(std::cout, "      ");
  std::cout << fmt::format("      Muon {} parameters, AdamW {}\n", with_commas(muon),
                           with_commas(adamw));
  for (const std::string& part : model.left_out) std::cout << "      left out: " << part << "\n";
}

// Whether two points' models are the same (their summaries would be).
bool same_model(const Model& a, const Model& b) {
  if (a.name != b.name || a.params.size() != b.params.size()) return false;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    if (a.params[i].shape != b.params[i].shape || a.params[i].role != b.params[i].role ||
        a.params[i].name != b.params[i].name)
      return false;
  return true;
}

int run_validate(const ValidateOptions& o) {
  const std::vector<Experiment> points = load_experiment(o.file);
  std::cout << fmt::format("{}: {} point{}\n", o.file, points.size(),
                           points.size() == 1 ? "" : "s");
  FloorCache floor_cache;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const Experiment& e = points[i];
    const std::shared_ptr<const ShardedModel> shared = shared_shard_model(e);
    const ShardedModel& sharded = *shared;
    const std::vector<int> muon = sharded.muon_params();
    std::int64_t matrices = 0;
    for (int p : muon) matrices += sharded.params[p].batch();
    std::cout << fmt::format("OK  {}\n",
                             e.point_label.empty() ? e.name : point_text(e, i, points.size()));
    std::cout << fmt::format(
        "    model     {}: {} parameters, {} Muon tensors ({} matrices), {} AdamW\n", e.model.name,
        human_count(static_cast<double>(e.model.numel())), muon.size(), matrices,
        sharded.adamw_params().size());
    std::cout << fmt::format("    mesh      {} on {}\n", mesh_text(e.mesh), e.cluster.name);
    print_memory_floor(e, sharded, floor_cache);
    std::cout << fmt::format("    strategy  {}; ns_steps {}, comm {}\n", strategy_text(e.strategy),
                             e.optimizer.muon.ns_steps, to_string(e.optimizer.comm_dtype));
    std::string backends;
    for (const std::string& b : e.backends) backends += (backends.empty() ? "" : ", ") + b;
    std::cout << fmt::format("    backends  {} (steps {}, repeats {}, output {})\n", backends,
                             e.steps, e.repeats, e.output_dir);
    const bool routing_changed =
        i > 0 &&
        (points[i - 1].parallel.routing.embeddings_to_adamw !=
             e.parallel.routing.embeddings_to_adamw ||
         points[i - 1].parallel.routing.lm_head_to_adamw != e.parallel.routing.lm_head_to_adamw ||
         points[i - 1].parallel.routing.router_to_adamw != e.parallel.routing.router_to_adamw ||
         points[i - 1].parallel.routing.force_adamw != e.parallel.routing.force_adamw);
    if (i == 0 || routing_changed || !same_model(points[i - 1].model, e.model))
      print_shapes(e.model, e.parallel.routing);
    if (o.resolved) std::cout << e.resolved_yaml << "\n";
    if (o.params && i == 0) print_params(sharded);
  }
  std::cout << "next: muonbed plan " << o.file << "\n";
  return 0;
}

}  // namespace

void add_validate_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<ValidateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "validate", "Check an experiment file: every key, type and value, and every sweep point");
  cmd->add_option("experiment", options->file, "experiment YAML file")
      ->required()
      ->type_name("EXP.yaml");
  cmd->add_flag("--params", options->params,
                "list the parameters of the (first point's) model with their layouts");
  cmd->add_flag("--resolved", options->resolved,
                "print each point's complete resolved configuration (YAML)");
  cmd->footer(R"(Examples:
  muonbed validate experiments/quickstart.yaml
  muonbed validate experiments/fsdp_tp.yaml --params     parameter names for tp_dim_per_param
  muonbed validate my.yaml --resolved                   what every default resolved to
An error names FILE:LINE:COLUMN, the offending value and the fix. Then: muonbed plan FILE.)");
  cmd->callback([options, &exit_code] { exit_code = run_validate(*options); });
}

}  // namespace muonbed::cli
