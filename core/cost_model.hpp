// Analytic step-time estimate: alpha-beta cost per collective (NCCL ring/tree algorithms and the
// nccl-tests bus factors), compute at the GPU's sustained rate, and a replay of the plan's
// streams and dependencies to find the critical path. A quick estimate before simulating, and the
// closed-form reference the simulator's tests compare against.
#pragma once

#include <string>
#include <vector>

#include "core/cluster.hpp"
#include "core/plan.hpp"

namespace muonbed {

// nccl-tests bus factors: busbw = algbw * factor, algbw = S / t.
//   all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter (n-1)/n;
//   broadcast, send/recv 1 (reduce 1).
double bus_factor(OpKind kind, int group_size);

// Link parameters seen by one collective instance: the slowest link class it crosses. `kind`
// picks the traffic pattern across nodes (rings aggregate a node's NICs, all-to-all and rooted
// collectives do not); the rules are documented in cost_model.cpp.
struct LinkParams {
  double latency_s = 0;
  double bandwidth_Bps = 0;  // per rank, per direction
};
LinkParams link_for_group(const ClusterSpec& cluster, const DeviceMesh& mesh,
                          const std::vector<int>& members, OpKind kind = OpKind::all_gather);

// Closed-form time of one collective instance. `total_bytes` is nccl-tests' S.
//   ring all_gather / reduce_scatter: (n-1) * (alpha + S/(n*B))
//   all_reduce: 2 (n-1) * (alpha + S/(n*B))
//   all_to_all (pairwise): (n-1) * (alpha + S/(n*B))
//   gather/scatter (direct): alpha + S*(n-1)/(n*B)  (root's link is the bottleneck)
//   broadcast (pipelined chain, fine chunks): alpha*(n-1) + S/B
//   send/recv: alpha + S/B; barrier: 2 alpha log2(n)
double collective_time(OpKind kind, int group_size, double total_bytes, const LinkParams& link);

struct RankTimes {
  double compute_s = 0;        // busy time on compute streams
  double communication_s = 0;  // busy time on communication streams
  double exposed_comm_s = 0;   // communication time not overlapped by compute
  double idle_s = 0;           // step time minus the union of busy time
  double finish_s = 0;
};

struct StepEstimate {
  int step = 0;
  double step_time_s = 0;  // max over ranks of finish time
  std::vector<RankTimes> ranks;
};

struct EstimateSummary {
  double average_step_s = 0;  // over one hyper-period
  double worst_step_s = 0;
  StepEstimate worst;  // the slowest step's detail
};

// Replays the plan for step `step` on the execution engine (core/engine.hpp) with closed-form op
// durations. Collective instances start when all members are ready (stream order and deps), so
// waiting shows up as idle time; the breakdown follows core/timeline.hpp's rules. Throws
// PlanError for a plan the engine cannot run or finish.
StepEstimate estimate_step(const StepPlan& plan, const ClusterSpec& cluster, int step = 0);
EstimateSummary estimate(const StepPlan& plan, const ClusterSpec& cluster);

// Duration of one compute op on one rank: flops at the sustained rate for its matrix size, or
// memory bytes at HBM bandwidth for elementwise ops, whichever is larger.
double compute_time(const StepPlan& plan, const Op& op, int rank, const ClusterSpec& cluster);

}  // namespace muonbed
