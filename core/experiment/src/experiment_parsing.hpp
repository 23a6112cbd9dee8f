// What the experiment parser's files share (core/experiment/src: experiment.cpp assembles a point
// from the sections parse_mesh.cpp, parse_model.cpp and parse_strategy.cpp read, resolved_yaml.cpp
// writes the point back out, sweep.cpp expands a sweep into points): the limits every size is
// checked against, the key lists each map allows, the parsed sections, and the readers' entry
// points. Private to the experiment room.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "core/config/cluster.hpp"
#include "core/config/src/cluster_yaml.hpp"
#include "core/config/src/yaml_util.hpp"
#include "core/experiment/experiment.hpp"
#include "core/experiment/keys.hpp"

namespace muonbed::experiment_parsing {

using namespace yaml_util;

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
inline const std::vector<std::string> kTopKeys = experiment_keys_in("");
inline const std::vector<std::string> kMeshKeys = experiment_keys_in("mesh");
inline const std::vector<std::string> kDimKeys = experiment_keys_in("mesh.dims[]");
// The map form {NAME: {size, role}}: the list form's keys less the name.
inline const std::vector<std::string> kDimValueKeys = [] {
  std::vector<std::string> keys = kDimKeys;
  std::erase(keys, "name");
  return keys;
}();
inline const std::vector<std::string> kRoleNames = {"replicate", "fsdp", "tp", "ep", "pp"};
inline const std::vector<std::string> kKnownDimNames = {"dp_shard", "dp_replicate", "dp", "cp",
                                                        "tp",       "ep",           "pp"};
inline const std::vector<std::string> kModelKeys = experiment_keys_in("model");
inline const std::vector<std::string> kDenseKeys = experiment_keys_in("model.dense");
inline const std::vector<std::string> kMoeExtraKeys = experiment_keys_in("model.moe");
inline const std::vector<std::string> kParamKeys = experiment_keys_in("model.params[]");
inline const std::vector<std::string> kParallelKeys = experiment_keys_in("parallel");
inline const std::vector<std::string> kDenseOverEp = {"replicate", "shard"};
// torch.optim.Muon's names (core/model/optimizer.hpp), plus muonbed's additions.
inline const std::vector<std::string> kOptimizerKeys = experiment_keys_in("optimizer");
inline const std::vector<std::string> kAdamWKeys = experiment_keys_in("optimizer.adamw");
inline const std::vector<std::string> kQkClipKeys = experiment_keys_in("optimizer.qk_clip");
// Keys of earlier muonbed versions and what they are called now.
inline const std::vector<std::pair<std::string, std::string>> kRenamedOptimizerKeys = {
    {"coefficients", "ns_coefficients: keller | polar_express | [[a, b, c], ...]"},
    {"custom_coefficients", "ns_coefficients: [[a, b, c], ...] (one per step)"},
    {"update_scale", "adjust_lr_fn: original | match_rms_adamw | none"},
    {"ns_epsilon", "eps: 1e-7"},
    {"adamw_lr", "adamw: {lr: ...}"},
    {"adamw_beta1", "adamw: {betas: [beta1, beta2]}"},
    {"adamw_beta2", "adamw: {betas: [beta1, beta2]}"},
    {"adamw_eps", "adamw: {eps: ...}"}};
inline const std::vector<std::string> kRoutingKeys = experiment_keys_in("optimizer.routing");
inline const std::vector<std::string> kStrategyKeys = experiment_keys_in("strategy");
inline const std::vector<std::string> kGradSyncKeys = experiment_keys_in("strategy.grad_sync");
inline const std::vector<std::string> kSplitNsKeys = experiment_keys_in("strategy.split_ns");
inline const std::vector<std::string> kSimKeys = experiment_keys_in("sim");
inline const std::vector<std::string> kMemoryKeys = experiment_keys_in("memory");
inline const std::vector<std::string> kTrainingKeys = experiment_keys_in("training");
inline const std::vector<std::string> kMasterWeights = {"auto", "fp32", "none"};
// Per-rank memory an experiment may add (activations, reserved): at most 64 TiB, beyond any device.
constexpr double kMaxMemoryGiB = 65536;
inline const std::vector<std::string> kFidelities = {"step", "flow", "auto"};
inline const std::vector<std::string> kDTypes = {"fp32", "bf16", "fp16"};

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

// Cluster files read while parsing one experiment file (a sweep reads each once), by path.
using ClusterCache = std::map<std::string, ClusterSpec>;

// Where a strategy option was given, and whether any point reads it (see read_strategy and
// check_strategy_options).
struct OptionUse {
  Context ctx;                       // the first point that gives it
  YAML::Node at;                     // its key there (or its sweep value)
  std::set<std::string> strategies;  // the strategies of the points that give it
  bool read = false;                 // some point's strategy reads it
};

using OptionUses = std::map<std::string, OptionUse>;

// What the points of one file share: sharded models by their layout inputs (layout_key, explicit
// placements) and cluster files.
using LayoutKey = std::pair<std::uint64_t, std::uint64_t>;

struct ParseCache {
  std::map<LayoutKey, std::shared_ptr<const ShardedModel>> shards;
  ClusterCache clusters;
  OptionUses options;  // strategy options given, over every point
};

// ---- Helpers (experiment.cpp) -------------------------------------------------------------------
std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b);
std::vector<std::string> schema_paths();
std::vector<std::string> split(const std::string& text, char separator);
std::string value_text(const YAML::Node& node);
Field missing_field(const YAML::Node& at, const std::string& path);
bool is_identifier(const std::string& text);
std::string shape_text(const std::vector<std::int64_t>& shape);
std::string divisors_text(std::int64_t n, std::int64_t limit);

