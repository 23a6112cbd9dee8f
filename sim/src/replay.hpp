// Event-driven replay of a StepPlan on the simulated platform. The execution semantics are
// core/engine/engine.hpp's (per rank, each stream runs its ops in plan order one at a time; deps
// wait for the rank's completion of earlier ops; a collective instance starts when its last member
// arrives and completes for all members at once; inactive ops pass through; send/recv involve
// only the root and the peer): the engine decides when ops start, and the replay only starts
// compute and lowered collective algorithms on SimGrid and reports their completions back.
//
// Every distinct step pattern of the hyper-period is replayed once, one after the other in the
// same simulation (each from an idle cluster), and measured with core/engine/timeline.hpp: step
// time (the last rank's last completion), per-rank compute / communication / exposed communication
// / idle time, bytes per link class, per-collective instance times, and the Chrome trace of the
// first ranks.
#pragma once

#include <future>
#include <string>
#include <vector>

#include "core/config/cluster.hpp"
#include "core/plan/plan.hpp"
#include "core/results/results.hpp"
#include "sim/simulate.hpp"
#include "sim/src/collectives.hpp"
#include "sim/src/platform.hpp"

namespace simgrid::s4u {
class Host;
}

namespace muonbed::sim {

struct ReplayOptions {
  bool step_fidelity = true;
  bool latency_in_links = false;  // NetworkConfig::latency_weighted_sharing
  bool net_fabric = true;         // SimOptions::flow_net_fabric
  int trace_max_ranks = 64;
  LoweringOptions lowering;
  // A progress line on stderr while the replay runs long (core/base/progress.hpp); empty: none.
  std::string progress_label;
  bool progress_in_place = true;  // stderr is a terminal: redraw one line (else: a log's lines)
};

struct ReplayOutput {
  std::vector<StepMeasurement> steps;
  std::vector<std::vector<CollectiveMeasurement>> collectives;
  // The worst step's Chrome trace (JSON text, "" when disabled), written on a thread of its own
  // while the caller fills the record: a 1,024-GPU training step's 100 MB trace took 0.2 s
  // after the simulation, beside the record's 0.3 s.
  std::future<std::string> trace;
};

// Runs the engine (which must hold the platform of `topology`, hosts in rank order) until every
// pattern is replayed. Throws Error when the plan deadlocks (names a stuck rank and op).
ReplayOutput replay_plan(const StepPlan& plan, const ClusterSpec& cluster, const Topology& topology,
                         const std::vector<simgrid::s4u::Host*>& hosts,
                         const ReplayOptions& options, SimulationStats& stats);

}  // namespace muonbed::sim
