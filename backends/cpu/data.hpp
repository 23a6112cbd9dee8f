// Deterministic step data from a seed, generated per rank for exactly the pieces it holds, with
// kernels/random.hpp's counter-based generator keyed by the full index of the *source* parameter
// (Model::params; an EP slice is a slice of its source stack, at its Independent coordinate
// along the ep dim), so every rank, every executor and the single-device reference see the same
// values.
//
//   initial parameters   random_params<float>(model, seed) of kernels/reference_optimizer.hpp,
//                        stored in the parameter's dtype (rounded, as the reference stores them).
//   gradients            step k (from 0) of source s, full index i: the sum over the members
//                        m < N of the gradient's sync group of
//                            contribution = n * 2^-14,  n = an integer in [-K, K],  K = 256 / N,
//                        drawn from stream counter_key(counter_key(seed, grad_stream(S, s, k+1)),
//                        m). A rank whose gradient the plan reduces (reduce_scatter, all_reduce)
//                        starts with its own contribution (member index in the union of the sync
//                        groups, core/plan/program.hpp's ParamPieces); others start with the sum
//                        (N = 1). Every partial sum is an integer of magnitude <= 256 times
//                        2^-14, exact in bf16 and fp32, so reductions are exact in any order and
//                        a distributed step can equal the reference bit for bit.
//                        Level-scheduled sync (seed 002): in a step where a level's sync ops are
//                        inactive (k % period != 0) that level is frozen and its gradient is zero
//                        on every rank and in the reference.
//   QK-clip logits       random_max_logits(layers, query heads, tau, seed, k + 1).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/store.hpp"
#include "core/plan/program.hpp"
#include "kernels/reference_optimizer.hpp"

namespace muonbed::cpu {

// Where a plan param's elements sit in its source parameter.
struct SourceSlice {
  int source = 0;
  std::int64_t offset = 0;  // full index of the slice's first element in the source
  std::vector<std::int64_t> source_shape;
};
SourceSlice source_slice(const ShardedModel& model, int param);

// The single-device model a sharded model came from (EP slices joined back into their stacks,
// in source order), and routing rules that route every parameter as the plan does. Throws
// PlanError when params share a source without being EP slices of it.
Model source_model(const ShardedModel& model);
RoutingRules source_routing(const ShardedModel& model);

// Member `member` of `members`' contribution to element `index` of source `source`'s gradient.
float gradient_contribution(std::uint64_t seed, std::size_t num_sources, int source, int step,
                            int member, int members, std::int64_t index);

// Fills the rank's parameter pieces with their initial values (momentum and moments are zero).
void fill_parameters(const StepPlan& plan, const RankProgram& program, RankStore& store,
                     std::uint64_t seed);
// Fills the rank's gradient pieces for step `step` (from 0).
void fill_gradients(const StepPlan& plan, const RankProgram& program, RankStore& store,
                    std::uint64_t seed, int step);

// The summed gradient of every source parameter in step `step` (what the reference is fed).
ModelTensors<float> summed_gradients(const StepPlan& plan, const Model& model, std::uint64_t seed,
                                     int step);
// The max logits of step `step`: per layer, one per query head.
QkLogits step_logits(const Model& model, const OptimizerConfig& config, std::uint64_t seed,
                     int step);

}  // namespace muonbed::cpu
