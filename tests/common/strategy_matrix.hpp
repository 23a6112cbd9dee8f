// The invariant matrix shared by the plan tests (tests/core) and the execution tests
// (tests/backends): nine topologies (every parallelism and a 4-D hybrid, small models) and the
// strategy variants (every built-in strategy with the options that change its plan's shape, then
// every other registered strategy with its defaults).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/model/parallelize.hpp"
#include "core/plan/strategy.hpp"

namespace muonbed::testing {

struct Topology {
  std::string name;
  std::vector<MeshDim> dims;
  std::string model;
};

inline std::vector<Topology> topologies() {
  return {
      {"DDP", {{"dp_replicate", 4, DimRole::replicate}}, "tiny-dense"},
      {"FSDP", {{"dp_shard", 4, DimRole::fsdp}}, "tiny-dense"},
      {"HSDP",
       {{"dp_replicate", 2, DimRole::replicate}, {"dp_shard", 2, DimRole::fsdp}},
       "tiny-dense"},
      {"TP", {{"tp", 4, DimRole::tp}}, "tiny-dense"},
      {"FSDP+TP", {{"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}}, "tiny-dense"},
      {"EP", {{"dp_shard", 2, DimRole::fsdp}, {"ep", 2, DimRole::ep}}, "tiny-moe"},
      {"CP", {{"dp_shard", 2, DimRole::fsdp}, {"cp", 2, DimRole::replicate}}, "tiny-dense"},
      {"PP", {{"pp", 2, DimRole::pp}, {"dp_shard", 2, DimRole::fsdp}}, "tiny-dense"},
      {"4-D",
       {{"pp", 2, DimRole::pp},
        {"dp_replicate", 2, DimRole::replicate},
        {"dp_shard", 2, DimRole::fsdp},
        {"tp", 2, DimRole::tp}},
       "tiny-dense"},
  };
}

inline std::vector<StrategyOptions> strategies() {
  std::vector<StrategyOptions> list;
  auto add = [&](std::string name, auto&& tweak) {
    StrategyOptions o;
    o.name = name;
    tweak(o);
    list.push_back(o);
  };
  add("sequential", [](StrategyOptions&) {});
  add("replicated", [](StrategyOptions&) {});
  add("owner", [](StrategyOptions& o) { o.prefetch_count = 0; });
  add("owner", [](StrategyOptions& o) { o.prefetch_count = 2; });
  add("owner", [](StrategyOptions& o) {
    o.async_gpu_parallelism = false;
    o.assign = "round_robin";
  });
  add("owner", [](StrategyOptions& o) {
    o.gather = "flat";
    o.assign = "size_balanced";
  });
  add("owner", [](StrategyOptions& o) {
    o.small_param_threshold = 5000;
    o.grad_sync.enabled = true;
    o.grad_sync.level_periods = {1, 2};
  });
  add("all_to_all", [](StrategyOptions& o) {
    o.chunk_size = 3;
    o.max_chunks_in_flight = 2;
  });
  add("all_to_all", [](StrategyOptions& o) {
    o.chunk_size = 1;
    o.max_chunks_in_flight = 1;
    o.grad_sync.enabled = true;
  });
  add("owner_allgather", [](StrategyOptions& o) { o.chunk_size = 4; });
  add("owner_allgather", [](StrategyOptions& o) {
    o.grad_sync.enabled = true;
    o.assign = "expert_local";
  });
  // Issue 13's levers, last so the indices above (which tests/mpi names) keep their variants.
  add("owner", [](StrategyOptions& o) {  // issue 13's levers: muonbed's preset, small
    o.gather = "rails";
    o.assign = "topology";
    o.comm_lanes = 3;
    o.order = "lpt";
  });
  add("all_to_all", [](StrategyOptions& o) {  // Dion's batches of one shape, largest first
    o.chunk_size = 3;
    o.chunk_by_shape = true;
    o.order = "lpt";
  });
  // Split Newton-Schulz of every matrix a group can split (threshold 0: each over the smallest
  // group that can split it), on hierarchical gathers, and on flat gathers with groups of at most
  // 2, two lanes and largest first. Their results equal the reference within kSplitNsTolerance
  // (tests/common/equivalence_cases.hpp), not bit for bit.
  add("owner", [](StrategyOptions& o) {
    o.split_ns.enabled = true;
    o.split_ns.threshold = 0;
    o.split_ns.max_members = 64;
  });
  add("owner", [](StrategyOptions& o) {
    o.gather = "flat";
    o.comm_lanes = 2;
    o.order = "lpt";
    o.split_ns.enabled = true;
    o.split_ns.threshold = 0;
    o.split_ns.max_members = 2;
  });
  add("all_to_all", [](StrategyOptions& o) {  // the pipelined all-to-all: chunks by NS cost
    o.chunk_sizing = "ns_cost";
    o.order = "lpt";
    o.max_chunks_in_flight = 2;
  });
  // Every other registered strategy (a user's own, core/policies/) with its default options, so
  // a strategy added in one file is held to every invariant and equivalence test at once.
  for (const std::string& name : strategy_names()) {
    const bool listed = std::any_of(list.begin(), list.end(),
                                    [&](const StrategyOptions& o) { return o.name == name; });
    if (!listed) add(name, [](StrategyOptions&) {});
  }
  return list;
}

// The GPU executors do not run split Newton-Schulz yet (backends/gpu refuses it).
inline bool gpu_runs(const StrategyOptions& o) {
  return !o.split_ns.enabled;
}

inline ShardedModel make_model(const Topology& t, const ParallelRules& rules = {}) {
  DeviceMesh mesh(t.dims, 4);
  return parallelize(*find_preset(t.model), mesh, rules);
}

}  // namespace muonbed::testing
