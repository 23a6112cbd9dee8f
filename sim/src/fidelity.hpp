// Which fidelity `sim.fidelity: auto` simulates a plan at, and why: the one rule, written once
// (issue 23 item 5). Flow fidelity is picked only for plans whose every feature is in the class
// tests/sim/fidelity_test.cpp shows to agree with step fidelity (the reference) within 1 % of the
// step time, over a matrix of meshes, strategies and clusters; the test fails when the rule
// picks flow for a case of that matrix where the two differ by more. Outside that class step
// fidelity runs where it is affordable: FidelityCase::step_cost, estimated from the plan (the
// SimGrid transfers step's lowering would post, each weighted by the transfers in flight beside
// it, on every lane at once, plus its zero-byte messages; fidelity.cpp), within
// SimOptions::auto_step_max_cost (about 8 s of CPU on the 2-core VM). Above it flow runs with a
// warning that names what is not proven and the cost against the budget.
// tests/sim/fidelity_shipped_test.cpp holds every shipped point up to 1,024 GPUs to a proven
// pick, but for the listed ones: pooled gathers on lanes at 1,024 GPUs (step takes minutes there,
// and per-member flows 15-46 s). The estimate
// counts network events only: a plan whose replay is costly elsewhere (scale_strategies' dion
// preset at 256 GPUs: 28 s of CPU at step, 6.5 s at flow, estimated 3.7 s) is underestimated.
//
// What keeps a plan out of the proven class (experiments/BENCHMARKS.md, "Fidelity auto"):
//   merged all-to-all rounds   an all-to-all group larger than flow fidelity keeps every round
//                              of (257 members by default): merging rounds moves the step by up
//                              to tens of percent on dense exchanges (a member that sends to
//                              at most as many peers as there are rounds, a shard to each of a
//                              chunk's owners, sends one flow per peer: 0.1 % from step on
//                              tests/sim/collectives_test.cpp's 512 members and 8 % slower on
//                              megatron's optimizer step at 1,024 GPUs; still kept out). Against
//                              every round kept, merging made scale_a2a_chunks' ns_cost point at
//                              1,024 GPUs 90 % slower: up to kAllRoundsMaxRanks auto keeps them
//                              all, proven, and only above merges them, unproven.
//   PCIe nodes                 GPUs on PCIe links (with or without a host bridge, one node or
//                              several): flow differs from step by up to 15 % (owner_allgather
//                              through a 32 GB/s bridge) and by 1-6 % on many other plans
//   pooled gathers on lanes    gathers (or scatters) with more than flow_pooled_members members
//                              on other nodes than the root, which flow moves as one pooled flow,
//                              on several communication lanes at once: their pooled flows
//                              contend at the members' NICs, where one held-back member holds
//                              the pool back. The test's three such plans (up to 128 GPUs)
//                              agree within 0.2 %, but deepseek-v3, muonbed preset, 256 GPUs is
//                              2.1 % apart (flow 418.2 ms, step 409.4 ms;
//                              experiments/BENCHMARKS.md). Up to kPerMemberFlowMaxRanks auto
//                              runs them at flow with one flow per member instead (409.4 ms
//                              there), proven, and above it pooled, unproven.
// Not a class: rings with uneven pieces (owner_allgather's chunks of owners' whole matrices).
// They take the same pipelined lowering at both fidelities (ring_needs_pipelining,
// sim/src/collectives.hpp). Until 2026-11-29 step fidelity moved rings whose largest piece was
// 1-2x the mean as whole pieces hop by hop, up to 2x slower than the pipelined ring, and this
// rule flagged only the rings above 2x: scale_strategies' keller_jordan at 256 GPUs was 25 %
// apart for that reason alone (experiments/BENCHMARKS.md, "Fidelity auto").
#pragma once

#include <string>
#include <vector>

#include "core/config/cluster.hpp"
#include "core/plan/plan.hpp"
#include "sim/simulate.hpp"

namespace muonbed::sim {

// The plan's features the rule reads.
struct FidelityCase {
  int ranks = 0;
  int largest_merged_all_to_all = 0;  // members of the largest all-to-all whose rounds merge
  bool pcie_nodes = false;
  bool pooled_on_lanes = false;  // pooled gathers or scatters on more than one stream
  // Step fidelity's cost: the SimGrid transfers its lowering would post over the step patterns
  // the replay simulates (all-reduces counted as rings), and those transfers weighted by how
  // many others are in flight beside them, plus its zero-byte messages (fidelity.cpp), which the
  // simulation's CPU time follows: about 5 us of CPU on the 2-core VM per unit of step_cost.
  double step_transfers = 0;
  double step_cost = 0;
};
// `estimate_step` false leaves step_transfers and step_cost at 0: they are the costly part
// (every collective's messages, per rank group), and auto reads them only where flow is not
// proven (pick_fidelity).
FidelityCase fidelity_case(const StepPlan& plan, const ClusterSpec& cluster,
                           const SimOptions& options, bool estimate_step = true);

// Flow fidelity moves a gather or scatter with more than flow_pooled_members members off the
// root's node as one pooled flow, and never more than flow_rooted_bundles flows: cheap, but on
// several lanes at once not proven (above). Up to this many ranks auto runs such plans at flow with
// one flow per member instead, as step fidelity posts them, which is the proven model: the
// shipped 256-GPU points take 2.6-3.8 s of CPU so (0.3-1.9 s pooled), the 1,024-GPU ones 15-46 s.
constexpr int kPerMemberFlowMaxRanks = 256;
// Flow fidelity merges the pairwise rounds of all-to-all groups above 257 members
// (SimOptions::flow_all_to_all_rounds / _transfers), not proven and up to 2x off (above). Up to
// this many ranks auto keeps every round instead: the shipped 1,024-GPU all-to-all points take
// 4-15 s of CPU so (experiments/BENCHMARKS.md).
constexpr int kAllRoundsMaxRanks = 1024;

struct FidelityChoice {
  std::string fidelity;  // step | flow
  bool proven = true;    // flow: within 1 % of step on this class of plans
  std::string reason;    // one sentence for the run line and the record's note
  // flow: every member of a gather or scatter is a flow of its own (no pooled flows, no
  // bundles), the lowering step fidelity uses for them.
  bool per_member_rooted = false;
  // flow: every all-to-all keeps all its pairwise rounds (none merged).
  bool keep_all_rounds = false;
};
// `options` as the choice simulates: per_member_rooted lifts the pooling and bundling limits,
// keep_all_rounds the all-to-all round budget.
SimOptions options_for(const FidelityChoice& choice, SimOptions options);
// The choice for `options.fidelity` ("auto" applies the rule; "step" and "flow" are kept).
FidelityChoice choose_fidelity(const FidelityCase& c, const SimOptions& options);
// choose_fidelity(fidelity_case(plan, cluster, options), options), estimating step's cost only
// when the choice reads it (flow not proven, step within its rank limit): the estimate was half
// of what a 1,024-GPU training point's process did before its simulations started.
FidelityChoice pick_fidelity(const StepPlan& plan, const ClusterSpec& cluster,
                             const SimOptions& options);

}  // namespace muonbed::sim
