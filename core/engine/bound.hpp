// A lower bound on the time of a plan's Muon step on a modelled cluster, T_bound, so that every
// plan says how far it is from what the hardware allows (issue 13). It uses only the cost model's
// figures (core/engine/cost_model.hpp: the compute time of a Newton-Schulz op, link_for_group's
// latency and bandwidth), so it follows their calibration.
//
//   T_bound = max( W(B) / R(B) + g_min(B) + s_min(B)   over the rank sets B below,
//                  max over matrices p of  g(p) + span(p) + s(p) )
//
// with, per Muon matrix p (a stack counts as its matrices together):
//   work(p)   the GPU-seconds its Newton-Schulz takes: compute_time of NS of the whole matrix on
//             one GPU; for a matrix the plan splits over a group (split_newton_schulz), the sum
//             of the members' compute times (more than on one GPU: the Gram products A.A are
//             repeated on every member);
//   span(p)   the least time it can take: work(p) on one GPU; split, the time of the split op
//             (a member's compute plus the Gram all-reduces).
//   g(p)      the first gather into the GPU that orthogonalizes it, through that GPU's own links:
//             the bytes it lacks over its NVLink and NIC ingress together, and the bytes its
//             node lacks over the node's NICs together, whichever takes longer, plus the path
//             latency (bytes in the comm dtype; what the GPU holds when the step starts is the
//             piece the plan's momentum op computes, its whole matrix under owner_allgather);
//   s(p)      the last scatter out of it: through the same links the other way, the elements of
//             the result that other ranks hold shards of (every element outside the GPU's own
//             shard, and outside its node's shards for the node's NICs).
// The balanced term: B runs over the rank sets that hold Muon matrices (holders boxes: every rank
// for FSDP x TP, a pipeline stage, an expert slice's ranks) and their union; W(B) is the work of
// the matrices held only inside B and R(B) its ranks (candidate owners: a superset of the ranks
// that may own, so the bound stays a lower bound); g_min and s_min are the smallest g and s of
// those matrices (the busiest owner must receive one matrix before it computes and send one back
// after). The longest term: the rank that orthogonalizes p must receive it, run it and send it
// back.
//
// With a training step (core/plan/training.hpp), T_bound is also at least the busiest rank's
// forward and backward compute (binding "training compute").
//
// Not in the bound: momentum, AdamW and apply_update (elementwise, a few ms at most), gradient
// sync, contention between matrices for links (the balanced term's comm is one matrix's), and
// the choice of owners (g and s are taken at the plan's owner, or the first holder when the plan
// has none; every holder of an evenly sharded matrix sees the same bytes).
#pragma once

#include <string>

#include "core/config/cluster.hpp"
#include "core/plan/plan.hpp"

namespace muonbed {

struct StepBound {
  double bound_s = 0;        // T_bound
  double ns_total_s = 0;     // sum of work(p): Newton-Schulz on one GPU, every matrix
  double ns_balanced_s = 0;  // the largest W(B) / R(B)
  double ns_longest_s = 0;   // the largest span(p)
  double gather_s = 0;       // g and s of the term that binds
  double scatter_s = 0;
  // With a training step: the forward and backward compute of the busiest rank, a third term
  // (binding "training compute") of T_bound.
  double training_compute_s = 0;
  int owner_ranks = 0;  // R of the balanced term that binds (or the largest term's set)
  std::string binding;  // "balanced", "longest" or "training compute": which term T_bound is
  std::string longest;  // the matrix of the longest term
};

// Throws PlanError when the plan cannot be costed on the cluster (as estimate() does).
StepBound step_bound(const StepPlan& plan, const ClusterSpec& cluster);

}  // namespace muonbed
