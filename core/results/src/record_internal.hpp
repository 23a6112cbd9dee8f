// Helpers the results room's sources share (record.cpp, analytic_backend.cpp); private to
// core/results/src.
#pragma once

#include <algorithm>

#include "core/config/cluster.hpp"
#include "core/model/mesh.hpp"

namespace muonbed {

// GPUs per physical node: the cluster's, else the mesh's (a cluster without the figure).
inline int physical_gpus_per_node(const ClusterSpec& cluster, const DeviceMesh& mesh) {
  return cluster.gpus_per_node > 0 ? cluster.gpus_per_node : std::max(1, mesh.gpus_per_node());
}

}  // namespace muonbed
