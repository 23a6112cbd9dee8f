// The modelled time of split Newton-Schulz (core/plan/split_ns.hpp says what a member computes
// and exchanges): its compute as the cost model times NS and its all-reduces as collective_time
// prices them. Declared in core/engine/cost_model.hpp; the analytic replay, the bound and the
// simulator all use it.
#include "core/engine/cost_model.hpp"

#include <algorithm>
#include <vector>

#include "core/base/errors.hpp"
#include "core/plan/split_ns.hpp"

namespace muonbed {

SplitNsCost split_ns_cost(const StepPlan& plan, const Op& op, int p, int rank,
                          const ClusterSpec& cluster) {
  const SplitNsSlice s = split_ns_slice(plan.model, p, rank, op.gathered);
  const double g = static_cast<double>(s.gram), n = static_cast<double>(s.part);
  const double flops = op.ns_steps * (4.0 * g * g * n + 2.0 * g * g * g);
  const GpuSpec& gpu = cluster.gpu;
  SplitNsCost c;
  // As cost_model.cpp costs NS: the sustained rate for the smallest dim of the products, bounded
  // below by the HBM traffic (per step: read X_r twice, write A, read A twice, write B, write X_r).
  const double rate = gpu.sustained_flops(std::min(g, n));
  if (flops > 0 && !(rate > 0))
    throw PlanError("split Newton-Schulz: the GPU '" + gpu.name +
                    "' has no compute rate; fix: set gpu.peak_tflops in the cluster");
  c.compute_s = flops > 0 ? flops / rate : 0;
  if (gpu.hbm_GBps > 0) {
    const double width = static_cast<double>(bytes_of(plan.settings.comm_dtype()));
    const double bytes = op.ns_steps * width * (3 * g * n + 3 * g * g);
    c.compute_s = std::max(c.compute_s, bytes / (gpu.hbm_GBps * 1e9));
  }
  const std::vector<int> members = plan.mesh().group_members(rank, op.group);
  const int k = static_cast<int>(members.size());
  if (k > 1) {
    const LinkParams link = link_for_group(cluster, plan.mesh(), members, OpKind::all_reduce);
    const double width = static_cast<double>(bytes_of(plan.settings.comm_dtype()));
    c.all_reduce_s = collective_time(OpKind::all_reduce, k, 4.0, link) +
                     op.ns_steps * collective_time(OpKind::all_reduce, k, g * g * width, link);
  }
  return c;
}

double split_ns_time(const StepPlan& plan, const Op& op, int rank, const ClusterSpec& cluster) {
  double t = 0;
  for (int p : op.params) {
    const SplitNsCost c = split_ns_cost(plan, op, p, rank, cluster);
    t += c.compute_s + c.all_reduce_s;
  }
  return t;
}

}  // namespace muonbed
