// Split Newton-Schulz: the orthogonalization of one matrix by a group of GPUs (plan.hpp's
// split_newton_schulz op), so that the longest single NS of a step shrinks when ranks outnumber
// matrices or one matrix dominates (issue 13). The method is the "distributed" tensor-parallel
// mode of NVIDIA's Emerging-Optimizers (NVIDIA-NeMo/Emerging-Optimizers,
// emerging_optimizers/orthogonalized_optimizers/muon_utils.py, newton_schulz_tp with
// tp_mode="distributed"): each member holds a slice of X along one tensor dim, whole along the
// other, and every product that needs the whole X is a Gram matrix of the other dim, which is a sum
// of the members' partial Grams. With S the dim the slices split and G the other one (Gram size
// g = |G|), member r holding X_r:
//
//   norm    ||X||^2 = sum_r ||X_r||^2          (an all-reduce of one number per matrix)
//   step    A = sum_r X_r^T X_r  (G x G)       (partial products, then an all-reduce)
//           B = b A + c A A                     (every member, redundantly)
//           X_r <- a X_r + X_r B                (its own slice)
//
// written for slices of rows (S = rows); slices of columns use A = sum_r X_r X_r^T and
// X_r <- a X_r + B X_r. Since X p(X^T X) = p(X X^T) X, this is the same polynomial as the
// single-device iteration. The split must run along the long dim (g <= |S|): the Gram is then the
// single-device one, and a member computes 4 g^2 |S_r| + 2 g^3 FLOPs per step instead of
// 4 g^2 |S| + 2 g^3. A square matrix may split either dim. Stacks (experts) are not split.
//
// Wire format: per NS run one all-reduce of the members' squared norms (fp32, one element per
// matrix), then one all-reduce per step of the partial Grams (g x g elements in the plan's comm
// dtype, as Emerging-Optimizers reduces them in the iteration's bf16), each split into
// torch.chunk parts like plan.hpp's all_reduce (reduce-scatter, then all-gather).
#pragma once

#include <cstdint>
#include <string>

#include "core/plan/plan.hpp"

namespace muonbed {

// A member's slice of one matrix.
struct SplitNsSlice {
  bool rows = false;       // the slices split rows (S = rows), else columns
  std::int64_t gram = 0;   // g: size of the whole dim (the Gram matrices are g x g)
  std::int64_t split = 0;  // |S|: size of the split dim
  std::int64_t part = 0;   // |S_r|: this member's share of it
};

// Can the members of `group` (with pieces index_set(r, gathered)) split param p's NS? Empty when
// they can, else why not: a stack, a piece not whole along one dim, a split along the short dim,
// pieces that do not cover the matrix.
std::string split_ns_problem(const ShardedModel& model, int p, int rank, DimSet gathered,
                             DimSet group);
// This member's slice (throws PlanError with split_ns_problem's reason when it cannot split).
SplitNsSlice split_ns_slice(const ShardedModel& model, int p, int rank, DimSet gathered);

// Elements all-reduced per NS run of the op's params: the norms (fp32, one per matrix) and, per
// step, the Grams (comm dtype).
struct SplitNsExchange {
  std::int64_t norm_elements = 0;  // fp32
  std::int64_t gram_elements = 0;  // comm dtype, per step
  int steps = 0;
};
SplitNsExchange split_ns_exchange(const StepPlan& plan, const Op& op, int rank);

// FLOPs a member computes (partial Grams, its A.A, its X_r update) over all steps.
double split_ns_flops(const StepPlan& plan, const Op& op, int rank);

// What a member's part costs on a modelled cluster (split_ns_cost, split_ns_time) is the cost
// model's: core/engine/cost_model.hpp.

}  // namespace muonbed
