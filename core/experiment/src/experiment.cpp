// Experiment YAML: strict parsing of one experiment file into resolved points, one per sweep
// combination. Each point is parsed from a fresh tree of the file with the sweep's values written
// over the swept keys, so an error in a swept value points at the value's line in `sweep:`.
// Every check says file:line:column, the offending value and the fix; a parsed point is complete
// (its model lays out on its mesh) and carries its resolved configuration as YAML.
#include "core/experiment/experiment.hpp"
#include "core/experiment/backends.hpp"
#include "core/experiment/keys.hpp"
#include "core/experiment/result_paths.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "core/config/src/yaml_util.hpp"
#include "core/model/hf_config.hpp"
#include "core/plan/training.hpp"

namespace muonbed {

namespace {

using namespace yaml_util;
namespace fs = std::filesystem;

// The cluster an experiment without a `cluster:` key runs on.
constexpr const char* kDefaultCluster = "dgx-h100";

// Physical ranges of every size an experiment may give (README "Limits"). They keep all size
// arithmetic far inside 64 bits (elements x bytes x ranks), and every documented limit reachable
// in reasonable time: `muonbed plan` of a 16,384-rank llama-70B point takes ~15 s here, and its
// per-rank tables grow with ranks x ops.
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
constexpr std::int64_t kMaxWorld = std::int64_t{1} << 14;  // 16,384 ranks
// Sweeps larger than this are almost certainly a mistake (and slow to validate).
constexpr std::size_t kMaxSweepPoints = 10000;
// Work bound of a sweep's validation: points x tensors of the model. Each point holds its own
// model: ~1.4 us and ~130 bytes per tensor and point here, so the bound is ~14 s and ~1.4 GB
// (10,000 points of deepseek-v3 validate in ~20 s).
constexpr std::int64_t kMaxSweepTensorPoints = 10'000'000;
#else
// The fuzzer (tests/fuzz/) exercises the same checks at sizes that keep an input to
// milliseconds; the limits themselves are tested at their real values.
constexpr std::int64_t kMaxWorld = 256;
constexpr std::size_t kMaxSweepPoints = 16;
constexpr std::int64_t kMaxSweepTensorPoints = 20'000;
#endif
constexpr std::int64_t kMaxExtent = std::int64_t{1} << 24;          // any tensor dim: 16,777,216
constexpr std::int64_t kMaxTensorElements = std::int64_t{1} << 40;  // 1.1 T elements, 2.2 TB bf16
constexpr std::int64_t kMaxModelElements = std::int64_t{1} << 44;   // 17.6 T parameters
constexpr std::int64_t kMaxTensors = 65536;                         // tensors in one model
constexpr int kMaxLayers = 1000;
constexpr std::int64_t kMaxHeads = 65536;
constexpr std::int64_t kMaxExperts = 65536;
// Level-scheduled gradient sync repeats after lcm(level periods) steps; analytic and simulated
// step times average over that hyper-period exactly, so it must stay countable.
constexpr std::int64_t kMaxHyperPeriod = std::int64_t{1} << 20;
// Text fields that become parts of file names (name) or paths (output).
constexpr std::size_t kMaxNameBytes = 200;
constexpr std::size_t kMaxPathBytes = 4000;
constexpr std::size_t kMaxPathComponentBytes = 255;

// The keys each map allows come from the key table (core/experiment/keys.hpp), which the key
// reference (`muonbed keys`, docs/KEYS.md) prints: a key is known here exactly when it is
// documented there.
const std::vector<std::string> kTopKeys = experiment_keys_in("");
const std::vector<std::string> kMeshKeys = experiment_keys_in("mesh");
const std::vector<std::string> kDimKeys = experiment_keys_in("mesh.dims[]");
// The map form {NAME: {size, role}}: the list form's keys less the name.
const std::vector<std::string> kDimValueKeys = [] {
  std::vector<std::string> keys = kDimKeys;
  std::erase(keys, "name");
  return keys;
}();
const std::vector<std::string> kRoleNames = {"replicate", "fsdp", "tp", "ep", "pp"};
const std::vector<std::string> kKnownDimNames = {"dp_shard", "dp_replicate", "dp", "cp",
                                                 "tp",       "ep",           "pp"};
const std::vector<std::string> kModelKeys = experiment_keys_in("model");
const std::vector<std::string> kDenseKeys = experiment_keys_in("model.dense");
const std::vector<std::string> kMoeExtraKeys = experiment_keys_in("model.moe");
const std::vector<std::string> kParamKeys = experiment_keys_in("model.params[]");
const std::vector<std::string> kParallelKeys = experiment_keys_in("parallel");
const std::vector<std::string> kDenseOverEp = {"replicate", "shard"};
// torch.optim.Muon's names (core/model/optimizer.hpp), plus muonbed's additions.
const std::vector<std::string> kOptimizerKeys = experiment_keys_in("optimizer");
const std::vector<std::string> kAdamWKeys = experiment_keys_in("optimizer.adamw");
const std::vector<std::string> kQkClipKeys = experiment_keys_in("optimizer.qk_clip");
// Keys of earlier muonbed versions and what they are called now.
const std::vector<std::pair<std::string, std::string>> kRenamedOptimizerKeys = {
    {"coefficients", "ns_coefficients: keller | polar_express | [[a, b, c], ...]"},
    {"custom_coefficients", "ns_coefficients: [[a, b, c], ...] (one per step)"},
    {"update_scale", "adjust_lr_fn: original | match_rms_adamw | none"},
    {"ns_epsilon", "eps: 1e-7"},
    {"adamw_lr", "adamw: {lr: ...}"},
    {"adamw_beta1", "adamw: {betas: [beta1, beta2]}"},
    {"adamw_beta2", "adamw: {betas: [beta1, beta2]}"},
    {"adamw_eps", "adamw: {eps: ...}"}};
const std::vector<std::string> kRoutingKeys = experiment_keys_in("optimizer.routing");
const std::vector<std::string> kStrategyKeys = experiment_keys_in("strategy");
const std::vector<std::string> kGradSyncKeys = experiment_keys_in("strategy.grad_sync");
const std::vector<std::string> kSplitNsKeys = experiment_keys_in("strategy.split_ns");
const std::vector<std::string> kSimKeys = experiment_keys_in("sim");
const std::vector<std::string> kMemoryKeys = experiment_keys_in("memory");
const std::vector<std::string> kTrainingKeys = experiment_keys_in("training");
const std::vector<std::string> kMasterWeights = {"auto", "fp32", "none"};
// Per-rank memory an experiment may add (activations, reserved): at most 64 TiB, beyond any device.
constexpr double kMaxMemoryGiB = 65536;
const std::vector<std::string> kFidelities = {"step", "flow", "auto"};
const std::vector<std::string> kDTypes = {"fp32", "bf16", "fp16"};

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

// ---------------------------------------------------------------------------------------------
// Parsed sections. Besides the values they keep the YAML fields checks later point at.

struct MeshSection {
  DeviceMesh mesh;
  Field field;  // the mesh map
  std::vector<Field> name_fields;
  std::vector<Field> size_fields;
  std::optional<int> world_size;  // as given
  bool gpus_per_node_given = false;
};

enum class ModelKind { preset, hf, dense, moe, params };

struct ModelSection {
  ModelKind kind = ModelKind::preset;
  Field field;
  Model model;
  std::string preset;
  int layers_override = 0;
  std::int64_t experts_override = 0;  // hf only
  std::optional<DType> dtype_override;
  std::string hf_fields;  // hf: the config's fields as read (JSON), emitted inline when resolved
  std::int64_t hf_heads = 0, hf_kv_heads = 0;
  std::string name_override;
  DenseSpec dense;
  MoeSpec moe;
  bool explicit_layouts = false;
  std::vector<std::vector<Placement>> placements;  // per param when explicit_layouts
};

// ---------------------------------------------------------------------------------------------
// Cluster

// Cluster files read while parsing one experiment file (a sweep reads each once), by path.
using ClusterCache = std::map<std::string, ClusterSpec>;

ClusterSpec load_named_cluster(const Context& ctx, const Field& at, const std::string& name,
                               ClusterCache& clusters) {
  const std::string path = resolve_cluster_file(name, ctx.file);
  if (path.empty()) {
    if (const std::string folder = cluster_folder_at(name, ctx.file); !folder.empty())
      fail(ctx, at,
           "cluster '" + name + "' is a folder ('" + folder + "'), not a cluster YAML file",
           "give the profile's file, e.g. cluster: " + (fs::path(name) / "NAME.yaml").string());
    const std::vector<std::string> names = cluster_names(ctx.file);
    fail(ctx, at, "cluster '" + name + "' not found" + did_you_mean(name, names),
         "use one of: " + join(names) + ", or a path to a cluster YAML file");
  }
  const auto found = clusters.find(path);
  if (found != clusters.end()) return found->second;
  return clusters.emplace(path, load_cluster_file(path)).first->second;
}

ClusterSpec read_cluster(const Context& ctx, const MapReader& top, ClusterCache& clusters) {
  const Field* field = top.find("cluster");
  if (!field)
    return load_named_cluster(ctx, missing_field(top.node(), "cluster"), kDefaultCluster, clusters);
  if (field->value.IsScalar())
    return load_named_cluster(ctx, *field, field->value.Scalar(), clusters);
  if (!field->value.IsMap())
    fail(ctx, *field,
         "'cluster' must be a cluster name, a path or a map, got " + kind_of(field->value),
         "write cluster: dgx-h100, or cluster: {preset: dgx-h100, nodes: 4}");
  ClusterSpec spec;
  const YAML::Node& node = field->value;
  const YAML::Node preset = node["preset"];
  if (preset.IsDefined()) {
    const Field preset_field{YAML::Node(YAML::NodeType::Undefined), preset, "cluster.preset"};
    spec = load_named_cluster(ctx, preset_field, to_string_value(ctx, preset_field), clusters);
    read_cluster_map(ctx, node, "cluster", false, spec);
  } else {
    read_cluster_map(ctx, node, "cluster", true, spec);
    spec.origin = location_of(node, ctx.file);
  }
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Mesh

DimRole role_from_name(const std::string& text) {
  for (DimRole role : {DimRole::replicate, DimRole::fsdp, DimRole::tp, DimRole::ep, DimRole::pp})
    if (to_string(role) == text) return role;
  return DimRole::replicate;
}

MeshSection read_mesh(const Context& ctx, const Field& field, const ClusterSpec& cluster) {
  MeshSection out;
  out.field = field;
  const MapReader mesh(ctx, field, kMeshKeys);
  const Field& dims = mesh.require("dims", "dims: [{name: dp_shard, size: 8}]");

  std::vector<MeshDim> parsed;
  auto add_dim = [&](const Field& name_field, const std::string& name, const Field& size_field,
                     const Field* role_field) {
    if (!is_identifier(name))
      fail(ctx, name_field, "mesh dim name '" + name + "' is not a plain name",
           "use letters, digits, '_' or '-' (e.g. dp_shard, tp, data)");
    if (std::find(kMeshKeys.begin(), kMeshKeys.end(), name) != kMeshKeys.end())
      fail(ctx, name_field, "mesh dim name '" + name + "' is reserved (it is a mesh key)",
           "choose another name");
    for (std::size_t i = 0; i < parsed.size(); ++i)
      if (parsed[i].name == name)
        fail(ctx, name_field,
             "mesh dim '" + name + "' appears twice (first at line " +
                 std::to_string(location_of(out.name_fields[i], ctx.file).line) + ")",
             "give every mesh dim a distinct name");
    MeshDim dim;
    dim.name = name;
    dim.size = static_cast<int>(to_int(ctx, size_field, 1, kMaxWorld));
    if (role_field) {
      dim.role = role_from_name(to_choice(ctx, *role_field, kRoleNames));
    } else if (!default_role_for_name(name, dim.role)) {
      fail(ctx, name_field,
           "mesh dim '" + name + "' has no role" + did_you_mean(name, kKnownDimNames),
           "add role: one of " + join(kRoleNames) + " (the names " + join(kKnownDimNames) +
               " imply a role)");
    }
    parsed.push_back(dim);
    out.name_fields.push_back(name_field);
    out.size_fields.push_back(size_field);
  };

  if (dims.value.IsSequence()) {
    for (const Field& item : list_items(ctx, dims)) {
      const MapReader d(ctx, item, kDimKeys);
      const Field& name = d.require("name", "name: dp_shard");
      const Field& size = d.require("size", "size: 8");
      add_dim(name, to_string_value(ctx, name), size, d.find("role"));
    }
  } else if (dims.value.IsMap()) {
    for (const auto& entry : dims.value) {
      const std::string name = entry.first.IsScalar() ? entry.first.Scalar() : show(entry.first);
      const Field item{entry.first, entry.second, dims.path + "." + name};
      const Field name_field{entry.first, entry.first, item.path};
      if (entry.second.IsMap()) {
        const MapReader d(ctx, item, kDimValueKeys);
        add_dim(name_field, name, d.require("size", "size: 8"), d.find("role"));
      } else {
        add_dim(name_field, name, item, nullptr);
      }
    }
  } else {
    fail(ctx, dims, "'mesh.dims' must be a list or a map, got " + kind_of(dims.value),
         "write dims: [{name: dp_shard, size: 8}] or dims: {dp_shard: 8}");
  }
  if (parsed.empty())
    fail(ctx, dims, "'mesh.dims' is empty", "list at least one dim, e.g. dims: {dp_shard: 8}");

  std::int64_t world = 1;
  std::string product;
  for (const MeshDim& d : parsed) {
    world *= d.size;
    product += (product.empty() ? "" : " x ") + d.name + "=" + std::to_string(d.size);
    if (world > kMaxWorld)
      fail(ctx, dims,
           "the mesh has more than " + std::to_string(kMaxWorld) + " ranks (" + product + " x ...)",
           "use smaller dim sizes");
  }

  int gpus_per_node = cluster.gpus_per_node;
  if (const Field* g = mesh.find("gpus_per_node")) {
    const int given = static_cast<int>(to_int(ctx, *g, 1, 1024));
    if (given != cluster.gpus_per_node)
      fail(ctx, *g,
           "mesh.gpus_per_node is " + std::to_string(given) + " but cluster '" + cluster.name +
               "' has " + std::to_string(cluster.gpus_per_node) + " GPUs per node",
           "remove mesh.gpus_per_node (it comes from the cluster), or override the cluster: "
           "cluster: {preset: " +
               cluster.name + ", gpus_per_node: " + std::to_string(given) + "}");
    out.gpus_per_node_given = true;
  }
  if (const Field* w = mesh.find("world_size")) {
    const std::int64_t given = to_int(ctx, *w, 1, kMaxWorld);
    if (given != world)
      fail(ctx, *w,
           "the mesh has " + std::to_string(world) + " ranks (" + product +
               ") but mesh.world_size is " + std::to_string(given),
           "make the dim sizes multiply to " + std::to_string(given) +
               ", or set world_size: " + std::to_string(world));
    out.world_size = static_cast<int>(given);
  }
  if (cluster.nodes > 0 &&
      world > static_cast<std::int64_t>(cluster.nodes) * cluster.gpus_per_node) {
    const std::int64_t needed = (world + cluster.gpus_per_node - 1) / cluster.gpus_per_node;
    fail(ctx, dims,
         "the mesh needs " + std::to_string(world) + " GPUs (" + product + ") but cluster '" +
             cluster.name + "' has " + std::to_string(cluster.nodes) + " nodes x " +
             std::to_string(cluster.gpus_per_node) + " GPUs",
         "shrink the mesh, or give the cluster more nodes: cluster: {preset: " + cluster.name +
             ", nodes: " + std::to_string(needed) + "}");
  }
  try {
    out.mesh = DeviceMesh(parsed, gpus_per_node);
  } catch (const Error& e) {
    fail(ctx, dims, std::string("invalid mesh: ") + e.what(), "fix the mesh dims");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Model

DType read_dtype(const Context& ctx, const Field& field) {
  return dtype_from_string(to_choice(ctx, field, kDTypes));
}

std::vector<std::string> role_names() {
  std::vector<std::string> names;
  for (int r = 0; r <= static_cast<int>(ParamRole::other_matrix); ++r)
    names.emplace_back(to_string(static_cast<ParamRole>(r)));
  return names;
}

// Placement text: R | Replicate, S(d) | Shard(d), SS(d,f) | StridedShard(d,f), I(c) |
// Independent(c).
std::optional<Placement> parse_placement(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), ' '), text.end());
  if (text == "R" || text == "Replicate") return Placement::replicate();
  const std::size_t open = text.find('(');
  if (open == std::string::npos || text.back() != ')') return std::nullopt;
  const std::string head = text.substr(0, open);
  const std::vector<std::string> args = split(text.substr(open + 1, text.size() - open - 2), ',');
  std::vector<int> numbers;
  for (const std::string& a : args) {
    if (a.empty() || a.size() > 9 || !std::all_of(a.begin(), a.end(), ::isdigit))
      return std::nullopt;
    numbers.push_back(std::stoi(a));
  }
  if ((head == "S" || head == "Shard") && numbers.size() == 1) return Placement::shard(numbers[0]);
  if ((head == "SS" || head == "StridedShard") && numbers.size() == 2)
    return Placement::strided_shard(numbers[0], numbers[1]);
  if ((head == "I" || head == "Independent") && numbers.size() == 1)
    return Placement::independent(numbers[0]);
  return std::nullopt;
}

// A map {mesh dim name: placement}; unlisted dims replicate.
std::vector<Placement> read_placements(const Context& ctx, const Field& field,
                                       const DeviceMesh& mesh,
                                       const std::vector<std::int64_t>& shape) {
  std::vector<std::string> dim_names;
  for (const MeshDim& d : mesh.dims()) dim_names.push_back(d.name);
  const MapReader map(ctx, field, dim_names);
  std::vector<Placement> placements(mesh.ndims(), Placement::replicate());
  for (const Field& f : map.fields()) {
    const int dim = mesh.find(f.key.Scalar());
    const std::string text = to_string_value(ctx, f);
    const std::optional<Placement> p = parse_placement(text);
    if (!p)
      fail(ctx, f, "bad placement '" + text + "' for mesh dim '" + f.key.Scalar() + "'",
           "use R (replicate), S(d) (shard tensor dim d), SS(d,f) (strided shard) or I(c) "
           "(only at coordinate c)");
    if (p->is_shard() && p->tensor_dim >= static_cast<int>(shape.size()))
      fail(ctx, f,
           "placement '" + text + "' shards tensor dim " + std::to_string(p->tensor_dim) +
               " but the shape " + shape_text(shape) + " has " + std::to_string(shape.size()) +
               " dims",
           "use a tensor dim in 0.." + std::to_string(shape.size() - 1));
    if (p->kind == PlacementKind::strided_shard && p->split_factor < 1)
      fail(ctx, f, "placement '" + text + "' has split factor 0", "use a split factor >= 1");
    if (p->kind == PlacementKind::independent && p->coord >= mesh.size(dim))
      fail(ctx, f,
           "placement '" + text + "' names coordinate " + std::to_string(p->coord) +
               " but mesh dim '" + f.key.Scalar() + "' has size " + std::to_string(mesh.size(dim)),
           "use a coordinate in 0.." + std::to_string(mesh.size(dim) - 1));
    placements[dim] = *p;
  }
  return placements;
}

void read_dense_fields(const Context& ctx, const MapReader& m, DenseSpec& s) {
  m.read("name", s.name);
  m.read("hidden", s.hidden, 1, kMaxExtent);
  m.read("layers", s.layers, 1, kMaxLayers);
  m.read("heads", s.heads, 1, kMaxHeads);
  m.read("kv_heads", s.kv_heads, 1, kMaxHeads);
  m.read("ffn", s.ffn, 1, kMaxExtent);
  m.read("vocab", s.vocab, 1, kMaxExtent);
  m.read("head_dim", s.head_dim, 1, kMaxHeads);
  m.read("gated_mlp", s.gated_mlp);
  m.read("qkv_bias", s.qkv_bias);
  m.read("tied_embeddings", s.tied_embeddings);
  m.read("layernorm_bias", s.layernorm_bias);
  m.read("linear_bias", s.linear_bias);
  m.read("max_positions", s.max_positions, 0, kMaxExtent);
  if (const Field* f = m.find("dtype")) s.dtype = read_dtype(ctx, *f);
  const std::int64_t kv = s.kv_heads > 0 ? s.kv_heads : s.heads;
  if (s.heads % kv != 0)
    fail(ctx, *m.find("kv_heads"),
         "heads (" + std::to_string(s.heads) + ") is not a multiple of kv_heads (" +
             std::to_string(kv) + ")",
         "use kv_heads dividing heads: " + divisors_text(s.heads, s.heads));
  if (s.head_dim == 0 && s.hidden % s.heads != 0)
    fail(ctx, *m.find("heads"),
         "hidden (" + std::to_string(s.hidden) + ") is not a multiple of heads (" +
             std::to_string(s.heads) + ")",
         "use heads dividing hidden, or give head_dim explicitly");
}

// Every tensor of a model within the physical ranges (each dim <= kMaxExtent, each tensor <=
// kMaxTensorElements elements, the model <= kMaxModelElements and kMaxTensors tensors), with
// overflow-checked products: a derived shape (heads x head_dim, experts x ffn) can exceed what
// each input allows. Errors point at the tensor's shape (model.params) or at the model section.
void check_model_size(const Context& ctx, const Field& model_field,
                      const std::vector<Field>& shape_fields, const Model& model) {
  if (static_cast<std::int64_t>(model.params.size()) > kMaxTensors)
    fail(ctx, model_field,
         "model '" + model.name + "' has " + std::to_string(model.params.size()) +
             " tensors, more than " + std::to_string(kMaxTensors),
         "use fewer layers (at most " + std::to_string(kMaxLayers) + ") or fewer parameters");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const Parameter& p = model.params[i];
    const Field& at = i < shape_fields.size() ? shape_fields[i] : model_field;
    std::int64_t numel = 1;
    bool overflow = false;
    for (std::int64_t extent : p.shape) {
      if (extent < 1 || extent > kMaxExtent)
        fail(ctx, at,
             "tensor '" + p.name + "' of model '" + model.name + "' has shape " +
                 shape_text(p.shape) + ": a dim of " + std::to_string(extent) + " is outside 1.." +
                 std::to_string(kMaxExtent),
             "use dims in 1.." + std::to_string(kMaxExtent) +
                 " (the model's widths, heads x head_dim and experts x expert_ffn all count)");
      overflow = overflow || __builtin_mul_overflow(numel, extent, &numel);
    }
    if (overflow || numel > kMaxTensorElements)
      fail(ctx, at,
           "tensor '" + p.name + "' of model '" + model.name + "' has shape " +
               shape_text(p.shape) + ", more than " + std::to_string(kMaxTensorElements) +
               " (2^40) elements",
           "use smaller dims: no GPU holds a tensor of 2^40 elements (2.2 TB in bf16)");
    total += numel;  // at most kMaxTensors x 2^40 = 2^56: no overflow
    if (total > kMaxModelElements)
      fail(ctx, at,
           "model '" + model.name + "' has more than " + std::to_string(kMaxModelElements) +
               " (2^44, 17.6 trillion) parameters (reached at tensor '" + p.name + "')",
           "use a smaller model: fewer layers, experts or narrower dims");
  }
}

// model.hf_config given inline: the YAML map as the JSON object a config.json would hold. A
// quoted scalar is a string; a plain one is read as YAML's core schema reads it (true/false,
// null/~, an integer, a number, else a string).
nlohmann::json yaml_to_json(const Context& ctx, const YAML::Node& node, const std::string& path) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "!") return text;
      if (text == "true" || text == "True" || text == "TRUE") return true;
      if (text == "false" || text == "False" || text == "FALSE") return false;
      if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL")
        return nullptr;
      std::int64_t integer = 0;
      const char* end = text.data() + text.size();
      if (const auto r = std::from_chars(text.data(), end, integer);
          r.ec == std::errc() && r.ptr == end)
        return integer;
      char* stop = nullptr;
      const double number = std::strtod(text.c_str(), &stop);
      if (stop == text.c_str() + text.size() && std::isfinite(number)) return number;
      return text;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json list = nlohmann::json::array();
      for (std::size_t i = 0; i < node.size(); ++i)
        list.push_back(yaml_to_json(ctx, node[i], path + "[" + std::to_string(i) + "]"));
      return list;
    }
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar())
          fail(ctx, entry.first, "a key of '" + path + "' is " + kind_of(entry.first),
               "use plain names as keys, as config.json does");
        const std::string key = entry.first.Scalar();
        if (object.contains(key))
          fail(ctx, entry.first, "key '" + key + "' appears twice in '" + path + "'",
               "keep one of them");
        object[key] = yaml_to_json(ctx, entry.second, path + "." + key);
      }
      return object;
    }
  }
  return nullptr;
}

