// Clusters on which concurrent collectives contend (shared by the agreement tests of tests/sim):
// fewer NICs than GPUs, a PCIe host bridge, oversubscribed leaves, nodes of two GPUs so that the
// invariant matrix's 4-16 ranks span 2-8 nodes.
#pragma once

#include <string>
#include <vector>

#include "core/config/cluster.hpp"
#include "muonbed/config.hpp"

namespace muonbed::testing {

inline ClusterSpec cluster_file(const std::string& name) {
  return load_cluster_file(std::string(MUONBED_SOURCE_DIR) + "/experiments/clusters/" + name +
                           ".yaml");
}

struct NamedCluster {
  std::string name;
  ClusterSpec spec;
};

inline std::vector<NamedCluster> contended_clusters() {
  std::vector<NamedCluster> out;
  {
    ClusterSpec c = cluster_file("dgx-h100");
    c.gpus_per_node = 2;
    c.nodes = 0;
    c.nic.count_per_node = 1;  // both GPUs behind one NIC
    c.nic.rail_optimized = false;
    out.push_back({"h100, 2 GPUs + 1 NIC per node", c});
  }
  {
    ClusterSpec c = cluster_file("a100-pcie-4x");  // 4 GPUs, 2 NICs per node
    c.nodes = 0;
    out.push_back({"a100-pcie-4x", c});
    c.intra.pcie_switch_GBps = 32;  // one host bridge for the node's GPUs and NICs
    out.push_back({"a100-pcie-4x behind a 32 GB/s host bridge", c});
  }
  {
    ClusterSpec c = cluster_file("dgx-h100");
    c.gpus_per_node = 2;
    c.nodes = 0;
    c.nic.count_per_node = 2;
    c.network.topology = TopologyKind::fat_tree;
    c.network.levels = 2;
    c.network.nodes_per_leaf = 2;
    c.network.oversubscription = 4;
    out.push_back({"h100 nodes of 2, 4:1 oversubscribed leaves of 2 nodes", c});
  }
  return out;
}

}  // namespace muonbed::testing
