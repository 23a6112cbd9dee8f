// Experiment YAML: strict parsing of one experiment file into resolved points, one per sweep
// combination. Each point is parsed from a fresh tree of the file with the sweep's values written
// over the swept keys, so an error in a swept value points at the value's line in `sweep:`.
// Every check says file:line:column, the offending value and the fix; a parsed point is complete
// (its model lays out on its mesh) and carries its resolved configuration as YAML. This file
// assembles a point from its sections and holds the entry points; the sections' readers are
// beside it (parse_mesh.cpp, parse_model.cpp, parse_strategy.cpp, resolved_yaml.cpp, sweep.cpp),
// their shared limits, key lists and declarations in experiment_parsing.hpp.
#include "core/experiment/experiment.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/experiment/backends.hpp"
#include "core/experiment/src/experiment_parsing.hpp"
#include "core/plan/training.hpp"

namespace muonbed {

namespace experiment_parsing {

namespace fs = std::filesystem;

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every dotted key a sweep may override (mesh.<dim> is added per file): every key of the table
// outside lists, and model.moe's share model.dense's.
std::vector<std::string> schema_paths() {
  std::vector<std::string> paths;
  for (const ExperimentKey& k : experiment_keys())
    if (k.path() != "sweep" && k.section.find('[') == std::string::npos) paths.push_back(k.path());
  for (const std::string& k : kDenseKeys) paths.push_back("model.moe." + k);
  paths.push_back("cluster.preset");
  for (const std::string& k : cluster_schema_paths()) paths.push_back("cluster." + k);
  return paths;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = text.find(separator, start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) break;
    start = at + 1;
  }
  return parts;
}

std::string value_text(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out.SetMapFormat(YAML::Flow);
  out.SetSeqFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

Field missing_field(const YAML::Node& at, const std::string& path) {
  return Field{YAML::Node(YAML::NodeType::Undefined), at, path};
}

bool is_identifier(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string divisors_text(std::int64_t n, std::int64_t limit) {
  std::vector<std::string> out;
  for (std::int64_t k = 1; k <= std::min(n, limit); ++k)
    if (n % k == 0) out.push_back(std::to_string(k));
  return join(out);
}

namespace {

// ---------------------------------------------------------------------------------------------
// One point

ShardedModel shard(const Experiment& e, const std::vector<std::vector<Placement>>* placements) {
  if (!placements) return parallelize(e.model, e.mesh, e.parallel);
  std::vector<DistributedParam> params;
  for (std::size_t i = 0; i < e.model.params.size(); ++i) {
    const Parameter& p = e.model.params[i];
    DistributedParam d;
    d.source = static_cast<int>(i);
    d.name = p.name;
    d.shape = p.shape;
    d.dtype = p.dtype;
    d.role = p.role;
    d.layer = p.layer;
    d.optimizer = route(p, e.parallel.routing);
    d.layout = TensorLayout(e.mesh, p.shape, (*placements)[i]);
    params.push_back(std::move(d));
  }
  return shard_explicitly(e.mesh, e.model.name, std::move(params));
}

// strategy.explicit_owners against the sharded model, so `validate` finds what the plan would
// refuse: every name a Muon matrix, every Muon matrix named once, every owner holding a piece.
void check_explicit_owners(const Context& ctx, const MapReader& top, const ShardedModel& sharded) {
  const Field& strategy = *top.find("strategy");
  const MapReader st(ctx, strategy, kStrategyKeys);
  const Field& owners_field = *st.find("explicit_owners");
  const std::vector<Field> owners = map_entries(ctx, owners_field, "explicit_owners: {NAME: RANK}");
  std::unordered_map<std::string_view, const DistributedParam*> muon;
  std::vector<std::string> muon_names;
  for (const DistributedParam& p : sharded.params)
    if (p.optimizer == OptimizerKind::muon) {
      muon.emplace(p.name, &p);
      muon_names.push_back(p.name);
    }
  std::unordered_set<std::string_view> named;
  for (const Field& owner : owners) {
    const std::string& name = owner.key.Scalar();
    const auto it = muon.find(name);
    if (it == muon.end())
      fail(ctx, owner.key,
           "explicit_owners names " + quote(name) +
               ", which is not a Muon matrix of the sharded model" + did_you_mean(name, muon_names),
           muon_names.empty() ? "the model has no Muon matrices"
                              : "use Muon matrix names such as '" + muon_names.front() +
                                    "' (EP slices are named NAME[ep=i]; 'muonbed validate "
                                    "--params FILE' lists them)");
    named.insert(it->first);
    const DistributedParam& p = *it->second;
    const int rank = static_cast<int>(to_int(ctx, owner, 0, sharded.mesh.world_size() - 1));
    if (!p.layout.holds(sharded.mesh, rank) || p.layout.shard_numel(sharded.mesh, rank) == 0)
      fail(ctx, owner,
           "explicit owner " + std::to_string(rank) + " of '" + name +
               "' holds no piece of it (placements " + p.layout.describe(sharded.mesh) + ")",
           "choose a rank that holds a shard of it ('muonbed validate --params FILE' shows the "
           "layouts)");
  }
  std::vector<std::string> missing;
  for (const std::string& name : muon_names)
    if (!named.count(name)) missing.push_back(name);
  if (!missing.empty()) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 5; ++i)
      list += (i ? ", " : "") + quote(missing[i]);
    if (missing.size() > 5) list += ", ... (" + std::to_string(missing.size()) + " in all)";
    fail(ctx, owners_field,
         "strategy.explicit_owners gives no owner to " + std::to_string(missing.size()) + " of " +
             std::to_string(muon_names.size()) + " Muon matrices: " + list,
         "add 'NAME: RANK' for every Muon matrix ('muonbed validate --params FILE' lists them), "
         "or use another assign policy such as flop_balanced");
  }
}

// A name or path from the file that ends up in file names, paths and one-line messages: at most
// `max_bytes`, and no control characters (a newline or NUL in a path is never intended).
void check_text(const Context& ctx, const Field& at, const std::string& text, std::size_t max_bytes,
                const std::string& key, const std::string& example) {
  if (text.size() > max_bytes)
    fail(ctx, at,
         "'" + key + "' is " + std::to_string(text.size()) + " bytes long, more than " +
             std::to_string(max_bytes),
         "use a shorter value, e.g. " + example);
  for (const char c : text)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      fail(ctx, at,
           "'" + key + "' contains a control character (byte " +
               std::to_string(static_cast<unsigned char>(c)) + ")",
           "use printable characters only, e.g. " + example);
}

// A 64-bit fingerprint (FNV-1a over length-prefixed fields, then a final mix).
class Fingerprint {
 public:
  void add(std::string_view text) {
    add(static_cast<std::int64_t>(text.size()));
    for (const char c : text) byte(static_cast<unsigned char>(c));
  }
  void add(std::int64_t value) {
    for (int i = 0; i < 8; ++i) byte(static_cast<unsigned char>(value >> (8 * i)));
  }
  std::uint64_t value() const {
    std::uint64_t h = hash_;  // splitmix64's finalizer spreads the last bytes' changes
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
  }

 private:
  void byte(unsigned char b) {
    hash_ ^= b;
    hash_ *= 1099511628211ull;
  }
  std::uint64_t hash_ = 1469598103934665603ull;
};

// Everything the sharding of a point depends on besides explicit placements: mesh, parallel and
// routing rules, the model's tensors.
std::uint64_t layout_key(const Experiment& e) {
  Fingerprint f;
  for (const MeshDim& d : e.mesh.dims()) {
    f.add(d.name);
    f.add(d.size);
    f.add(static_cast<std::int64_t>(d.role));
  }
  f.add(e.mesh.gpus_per_node());
  f.add(e.parallel.fsdp_tensor_dim);
  f.add(e.parallel.tp_shard_embeddings ? 1 : 0);
  f.add(static_cast<std::int64_t>(e.parallel.dense_over_ep));
  for (const auto& [name, dim] : e.parallel.tp_dim_per_param) {
    f.add(name);
    f.add(dim);
  }
  const RoutingRules& r = e.parallel.routing;
  f.add((r.embeddings_to_adamw ? 1 : 0) + (r.lm_head_to_adamw ? 2 : 0) +
        (r.router_to_adamw ? 4 : 0));
  for (const std::string& name : r.force_adamw) f.add(name);
  f.add(e.model.name);
  f.add(e.model.num_layers);
  for (const Parameter& p : e.model.params) {
    f.add(p.name);
    f.add(static_cast<std::int64_t>(p.shape.size()));
    for (std::int64_t extent : p.shape) f.add(extent);
    f.add(static_cast<std::int64_t>(p.dtype));
    f.add(static_cast<std::int64_t>(p.role));
    f.add(p.layer);
  }
  return f.value();
}

}  // namespace

// An option that no point's strategy reads would be silently ignored: an error at the option,
// naming the strategies it applies to. (In a sweep over strategies an option that some points
// read is kept: it applies where it can, and the summaries show it only there.)
void check_strategy_options(const OptionUses& uses) {
  for (const auto& [key, use] : uses) {
    if (use.read) continue;
    std::string given;
    for (const std::string& name : use.strategies) given += (given.empty() ? "" : ", ") + name;
    const std::string readers = strategies_reading_option(key);
    std::string why;
    if (key == "chunk_size" && readers.find(*use.strategies.begin()) != std::string::npos)
      why = " (chunk_sizing: ns_cost sizes the chunks by NS cost, one matrix per owner)";
    fail(use.ctx, use.at,
         "'strategy." + key + "' does not apply to strategy " + given + why +
             ": nothing would read it",
         why.empty() ? "remove it, or use a strategy it applies to (" + readers + ")"
                     : "remove it, or set chunk_sizing: count to size chunks by count");
  }
}

namespace {

std::uint64_t placements_key(const ModelSection& model) {
  Fingerprint f;
  for (const auto& row : model.placements)
    for (const Placement& p : row) f.add(p.to_string());
  return f.value();
}

// training: the training step around the optimizer (core/plan/training.hpp).
void read_training(const Context& ctx, const Field& field, TrainingOptions& t) {
  const MapReader m(ctx, field, kTrainingKeys);
  m.require("tokens_per_step", "tokens_per_step: 4194304");
  m.require("seq_len", "seq_len: 4096");
  t.enabled = true;
  m.read("tokens_per_step", t.tokens_per_step, 1, std::int64_t{1} << 40);
  m.read("seq_len", t.seq_len, 1, std::int64_t{1} << 24);
  m.read("micro_batch_size", t.micro_batch_size, 1, std::int64_t{1} << 20);
  m.read_choice("overlap", t.overlap, {"none", "backward"});
  m.read("experts_per_token", t.experts_per_token, 1, 1 << 16);
  m.read("max_micro_batch_groups", t.max_micro_batch_groups, 1, 1024);
  m.read("flash_attention", t.flash_attention);
}

// memory: the training state around the optimizer step, for the feasibility check
// (core/plan/plan.hpp TrainingMemoryOptions).
void read_memory(const Context& ctx, const Field& field, TrainingMemoryOptions& memory) {
  const MapReader m(ctx, field, kMemoryKeys);
  std::string master = std::string(to_string(memory.master_weights));
  if (m.read_choice("master_weights", master, kMasterWeights))
    memory.master_weights = master_weights_from_string(master);
  const auto gib = [&](const char* key, std::int64_t& bytes) {
    double value = 0;
    if (m.read(key, value, 0, kMaxMemoryGiB))
      bytes = static_cast<std::int64_t>(std::llround(value * 1024.0 * 1024.0 * 1024.0));
  };
  gib("activations_GiB", memory.activations_bytes);
  gib("reserved_GiB", memory.reserved_bytes);
}

}  // namespace

Experiment parse_point(const Context& ctx, const YAML::Node& root, ParseCache* cache,
                       const ExperimentOverrides& overrides) {
  Experiment e;
  e.file = ctx.file;
  e.point_label = ctx.point;
  const MapReader top(ctx, root, "", kTopKeys);
  e.name = fs::path(ctx.file).stem().string();
  if (const Field* f = top.find("name")) {
    e.name = to_string_value(ctx, *f);
    if (e.name.empty())
      fail(ctx, *f, "'name' is empty", "name the experiment, e.g. name: quickstart");
    check_text(ctx, *f, e.name, kMaxNameBytes, "name", "name: quickstart");
    // The name is a folder name too (results/<name>): never one that leaves results/.
    if (e.name == "." || e.name == ".." || e.name.find('/') != std::string::npos ||
        e.name.find('\\') != std::string::npos)
      fail(ctx, *f,
           "'name' = '" + e.name + "' is not a folder name (it names results/" + e.name +
               ", which " +
               (e.name.find('/') != std::string::npos || e.name.find('\\') != std::string::npos
                    ? "has a path separator"
                    : "leaves results/") +
               ")",
           "use a plain name without '/', '\\', '.' or '..', e.g. name: quickstart");
  } else if (e.name == "." || e.name == ".." || e.name.empty()) {
    throw ConfigError(SourceLocation{ctx.file, 0, 0},
                      "the experiment has no 'name' and its file name '" +
                          fs::path(ctx.file).filename().string() + "' gives none",
                      "add a name, e.g. name: quickstart");
  }
  e.cluster = read_cluster(ctx, top, cache->clusters);
  const MeshSection ms =
      read_mesh(ctx, top.require("mesh", "mesh: {dims: {dp_shard: 8}}"), e.cluster);
  e.mesh = ms.mesh;
  const ModelSection model =
      read_model(ctx, top.require("model", "model: {preset: llama-7b}"), e.mesh);
  e.model = model.model;
  read_parallel(ctx, top, e.model, e.parallel);
  read_optimizer(ctx, top, e.model, e.optimizer, e.parallel.routing);
  read_strategy(ctx, top, ms, e.model, e.strategy, cache->options);

  e.backends = {"sim"};  // the main job: the simulator (muonbed run)
  if (const Field* f = top.find("backend")) {
    std::vector<Field> items;
    if (f->value.IsSequence()) {
      items = list_items(ctx, *f);
      if (items.empty())
        fail(ctx, *f, "'backend' is an empty list",
             "use one or more of: " + join(known_backend_names()));
    } else {
      items.push_back(*f);
    }
    e.backends.clear();
    for (const Field& item : items) {
      const std::string b = to_choice(ctx, item, known_backend_names());
      if (std::find(e.backends.begin(), e.backends.end(), b) != e.backends.end())
        fail(ctx, item, "backend '" + b + "' is listed twice", "list each backend once");
      e.backends.push_back(b);
    }
  }
  if (const Field* f = top.find("sim")) {
    const MapReader sim(ctx, *f, kSimKeys);
    sim.read_choice("fidelity", e.sim_fidelity, kFidelities);
    if (e.sim_fidelity == "step" && e.mesh.world_size() > kMaxStepFidelityRanks)
      fail(ctx, *sim.find("fidelity"),
           "sim.fidelity step models every transfer, and this mesh has " +
               std::to_string(e.mesh.world_size()) + " ranks (step fidelity takes hours above " +
               std::to_string(kMaxStepFidelityRanks) + ")",
           "use fidelity: flow (or auto, which picks step only where flow is not proven within "
           "1 % of it and step's estimated cost is within its budget)");
  }
  if (const Field* f = top.find("memory")) read_memory(ctx, *f, e.memory);
  if (const Field* f = top.find("training")) read_training(ctx, *f, e.training);
  top.read("steps", e.steps, 0, 1000000);
  top.read("repeats", e.repeats, 1, 1000000);
  if (std::int64_t seed = 1; top.read("seed", seed, 0)) e.seed = static_cast<std::uint64_t>(seed);
  e.output_dir = "results/" + e.name;
  if (const Field* f = top.find("output")) {
    e.output_dir = to_string_value(ctx, *f);
    if (e.output_dir.empty())
      fail(ctx, *f, "'output' is empty", "give a directory, e.g. output: results/" + e.name);
    check_text(ctx, *f, e.output_dir, kMaxPathBytes, "output", "output: results/my_study");
    for (const auto& part : fs::path(e.output_dir))
      if (part.native().size() > kMaxPathComponentBytes)
        fail(ctx, *f,
             "'output' has a folder name of " + std::to_string(part.native().size()) +
                 " bytes; file systems allow at most " + std::to_string(kMaxPathComponentBytes),
             "use shorter folder names");
  }
  if (!overrides.output.empty()) e.output_dir = overrides.output;

  check_model_on_mesh(ctx, ms, model);
  // The layout rules have the last word: a model that does not lay out is a config error. Points
  // of a sweep whose mesh, model and parallel rules agree share one sharded model.
  try {
    e.sharded_key = layout_key(e);
    const LayoutKey key{e.sharded_key, model.explicit_layouts ? placements_key(model) : 0};
    std::shared_ptr<const ShardedModel>& cached = cache->shards[key];
    if (!cached)
      cached = std::make_shared<const ShardedModel>(
          shard(e, model.explicit_layouts ? &model.placements : nullptr));
    e.sharded = cached;
    if (!e.strategy.explicit_owners.empty()) check_explicit_owners(ctx, top, *e.sharded);
    if (e.training.enabled) {
      try {
        training_shape(*e.sharded, e.training);
      } catch (const PlanError& err) {
        const std::string what = err.what();
        const std::size_t fix = what.find("; fix: ");
        fail(ctx, *top.find("training"), what.substr(0, fix),
             fix == std::string::npos ? "change the training section" : what.substr(fix + 7));
      }
    }
  } catch (const LayoutError& err) {
    fail(ctx, model.field,
         "model '" + e.model.name + "' does not lay out on mesh " + e.mesh.describe() + ": " +
             err.what(),
         "change the mesh sizes, the parallel section or the model");
  }
  e.resolved_yaml = resolved_yaml(e, ms, model);
  return e;
}

}  // namespace experiment_parsing

