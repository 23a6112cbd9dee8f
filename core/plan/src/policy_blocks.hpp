// Private to core/plan: helpers the building blocks share (gather_policies.cpp, schedule.cpp,
// build_plan.cpp), and the units and scheduler that run a Schedule.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/plan/schedule.hpp"

namespace muonbed::plan_detail {

// "layers.0.attn.q", or "3 matrices from layers.0.attn.q".
std::string param_label(const PlanBuilder& b, std::span<const int> params);
// Sharding mesh dims of a layout, innermost (fastest-varying, e.g. tp) first.
std::vector<int> shard_dims_inner_first(const DeviceMesh& mesh, const TensorLayout& layout);
DimSet minus(DimSet a, DimSet b);

// A staged gather or redistribution that leaves out the stages over `split` (split
// Newton-Schulz: the gather ends with every member of the split group holding its slice).
std::unique_ptr<GatherPolicy> make_staged_gather(const std::string& name, StageOrder order,
                                                 DimSet split);
std::unique_ptr<RedistributePolicy> make_staged_redistribute(const std::string& name,
                                                             StageOrder order, DimSet split);

// What moves and is orthogonalized together.
struct Unit {
  std::vector<int> params;
  std::vector<int> lane_key;
  DimSet split;  // non-empty: one matrix whose NS is split over these dims (SplitNsOptions)
  // What the unit waits for besides the schedule's start (a training step with overlap: the
  // momentum ops of its matrices' layers).
  std::vector<int> deps;
};

// The group a matrix's collectives run in: independent coords, shard and replicate dims.
std::vector<int> group_key(const PlanBuilder& b, int p);

// How units are cut from `params` (matrices or chunks, in plan or LPT order).
struct UnitOptions {
  int chunk_size = 8;
  bool lpt = false;
  bool chunk_by_shape = false;
  bool ns_cost_chunks = false;
};
std::vector<Unit> make_units(const PlanBuilder& b, std::vector<int> params, const Schedule& s,
                             const UnitOptions& o, const std::map<int, DimSet>& split = {});

// Runs the pipeline of `schedule` over `units` after `start_deps`; returns the op ids after which
// every update of these units is in place.
std::vector<int> run_schedule(PlanBuilder& b, const Schedule& schedule, int ns_steps,
                              const std::vector<Unit>& units, const std::vector<int>& start_deps);

}  // namespace muonbed::plan_detail
