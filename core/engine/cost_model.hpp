// Analytic step-time estimate: alpha-beta cost per collective (NCCL's ring, pairwise, direct and
// NVLS algorithms, each link class at its achievable share for the collective class, plus a
// per-call launch overhead; nccl-tests bus factors), compute from the GPU's measured
// Newton-Schulz table or its sustained rate, and a replay of the plan's streams and dependencies
// to find the critical path. A quick estimate before simulating, and the closed-form reference
// the simulator's tests compare against.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "core/config/cluster.hpp"
#include "core/engine/measurement.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/training.hpp"

namespace muonbed {

// nccl-tests bus factors: busbw = algbw * factor, algbw = S / t.
//   all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter (n-1)/n;
//   broadcast, send/recv 1 (reduce 1).
double bus_factor(OpKind kind, int group_size);

// The collective class of a collective kind (all_reduce: ring; NVLS is an algorithm choice, see
// all_reduce_algorithm).
CollectiveClass collective_class(OpKind kind);

// All-reduce algorithms (NCCL's names): a ring (reduce-scatter then all-gather), NVLS (NVLink
// SHARP reduces in the NVSwitch; one node), NVLS tree (NVLS inside each node, the node results
// combined across nodes rail by rail).
enum class AllReduceAlgorithm { ring, nvls, nvls_tree };
std::string_view to_string(AllReduceAlgorithm algorithm);

// Peers a member of an all-to-all exchanges with at once (pairwise rounds, this many in flight;
// the simulator's lowering uses the same window). NCCL posts a grouped send/recv to every peer
// and runs them over its p2p channels, a few peers per channel; 8 is our assumption, not a
// calibrated figure. What matters for multi-node groups is that NVLink and NIC peers overlap.
inline constexpr int kAllToAllPeersInFlight = 8;

// The broadcast chain's chunking (the simulator lowers it the same way): each channel's share is
// cut into chunks of this size, at most this many.
inline constexpr double kBroadcastChunkBytes = 512.0 * 1024;
inline constexpr int kBroadcastMaxChunks = 64;

// NVLS parameters of a group (NvlsParams::available is false where NVLS cannot run: no
// intra_node.nvls, fewer than 2 members on some node, or unequal counts per node).
struct NvlsParams {
  bool available = false;
  int per_node = 0;           // g: members on each node
  int nodes = 1;              // N
  double latency_s = 0;       // intra_node.nvls_latency_us
  double intra_Bps = 0;       // per GPU NVLink x efficiency.intra_node.nvls
  double network_Bps = 0;     // N > 1: per GPU NIC share x efficiency.network.nvls
  double step_latency_s = 0;  // N > 1: one inter-node step (NIC and switch latency)
};

// What one collective instance sees of the cluster, for its kind (rules in cost_model.cpp):
// latencies of a step inside a node and of one that crosses nodes, how many nodes the group
// spans, the per-rank bandwidth of the kind's traffic pattern (each link class at its efficiency
// for the kind's collective class), the per-call launch overhead and, for all-reduce, NVLS.
struct LinkParams {
  double latency_s = 0;        // a step or message (one that crosses nodes, in a multi-node group:
                               // the group's worst path)
  double bandwidth_Bps = 0;    // per rank, per direction
  double intra_latency_s = 0;  // multi-node groups: a step or message inside a node
  double node_latency_s = 0;   // multi-node groups: to another node under the same leaf switch
  double leaf_latency_s = 0;   // and to another leaf of the same pod (3 switches)
  int nodes = 1;               // nodes the group spans
  int leaves = 1;              // fat-tree leaves and pods its nodes sit under
  int pods = 1;
  double launch_s = 0;           // per call (launch_overhead_us.collective)
  int channels = 1;              // multi-node rings: channels (the fewest members on a node)
  double intra_channel_Bps = 0;  // multi-node rings: a GPU's NVLink, shared by its channels
  // The two parts of bandwidth_Bps, per rank and direction, at the class's efficiency: inside
  // the node (NVLink, or PCIe under its host bridge's share) and to other nodes (the NICs a
  // member can drive for this class; fat-tree oversubscription applied).
  double intra_Bps = 0;
  double network_Bps = 0;
  NvlsParams nvls;
};
LinkParams link_for_group(const ClusterSpec& cluster, const DeviceMesh& mesh,
                          const std::vector<int>& members, OpKind kind = OpKind::all_gather);
// The same with the cluster's GPUs per node given directly (the simulator's placement).
LinkParams link_for_group(const ClusterSpec& cluster, int gpus_per_node,
                          const std::vector<int>& members, OpKind kind);

// Closed-form time of one collective instance. `total_bytes` is nccl-tests' S; n the group size.
// Every kind pays launch_s once. Step latencies: a ring of n members over m nodes (node-
// contiguous, the simulator's rings) has m of its n edges crossing nodes, and L consecutive steps
// pay a crossing latency for ceil(L m / n) of them (at most L) and `a_i` for the rest: lat(L).
// Of the crossing edges, those that cross fat-tree leaves (pods) pay the longer path's latency
// in the same proportion (core/config/cluster.hpp switch_hops_between); `a_x` below is the
// group's worst path.
//   all_gather / reduce_scatter (ring): lat(n-1) + (S - p_min)/B, with p_min the smallest
//     member's piece (S/n when even; 0 when one member contributes everything, so the time is
//     never below that member's data over its own link)
//   all_reduce: the faster of the ring, lat(2(n-1)) + 2 (n-1) S/(n B), and, where NVLS is
//     available, NVLS: nvls latency + a_i (one node) or 2(N-1) a_x (NVLS tree) +
//     max(S (g+1)/g / B_nvls, [N > 1] 2(N-1)/N S/g / B_nvls_net)  (the NVSwitch reduces: each
//     GPU moves S (g+1)/g per direction instead of the ring's 2(n-1)/n S)
//   all_to_all (pairwise, kAllToAllPeersInFlight peers at once): ceil((n-1)/W) a_x + (n-1) S/(n B)
//   gather / scatter (direct): a_x + S (n-1)/(n B)
//   broadcast (pipelined chain from the root along each channel's ring, c channels = members per
//     node, k chunks of the channel's S/c, as the simulator lowers it): one node:
//     (n-2+k) (a + chunk/B); across nodes the first chunk crosses every hop (a NIC per channel,
//     or NVLink shared by about half the c-1 other channels) and the other k-1 follow at the
//     slowest hop (a_x + chunk/(B/c), or a_i + chunk (c-1)/B_nvlink)
//   send / recv: a_x + S/B; barrier: 2 a_x ceil(log2 n)
// `min_piece_bytes` < 0 means even pieces.
double collective_time(OpKind kind, int group_size, double total_bytes, const LinkParams& link,
                       double min_piece_bytes = -1);
// The smallest piece a member of an all_gather or reduce_scatter instance contributes or ends
// with (collective_time's p_min); -1 for other kinds.
double smallest_piece_bytes(const StepPlan& plan, const Op& op, const std::vector<int>& members);
// The analytic time of one instance of collective `op` alone (nothing else in flight):
// `participants` as the engine lists them (the group, or the send/recv pair {sender, receiver});
// ring classes sized by `leader`, point-to-point classes (all_to_all, gather, scatter, send/recv)
// by their busiest member's bytes to its node and to other nodes; never less than the occupancy
// of the busiest link its own traffic crosses (core/engine/link_sharing.hpp).
double instance_time(const StepPlan& plan, const ClusterSpec& cluster, const Op& op,
                     const std::vector<int>& participants, int leader);
// The algorithm collective_time picks for an all-reduce of S bytes (ring without NVLS).
AllReduceAlgorithm all_reduce_algorithm(int group_size, double total_bytes, const LinkParams& link);
// Time of one all-reduce algorithm (+infinity for NVLS where it is not available).
double all_reduce_time(AllReduceAlgorithm algorithm, int group_size, double total_bytes,
                       const LinkParams& link);

// How the model times the plan's Newton-Schulz calls: each distinct call shape (rows x cols,
// batch, steps) by the source of its time (GpuSpec::ns_call_seconds; without a table of the
// cluster's kernel version, every shape is "curve"). A sentence for a result's notes, e.g.
// "NS times (gpu.ns_table v2): 5 shapes from the table, 2 interpolated, 1 from the GEMM-
// efficiency curve (past the table by more than 2x in FLOPs: 128x[768x2048])"; the counts are
// also returned by source.
struct NsSourceSummary {
  int table = 0, interpolated = 0, extrapolated = 0, curve = 0;
  std::vector<std::string> extrapolated_shapes, curve_shapes;
  std::string note;
};
NsSourceSummary ns_time_sources(const StepPlan& plan, const ClusterSpec& cluster);

// The instances of one collective op in a step: how many ran and how long each took from its
// start (the last member's arrival) to its completion, links shared with everything in flight.
struct InstanceTimes {
  int instances = 0;
  double time_sum_s = 0;
  double time_max_s = 0;
};

struct StepEstimate {
  int step = 0;
  double step_time_s = 0;                  // max over ranks of finish time
  std::vector<TimeBreakdown> ranks;        // per rank (measurement.hpp)
  std::vector<InstanceTimes> collectives;  // by op id (zero for compute ops and idle steps)
  // A training step: per rank, each StepPhase's busy time and its last op's end (timeline.hpp).
  std::vector<std::array<double, kStepPhases>> phase_busy_s;
  std::vector<std::array<double, kStepPhases>> phase_end_s;
};

struct EstimateSummary {
  double average_step_s = 0;  // over one hyper-period
  double worst_step_s = 0;
  StepEstimate worst;  // the slowest step's detail
};

// Replays the plan for step `step` on the execution engine (core/engine/engine.hpp) with
// closed-form op durations. Collective instances start when all members are ready (stream order and
// deps), so waiting shows up as idle time; the breakdown follows core/engine/timeline.hpp's rules.
// Throws PlanError for a plan the engine cannot run or finish.
//
// share_links = false prices every collective instance alone, as if nothing else were in flight
// (core/engine/link_sharing.hpp says what sharing adds): a bound on what contention costs, and
// the reference that tests of the replay's own bookkeeping compare with.
struct AnalyticOptions {
  bool share_links = true;
};
StepEstimate estimate_step(const StepPlan& plan, const ClusterSpec& cluster, int step = 0,
                           const AnalyticOptions& options = {});
EstimateSummary estimate(const StepPlan& plan, const ClusterSpec& cluster,
                         const AnalyticOptions& options = {});

// Duration of one compute op on one rank. Newton-Schulz: per matrix (or stacked batch) call, the
// measured time of gpu.ns_table for the cluster's gpu.ns_kernel version, else its FLOPs at the
// sustained rate for its size plus one kernel launch overhead. Elementwise ops: FLOPs at peak or
// memory bytes at HBM bandwidth, whichever is larger, plus one kernel launch overhead per
// parameter the op touches on the rank. `training` (optional) prices forward and backward ops
// once per rank for all their micro-batches.
double compute_time(const StepPlan& plan, const Op& op, int rank, const ClusterSpec& cluster,
                    TrainingCosts* training = nullptr);
// compute_time and the op's FLOPs on the rank (op_flops; forward and backward: `training`'s when
// given), with an elementwise op's elements counted once for both (without `with_flops`: 0).
struct ComputeCost {
  double seconds = 0;
  double flops = 0;
};
ComputeCost compute_cost(const StepPlan& plan, const Op& op, int rank, const ClusterSpec& cluster,
                         TrainingCosts* training = nullptr, bool with_flops = true);

// Split Newton-Schulz (core/plan/split_ns.hpp): the time of one member's part of param p's split
// NS on the cluster: its compute at the GPU's sustained rate for the slice (compute_time's rule
// for NS) and the all-reduces over its group.
struct SplitNsCost {
  double compute_s = 0;
  double all_reduce_s = 0;
};
SplitNsCost split_ns_cost(const StepPlan& plan, const Op& op, int p, int rank,
                          const ClusterSpec& cluster);
// Every param of the op, one after another (the analytic model's duration of an instance).
double split_ns_time(const StepPlan& plan, const Op& op, int rank, const ClusterSpec& cluster);

// The host work of communication on ranks that have no engine of their own for it
// (gpu.host_comm_us_per_message or host_comm_ns_per_byte > 0: CPU ranks, whose MPI executor
// packs, copies and unpacks messages at progress points inside its compute). Each collective a
// rank takes part in owes host_comm_us_per_message per peer it sends to or receives from plus
// host_comm_ns_per_byte x the bytes it sends and receives in it; the rank's idle time since
// its last compute op pays first, its next compute op is lengthened by the rest. A rank that
// waits for a collective therefore pays nothing extra (the collective's measured time holds its
// host work), one that computes while messages flow pays it all. One rule for the analytic model
// and the simulator: both call it from their engine handlers, times in seconds from the step's
// start. Inactive (charges nothing, costs nothing) when both of the profile's values are 0.
class HostCommCharge {
 public:
  HostCommCharge(const StepPlan& plan, const ClusterSpec& cluster);
  bool active() const { return seconds_per_message_ > 0 || seconds_per_byte_ > 0; }
  void begin_step();
  // A collective instance of `op` started with these participants (split Newton-Schulz and
  // barriers move no data of their own here).
  void collective_started(int op, const std::vector<int>& participants);
  void compute_finished(int rank, double t);
  // Seconds to add to the compute op `rank` starts at `t`; the rank then owes nothing.
  double compute_started(int rank, double t);

 private:
  const StepPlan& plan_;
  double seconds_per_message_ = 0;
  double seconds_per_byte_ = 0;
  std::vector<double> owed_;      // per rank: seconds of host work not yet paid
  std::vector<double> last_end_;  // per rank: when its last compute op ended (0: step start)
};

}  // namespace muonbed