using namespace experiment_parsing;

PlanSettings Experiment::plan_settings() const {
  PlanSettings settings;
  settings.optimizer = optimizer;
  settings.state_dtype = DType::fp32;
  settings.training_memory = memory;
  settings.training = training;
  return settings;
}

std::vector<Experiment> parse_experiment(const std::string& yaml_text, const std::string& file,
                                         const ExperimentOverrides& overrides) {
  try {
    return parse_file(yaml_text, file, overrides);
  } catch (const YAML::Exception& e) {
    // The accessors check types before converting; this is the safety net for any yaml-cpp
    // refusal they do not foresee, reported where yaml-cpp saw it.
    SourceLocation where{file, e.mark.line + 1, e.mark.column + 1};
    if (e.mark.is_null()) where = SourceLocation{file, 0, 0};
    throw ConfigError(where, "cannot read this YAML value: " + e.msg,
                      "check the value's type against the experiment schema (README, 'Writing "
                      "an experiment')");
  }
}

std::vector<Experiment> load_experiment(const std::string& path,
                                        const ExperimentOverrides& overrides) {
  return parse_experiment(read_text_file(path, "experiment file"), path, overrides);
}

namespace {

ShardedModel shard_anew(const Experiment& experiment) {
  // Explicit placements live in the resolved configuration (model.params[i].placements).
  if (!experiment.resolved_yaml.empty()) {
    const YAML::Node root = YAML::Load(experiment.resolved_yaml);
    const YAML::Node params = child(child(root, "model"), "params");
    if (params.IsDefined() && params.IsSequence() &&
        params.size() == experiment.model.params.size() && params.size() > 0 &&
        child(params[0], "placements").IsDefined()) {
      std::vector<std::vector<Placement>> placements;
      for (const auto& p : params) {
        std::vector<Placement> row(experiment.mesh.ndims(), Placement::replicate());
        for (const auto& entry : p["placements"]) {
          const int dim = experiment.mesh.find(entry.first.Scalar());
          const std::optional<Placement> parsed = parse_placement(entry.second.Scalar());
          if (dim < 0 || !parsed)
            throw LayoutError("experiment '" + experiment.name + "': bad placement '" +
                              entry.second.Scalar() + "' for dim '" + entry.first.Scalar() +
                              "' in the resolved configuration");
          row[dim] = *parsed;
        }
        placements.push_back(std::move(row));
      }
      return shard(experiment, &placements);
    }
  }
  return shard(experiment, nullptr);
}

}  // namespace

ShardedModel shard_model(const Experiment& experiment) {
  return *shared_shard_model(experiment);
}

std::shared_ptr<const ShardedModel> shared_shard_model(const Experiment& experiment) {
  // The sharding made at parse time, while the point's layout inputs are unchanged.
  if (experiment.sharded && experiment.sharded_key == layout_key(experiment))
    return experiment.sharded;
  return std::make_shared<const ShardedModel>(shard_anew(experiment));
}

}  // namespace muonbed
