// Builds the SimGrid platform of a ClusterSpec (see platform.hpp for the layout and the latency
// rules) and answers nominal path questions without SimGrid.
#include "sim/src/platform.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <simgrid/s4u.hpp>

#include "core/base/errors.hpp"

namespace sg4 = simgrid::s4u;

namespace muonbed::sim {

namespace {

constexpr double kGB = 1e9;
constexpr double kMicro = 1e-6;
// The "bandwidth" of a rank to itself: far above any real link.
constexpr double kUnlimitedBps = 1e18;

std::string num(int i) {
  return std::to_string(i);
}

}  // namespace

Topology::Topology(const ClusterSpec& cluster, int world_size, int gpus_per_node)
    : cluster_(cluster), world_(world_size), gpn_(std::max(1, gpus_per_node)) {
  nodes_ = (world_ + gpn_ - 1) / gpn_;
  if (cluster.nodes > 0 && cluster.nodes < nodes_)
    throw PlanError("the plan needs " + num(world_) + " GPUs (" + num(nodes_) + " nodes of " +
                    num(gpn_) + ") but cluster '" + cluster.name + "' has " + num(cluster.nodes) +
                    " nodes; fix: set cluster.nodes to " + num(nodes_) +
                    " or more (0 = as many as needed), or shrink the mesh");
  pcie_ = cluster.intra.kind == IntraNodeKind::pcie;
  intra_Bps_ = cluster.intra.bandwidth_GBps * kGB;
  bridge_Bps_ = pcie_ ? cluster.intra.pcie_switch_GBps * kGB : 0;
  intra_latency_ = cluster.intra.latency_us * kMicro;
  // NIC links: one per GPU at most; with more NICs than GPUs a GPU drives several (their
  // bandwidth adds up on its link), with fewer, GPUs share.
  const int nic_count = std::max(1, cluster.nic.count_per_node);
  nic_links_ = std::min(nic_count, gpn_);
  nic_link_Bps_ = cluster.nic.bandwidth_GBps * kGB * nic_count / nic_links_;
  uplink_Bps_ = cluster.nic.bandwidth_GBps * kGB * nic_count;
  nic_latency_ = cluster.nic.latency_us * kMicro;
  switch_latency_ = cluster.network.switch_latency_us * kMicro;
  if (!(intra_Bps_ > 0) && gpn_ > 1)
    throw PlanError("cluster '" + cluster.name +
                    "': intra_node.bandwidth_GBps must be positive to simulate " + num(gpn_) +
                    " GPUs per node");
  if (!(nic_link_Bps_ > 0) && nodes_ > 1)
    throw PlanError("cluster '" + cluster.name +
                    "': nic.bandwidth_GBps must be positive to simulate " + num(nodes_) + " nodes");

  if (cluster.network.topology == TopologyKind::fat_tree) {
    const double over = std::max(1.0, cluster.network.oversubscription);
    const unsigned k =
        static_cast<unsigned>(std::max(1, std::min(cluster.network.nodes_per_leaf, nodes_)));
    const unsigned leaves = (static_cast<unsigned>(nodes_) + k - 1) / k;
    // Each leaf has k node ports; round(k / oversubscription) uplinks keep it non-blocking at 1.
    const unsigned leaf_up = std::max(1u, static_cast<unsigned>(std::lround(k / over)));
    if (cluster.network.levels <= 1) {
      down_ = {static_cast<unsigned>(nodes_)};
      up_ = {1};
    } else if (cluster.network.levels == 2) {
      down_ = {k, leaves};
      up_ = {1, leaf_up};
    } else {
      // Pods of k2 leaves (the switch radix of a leaf, or fewer when there are fewer leaves);
      // each aggregation switch has k2 uplinks, one per leaf below it: non-blocking.
      const unsigned k2 = std::max(1u, std::min(k, leaves));
      const unsigned pods = (leaves + k2 - 1) / k2;
      down_ = {k, k2, pods};
      up_ = {1, leaf_up, k2};
    }
  }
  if (nodes_ > 1 && nodes_ <= kHopTableNodes) {
    hops_.resize(static_cast<std::size_t>(nodes_) * static_cast<std::size_t>(nodes_));
    for (int a = 0; a < nodes_; ++a)
      for (int b = 0; b < nodes_; ++b)
        hops_[static_cast<std::size_t>(a) * static_cast<std::size_t>(nodes_) +
              static_cast<std::size_t>(b)] =
            static_cast<std::uint8_t>(muonbed::switch_hops_between(cluster_, a, b));
  }
}

int Topology::switch_hops_between(int node_a, int node_b) const {
  if (!hops_.empty())
    return hops_[static_cast<std::size_t>(node_a) * static_cast<std::size_t>(nodes_) +
                 static_cast<std::size_t>(node_b)];
  return muonbed::switch_hops_between(cluster_, node_a, node_b);
}

double Topology::latency_beyond_links(int src, int dst) const {
  const int na = node_of(src), nb = node_of(dst);
  if (na == nb) return 0;
  int levels = 1;  // tree levels the route climbs: leaf 1, spine or aggregation 2, core 3
  if (cluster_.network.topology == TopologyKind::fat_tree && down_.size() > 1) {
    const int hops = switch_hops_between(na, nb);
    levels = hops == 1 ? 1 : hops == 3 ? 2 : 3;
  }
  return (switch_hops_between(na, nb) - levels) * switch_latency_;
}

PathInfo Topology::path(int src, int dst) const {
  if (src == dst) return {0, kUnlimitedBps};
  const int na = node_of(src), nb = node_of(dst);
  double intra = intra_Bps_;
  if (bridge_Bps_ > 0) intra = std::min(intra, bridge_Bps_);
  if (na == nb) return {intra_latency_, intra};
  double bw = nic_link_Bps_;
  if (pcie_) bw = std::min(bw, intra);
  return {nic_latency_ + switch_hops_between(na, nb) * switch_latency_, bw};
}

void apply_network_config(const NetworkConfig& config) {
  sg4::Engine::set_config("network/model:" + config.model);
  sg4::Engine::set_config(std::string("network/crosstraffic:") + (config.crosstraffic ? "1" : "0"));
  char gamma[64];
  std::snprintf(gamma, sizeof gamma, "network/TCP-gamma:%.17g", config.tcp_gamma);
  sg4::Engine::set_config(gamma);
  for (const std::string& setting : config.extra) sg4::Engine::set_config(setting);
}

namespace {

// Names of a node zone's links (is_node_link tells them from the fabric's by these).
constexpr const char* kNvlinkPrefix = "nvlink-";
constexpr const char* kPciePrefix = "pcie-";
constexpr const char* kBridgePrefix = "bridge-";
constexpr const char* kNicPrefix = "nic-";

}  // namespace

bool is_node_link(const sg4::Link& link) {
  const std::string& name = link.get_name();
  for (const char* prefix : {kNvlinkPrefix, kPciePrefix, kBridgePrefix, kNicPrefix})
    if (name.starts_with(prefix)) return true;
  return false;
}

namespace {

// One node: a full zone with the GPUs, their NVLink/PCIe links, the NIC links and a router as
// gateway. Returns the zone; hosts are appended to `hosts` in rank order.
sg4::NetZone* build_node(const Topology& t, int node, bool latency_in_links, sg4::NetZone* parent,
                         std::vector<sg4::Host*>& hosts, sg4::NetZone*& zone_out,
                         simgrid::kernel::routing::NetPoint*& router_out) {
  const ClusterSpec& c = t.cluster();
  const int gpn = t.gpus_per_node();
  const int first = node * gpn;
  const int count = std::min(gpn, t.world_size() - first);
  auto* zone = sg4::create_full_zone("node-" + num(node));
  zone->set_parent(parent);
  auto* router = zone->create_router("router-" + num(node));
  const double speed = c.gpu.peak_tflops > 0 ? c.gpu.peak_tflops * 1e12 : 1e12;
  const double in_links = latency_in_links ? 1.0 : 0.0;  // see NetworkConfig
  const double half_intra = in_links * t.intra_latency_s() / 2;
  const double half_nic = in_links * c.nic.latency_us * kMicro / 2;

  std::vector<sg4::Host*> gpus;
  std::vector<sg4::Link*> intra;
  for (int i = 0; i < count; ++i) {
    const int rank = first + i;
    gpus.push_back(zone->create_host("gpu-" + num(rank), speed));
    if (count > 1 || t.pcie())
      intra.push_back(
          zone->create_split_duplex_link((t.pcie() ? kPciePrefix : kNvlinkPrefix) + num(rank),
                                         t.intra_link_Bps())
              ->set_latency(half_intra)
              ->seal());
  }
  sg4::Link* bridge = nullptr;
  if (t.bridge_Bps() > 0)
    // One budget for both directions (SHARED): every byte through the host bridge counts once,
    // so no step moves more bytes through it than its bandwidth allows (the analytic model's
    // core/engine/link_sharing.hpp counts it the same way).
    bridge = zone->create_link(kBridgePrefix + num(node), t.bridge_Bps())->set_latency(0)->seal();
  std::vector<sg4::Link*> nics;
  if (t.nodes() > 1)
    for (int k = 0; k < t.nic_links(); ++k)
      nics.push_back(
          zone->create_split_duplex_link(kNicPrefix + num(node) + "-" + num(k), t.nic_link_Bps())
              ->set_latency(half_nic)
              ->seal());

  using Dir = sg4::LinkInRoute::Direction;
  for (int i = 0; i < count; ++i) {
    for (int j = i + 1; j < count; ++j) {
      std::vector<sg4::LinkInRoute> links{{intra[i], Dir::UP}};
      if (bridge) links.emplace_back(bridge);
      links.emplace_back(intra[j], Dir::DOWN);
      zone->add_route(gpus[i]->get_netpoint(), gpus[j]->get_netpoint(), nullptr, nullptr, links,
                      true);
    }
    if (!nics.empty()) {
      std::vector<sg4::LinkInRoute> links;
      if (t.pcie()) {  // GPU-to-NIC DMA crosses the GPU's PCIe link and the host bridge
        links.emplace_back(intra[i], Dir::UP);
        if (bridge) links.emplace_back(bridge);
      }
      links.emplace_back(nics[t.nic_of_local(i)], Dir::UP);
      zone->add_route(gpus[i]->get_netpoint(), router, nullptr, nullptr, links, true);
    }
  }
  zone->seal();
  hosts.insert(hosts.end(), gpus.begin(), gpus.end());
  zone_out = zone;
  router_out = router;
  return zone;
}

}  // namespace

std::vector<sg4::Host*> build_platform(const Topology& t, const NetworkConfig& config) {
  apply_network_config(config);
  const ClusterSpec& c = t.cluster();
  std::vector<sg4::Host*> hosts;
  hosts.reserve(t.world_size());
  const bool latency_in_links = config.latency_weighted_sharing;
  const double half_switch =
      (latency_in_links ? 1.0 : 0.0) * c.network.switch_latency_us * kMicro / 2;

  if (t.nodes() == 1) {
    auto* root = sg4::create_star_zone("cluster");
    sg4::NetZone* zone = nullptr;
    simgrid::kernel::routing::NetPoint* router = nullptr;
    build_node(t, 0, latency_in_links, root, hosts, zone, router);
    root->seal();
    return hosts;
  }

  if (c.network.topology == TopologyKind::single_switch) {
    // A star: every node's aggregate uplink goes to one switch; half the switch latency on each
    // side, so a node-to-node route pays it once.
    auto* root = sg4::create_star_zone("cluster");
    for (int n = 0; n < t.nodes(); ++n) {
      sg4::NetZone* zone = nullptr;
      simgrid::kernel::routing::NetPoint* router = nullptr;
      build_node(t, n, latency_in_links, root, hosts, zone, router);
      auto* up = root->create_split_duplex_link("uplink-" + num(n), t.node_uplink_Bps())
                     ->set_latency(half_switch)
                     ->seal();
      root->add_route(zone->get_netpoint(), nullptr, router, nullptr,
                      {{up, sg4::LinkInRoute::Direction::UP}}, true);
    }
    root->seal();
    return hosts;
  }

  // Fat tree. Leaves are node zones (or, past the last node, bare routers filling the tree's
  // positions); its links carry a node's aggregate NIC bandwidth and half a switch latency each,
  // so a route pays one switch latency per tree level it climbs (SimGrid 3.32 adds no latency
  // for a fat tree's per-switch limiter links, so a per-switch charge cannot be expressed); the
  // switches it passes beyond that are waited out before the flow (latency_beyond_links).
  const std::vector<unsigned> down = t.fat_tree_down();
  const std::vector<unsigned> up = t.fat_tree_up();
  const std::vector<unsigned> count(down.size(), 1);
  const auto netpoint_cb = [&t, &hosts, latency_in_links](sg4::NetZone* zone,
                                                          const std::vector<unsigned long>&,
                                                          unsigned long id)
      -> std::pair<simgrid::kernel::routing::NetPoint*, simgrid::kernel::routing::NetPoint*> {
    const int node = static_cast<int>(id);
    if (node >= t.nodes()) return {zone->create_router("unused-" + num(node)), nullptr};
    sg4::NetZone* node_zone = nullptr;
    simgrid::kernel::routing::NetPoint* router = nullptr;
    build_node(t, node, latency_in_links, zone, hosts, node_zone, router);
    return {node_zone->get_netpoint(), router};
  };
  sg4::FatTreeParams params(static_cast<unsigned>(down.size()), down, up, count);
  auto* tree = sg4::create_fatTree_zone("cluster", nullptr, params,
                                        sg4::ClusterCallbacks(netpoint_cb), t.node_uplink_Bps(),
                                        half_switch, sg4::Link::SharingPolicy::SPLITDUPLEX);
  tree->seal();
  if (static_cast<int>(hosts.size()) != t.world_size())
    throw Error("internal: the fat tree built " + num(static_cast<int>(hosts.size())) +
                " GPU hosts for " + num(t.world_size()) + " ranks");
  // The callback order is the tree's leaf order; hosts must be in rank order.
  for (int r = 0; r < t.world_size(); ++r)
    if (hosts[r]->get_name() != "gpu-" + num(r))
      throw Error("internal: fat-tree leaves were created out of rank order");
  return hosts;
}

}  // namespace muonbed::sim
