// The SimGrid backend's public facade: replay a step plan on a modelled cluster and get the
// results record of core/results/results.hpp, a Chrome/Perfetto trace and run statistics. No
// SimGrid type appears here; everything SimGrid lives in sim/src/.
//
// Fidelities (SimOptions::fidelity):
//   step  every algorithm step (ring step, all-to-all round, broadcast chunk) is a transfer; the
//         reference, practical up to a few hundred ranks.
//   flow  one long flow per ring edge and channel, per merged all-to-all round, or per bundle of
//         senders to a root, with the latency terms of the skipped steps added analytically
//         (broadcast keeps its chunked chain, linear in size); intra-node links are shared by an
//         exact per-node max-min model instead of SimGrid activities (sim/src/node_fabric.hpp
//         explains why; not on multi-node PCIe clusters, whose GPU links also carry NIC
//         traffic), and so are the links between nodes (sim/src/net_fabric.hpp, with
//         flow_net_fabric), where a gather or scatter with more than flow_pooled_members remote
//         members is one pooled flow. For scale.
//   auto  flow where tests/sim/fidelity_test.cpp shows flow within 1 % of step for plans like
//         this one, else step where its estimated cost is within `auto_step_max_cost`, else
//         flow with a warning
//         (sim/src/fidelity.hpp: the rule, and what keeps a plan out of the proven class); the
//         record's note says which it picked and why.
// Step and flow agree within 3% on tests/sim's matrix of collectives, group sizes and layouts
// (PCIe nodes included), except a smaller (64 MB) ring all-reduce mixing NVLink and NIC edges
// (flow up to 7% slower: the step model's own jumps of a few percent under sub-microsecond
// latency changes, experiments/BENCHMARKS.md) and all-to-all groups of more than 257 members on
// a fat tree, whose merged rounds can be off by tens of percent (a warning note in the record).
//
// SimGrid's engine is a process-wide singleton that cannot be re-created, and its fat-tree zone
// numbers leaves with a static counter, so by default every simulate() call runs in a fork()ed
// child that sends its result back through a pipe; any number of simulations can run in one
// process (tests, sweeps). isolate = false runs in the calling process, once per process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/cluster.hpp"
#include "core/engine/cost_model.hpp"
#include "core/plan/plan.hpp"
#include "core/results/results.hpp"

