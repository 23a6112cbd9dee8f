// The simulated cluster: a SimGrid platform built from a ClusterSpec with the s4u API, and the
// SimGrid-free description of the same topology (which node a rank sits on, which NIC it uses,
// the nominal latency and bandwidth between two ranks) that the collective lowering needs for
// its analytic latency terms.
//
// Platform, per node: a full zone with one host per GPU (rank r is GPU r % gpus_per_node of node
// r / gpus_per_node; hosts are kept in rank order, never in SimGrid's hash order), a router as
// the zone's gateway (never a GPU host, or every byte leaving the node would cross that GPU's
// link), per-GPU NVLink links to the node's switch (or PCIe links plus a shared host bridge), and
// NIC links (one per GPU when rail-optimized; GPUs share NICs when there are fewer). Between
// nodes: one link per node carrying the node's aggregate NIC bandwidth, into a single switch (a
// star zone) or a 2/3-level fat tree (create_fatTree_zone, D-mod-K routing, spines sized to be
// non-blocking unless the spec oversubscribes). Path latencies: intra-node latency inside a node;
// between nodes, NIC latency plus one switch latency under a single switch or one leaf, and one
// per tree level climbed otherwise (each fat-tree link carries half a switch latency: SimGrid
// 3.32 ignores the latency of a fat tree's per-switch limiter links, so the analytic model's
// 2*levels-1 switch crossings cannot be matched for routes that leave a leaf).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/cluster.hpp"

namespace simgrid::s4u {
class Host;
class Link;
}  // namespace simgrid::s4u

namespace muonbed::sim {

struct PathInfo {
  double latency_s = 0;
  double bandwidth_Bps = 0;  // the slowest link of an uncontended point-to-point transfer
};

// Rank placement and nominal paths; no SimGrid.
class Topology {
 public:
  Topology(const ClusterSpec& cluster, int world_size, int gpus_per_node);

  int world_size() const { return world_; }
  int gpus_per_node() const { return gpn_; }
  int nodes() const { return nodes_; }
  int node_of(int rank) const { return rank / gpn_; }
  int local_of(int rank) const { return rank % gpn_; }
  // The NIC link a GPU uses (node-local index) and how many NIC links a node has.
  int nic_of_local(int local) const { return local * nic_links_ / gpn_; }
  int nic_links() const { return nic_links_; }
  double nic_link_Bps() const { return nic_link_Bps_; }
  double node_uplink_Bps() const { return uplink_Bps_; }
  double intra_link_Bps() const { return intra_Bps_; }
  double bridge_Bps() const { return bridge_Bps_; }  // 0: no shared PCIe bridge
  bool pcie() const { return pcie_; }
  double intra_latency_s() const { return intra_latency_; }
  // Switches a message between two nodes passes (core/config/cluster.hpp switch_hops_between:
  // 1 under one switch or leaf, 3 through a spine or a pod's aggregation switch, 5 across pods).
  int switch_hops_between(int node_a, int node_b) const;
  // With latencies in SimGrid's links (NetworkConfig::latency_weighted_sharing) the fat tree's
  // links all carry half a switch latency (SimGrid 3.32 takes one latency for every link of a
  // fat tree), so a route pays one per tree level it climbs, not one per switch: the latency of
  // the path the links leave out, which Network waits out before the flow starts.
  double latency_beyond_links(int src_rank, int dst_rank) const;
  PathInfo path(int src_rank, int dst_rank) const;
  const ClusterSpec& cluster() const { return cluster_; }

  // Fat-tree shape actually built: per level, children per switch (down), parents per element
  // (up); positions = product of down (>= nodes, the rest are empty routers).
  std::vector<unsigned> fat_tree_down() const { return down_; }
  std::vector<unsigned> fat_tree_up() const { return up_; }

 private:
  ClusterSpec cluster_;
  int world_ = 0;
  int gpn_ = 1;
  int nodes_ = 1;
  int nic_links_ = 1;
  double nic_link_Bps_ = 0;
  double uplink_Bps_ = 0;
  double intra_Bps_ = 0;
  double bridge_Bps_ = 0;
  bool pcie_ = false;
  double intra_latency_ = 0;
  double nic_latency_ = 0;
  double switch_latency_ = 0;
  std::vector<unsigned> down_, up_;
  // switch_hops_between for every pair of nodes, up to kHopTableNodes nodes (path() runs for
  // every transfer: a tenth of a 1,024-GPU all-to-all step went into the fat tree's arithmetic).
  static constexpr int kHopTableNodes = 1024;
  std::vector<std::uint8_t> hops_;
};

// Network model settings applied before the platform is built (see SimOptions).
struct NetworkConfig {
  std::string model = "CM02";
  // false: links carry no latency; Network waits out each transfer's path latency with a timer
  // and then starts the flow, so concurrent flows share links equally (RDMA, NVLink, PCIe DMA).
  // true: latencies live in the links, as SimGrid models TCP: CM02 shares a link in inverse
  // proportion to each flow's route latency (RTT bias), so a cross-node flow gets less of a GPU's
  // PCIe link than an intra-node one.
  bool latency_weighted_sharing = false;
  double tcp_gamma = 1e20;
  bool crosstraffic = false;
  std::vector<std::string> extra;  // more "key:value" SimGrid settings
};

// Configures the engine and builds the platform; returns the GPU hosts indexed by rank. Needs an
// s4u::Engine and must run once per process (SimGrid's engine is a singleton).
std::vector<simgrid::s4u::Host*> build_platform(const Topology& topology,
                                                const NetworkConfig& config);
void apply_network_config(const NetworkConfig& config);

// Whether `link` belongs to a node's own zone (its GPUs' NVLink or PCIe links, its host bridge,
// its NIC links) rather than to the fabric between nodes: routes between GPUs on two nodes are
// the source node's links, the fabric's, then the destination node's (Network::net_route).
bool is_node_link(const simgrid::s4u::Link& link);

}  // namespace muonbed::sim
