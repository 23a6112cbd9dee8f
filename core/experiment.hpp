// Experiment files (YAML): cluster, mesh, model, optimizer, strategy, backend(s), steps, sweeps,
// output. Parsing is strict: an unknown key, a wrong type or an impossible value is a ConfigError
// naming file:line:column, the offending value and what to change. A sweep is a cartesian
// product of overrides of dotted keys; each point is resolved to a complete Experiment.
//
//   name: quickstart
//   cluster: dgx-h100                 # a file under experiments/clusters/, or an inline map
//   mesh: {dims: [{name: dp_shard, size: 8}], gpus_per_node: 8}   # gpus_per_node from cluster
//   model: {preset: llama-7b}         # or {dense: {...}}, {moe: {...}}, {params: [...]}
//   parallel: {fsdp_tensor_dim: 0, tp_dim_per_param: {layers.0.attn.o: 1}}
//   optimizer: {lr: 0.02, momentum: 0.95, nesterov: true, ns_steps: 5, coefficients: keller}
//   strategy: {name: owner, assign: flop_balanced, prefetch_count: 1}
//   backend: sim                      # sim | analytic | mpi | nccl, or a list
//   steps: 1
//   sweep: {strategy.name: [sequential, owner, all_to_all]}
//   output: results/quickstart
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/cluster.hpp"
#include "core/model.hpp"
#include "core/parallelize.hpp"
#include "core/strategy.hpp"

namespace muonbed {

struct OptimizerConfig {
  double lr = 0.02;
  double momentum = 0.95;
  bool nesterov = true;
  std::string momentum_form =
      "ema";  // "ema": buf = beta*buf + g; "lerp": buf = lerp(buf, g, 1-beta)
  double weight_decay = 0.0;
  int ns_steps = 5;
  std::string coefficients = "keller";                     // keller | polar_express | custom
  std::vector<std::array<double, 3>> custom_coefficients;  // per step (a, b, c) when custom
  std::string update_scale = "original";                   // original | match_rms_adamw
  double ns_epsilon = 1e-7;
  double adamw_lr = 3e-4, adamw_beta1 = 0.9, adamw_beta2 = 0.95, adamw_eps = 1e-8;
  DType comm_dtype = DType::bf16;
};

struct Experiment {
  std::string name;
  std::string file;         // the YAML it came from
  std::string point_label;  // "strategy.name=owner,mesh.dp_shard=8" ("" without sweep)
  std::map<std::string, std::string> overrides;  // this point's sweep values
  ClusterSpec cluster;
  DeviceMesh mesh;
  Model model;
  ParallelRules parallel;
  OptimizerConfig optimizer;
  StrategyOptions strategy;
  std::vector<std::string> backends;  // sim, analytic, mpi, nccl
  std::string sim_fidelity = "auto";  // step | flow | auto (sim backend: step up to 256 ranks)
  int steps = 1;
  int repeats = 1;
  std::string output_dir;
  std::string resolved_yaml;  // the complete resolved configuration of this point, as YAML
  // The sharded model, built once when the file is parsed and shared by the points of a sweep
  // whose mesh, model and parallel rules agree; shard_model() returns it while the fingerprint
  // of those inputs (sharded_key) still matches.
  std::shared_ptr<const ShardedModel> sharded;
  std::uint64_t sharded_key = 0;

  PlanSettings plan_settings() const;
};

// Loads a file and expands its sweep into points (one point without a sweep). Throws
// ConfigError for any invalid input; never returns a half-valid experiment.
std::vector<Experiment> load_experiment(const std::string& path);
// Same from text (tests); `file` is used in messages.
std::vector<Experiment> parse_experiment(const std::string& yaml_text, const std::string& file);

// Builds the sharded model and the plan of a point.
ShardedModel shard_model(const Experiment& experiment);
// The same without a copy: the sharding made at parse time while it still fits the point.
std::shared_ptr<const ShardedModel> shared_shard_model(const Experiment& experiment);
StepPlan plan_experiment(const Experiment& experiment);

}  // namespace muonbed
