// A plan-free harness for tests and benchmarks of the lower layers: runs bare collectives on a
// platform built from a ClusterSpec, one after the other from an idle network, and returns each
// one's simulated time. Each call runs in its own child process (see isolate.hpp).
#pragma once

#include <string>
#include <vector>

#include "core/config/cluster.hpp"
#include "sim/src/collectives.hpp"
#include "sim/src/platform.hpp"

namespace muonbed::sim {

struct HarnessResult {
  std::vector<double> times;  // per spec, seconds
  std::int64_t simgrid_transfers = 0;
  std::int64_t node_flows = 0;
  double wall_s = 0;
};

HarnessResult time_collectives(const ClusterSpec& cluster, int world_size, int gpus_per_node,
                               const std::vector<CollectiveSpec>& specs,
                               const LoweringOptions& options, const NetworkConfig& network = {});

// Builds the platform for `cluster` (flow fidelity's inter-node fabric) and compares the route
// the fabric composes from per-rank and per-node-pair parts with SimGrid's own route for every
// pair of ranks on different nodes: "" when all are equal, else the first difference.
std::string check_net_routes(const ClusterSpec& cluster, int world_size, int gpus_per_node);

// The network's alarms on a 2-GPU platform of `cluster`, as "owner:tag@time" per completion in
// order: alarm 1 set for t = 1 s, then moved to 2 s; alarm 2 set for 3 s, then freed; alarm 3 set
// for 4 s and freed, its slot taken by a new alarm set for 5 s; alarm 4 set for 6 s and moved to
// 0.5 s. Moved and freed alarms must never complete at their old dates (tests).
std::string alarm_completions(const ClusterSpec& cluster);

}  // namespace muonbed::sim