// ---- The cluster and the mesh (parse_mesh.cpp) --------------------------------------------------
ClusterSpec read_cluster(const Context& ctx, const MapReader& top, ClusterCache& clusters);
MeshSection read_mesh(const Context& ctx, const Field& field, const ClusterSpec& cluster);
void check_model_on_mesh(const Context& ctx, const MeshSection& ms, const ModelSection& model);

// ---- The model (parse_model.cpp) ----------------------------------------------------------------
DType read_dtype(const Context& ctx, const Field& field);
std::optional<Placement> parse_placement(std::string text);
ModelSection read_model(const Context& ctx, const Field& field, const DeviceMesh& mesh);
void emit_json_as_yaml(YAML::Emitter& out, const nlohmann::ordered_json& value);

// ---- Parallelism, optimizer and strategy (parse_strategy.cpp) -----------------------------------
void read_parallel(const Context& ctx, const MapReader& top, const Model& model,
                   ParallelRules& rules);
void read_optimizer(const Context& ctx, const MapReader& top, const Model& model,
                    OptimizerConfig& opt, RoutingRules& routing);
void read_strategy(const Context& ctx, const MapReader& top, const MeshSection& mesh,
                   const Model& model, StrategyOptions& s, OptionUses& uses);

// ---- The resolved configuration (resolved_yaml.cpp) ---------------------------------------------
std::string resolved_yaml(const Experiment& e, const MeshSection& ms, const ModelSection& model);

// ---- A point (experiment.cpp) -------------------------------------------------------------------
Experiment parse_point(const Context& ctx, const YAML::Node& root, ParseCache* cache,
                       const ExperimentOverrides& overrides);
void check_strategy_options(const OptionUses& uses);

// ---- Sweeps (sweep.cpp) -------------------------------------------------------------------------
YAML::Node child(const YAML::Node& node, const char* key);
std::vector<Experiment> parse_file(const std::string& yaml_text, const std::string& file,
                                   const ExperimentOverrides& overrides);

}  // namespace muonbed::experiment_parsing