// The read fields of a config (JSON) as YAML, for the resolved configuration: strings quoted, so
// that yaml_to_json reads every value back with its JSON type.
void emit_json_as_yaml(YAML::Emitter& out, const nlohmann::ordered_json& value) {
  if (value.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [key, item] : value.items()) {
      out << YAML::Key << key << YAML::Value;
      emit_json_as_yaml(out, item);
    }
    out << YAML::EndMap;
  } else if (value.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& item : value) emit_json_as_yaml(out, item);
    out << YAML::EndSeq;
  } else if (value.is_string()) {
    out << YAML::DoubleQuoted << value.get<std::string>();
  } else if (value.is_boolean()) {
    out << value.get<bool>();
  } else if (value.is_number_integer()) {
    out << value.get<std::int64_t>();
  } else if (value.is_number_float()) {
    out << format_number(value.get<double>());
  } else {
    out << YAML::Null;
  }
}

// The YAML node an inline config's field path ("text_config.num_attention_heads", "a[2]") names,
// or `fallback` when the field is absent (a missing field's error points at the map).
YAML::Node inline_field(const YAML::Node& map, const std::string& path,
                        const YAML::Node& fallback) {
  YAML::Node node = map;
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const std::size_t bracket = part.find('[');
    const std::string key = part.substr(0, bracket);
    if (!node.IsMap()) return fallback;
    YAML::Node next;
    for (const auto& entry : node)
      if (entry.first.IsScalar() && entry.first.Scalar() == key) next = entry.second;
    if (!next.IsDefined()) return fallback;
    node = next;
    if (bracket != std::string::npos) {
      const std::size_t index = std::strtoull(part.c_str() + bracket + 1, nullptr, 10);
      if (!node.IsSequence() || index >= node.size()) return fallback;
      node = node[index];
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return node;
}

// model.hf_config: a path to a config.json (relative to the experiment file) or its fields
// inline; model.layers, model.experts and model.dtype override it (core/model/hf_config.hpp).
void read_hf_model(const Context& ctx, const MapReader& m, const Field& chosen, ModelSection& out) {
  out.kind = ModelKind::hf;
  HfOverrides overrides;
  if (const Field* f = m.find("layers")) {
    overrides.layers = to_int(ctx, *f, 1, kMaxLayers);
    out.layers_override = static_cast<int>(overrides.layers);
  }
  if (const Field* f = m.find("experts")) {
    overrides.experts = to_int(ctx, *f, 1, kMaxExperts);
    out.experts_override = overrides.experts;
  }
  if (const Field* f = m.find("dtype")) out.dtype_override = overrides.dtype = read_dtype(ctx, *f);
  if (!chosen.value.IsScalar() && !chosen.value.IsMap())
    fail(ctx, chosen, "'model.hf_config' must be a path or a map, got " + kind_of(chosen.value),
         "write hf_config: path/to/config.json (relative to this file), or its fields as a map");
  HfModel hf;
  try {
    if (chosen.value.IsScalar()) {
      const std::string given = to_string_value(ctx, chosen);
      fs::path path(given);
      if (path.is_relative() && !given.empty()) path = fs::path(ctx.file).parent_path() / path;
      hf = load_hf_config(path.lexically_normal().string(), overrides);
    } else {
      const std::string text = yaml_to_json(ctx, chosen.value, "model.hf_config").dump();
      hf = model_from_hf_config(text, "model.hf_config (inline)", overrides);
    }
  } catch (const HfOverrideError& e) {
    fail(ctx, *m.find(e.field()), "model." + e.field() + " " + e.problem(), e.fix());
  } catch (const HfConfigError& e) {
    const YAML::Node at = chosen.value.IsMap() && !e.field().empty()
                              ? inline_field(chosen.value, e.field(), chosen.value)
                              : chosen.value;
    fail(ctx, at, "model.hf_config: " + e.message(), e.fix());
  }
  out.model = std::move(hf.model);
  out.hf_fields = hf.fields;
  out.hf_heads = hf.heads;
  out.hf_kv_heads = hf.kv_heads;
}

ModelSection read_model(const Context& ctx, const Field& field, const DeviceMesh& mesh) {
  ModelSection out;
  out.field = field;
  std::vector<Field> shape_fields;  // model.params: each tensor's shape, for size errors
  const MapReader m(ctx, field, kModelKeys);
  const Field* kinds[] = {m.find("preset"), m.find("hf_config"), m.find("dense"), m.find("moe"),
                          m.find("params")};
  const Field* chosen = nullptr;
  for (const Field* k : kinds) {
    if (!k) continue;
    if (chosen)
      fail(ctx, k->key,
           "model has both '" + chosen->key.Scalar() + "' and '" + k->key.Scalar() + "'",
           "give exactly one of preset, hf_config, dense, moe or params");
    chosen = k;
  }
  if (!chosen)
    fail(ctx, field, "model has none of preset, hf_config, dense, moe or params",
         "add e.g. 'preset: llama-7b' under model (valid presets: " + join(preset_names()) +
             "), or 'hf_config: path/to/config.json'");
  const std::string kind = chosen->key.Scalar();
  for (const char* key : {"layers", "dtype"})
    if (kind != "preset" && kind != "hf_config" && m.has(key))
      fail(ctx, m.find(key)->key,
           "'model." + std::string(key) + "' applies only with model.preset or model.hf_config",
           "put " + std::string(key) + " inside model." + kind);
  if (kind != "hf_config" && m.has("experts"))
    fail(ctx, m.find("experts")->key, "'model.experts' applies only with model.hf_config",
         kind == "moe" ? "put experts inside model.moe" : "remove it");
  if (kind != "params" && m.has("placements"))
    fail(ctx, m.find("placements")->key, "'model.placements' applies only with model.params",
         "remove it; layouts of generated models come from the parallel rules");
  m.read("name", out.name_override);

  if (kind == "preset") {
    out.kind = ModelKind::preset;
    out.preset = to_string_value(ctx, *chosen);
    std::optional<Model> model = find_preset(out.preset);
    if (!model)
      fail(ctx, *chosen,
           "unknown model preset '" + out.preset + "'" + did_you_mean(out.preset, preset_names()),
           "use one of: " + join(preset_names()) + ", or describe the model with dense/moe/params");
    out.model = std::move(*model);
    if (const Field* f = m.find("layers")) {
      out.layers_override = static_cast<int>(to_int(ctx, *f, 1, out.model.num_layers));
      // Keep the first blocks (and the non-block parameters): a quick, shallower variant.
      std::erase_if(out.model.params,
                    [&](const Parameter& p) { return p.layer >= out.layers_override; });
      out.model.num_layers = out.layers_override;
    }
    if (const Field* f = m.find("dtype")) {
      out.dtype_override = read_dtype(ctx, *f);
      for (Parameter& p : out.model.params) p.dtype = *out.dtype_override;
    }
  } else if (kind == "hf_config") {
    read_hf_model(ctx, m, *chosen, out);
  } else if (kind == "dense" || kind == "moe") {
    const bool moe = kind == "moe";
    out.kind = moe ? ModelKind::moe : ModelKind::dense;
    const MapReader d(ctx, *chosen, moe ? concat(kDenseKeys, kMoeExtraKeys) : kDenseKeys);
    d.require("hidden", "hidden: 4096");
    d.require("layers", "layers: 32");
    d.require("heads", "heads: 32");
    d.require("vocab", "vocab: 32000");
    if (moe) {
      d.require("experts", "experts: 64");
      d.require("expert_ffn", "expert_ffn: 1408");
    } else {
      d.require("ffn", "ffn: 11008");
    }
    DenseSpec& s = moe ? out.moe.base : out.dense;
    s.name = moe ? "custom-moe" : "custom-dense";
    read_dense_fields(ctx, d, s);
    if (moe) {
      d.read("experts", out.moe.experts, 1, kMaxExperts);
      d.read("expert_ffn", out.moe.expert_ffn, 1, kMaxExtent);
      d.read("shared_experts", out.moe.shared_experts, 0, 1024);
      d.read("dense_layers", out.moe.dense_layers, 0, s.layers);
      if (out.moe.dense_layers > 0 && s.ffn <= 0)
        fail(ctx, *d.find("dense_layers"), "dense_layers > 0 needs the dense MLP width 'ffn'",
             "add ffn: N under model.moe, or set dense_layers: 0");
    }
    try {
      out.model = moe ? make_moe(out.moe) : make_dense(out.dense);
    } catch (const Error& e) {
      fail(ctx, *chosen, e.what(), "fix the model." + kind + " numbers");
    }
  } else {
    out.kind = ModelKind::params;
    out.model.name = "custom";
    const std::vector<Field> items = list_items(ctx, *chosen);
    if (items.empty())
      fail(ctx, *chosen, "'model.params' is an empty list",
           "list parameters, e.g. - {name: w, shape: [1024, 1024]}");
    if (static_cast<std::int64_t>(items.size()) > kMaxTensors)
      fail(ctx, *chosen,
           "'model.params' lists " + std::to_string(items.size()) + " tensors, more than " +
               std::to_string(kMaxTensors),
           "list at most " + std::to_string(kMaxTensors) +
               " tensors, or describe the model with model.dense or model.moe");
    const std::vector<std::string> roles = role_names();
    std::vector<Field> placement_fields;
    std::vector<Field> name_fields;
    std::unordered_map<std::string, std::size_t> name_index;
    int max_layer = -1;
    for (const Field& item : items) {
      const MapReader p(ctx, item, kParamKeys);
      Parameter param;
      const Field& name = p.require("name", "name: layers.0.attn.q");
      param.name = to_string_value(ctx, name);
      if (param.name.empty()) fail(ctx, name, "a parameter has an empty name", "name it");
      if (const auto it = name_index.find(param.name); it != name_index.end())
        fail(ctx, name,
             "parameter name " + quote(param.name) + " appears twice (first at line " +
                 std::to_string(location_of(name_fields[it->second], ctx.file).line) + ")",
             "give every parameter a distinct name");
      name_index.emplace(param.name, name_fields.size());
      name_fields.push_back(name);
      const Field& shape = p.require("shape", "shape: [4096, 4096]");
      shape_fields.push_back(shape);
      const std::vector<Field> extents = list_items(ctx, shape);
      if (extents.empty() || extents.size() > 3)
        fail(ctx, shape,
             "shape of '" + param.name + "' has " + std::to_string(extents.size()) + " dims",
             "use 1 to 3 dims: [n] (vector), [rows, cols] (matrix), [batch, rows, cols] (stack)");
      for (const Field& e : extents) param.shape.push_back(to_int(ctx, e, 1, kMaxExtent));
      param.role = param.shape.size() == 1 ? ParamRole::norm : ParamRole::other_matrix;
      if (const Field* r = p.find("role"))
        param.role = param_role_from_string(to_choice(ctx, *r, roles));
      if (const Field* dt = p.find("dtype")) param.dtype = read_dtype(ctx, *dt);
      p.read("layer", param.layer, -1, kMaxLayers - 1);
      max_layer = std::max(max_layer, param.layer);
      const Field* pl = p.find("placements");
      placement_fields.push_back(pl ? *pl : missing_field(item.value, item.path + ".placements"));
      out.model.params.push_back(std::move(param));
    }
    out.model.num_layers = max_layer + 1;
    const Field* defaults = m.find("placements");
    out.explicit_layouts = defaults != nullptr;
    for (const Field& f : placement_fields) out.explicit_layouts |= f.key.IsDefined();
    if (out.explicit_layouts) {
      for (std::size_t i = 0; i < out.model.params.size(); ++i) {
        const Field& f = placement_fields[i].key.IsDefined() ? placement_fields[i]
                         : defaults                          ? *defaults
                                                             : placement_fields[i];
        if (!f.key.IsDefined()) {
          out.placements.emplace_back(mesh.ndims(), Placement::replicate());
          continue;
        }
        out.placements.push_back(read_placements(ctx, f, mesh, out.model.params[i].shape));
        try {
          TensorLayout(mesh, out.model.params[i].shape, out.placements.back());
        } catch (const Error& e) {
          fail(ctx, f, "placements of '" + out.model.params[i].name + "': " + e.what(),
               "fix the placements");
        }
      }
    }
  }
  if (!out.name_override.empty()) out.model.name = out.name_override;
  check_model_size(ctx, *chosen, shape_fields, out.model);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Parallel rules, optimizer, strategy

const Parameter* find_param(const Model& model, const std::string& name) {
  for (const Parameter& p : model.params)
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<std::string> param_names(const Model& model) {
  std::vector<std::string> names;
  for (const Parameter& p : model.params) names.push_back(p.name);
  return names;
}

[[noreturn]] void unknown_param(const Context& ctx, const Field& at, const Model& model,
                                const std::string& name, const std::string& what) {
  const std::vector<std::string> names = param_names(model);
  fail(ctx, at,
       what + " names " + quote(name) + ", which is not a parameter of model '" + model.name + "'" +
           did_you_mean(name, names),
       "use a parameter name such as '" + (names.size() > 1 ? names[1] : names.front()) +
           "' (run 'muonbed validate --params FILE' to list them)");
}

void require_param(const Context& ctx, const Field& at, const Model& model, const std::string& name,
                   const std::string& what) {
  if (!find_param(model, name)) unknown_param(ctx, at, model, name, what);
}

void read_parallel(const Context& ctx, const MapReader& top, const Model& model,
                   ParallelRules& rules) {
  const Field* field = top.find("parallel");
  if (!field) return;
  const MapReader p(ctx, *field, kParallelKeys);
  p.read("fsdp_tensor_dim", rules.fsdp_tensor_dim, 0, 1);
  p.read("tp_shard_embeddings", rules.tp_shard_embeddings);
  if (std::string text; p.read_choice("dense_over_ep", text, kDenseOverEp))
    rules.dense_over_ep = text == "shard" ? DenseOverEp::shard : DenseOverEp::replicate;
  if (const Field* t = p.find("tp_dim_per_param")) {
    std::unordered_map<std::string_view, const Parameter*> by_name;
    for (const Parameter& param : model.params) by_name.emplace(param.name, &param);
    for (const Field& f : map_entries(ctx, *t, "tp_dim_per_param: {layers.0.attn.o: 1}")) {
      const std::string name = f.key.Scalar();
      const auto found = by_name.find(name);
      if (found == by_name.end())
        unknown_param(ctx, Field{f.key, f.key, f.path}, model, name, "tp_dim_per_param");
      const Parameter* param = found->second;
      const int ndim = static_cast<int>(param->shape.size());
      const std::int64_t dim = to_int(ctx, f, 0);
      if (dim >= ndim)
        fail(ctx, f,
             "tp_dim_per_param['" + name + "'] = " + std::to_string(dim) +
                 " is out of range for shape " + shape_text(param->shape),
             "use a tensor dim in 0.." + std::to_string(ndim - 1));
      rules.tp_dim_per_param[name] = static_cast<int>(dim);
    }
  }
}

bool uses_mla(const Model& model) {
  return std::any_of(model.params.begin(), model.params.end(), [](const Parameter& p) {
    return p.role == ParamRole::attn_q_up || p.role == ParamRole::attn_kv_up;
  });
}

void read_optimizer(const Context& ctx, const MapReader& top, const Model& model,
                    OptimizerConfig& opt, RoutingRules& routing) {
  const Field* field = top.find("optimizer");
  if (!field) return;
  if (field->value.IsMap())
    for (const auto& entry : field->value) {
      if (!entry.first.IsScalar()) continue;
      for (const auto& [old_key, now] : kRenamedOptimizerKeys)
        if (entry.first.Scalar() == old_key)
          fail(ctx, entry.first,
               "'optimizer." + old_key +
                   "' was renamed (muonbed follows torch.optim.Muon's and AdamW's names)",
               "write " + now);
    }
  const MapReader o(ctx, *field, kOptimizerKeys);
  constexpr double kHuge = std::numeric_limits<double>::max();
  MuonConfig& muon = opt.muon;
  o.read("lr", muon.lr, 0, kHuge, true);
  o.read("weight_decay", muon.weight_decay, 0, kHuge);
  if (const Field* f = o.find("momentum")) {
    muon.momentum = to_double(ctx, *f, 0, 1);
    if (muon.momentum >= 1)
      fail(ctx, *f, "'optimizer.momentum' = " + f->value.Scalar() + " must be below 1",
           "use a momentum in [0, 1), typically 0.95");
  }
  o.read("nesterov", muon.nesterov);
  if (const Field* f = o.find("momentum_form"))
    muon.momentum_form = momentum_form_from_string(to_choice(ctx, *f, {"lerp", "classic"}));
  o.read("ns_steps", muon.ns_steps, 1, 100);
  o.read("eps", muon.eps, 0, 1);
  if (const Field* f = o.find("adjust_lr_fn"))
    muon.adjust_lr_fn =
        lr_scale_rule_from_string(to_choice(ctx, *f, {"original", "match_rms_adamw", "none"}));
  if (const Field* f = o.find("comm_dtype")) opt.comm_dtype = read_dtype(ctx, *f);

  // ns_coefficients: a set's name, one torch-style [a, b, c] for every step, or one per step.
  if (const Field* f = o.find("ns_coefficients")) {
    const std::string example = "ns_coefficients: [[3.4445, -4.775, 2.0315], ...]";
    if (f->value.IsScalar()) {
      muon.ns_coefficients = to_choice(ctx, *f, {"keller", "keller_jordan", "polar_express"});
      if (muon.ns_coefficients == "keller_jordan") muon.ns_coefficients = "keller";
    } else {
      const std::vector<Field> items = list_items(ctx, *f);
      const auto read_triple = [&](const Field& step) {
        const std::vector<Field> abc = list_items(ctx, step);
        if (abc.size() != 3)
          fail(ctx, step,
               "'" + step.path + "' has " + std::to_string(abc.size()) + " numbers, not 3",
               "write each step as [a, b, c], e.g. " + example);
        return NsStepCoefficients{to_double(ctx, abc[0], -1e6, 1e6),
                                  to_double(ctx, abc[1], -1e6, 1e6),
                                  to_double(ctx, abc[2], -1e6, 1e6)};
      };
      if (items.empty())
        fail(ctx, *f, "'optimizer.ns_coefficients' is an empty list",
             "name a set (keller, polar_express) or give " + example);
      muon.ns_coefficients = "custom";
      if (!items.front().value.IsSequence()) {
        // torch.optim.Muon's form: one (a, b, c) used at every step.
        const NsStepCoefficients abc = read_triple(*f);
        muon.custom_coefficients.assign(static_cast<std::size_t>(muon.ns_steps), abc);
      } else {
        for (const Field& step : items) muon.custom_coefficients.push_back(read_triple(step));
        if (static_cast<int>(items.size()) != muon.ns_steps) {
          if (o.find("ns_steps"))
            fail(ctx, *f,
                 "ns_coefficients lists " + std::to_string(items.size()) +
                     " steps but ns_steps is " + std::to_string(muon.ns_steps),
                 "give one [a, b, c] per Newton-Schulz step, or set ns_steps: " +
                     std::to_string(items.size()));
          muon.ns_steps = static_cast<int>(items.size());
        }
      }
    }
  }

  if (const Field* a = o.find("adamw")) {
    const MapReader ar(ctx, *a, kAdamWKeys);
    ar.read("lr", opt.adamw.lr, 0, kHuge, true);
    ar.read("eps", opt.adamw.eps, 0, 1);
    ar.read("weight_decay", opt.adamw.weight_decay, 0, kHuge);
    if (const Field* f = ar.find("betas")) {
      const std::vector<Field> betas = list_items(ctx, *f);
      if (betas.size() != 2)
        fail(ctx, *f, "'optimizer.adamw.betas' has " + std::to_string(betas.size()) + " values",
             "write betas: [0.9, 0.999] (beta1, beta2)");
      double* out[2] = {&opt.adamw.beta1, &opt.adamw.beta2};
      for (int i = 0; i < 2; ++i) {
        *out[i] = to_double(ctx, betas[i], 0, 1);
        if (*out[i] >= 1)
          fail(ctx, betas[i],
               "'" + betas[i].path + "' = " + betas[i].value.Scalar() + " must be below 1",
               "use a value in [0, 1)");
      }
    }
  }
  if (const Field* q = o.find("qk_clip")) {
    const MapReader qr(ctx, *q, kQkClipKeys);
    qr.read("enabled", opt.qk_clip.enabled);
    qr.read("tau", opt.qk_clip.tau, 0, kHuge, true);
    qr.read("head_dim", opt.qk_clip.head_dim, 0, std::int64_t{1} << 20);
    if (opt.qk_clip.enabled && opt.qk_clip.head_dim == 0) {
      // The model's attention head size, when the model says it.
      opt.qk_clip.head_dim = model.head_dim;
      if (opt.qk_clip.head_dim <= 0 && !uses_mla(model))
        fail(ctx, *q, "qk_clip is enabled but the head size is unknown for this model",
             "give optimizer.qk_clip.head_dim (rows per attention head of attn_q / attn_k)");
    }
    // MuonClip of MLA rescales the head blocks of q_b and kv_b (Kimi K2); muonbed clips attn_q
    // and attn_k only, and would silently clip nothing here.
    if (opt.qk_clip.enabled && uses_mla(model))
      fail(ctx, *q,
           "qk_clip is enabled, but model '" + model.name +
               "' uses multi-head latent attention (attn_q_up / attn_kv_up), which muonbed's "
               "QK-clip does not cover",
           "set qk_clip: {enabled: false}");
  }

  if (const Field* r = o.find("routing")) {
    const MapReader rr(ctx, *r, kRoutingKeys);
    rr.read("embeddings_to_adamw", routing.embeddings_to_adamw);
    rr.read("lm_head_to_adamw", routing.lm_head_to_adamw);
    rr.read("router_to_adamw", routing.router_to_adamw);
    if (const Field* f = rr.find("force_adamw")) {
      for (const Field& item : list_items(ctx, *f)) {
        const std::string name = to_string_value(ctx, item);
        require_param(ctx, item, model, name, "optimizer.routing.force_adamw");
        routing.force_adamw.push_back(name);
      }
    }
  }
}

// Where a strategy option was given, and whether any point reads it (see read_strategy and
// check_strategy_options).
struct OptionUse {
  Context ctx;                       // the first point that gives it
  YAML::Node at;                     // its key there (or its sweep value)
  std::set<std::string> strategies;  // the strategies of the points that give it
  bool read = false;                 // some point's strategy reads it
};
using OptionUses = std::map<std::string, OptionUse>;

void read_strategy(const Context& ctx, const MapReader& top, const MeshSection& mesh,
                   const Model& model, StrategyOptions& s, OptionUses& uses) {
  const Field* field = top.find("strategy");
  if (!field) return;
  const MapReader st(ctx, *field, kStrategyKeys);

  if (st.find("preset")) {  // the preset first; the other keys override it
    std::string preset;
    st.read_choice("preset", preset, strategy_preset_names());
    s = strategy_preset(preset, mesh.mesh.world_size());
  }
  st.read_choice("name", s.name, strategy_names());
  std::vector<std::string> policies = assign_policy_names();
  if (std::find(policies.begin(), policies.end(), "explicit") == policies.end())
    policies.push_back("explicit");  // made by make_explicit_assign_policy, not the registry
  st.read_choice("assign", s.assign, policies);
  st.read("async_gpu_parallelism", s.async_gpu_parallelism);
  st.read("prefetch_count", s.prefetch_count, 0, 1024);
  if (const Field* g = st.find("gather")) {
    s.gather = to_string_value(ctx, *g);
    try {
      make_gather_policy(s.gather);
    } catch (const Error& e) {
      fail(ctx, *g,
           "unknown gather policy '" + s.gather + "'" +
               did_you_mean(s.gather, {"hierarchical", "rails", "flat"}),
           std::string("use hierarchical, rails or flat (") + e.what() + ")");
    }
  }
  st.read("chunk_size", s.chunk_size, 1, 1 << 20);
  st.read("max_chunks_in_flight", s.max_chunks_in_flight, 1, 1 << 20);
  st.read("small_param_threshold", s.small_param_threshold, 0);
  st.read("comm_lanes", s.comm_lanes, 1, 4096);
  st.read_choice("order", s.order, {"plan", "lpt"});
  st.read("chunk_by_shape", s.chunk_by_shape);
  st.read_choice("chunk_sizing", s.chunk_sizing, {"count", "ns_cost"});
  if (const Field* f = st.find("split_ns")) {
    // split_ns: true | false, or a map (its presence enables it unless enabled: false).
    if (f->value.IsScalar()) {
      s.split_ns.enabled = to_bool(ctx, *f);
    } else {
      const MapReader sn(ctx, *f, kSplitNsKeys);
      s.split_ns.enabled = true;
      sn.read("enabled", s.split_ns.enabled);
      sn.read("max_members", s.split_ns.max_members, 2, 16384);
      sn.read("threshold", s.split_ns.threshold, 0.0, 1e9);
    }
    if (s.split_ns.enabled && !strategy_reads_option(s, "split_ns"))
      fail(ctx, f->key,
           "'strategy.split_ns' needs a strategy whose staged gathers leave each member of a "
           "split group its slice (" +
               strategies_reading_option("split_ns") + "), not '" + s.name + "'",
           "set strategy.name: owner, or remove split_ns");
    if (s.split_ns.enabled && s.gather != "hierarchical" && s.gather != "rails" &&
        s.gather != "flat")
      fail(ctx, f->key, "'strategy.split_ns' needs a staged gather, not '" + s.gather + "'",
           "set strategy.gather: hierarchical, rails or flat, or remove split_ns");
  }
  if (const Field* f = st.find("explicit_owners")) {
    if (s.assign != "explicit")
      fail(ctx, f->key,
           "'strategy.explicit_owners' is given but strategy.assign is '" + s.assign + "'",
           "set assign: explicit, or remove explicit_owners");
    for (const Field& owner :
         map_entries(ctx, *f, "explicit_owners: {layers.0.attn.q: 0, layers.0.attn.k: 1}"))
      s.explicit_owners[owner.key.Scalar()] =
          static_cast<int>(to_int(ctx, owner, 0, mesh.mesh.world_size() - 1));
  } else if (s.assign == "explicit") {
    fail(ctx, *st.find("assign"), "strategy.assign: explicit needs 'explicit_owners'",
         "add explicit_owners: {PARAM_NAME: RANK, ...} under strategy, one entry per Muon matrix");
  }
  if (const Field* g = st.find("grad_sync")) {
    const MapReader gs(ctx, *g, kGradSyncKeys);
    gs.read("enabled", s.grad_sync.enabled);
    if (const Field* lp = gs.find("level_periods")) {
      const std::vector<Field> items = list_items(ctx, *lp);
      if (items.empty())
        fail(ctx, *lp, "'strategy.grad_sync.level_periods' is empty",
             "give one period per level, e.g. level_periods: [1, 2, 4]");
      const int max_levels = std::max(1, model.num_layers);
      if (static_cast<int>(items.size()) > max_levels)
        fail(ctx, *lp,
             "grad_sync has " + std::to_string(items.size()) + " levels but model '" + model.name +
                 "' has only " + std::to_string(model.num_layers) + " layers to split into levels",
             "use at most " + std::to_string(max_levels) + " level periods");
      s.grad_sync.level_periods.clear();
      std::int64_t hyper_period = 1;
      for (const Field& item : items) {
        const std::int64_t period = to_int(ctx, item, 1, kMaxHyperPeriod);
        s.grad_sync.level_periods.push_back(static_cast<int>(period));
        // Both factors are at most 2^20, so the product cannot overflow.
        hyper_period = hyper_period / std::gcd(hyper_period, period) * period;
        if (hyper_period > kMaxHyperPeriod)
          fail(ctx, item,
               "the level periods up to here repeat only every " + std::to_string(hyper_period) +
                   " steps (their least common multiple), more than " +
                   std::to_string(kMaxHyperPeriod) + " (2^20)",
               "use periods whose least common multiple is at most " +
                   std::to_string(kMaxHyperPeriod) +
                   ", e.g. powers of two such as [1, 2, 4, 8] (coprime periods multiply)");
      }
    }
  }
  // Which options this point gives a setting that its strategy reads (an option no point reads
  // is an error: check_strategy_options), then the unread ones back to their defaults.
  for (const std::string& key : kStrategyKeys) {
    const Field* f = st.find(key);
    if (f == nullptr || strategy_option_is_default(s, key)) continue;
    auto [it, fresh] = uses.try_emplace(key);
    if (fresh) {
      it->second.ctx = ctx;
      // A swept option's key is written into the tree without a mark: point at its value in
      // `sweep:` then.
      it->second.at = f->key.IsDefined() && !f->key.Mark().is_null() ? f->key : f->value;
    }
    it->second.strategies.insert(s.name);
    it->second.read = it->second.read || strategy_reads_option(s, key);
  }
  reset_unread_options(s);
}

// ---------------------------------------------------------------------------------------------
// Checks across sections: model shapes against mesh sizes.

void check_model_on_mesh(const Context& ctx, const MeshSection& ms, const ModelSection& model) {
  const DeviceMesh& mesh = ms.mesh;
  for (DimRole role : {DimRole::ep, DimRole::pp}) {
    const std::vector<int> dims = mesh.dims_with_role(role);
    if (dims.size() > 1)
      fail(ctx, ms.name_fields[dims[1]],
           "the mesh has " + std::to_string(dims.size()) + " " + std::string(to_string(role)) +
               " dims ('" + mesh.dim(dims[0]).name + "' and '" + mesh.dim(dims[1]).name + "')",
           "use at most one " + std::string(to_string(role)) + " dim");
  }
  if (model.explicit_layouts) return;  // placements given: the layout rules do not apply

  for (int d : mesh.dims_with_role(DimRole::ep)) {
    const int ep = mesh.size(d);
    std::set<std::int64_t> expert_counts;
    for (const Parameter& p : model.model.params)
      if (p.shape.size() == 3 &&
          (p.role == ParamRole::expert_up || p.role == ParamRole::expert_gate ||
           p.role == ParamRole::expert_down))
        expert_counts.insert(p.shape[0]);
    if (expert_counts.empty() && ep > 1)
      fail(ctx, ms.size_fields[d],
           "mesh dim '" + mesh.dim(d).name + "' (ep, size " + std::to_string(ep) +
               ") splits experts, but model '" + model.model.name + "' has no expert stacks",
           "use a MoE model, or name the dim dp_replicate for plain data parallelism");
    for (std::int64_t experts : expert_counts)
      if (experts % ep != 0)
        fail(ctx, ms.size_fields[d],
             "ep = " + std::to_string(ep) + " does not divide the " + std::to_string(experts) +
                 " experts of model '" + model.model.name + "'",
             "choose an ep size that divides " + std::to_string(experts) + ": " +
                 divisors_text(experts, kMaxWorld));
  }
  for (int d : mesh.dims_with_role(DimRole::pp)) {
    const int pp = mesh.size(d);
    if (pp > model.model.num_layers)
      fail(ctx, ms.size_fields[d],
           "pp = " + std::to_string(pp) + " pipeline stages but model '" + model.model.name +
               "' has only " + std::to_string(model.model.num_layers) + " layers",
           "use at most " + std::to_string(model.model.num_layers) + " stages");
  }
  // TP splits attention by whole heads (as Megatron does): tp must divide heads and kv_heads.
  // Checked where the head counts are known (model.dense / moe / hf_config); presets and params
  // lists rely on the layout, whose torch.chunk shards may be uneven.
  if (model.kind == ModelKind::dense || model.kind == ModelKind::moe ||
      model.kind == ModelKind::hf) {
    const DenseSpec& s = model.kind == ModelKind::dense ? model.dense : model.moe.base;
    const std::int64_t heads = model.kind == ModelKind::hf ? model.hf_heads : s.heads;
    const std::int64_t kv = model.kind == ModelKind::hf ? model.hf_kv_heads
                            : s.kv_heads > 0            ? s.kv_heads
                                                        : s.heads;
    std::int64_t tp = 1;
    int tp_dim = -1;
    for (int d : mesh.dims_with_role(DimRole::tp)) {
      tp *= mesh.size(d);
      tp_dim = d;
    }
    if (tp_dim >= 0 && (heads % tp != 0 || kv % tp != 0))
      fail(ctx, ms.size_fields[tp_dim],
           "tp = " + std::to_string(tp) + " does not divide heads = " + std::to_string(heads) +
               " and kv_heads = " + std::to_string(kv) + " (TP splits attention by whole heads)",
           "use a tp size dividing " + std::to_string(std::gcd(heads, kv)) + ": " +
               divisors_text(std::gcd(heads, kv), 1 << 20));
  }
}

// ---------------------------------------------------------------------------------------------
// Resolved YAML (provenance): complete, and parse_experiment reads it back to the same point.

void emit_number(YAML::Emitter& out, const char* key, double value) {
  out << YAML::Key << key << YAML::Value << format_number(value);
}

void emit_dense_fields(YAML::Emitter& out, const DenseSpec& s) {
  out << YAML::Key << "name" << YAML::Value << s.name;
  out << YAML::Key << "hidden" << YAML::Value << s.hidden;
  out << YAML::Key << "layers" << YAML::Value << s.layers;
  out << YAML::Key << "heads" << YAML::Value << s.heads;
  out << YAML::Key << "kv_heads" << YAML::Value << (s.kv_heads > 0 ? s.kv_heads : s.heads);
  out << YAML::Key << "ffn" << YAML::Value << s.ffn;
  out << YAML::Key << "vocab" << YAML::Value << s.vocab;
  if (s.head_dim > 0) out << YAML::Key << "head_dim" << YAML::Value << s.head_dim;
  out << YAML::Key << "gated_mlp" << YAML::Value << s.gated_mlp;
  out << YAML::Key << "qkv_bias" << YAML::Value << s.qkv_bias;
  out << YAML::Key << "tied_embeddings" << YAML::Value << s.tied_embeddings;
  out << YAML::Key << "layernorm_bias" << YAML::Value << s.layernorm_bias;
  out << YAML::Key << "linear_bias" << YAML::Value << s.linear_bias;
  out << YAML::Key << "max_positions" << YAML::Value << s.max_positions;
  out << YAML::Key << "dtype" << YAML::Value << std::string(to_string(s.dtype));
}

std::string resolved_yaml(const Experiment& e, const MeshSection& ms, const ModelSection& model) {
  YAML::Emitter out;
  out << YAML::Comment("resolved configuration of " + e.file +
                       (e.point_label.empty() ? "" : ", sweep point " + e.point_label));
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << e.name;
  out << YAML::Key << "cluster" << YAML::Value;
  emit_cluster(out, e.cluster);

  out << YAML::Key << "mesh" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "dims" << YAML::Value << YAML::BeginSeq;
  for (const MeshDim& d : e.mesh.dims())
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << d.name << YAML::Key
        << "size" << YAML::Value << d.size << YAML::Key << "role" << YAML::Value
        << std::string(to_string(d.role)) << YAML::EndMap;
  out << YAML::EndSeq;
  out << YAML::Key << "gpus_per_node" << YAML::Value << e.mesh.gpus_per_node();
  out << YAML::Key << "world_size" << YAML::Value << e.mesh.world_size();
  out << YAML::EndMap;

  out << YAML::Key << "model" << YAML::Value;
  out << YAML::Comment(format_number(static_cast<double>(e.model.numel())) + " parameters in " +
                       std::to_string(e.model.params.size()) + " tensors, " +
                       std::to_string(e.model.num_layers) + " layers");
  out << YAML::BeginMap;
  switch (model.kind) {
    case ModelKind::preset:
      out << YAML::Key << "preset" << YAML::Value << model.preset;
      if (!model.name_override.empty())
        out << YAML::Key << "name" << YAML::Value << model.name_override;
      if (model.layers_override > 0)
        out << YAML::Key << "layers" << YAML::Value << model.layers_override;
      if (model.dtype_override)
        out << YAML::Key << "dtype" << YAML::Value << std::string(to_string(*model.dtype_override));
      break;
    case ModelKind::hf:
      // The fields read, defaults explicit: the resolved file needs no config.json, and a changed
      // config.json changes the point's identity.
      out << YAML::Key << "hf_config" << YAML::Value;
      emit_json_as_yaml(out, nlohmann::ordered_json::parse(model.hf_fields));
      out << YAML::Key << "name" << YAML::Value << e.model.name;
      if (model.layers_override > 0)
        out << YAML::Key << "layers" << YAML::Value << model.layers_override;
      if (model.experts_override > 0)
        out << YAML::Key << "experts" << YAML::Value << model.experts_override;
      if (model.dtype_override)
        out << YAML::Key << "dtype" << YAML::Value << std::string(to_string(*model.dtype_override));
      break;
    case ModelKind::dense:
      out << YAML::Key << "dense" << YAML::Value << YAML::BeginMap;
      emit_dense_fields(out, model.dense);
      out << YAML::EndMap;
      break;
    case ModelKind::moe:
      out << YAML::Key << "moe" << YAML::Value << YAML::BeginMap;
      emit_dense_fields(out, model.moe.base);
      out << YAML::Key << "experts" << YAML::Value << model.moe.experts;
      out << YAML::Key << "expert_ffn" << YAML::Value << model.moe.expert_ffn;
      out << YAML::Key << "shared_experts" << YAML::Value << model.moe.shared_experts;
      out << YAML::Key << "dense_layers" << YAML::Value << model.moe.dense_layers;
      out << YAML::EndMap;
      break;
    case ModelKind::params:
      out << YAML::Key << "name" << YAML::Value << e.model.name;
      out << YAML::Key << "params" << YAML::Value << YAML::BeginSeq;
      for (std::size_t i = 0; i < e.model.params.size(); ++i) {
        const Parameter& p = e.model.params[i];
        out << YAML::Flow << YAML::BeginMap;
        out << YAML::Key << "name" << YAML::Value << p.name;
        out << YAML::Key << "shape" << YAML::Value << YAML::Flow << p.shape;
        out << YAML::Key << "role" << YAML::Value << std::string(to_string(p.role));
        out << YAML::Key << "dtype" << YAML::Value << std::string(to_string(p.dtype));
        out << YAML::Key << "layer" << YAML::Value << p.layer;
        if (model.explicit_layouts) {
          out << YAML::Key << "placements" << YAML::Value << YAML::Flow << YAML::BeginMap;
          for (int d = 0; d < e.mesh.ndims(); ++d)
            out << YAML::Key << e.mesh.dim(d).name << YAML::Value
                << model.placements[i][d].to_string();
          out << YAML::EndMap;
        }
        out << YAML::EndMap;
      }
      out << YAML::EndSeq;
      break;
  }
  out << YAML::EndMap;

  out << YAML::Key << "parallel" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "fsdp_tensor_dim" << YAML::Value << e.parallel.fsdp_tensor_dim;
  if (!e.parallel.tp_dim_per_param.empty())
    out << YAML::Key << "tp_dim_per_param" << YAML::Value << YAML::Flow
        << e.parallel.tp_dim_per_param;
  out << YAML::Key << "tp_shard_embeddings" << YAML::Value << e.parallel.tp_shard_embeddings;
  // Only when not the default, so that points resolved before the option existed keep their
  // identity (and their results).
  if (e.parallel.dense_over_ep != DenseOverEp::replicate)
    out << YAML::Key << "dense_over_ep" << YAML::Value
        << std::string(to_string(e.parallel.dense_over_ep));
  out << YAML::EndMap;

  const OptimizerConfig& o = e.optimizer;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  emit_number(out, "lr", o.muon.lr);
  emit_number(out, "weight_decay", o.muon.weight_decay);
  emit_number(out, "momentum", o.muon.momentum);
  out << YAML::Key << "nesterov" << YAML::Value << o.muon.nesterov;
  out << YAML::Key << "momentum_form" << YAML::Value
      << std::string(to_string(o.muon.momentum_form));
  out << YAML::Key << "ns_steps" << YAML::Value << o.muon.ns_steps;
  out << YAML::Key << "ns_coefficients" << YAML::Value;
  if (o.muon.ns_coefficients == "custom") {
    out << YAML::BeginSeq;
    for (const auto& abc : o.muon.custom_coefficients)
      out << YAML::Flow << YAML::BeginSeq << format_number(abc.a) << format_number(abc.b)
          << format_number(abc.c) << YAML::EndSeq;
    out << YAML::EndSeq;
  } else {
    out << o.muon.ns_coefficients;
  }
  emit_number(out, "eps", o.muon.eps);
  out << YAML::Key << "adjust_lr_fn" << YAML::Value << std::string(to_string(o.muon.adjust_lr_fn));
  out << YAML::Key << "adamw" << YAML::Value << YAML::BeginMap;
  emit_number(out, "lr", o.adamw.lr);
  out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
      << format_number(o.adamw.beta1) << format_number(o.adamw.beta2) << YAML::EndSeq;
  emit_number(out, "eps", o.adamw.eps);
  emit_number(out, "weight_decay", o.adamw.weight_decay);
  out << YAML::EndMap;
  out << YAML::Key << "qk_clip" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "enabled" << YAML::Value << o.qk_clip.enabled;
  emit_number(out, "tau", o.qk_clip.tau);
  out << YAML::Key << "head_dim" << YAML::Value << o.qk_clip.head_dim;
  out << YAML::EndMap;
  out << YAML::Key << "comm_dtype" << YAML::Value << std::string(to_string(o.comm_dtype));
  const RoutingRules& r = e.parallel.routing;
  out << YAML::Key << "routing" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "embeddings_to_adamw" << YAML::Value << r.embeddings_to_adamw;
  out << YAML::Key << "lm_head_to_adamw" << YAML::Value << r.lm_head_to_adamw;
  out << YAML::Key << "router_to_adamw" << YAML::Value << r.router_to_adamw;
  if (!r.force_adamw.empty())
    out << YAML::Key << "force_adamw" << YAML::Value << YAML::Flow << r.force_adamw;
  out << YAML::EndMap;
  out << YAML::EndMap;

  const StrategyOptions& s = e.strategy;
  out << YAML::Key << "strategy" << YAML::Value << YAML::BeginMap;
  if (!s.preset.empty()) out << YAML::Key << "preset" << YAML::Value << s.preset;
  out << YAML::Key << "name" << YAML::Value << s.name;
  out << YAML::Key << "assign" << YAML::Value << s.assign;
  if (!s.explicit_owners.empty())
    out << YAML::Key << "explicit_owners" << YAML::Value << s.explicit_owners;
  out << YAML::Key << "async_gpu_parallelism" << YAML::Value << s.async_gpu_parallelism;
  out << YAML::Key << "prefetch_count" << YAML::Value << s.prefetch_count;
  out << YAML::Key << "gather" << YAML::Value << s.gather;
  out << YAML::Key << "chunk_size" << YAML::Value << s.chunk_size;
  out << YAML::Key << "max_chunks_in_flight" << YAML::Value << s.max_chunks_in_flight;
  out << YAML::Key << "small_param_threshold" << YAML::Value << s.small_param_threshold;
  if (s.comm_lanes != 1) out << YAML::Key << "comm_lanes" << YAML::Value << s.comm_lanes;
  if (s.order != "plan") out << YAML::Key << "order" << YAML::Value << s.order;
  if (s.chunk_by_shape) out << YAML::Key << "chunk_by_shape" << YAML::Value << true;
  if (s.chunk_sizing != "count")
    out << YAML::Key << "chunk_sizing" << YAML::Value << s.chunk_sizing;
  // Only when on, so points resolved before it was written keep their identity.
  if (s.split_ns.enabled) {
    out << YAML::Key << "split_ns" << YAML::Value << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "max_members" << YAML::Value << s.split_ns.max_members;
    emit_number(out, "threshold", s.split_ns.threshold);
    out << YAML::EndMap;
  }
  out << YAML::Key << "grad_sync" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "enabled" << YAML::Value << s.grad_sync.enabled;
  out << YAML::Key << "level_periods" << YAML::Value << YAML::Flow << s.grad_sync.level_periods;
  out << YAML::EndMap;
  out << YAML::EndMap;

  if (e.training.enabled) {
    const TrainingOptions& t = e.training;
    out << YAML::Key << "training" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "tokens_per_step" << YAML::Value << t.tokens_per_step;
    out << YAML::Key << "seq_len" << YAML::Value << t.seq_len;
    out << YAML::Key << "micro_batch_size" << YAML::Value << t.micro_batch_size;
    out << YAML::Key << "overlap" << YAML::Value << t.overlap;
    if (t.experts_per_token > 0)
      out << YAML::Key << "experts_per_token" << YAML::Value << t.experts_per_token;
    out << YAML::Key << "max_micro_batch_groups" << YAML::Value << t.max_micro_batch_groups;
    out << YAML::Key << "flash_attention" << YAML::Value << t.flash_attention;
    out << YAML::EndMap;
  }
  // Only when it differs from the default, so the identities of existing results stay.
  if (!(e.memory == TrainingMemoryOptions{})) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    out << YAML::Key << "memory" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "master_weights" << YAML::Value
        << std::string(to_string(e.memory.master_weights));
    emit_number(out, "activations_GiB", static_cast<double>(e.memory.activations_bytes) / gib);
    emit_number(out, "reserved_GiB", static_cast<double>(e.memory.reserved_bytes) / gib);
    out << YAML::EndMap;
  }
  out << YAML::Key << "backend" << YAML::Value << YAML::Flow << e.backends;
  out << YAML::Key << "sim" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "fidelity" << YAML::Value << e.sim_fidelity << YAML::EndMap;
  out << YAML::Key << "steps" << YAML::Value << e.steps;
  out << YAML::Key << "repeats" << YAML::Value << e.repeats;
  out << YAML::Key << "seed" << YAML::Value << e.seed;
  out << YAML::Key << "output" << YAML::Value << e.output_dir;
  out << YAML::EndMap;
  (void)ms;
  return std::string(out.c_str()) + "\n";
}

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

// What the points of one file share: sharded models by their layout inputs (layout_key, explicit
// placements) and cluster files.
using LayoutKey = std::pair<std::uint64_t, std::uint64_t>;
struct ParseCache {
  std::map<LayoutKey, std::shared_ptr<const ShardedModel>> shards;
  ClusterCache clusters;
  OptionUses options;  // strategy options given, over every point
};

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

Experiment parse_point(const Context& ctx, const YAML::Node& root, ParseCache* cache) {
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
           "use fidelity: flow (or auto, which picks step only up to 64 ranks and where flow "
           "is not proven within 1 % of it)");
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

// ---------------------------------------------------------------------------------------------
// Sweeps

// One axis of the sweep's cartesian product: one swept key, or a `zip` group of keys whose lists
// vary together (the i-th value of every key in the same point).
struct SweepAxis {
  std::vector<std::string> keys;
  std::vector<YAML::Node> lists;                 // per key, its list of values (marks kept)
  std::vector<std::vector<std::string>> labels;  // per key, the text of each value
  std::size_t size() const { return labels.front().size(); }
};

// The key under `sweep:` that holds zipped groups.
constexpr const char* kZipKey = "zip";

// The child `key` of a map node; an undefined node when `node` is no map or lacks the key
// (yaml-cpp throws on any use of a missing child other than IsDefined()).
YAML::Node child(const YAML::Node& node, const char* key) {
  if (!node.IsDefined() || !node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node found = node[key];
  return found.IsDefined() ? found : YAML::Node(YAML::NodeType::Undefined);
}

std::vector<std::string> mesh_dim_names(const YAML::Node& root) {
  std::vector<std::string> names;
  const YAML::Node dims = child(child(root, "mesh"), "dims");
  if (dims.IsSequence()) {
    for (const auto& d : dims)
      if (child(d, "name").IsDefined() && child(d, "name").IsScalar())
        names.push_back(child(d, "name").Scalar());
  } else if (dims.IsMap()) {
    for (const auto& d : dims)
      if (d.first.IsScalar()) names.push_back(d.first.Scalar());
  }
  return names;
}

bool is_mesh_dim_key(const std::string& key, const std::vector<std::string>& dim_names) {
  const std::vector<std::string> parts = split(key, '.');
  return parts.size() == 2 && parts[0] == "mesh" &&
         std::find(kMeshKeys.begin(), kMeshKeys.end(), parts[1]) == kMeshKeys.end() &&
         std::find(dim_names.begin(), dim_names.end(), parts[1]) != dim_names.end();
}

// `sweep:` is a map of dotted keys to lists of values, whose cartesian product makes the points;
// its entry `zip:` holds keys whose lists vary together instead (one map, or a list of maps for
// several groups), each group one axis of the product.
std::vector<SweepAxis> read_sweep(const Context& ctx, const Field& sweep, const YAML::Node& root) {
  if (!sweep.value.IsMap() || sweep.value.size() == 0)
    fail(ctx, sweep,
         "'sweep' must be a non-empty map of key: [values], got " + kind_of(sweep.value) + " " +
             show(sweep.value),
         "write sweep: {strategy.name: [owner, all_to_all]}, and keys that vary together under "
         "zip: {mesh.dp_shard: [8, 16], cluster.nodes: [8, 16]}");
  const std::vector<std::string> schema = schema_paths();
  const std::vector<std::string> dims = mesh_dim_names(root);
  std::vector<std::string> candidates = schema;
  for (const std::string& d : dims) candidates.push_back("mesh." + d);
  std::vector<SweepAxis> axes;
  std::vector<std::string> keys;  // every swept key so far, cartesian and zipped
  std::size_t points = 1;

  // A swept key must be a key of the schema (or a mesh dim) and overlap no other swept key.
  const auto check_key = [&](const YAML::Node& key_node, const std::string& key) {
    const bool known = std::find(schema.begin(), schema.end(), key) != schema.end();
    // A key of an earlier muonbed version gets its new name, as it does outside the sweep.
    for (const auto& [old_key, now] : kRenamedOptimizerKeys)
      if (!known && key == "optimizer." + old_key)
        fail(ctx, key_node,
             "sweep key 'optimizer." + old_key +
                 "' was renamed (muonbed follows torch.optim.Muon's and AdamW's names)",
             "sweep optimizer." + now.substr(0, now.find(':')) + " instead (" + now + ")");
    if (!known && !is_mesh_dim_key(key, dims))
      fail(ctx, key_node, "unknown sweep key " + quote(key) + did_you_mean(key, candidates),
           "a sweep key is a dotted key of the experiment schema, e.g. strategy.name, "
           "model.preset, cluster.nodes, or mesh.<dim name> for a mesh dim's size (dims here: " +
               join(dims) + "); keys that vary together go under zip:");
    for (const std::string& other : keys) {
      const bool overlap =
          other == key || key.starts_with(other + ".") || other.starts_with(key + ".");
      if (overlap)
        fail(ctx, key_node, "sweep keys '" + other + "' and '" + key + "' overlap",
             "sweep each key once (in zip: groups too), and not a key together with one inside "
             "it");
    }
    keys.push_back(key);
  };
  // The values of one key: a non-empty list, within the point limit.
  const auto read_list = [&](const Field& field, const std::string& key, bool each_once) {
    if (!field.value.IsSequence())
      fail(ctx, field,
           "sweep '" + key + "' must be a list of values, got " + kind_of(field.value) + " " +
               show(field.value),
           "write " + key + ": [value1, value2]");
    if (field.value.size() == 0)
      fail(ctx, field, "sweep '" + key + "' has an empty list", "give at least one value");
    std::vector<std::string> labels;
    std::unordered_set<std::string> seen;
    for (const Field& item : list_items(ctx, field)) {
      std::string text = value_text(item.value);
      if (each_once && !seen.insert(text).second)
        fail(ctx, item, "sweep '" + key + "' lists the value " + quote(text) + " twice",
             "list each value once");
      labels.push_back(std::move(text));
    }
    return labels;
  };
  // The limit first, before any work per value (a huge list is refused in O(1)).
  const auto check_count = [&](const Field& field, std::size_t values, const std::string& what) {
    if (values > kMaxSweepPoints / points)
      fail(ctx, field,
           "the sweep has more than " + std::to_string(kMaxSweepPoints) + " points (" +
               std::to_string(points) + " x " + std::to_string(values) + " values of " + what + ")",
           "sweep fewer values, or split the study into several files");
    points *= values;
  };

  bool zip_seen = false;
  for (const auto& entry : sweep.value) {
    const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : show(entry.first);
    const Field field{entry.first, entry.second, "sweep." + key};
    if (key != kZipKey) {
      check_key(entry.first, key);
      if (entry.second.IsSequence()) check_count(field, entry.second.size(), "'" + key + "'");
      SweepAxis axis{{key}, {entry.second}, {read_list(field, key, true)}};
      axes.push_back(std::move(axis));
      continue;
    }
    if (zip_seen)
      fail(ctx, entry.first, "'sweep' has two zip: entries",
           "write several groups as one list: zip: [{a: [..], b: [..]}, {c: [..], d: [..]}]");
    zip_seen = true;
    std::vector<Field> groups;
    if (entry.second.IsSequence() && entry.second.size() > 0)
      groups = list_items(ctx, field);
    else
      groups.push_back(field);
    for (const Field& group : groups) {
      if (!group.value.IsMap() || group.value.size() == 0)
        fail(ctx, group,
             "'" + group.path + "' must be a non-empty map of keys whose lists vary together (or " +
                 "a list of such maps), got " + kind_of(group.value) + " " + show(group.value),
             "write zip: {mesh.dp_shard: [8, 16, 32], cluster.nodes: [8, 16, 32]}");
      SweepAxis axis;
      std::vector<Field> fields;  // per key, its list's field (for messages)
      for (const auto& zipped : group.value) {
        const std::string zkey =
            zipped.first.IsScalar() ? zipped.first.Scalar() : show(zipped.first);
        check_key(zipped.first, zkey);
        fields.push_back(Field{zipped.first, zipped.second, group.path + "." + zkey});
        const Field& zfield = fields.back();
        if (axis.keys.empty()) {
          if (zipped.second.IsSequence())
            check_count(zfield, zipped.second.size(), "zipped '" + zkey + "'");
        } else if (zipped.second.IsSequence() && zipped.second.size() != axis.size()) {
          fail(ctx, zfield,
               "zipped lists vary together and need equal lengths: '" + axis.keys.front() +
                   "' has " + std::to_string(axis.size()) + " values, '" + zkey + "' has " +
                   std::to_string(zipped.second.size()),
               "give every key of a zip group one value per point (" + std::to_string(axis.size()) +
                   " here), or sweep a key that does not vary with the others outside zip:");
        }
        axis.labels.push_back(read_list(zfield, zkey, false));
        axis.keys.push_back(zkey);
        axis.lists.push_back(zipped.second);
      }
      // Each point of a group once: values may repeat in one key, not as a whole combination.
      std::map<std::string, std::size_t> combinations;
      for (std::size_t i = 0; i < axis.size(); ++i) {
        std::string combination;
        for (std::size_t k = 0; k < axis.keys.size(); ++k)
          combination += (k ? ", " : "") + axis.keys[k] + "=" + axis.labels[k][i];
        const auto [it, added] = combinations.emplace(combination, i);
        if (!added)
          fail(ctx, list_items(ctx, fields.front())[i],
               "'" + group.path + "' lists the combination " + quote(combination) +
                   " twice (values " + std::to_string(it->second + 1) + " and " +
                   std::to_string(i + 1) + " of its lists)",
               "list each combination once");
      }
      axes.push_back(std::move(axis));
    }
  }
  return axes;
}

// Edits of the file's tree for one sweep point, undone before the next: the file is parsed once,
// not once per point (a 10,000-point sweep would parse a 10,000-value list 10,000 times). yaml-cpp
// assignment rebinds the map entry to the assigned node, so the original value is kept alive by a
// holder map and bound back on undo; keys keep their order and every node its mark, so errors
// about a swept value point at the value's line in `sweep:`.
class TreeEdits {
 public:
  TreeEdits() = default;
  TreeEdits(const TreeEdits&) = delete;
  TreeEdits& operator=(const TreeEdits&) = delete;
  ~TreeEdits() {
    try {
      undo();
    } catch (...) {
      // Unwinding from a point's error: the tree is not used again.
    }
  }

  // parent[key] = value (parent is a map).
  void set(YAML::Node parent, const std::string& key, const YAML::Node& value) {
    Edit edit{parent, key, YAML::Node(YAML::NodeType::Undefined)};
    if (child(parent, key.c_str()).IsDefined()) {
      edit.saved = YAML::Node(YAML::NodeType::Map);
      edit.saved["value"] = parent[key];
    }
    parent[key] = value;
    edits_.push_back(std::move(edit));
  }

  void undo() {
    for (auto it = edits_.rbegin(); it != edits_.rend(); ++it) {
      if (it->saved.IsDefined())
        it->parent[it->key] = it->saved["value"];
      else
        it->parent.remove(it->key);
    }
    edits_.clear();
  }

 private:
  struct Edit {
    YAML::Node parent;
    std::string key;
    YAML::Node saved;  // {value: original} when the key existed
  };
  std::vector<Edit> edits_;
};

// Writes `value` over the key `path` of `root` (creating maps on the way), recording in `edits`.
void apply_override(TreeEdits& edits, YAML::Node root, const std::string& path,
                    const YAML::Node& value) {
  const std::vector<std::string> parts = split(path, '.');
  if (parts.size() == 2 && parts[0] == "mesh" &&
      std::find(kMeshKeys.begin(), kMeshKeys.end(), parts[1]) == kMeshKeys.end()) {
    YAML::Node dims = child(child(root, "mesh"), "dims");
    if (dims.IsSequence()) {
      for (YAML::Node d : dims) {
        const YAML::Node name = child(d, "name");
        if (name.IsDefined() && name.IsScalar() && name.Scalar() == parts[1])
          edits.set(d, "size", value);
      }
    } else if (dims.IsMap()) {
      YAML::Node d = child(dims, parts[1].c_str());
      if (d.IsMap())
        edits.set(d, "size", value);
      else
        edits.set(dims, parts[1], value);
    }
    return;
  }
  if (parts[0] == "cluster" && parts.size() > 1) {
    // `cluster: NAME` (or no cluster) becomes {preset: NAME} so its fields can be overridden.
    const YAML::Node cluster = child(root, "cluster");
    if (!cluster.IsMap()) {
      YAML::Node map(YAML::NodeType::Map);
      if (cluster.IsDefined() && cluster.IsScalar())
        map["preset"] = cluster;
      else
        map["preset"] = kDefaultCluster;
      edits.set(root, "cluster", map);
    }
  }
  YAML::Node current = root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!child(current, parts[i].c_str()).IsMap())
      edits.set(current, parts[i], YAML::Node(YAML::NodeType::Map));
    YAML::Node next = child(current, parts[i].c_str());
    current.reset(next);
  }
  edits.set(current, parts.back(), value);
}

}  // namespace