namespace muonbed {

struct SimOptions {
  std::string fidelity = "auto";  // step | flow | auto
  // auto: the most a plan whose flow fidelity is not proven may cost at step fidelity
  // (sim/src/fidelity.hpp's FidelityCase::step_cost, SimGrid transfers weighted by those in
  // flight beside them); costlier ones run at flow with a warning. 1.6 M is about 8 s of CPU on
  // the 2-core VM at 5 us per unit (experiments/BENCHMARKS.md, "Fidelity auto").
  double auto_step_max_cost = 1.6e6;
  bool isolate = true;       // run in a fork()ed child (see above)
  int trace_max_ranks = 64;  // ranks (lowest first) in the Chrome trace; 0 = no trace
  // Not empty: while a simulation runs long, a progress line named so on stderr: redrawn in
  // place on a terminal, else a line every 30 s (core/base/progress.hpp); never in results.
  std::string progress_label;
  // Collective lowering.
  double broadcast_chunk_bytes = kBroadcastChunkBytes;  // pipelined chain: chunk size ...
  int broadcast_max_chunks = kBroadcastMaxChunks;       // ... and at most this many chunks
  // flow: an all-to-all of n members keeps max(flow_all_to_all_rounds,
  // flow_all_to_all_transfers / n) of its n-1 pairwise rounds, merging the rest. Groups of up to
  // 257 members keep every round (exact); merging larger groups' rounds changes how
  // neighbouring rounds overlap as members drift apart (experiments/BENCHMARKS.md), and the
  // record says so.
  int flow_all_to_all_rounds = 64;
  long flow_all_to_all_transfers = 65536;
  // flow: cross-node members of a gather or scatter move in at most this many flows to / from
  // the root; with flow_net_fabric, more than flow_pooled_members of them move as one pooled
  // flow instead (see below).
  int flow_rooted_bundles = 64;
  int flow_pooled_members = 8;
  // flow: flows between nodes share the platform's links in muonbed's max-min model
  // (sim/src/net_fabric.hpp: the routes SimGrid computes, equal shares as CM02 without link
  // latencies, re-shared once per simulated instant) instead of one SimGrid communication each,
  // and a gather or scatter with more than flow_pooled_members remote members is one pooled
  // flow (weight = members on the root's links, one share on each member's NIC link). Off:
  // SimGrid communications and bundles (the reference the tests compare with). Not used with
  // latency_weighted_sharing or on multi-node PCIe clusters.
  bool flow_net_fabric = true;
  // Network model (SimGrid configuration). CM02 with no cross traffic and a huge TCP-gamma makes a
  // transfer cost exactly latency + size / bandwidth when alone, shared max-min fairly otherwise;
  // SimGrid's default LV08 is a TCP model (latency x13, bandwidth x0.97), wrong for NVLink/RDMA.
  std::string network_model = "CM02";
  // CM02 weighs each flow's share of a link by the inverse of its route latency (TCP's RTT
  // bias). Off (the default), links carry no latency: each transfer waits out its path latency
  // and then shares links equally, as RDMA and NVLink do. On: SimGrid's own TCP-like sharing.
  bool latency_weighted_sharing = false;
  double tcp_gamma = 1e20;  // in 3.32, 0 does not disable the window bound
  bool crosstraffic = false;
  std::vector<std::string> simgrid_config;  // more "key:value" settings, applied last
};

// What a run cost; not part of the results file (it is not deterministic).
struct SimulationStats {
  std::string fidelity;                // the resolved fidelity
  double wall_s = 0;                   // the simulation itself (child process), platform included
  double peak_rss_bytes = 0;           // of the process that simulated
  std::int64_t simgrid_transfers = 0;  // SimGrid communications (every transfer at step fidelity)
  std::int64_t node_flows = 0;  // flows on muonbed's fabric models (flow fidelity: inside nodes,
                                // and between nodes with flow_net_fabric)
  std::int64_t timers = 0;      // latency-only messages and analytic delays
  std::int64_t computes = 0;    // compute ops executed
};

struct SimulationResult {
  ResultRecord record;  // backend "sim"; provenance without the experiment part
  std::string trace;    // Chrome trace of the worst step, JSON text (empty when disabled)
  SimulationStats stats;
};

// "step" or "flow" for this plan (auto: sim/src/fidelity.hpp's rule; `why`, when given, gets
// its reason); throws Error for an unknown name or step fidelity above kMaxStepFidelityRanks.
std::string resolve_fidelity(const SimOptions& options, const StepPlan& plan,
                             const ClusterSpec& cluster, std::string* why = nullptr);
// Throws PlanError with the fix when the plan cannot run on the cluster (too few GPUs, missing
// bandwidths), before any simulation work.
void check_simulable(const StepPlan& plan, const ClusterSpec& cluster);

SimulationResult simulate(const StepPlan& plan, const ClusterSpec& cluster,
                          const SimOptions& options = {});
// Several independent plans on one cluster (a training point and its AdamW twin), each simulated
// as simulate() would: side by side in child processes, as many at once as this process has
// cores (its affinity mask), one after another when options.isolate is off; results in the
// plans' order. Each plan is checked (check_simulable, fidelity) before any simulation starts.
std::vector<SimulationResult> simulate_each(const std::vector<const StepPlan*>& plans,
                                            const ClusterSpec& cluster,
                                            const std::vector<SimOptions>& options);

// SimGrid's version string of this build ("3.32.0").
std::string simgrid_version();

// Registers the "sim" backend with core/results/run_point.hpp's registry (again: harmless): it
// simulates a point at its experiment's sim.fidelity in a child process, with the Chrome trace of
// RunSettings::trace_max_ranks ranks. The CLI gets it from sim/registration.cpp (the backend's
// one registration, linked whole); tests call it themselves.
void register_sim_backend();

}  // namespace muonbed
