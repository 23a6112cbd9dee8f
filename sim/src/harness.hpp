// A plan-free harness for tests and benchmarks of the lower layers: runs bare collectives on a
// platform built from a ClusterSpec, one after the other from an idle network, and returns each
// one's simulated time. Each call runs in its own child process (see isolate.hpp).
#pragma once

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

}  // namespace muonbed::sim