PlanSettings Experiment::plan_settings() const {
  PlanSettings settings;
  settings.optimizer = optimizer;
  settings.state_dtype = DType::fp32;
  settings.training_memory = memory;
  settings.training = training;
  return settings;
}

namespace {

std::vector<Experiment> parse_file(const std::string& yaml_text, const std::string& file) {
  const Context ctx{file, ""};
  const YAML::Node root = load_yaml(yaml_text, file);
  const MapReader top(ctx, root, "", kTopKeys);
  const Field* sweep = top.find("sweep");
  ParseCache cache;
  if (!sweep) {
    std::vector<Experiment> one = {parse_point(ctx, root, &cache)};
    check_strategy_options(cache.options);
    return one;
  }

  const std::vector<SweepAxis> axes = read_sweep(ctx, *sweep, root);
  std::size_t count = 1;
  for (const SweepAxis& a : axes) count *= a.size();
  YAML::Node tree = root;  // edited in place per point, then restored
  tree.remove("sweep");
  std::vector<Experiment> points;
  points.reserve(count);
  std::int64_t work = 0;
  for (std::size_t index = 0; index < count; ++index) {
    // The last axis varies fastest; a zip group's keys take their values together.
    std::vector<std::size_t> choice(axes.size());
    std::size_t rest = index;
    for (std::size_t a = axes.size(); a-- > 0;) {
      choice[a] = rest % axes[a].size();
      rest /= axes[a].size();
    }
    std::string label;
    std::map<std::string, std::string> overrides;
    TreeEdits edits;
    for (std::size_t a = 0; a < axes.size(); ++a) {
      for (std::size_t k = 0; k < axes[a].keys.size(); ++k) {
        const std::string& key = axes[a].keys[k];
        const std::string& text = axes[a].labels[k][choice[a]];
        label += (label.empty() ? "" : ",") + key + "=" + text;
        overrides[key] = text;
        apply_override(edits, tree, key, axes[a].lists[k][choice[a]]);
      }
    }
    Experiment e = parse_point(Context{file, label}, tree, &cache);
    e.overrides = std::move(overrides);
    const std::int64_t tensors = static_cast<std::int64_t>(e.model.params.size());
    points.push_back(std::move(e));
    // Every point builds and checks its model: bound the sweep's work (estimated from its first
    // point before going on, then counted, as swept models may grow).
    work += tensors;
    if (work > kMaxSweepTensorPoints)
      fail(ctx, *sweep,
           "the sweep's points hold more than " + std::to_string(kMaxSweepTensorPoints) +
               " tensors in all (reached at point " + std::to_string(index + 1) + " of " +
               std::to_string(count) + ")",
           "sweep fewer values or smaller models, or split the study into several files");
    if (index == 0) {
      if (tensors * static_cast<std::int64_t>(count) > kMaxSweepTensorPoints)
        fail(ctx, *sweep,
             "the sweep has " + std::to_string(count) + " points of a model with " +
                 std::to_string(tensors) + " tensors: checking them all (" +
                 std::to_string(tensors * static_cast<std::int64_t>(count)) +
                 " tensor layouts) exceeds the limit of " + std::to_string(kMaxSweepTensorPoints),
             "sweep fewer values, or split the study into several files");
    }
  }
  // Each point's results live in a folder named after its label: two points in one folder would
  // overwrite each other's results and rerun forever. point_slug is injective, so this can only
  // fire on a hash collision of very long labels or a case-insensitive file system's view.
  std::map<std::string, const Experiment*> folders;
  for (const Experiment& e : points) {
    std::string folder = point_slug(e.point_label);
    for (char& c : folder) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const auto [it, added] = folders.emplace(folder, &e);
    if (!added)
      fail(ctx, *sweep,
           "sweep points '" + it->second->point_label + "' and '" + e.point_label +
               "' would share the results folder '" + point_slug(e.point_label) +
               "' (names that differ only in upper/lower case collide on some file systems)",
           "make the swept values differ in more than letter case");
  }
  check_strategy_options(cache.options);
  return points;
}

}  // namespace

std::vector<Experiment> parse_experiment(const std::string& yaml_text, const std::string& file) {
  try {
    return parse_file(yaml_text, file);
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

std::vector<Experiment> load_experiment(const std::string& path) {
  return parse_experiment(read_text_file(path, "experiment file"), path);
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
