// Switch hops between nodes of a cluster's network (core/config/cluster.hpp): one rule for the
// simulator's platform (sim/src/platform.cpp) and the analytic model's latencies
// (core/engine/src/cost_model.cpp), so the two backends pay the same latency per message.
#include <algorithm>

#include "core/config/cluster.hpp"

namespace muonbed {

namespace {

int leaf_nodes(const ClusterSpec& cluster) {
  if (cluster.network.topology != TopologyKind::fat_tree || cluster.network.levels <= 1) return 0;
  return std::max(1, cluster.network.nodes_per_leaf);
}

}  // namespace

int fat_tree_leaf(const ClusterSpec& cluster, int node) {
  const int leaf = leaf_nodes(cluster);
  return leaf == 0 ? 0 : node / leaf;
}

// The simulator builds pods of min(nodes_per_leaf, leaves) leaves: with fewer leaves than a
// leaf's radix every node is in pod 0, which a pod of nodes_per_leaf^2 nodes gives too.
int fat_tree_pod(const ClusterSpec& cluster, int node) {
  const long leaf = leaf_nodes(cluster);
  if (leaf == 0 || cluster.network.levels < 3) return 0;
  return static_cast<int>(node / (leaf * leaf));
}

int switch_hops_between(const ClusterSpec& cluster, int node_a, int node_b) {
  if (node_a == node_b) return 0;
  if (fat_tree_leaf(cluster, node_a) == fat_tree_leaf(cluster, node_b)) return 1;
  if (fat_tree_pod(cluster, node_a) == fat_tree_pod(cluster, node_b)) return 3;
  return 5;
}

}  // namespace muonbed
