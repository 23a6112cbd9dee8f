// Experiment files (YAML): cluster, mesh, model, optimizer, strategy, backend(s), steps, sweeps,
// output. Parsing is strict: an unknown key, a wrong type or an impossible value is a ConfigError
// naming file:line:column, the offending value and what to change. A sweep is a cartesian
// product of overrides of dotted keys, where the keys of a `zip:` group vary together (one axis);
// each point is resolved to a complete Experiment.
//
//   name: quickstart
//   cluster: dgx-h100                 # a file under experiments/clusters/, or an inline map
//   mesh: {dims: [{name: dp_shard, size: 8}], gpus_per_node: 8}   # gpus_per_node from cluster
//   model: {preset: llama-7b}         # or {hf_config: config.json}, {dense: {...}}, {moe: {...}},
//                                     # {params: [...]}
//   parallel: {fsdp_tensor_dim: 0, tp_dim_per_param: {layers.0.attn.o: 1}, dense_over_ep: shard}
//   optimizer: {lr: 0.02, momentum: 0.95, nesterov: true, ns_steps: 5, ns_coefficients: keller,
//               adamw: {lr: 3e-4, betas: [0.9, 0.95]}}   # core/model/optimizer.hpp:
//               torch.optim.Muon names
//   strategy: {name: owner, assign: flop_balanced, prefetch_count: 1}
//   backend: sim                      # sim | analytic | mpi | nccl, or a list
//   steps: 2                          # measured backends: untimed warm-up steps (default 2)
//   repeats: 10                       # measured backends: timed steps after them (default 10)
//   seed: 1                           # measured backends: seed of the step data (default 1)
//   memory: {master_weights: auto, activations_GiB: 0, reserved_GiB: 0}   # feasibility check
//   sweep: {strategy.name: [sequential, owner, all_to_all]}   # or, keys varying together:
//   sweep: {zip: {mesh.dp_shard: [8, 16], cluster.nodes: [1, 2]}, strategy.name: [owner]}
//   output: results/quickstart
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config/cluster.hpp"
#include "core/model/model.hpp"
#include "core/model/optimizer.hpp"
#include "core/model/parallelize.hpp"
#include "core/plan/strategy.hpp"

namespace muonbed {

// The simulator's step fidelity models every transfer: O(ranks^2) transfers per collective, so
// above this many ranks one point takes hours. Larger meshes use flow fidelity (or auto).
inline constexpr int kMaxStepFidelityRanks = 2048;

struct Experiment {
  std::string name;
  std::string file;         // the YAML it came from
  std::string point_label;  // "strategy.name=owner,mesh.dp_shard=8" ("" without sweep)
  std::map<std::string, std::string> overrides;  // this point's sweep values
  ClusterSpec cluster;
  DeviceMesh mesh;
  Model model;
  ParallelRules parallel;
  OptimizerConfig optimizer;  // core/model/optimizer.hpp; routing rules live in parallel.routing
  StrategyOptions strategy;
  // The training state around the optimizer step (memory: {master_weights, activations_GiB,
  // reserved_GiB}), for the memory feasibility check; no step time depends on it.
  TrainingMemoryOptions memory;
  // The training step around the optimizer (training: {tokens_per_step, seq_len, ...});
  // disabled: the optimizer step alone.
  TrainingOptions training;
  std::vector<std::string> backends;  // sim, analytic, mpi, nccl
  std::string sim_fidelity = "auto";  // step | flow | auto (sim/src/fidelity.hpp's rule)
  // Real executors (mpi, nccl) run `steps` untimed warm-up steps, then `repeats` timed steps,
  // on data generated from `seed` (backends/cpu/data.hpp). The analytic model and the simulator
  // are deterministic: they ignore all three (their records say so in their notes).
  int steps = 2;
  int repeats = 10;
  std::uint64_t seed = 1;
  std::string output_dir;
  std::string resolved_yaml;  // the complete resolved configuration of this point, as YAML
  // The sharded model, built once when the file is parsed and shared by the points of a sweep
  // whose mesh, model and parallel rules agree; shard_model() returns it while the fingerprint
  // of those inputs (sharded_key) still matches.
  std::shared_ptr<const ShardedModel> sharded;
  std::uint64_t sharded_key = 0;

  PlanSettings plan_settings() const;
};

// What the command line sets over the file for every point (muonbed run --output): applied as
// the points are parsed, so that their resolved configuration says it from the start.
struct ExperimentOverrides {
  std::string output;  // the results folder; empty: the file's
};

// Loads a file and expands its sweep into points (one point without a sweep). Throws
// ConfigError for any invalid input; never returns a half-valid experiment.
std::vector<Experiment> load_experiment(const std::string& path,
                                        const ExperimentOverrides& overrides = {});
// Same from text (tests); `file` is used in messages.
std::vector<Experiment> parse_experiment(const std::string& yaml_text, const std::string& file,
                                         const ExperimentOverrides& overrides = {});

// Builds the sharded model and the plan of a point.
ShardedModel shard_model(const Experiment& experiment);
// The same without a copy: the sharding made at parse time while it still fits the point.
std::shared_ptr<const ShardedModel> shared_shard_model(const Experiment& experiment);
StepPlan plan_experiment(const Experiment& experiment);

}  // namespace muonbed
