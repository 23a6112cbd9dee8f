// Shared links and max-min fair speeds of the collectives in flight (see link_sharing.hpp).
#include "core/engine/link_sharing.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

namespace muonbed {

namespace {
constexpr double kGB = 1e9;
// A link counts as saturated above this load: below it no instance on it can be held back.
constexpr double kSaturated = 1 + 1e-9;
}  // namespace

ClusterLinks::ClusterLinks(const ClusterSpec& c, int world_size, int gpus_per_node)
    : gpn_(std::max(1, gpus_per_node)) {
  const int world = std::max(1, world_size);
  nodes_ = (world + gpn_ - 1) / gpn_;
  pcie_ = c.intra.kind == IntraNodeKind::pcie;
  const int nic_count = std::max(1, c.nic.count_per_node);
  nic_links_ = std::min(nic_count, gpn_);
  const double intra = c.intra.bandwidth_GBps * kGB;
  const double nic_link = c.nic.bandwidth_GBps * kGB * nic_count / nic_links_;
  const double node_uplink = c.nic.bandwidth_GBps * kGB * nic_count;
  capacity_Bps_.assign(2 * static_cast<std::size_t>(world), intra);
  nic_ = count();
  capacity_Bps_.resize(capacity_Bps_.size() + 2 * static_cast<std::size_t>(nodes_) * nic_links_,
                       nic_link);
  if (pcie_ && c.intra.pcie_switch_GBps > 0) {
    bridge_ = count();
    capacity_Bps_.resize(capacity_Bps_.size() + nodes_, c.intra.pcie_switch_GBps * kGB);
  }
  // Leaf uplinks as the simulator builds them: round(k / oversubscription) node-uplink-sized
  // links per leaf of k nodes (sim/src/platform.cpp). With oversubscription 1 they carry every
  // NIC of the leaf and never bind, so they are left out.
  const NetworkSpec& net = c.network;
  if (net.topology == TopologyKind::fat_tree && net.levels >= 2 && net.oversubscription > 1 &&
      nodes_ > 1) {
    const int k = std::max(1, std::min(net.nodes_per_leaf, nodes_));
    if (k < nodes_) {
      npl_ = k;
      const int leaves = (nodes_ + k - 1) / k;
      const long up = std::max(1L, std::lround(k / net.oversubscription));
      leaf_up_ = count();
      capacity_Bps_.resize(capacity_Bps_.size() + 2 * static_cast<std::size_t>(leaves),
                           static_cast<double>(up) * node_uplink);
    }
  }
}

SharedLinks::SharedLinks(int links)
    : links_(static_cast<std::size_t>(std::max(0, links))),
      link_seen_(links_.size(), 0),
      frozen_load_(links_.size(), 0),
      free_load_(links_.size(), 0),
      free_count_(links_.size(), 0),
      link_position_(links_.size(), 0),
      link_stamp_(links_.size(), 0) {}

bool SharedLinks::saturated(int link) const {
  return links_[link].load > kSaturated;
}

void SharedLinks::add(int id, double now, double work_s, const LinkOccupancy& occupancy) {
  if (id >= static_cast<int>(jobs_.size())) {
    jobs_.resize(id + 1);
    in_set_.resize(id + 1, 0);
  }
  Job& job = jobs_[id];
  job.active = true;
  job.fresh = true;
  job.remaining_s = work_s;
  job.last_s = now;
  job.speed = 1;
  ++job.version;
  job.load.clear();
  // One entry per link (an instance's members may share a NIC link or a bridge).
  LinkOccupancy sorted = occupancy;
  std::sort(sorted.begin(), sorted.end());
  for (const auto& [link, seconds] : sorted) {
    if (!(seconds > 0)) continue;
    if (!job.load.empty() && job.load.back().first == link)
      job.load.back().second += seconds / work_s;
    else
      job.load.emplace_back(link, seconds / work_s);
  }
  for (const auto& [link, u] : job.load) {
    links_[link].jobs.push_back(id);
    links_[link].load += u;
  }
  dirty_.push_back(id);
}

void SharedLinks::remove(int id) {
  Job& job = jobs_[id];
  job.active = false;
  for (const auto& [link, u] : job.load) {
    Link& l = links_[link];
    const bool was_saturated = saturated(link);
    l.jobs.erase(std::find(l.jobs.begin(), l.jobs.end(), id));
    l.load = l.jobs.empty() ? 0 : l.load - u;
    if (was_saturated) dirty_.insert(dirty_.end(), l.jobs.begin(), l.jobs.end());
  }
  job.load.clear();
}

double SharedLinks::finish_s(int id) const {
  const Job& job = jobs_[id];
  return job.last_s + job.remaining_s / job.speed;
}

const std::vector<int>& SharedLinks::resolve(double now) {
  changed_.clear();
  // The instances linked to a touched one through saturated links: only they can interact.
  std::vector<int> set;
  std::vector<int> comp_links;
  for (int id : dirty_)
    if (jobs_[id].active && !in_set_[id]) {
      in_set_[id] = 1;
      set.push_back(id);
    }
  dirty_.clear();
  for (std::size_t i = 0; i < set.size(); ++i)
    for (const auto& [link, u] : jobs_[set[i]].load) {
      if (link_seen_[link] || !saturated(link)) continue;
      link_seen_[link] = 1;
      comp_links.push_back(link);
      for (int other : links_[link].jobs)
        if (!in_set_[other]) {
          in_set_[other] = 1;
          set.push_back(other);
        }
    }
  // Bring every one to `now` at its old speed, then fill.
  std::vector<double> old_speed(set.size());
  for (std::size_t i = 0; i < set.size(); ++i) {
    Job& job = jobs_[set[i]];
    old_speed[i] = job.speed;
    job.remaining_s = std::max(0.0, job.remaining_s - (now - job.last_s) * job.speed);
    job.last_s = now;
    job.speed = -1;  // unfrozen
  }
  // Progressive filling: the bottleneck is the link with the lowest level at which it fills
  // (the first in comp_links order among equal ones), its unfrozen instances freeze there. The
  // levels sit in a lazy min-heap keyed (level, position in comp_links): a link's entry is
  // replaced when a freeze changes its loads (the stamp tells the stale ones), so each freeze
  // costs the links of the instances it freezes, not a scan of the component.
  const auto level_of = [&](int link) {
    return std::max(0.0, 1 - frozen_load_[link]) / std::max(free_load_[link], 1e-300);
  };
  heap_.clear();
  for (std::size_t i = 0; i < comp_links.size(); ++i) {
    const int link = comp_links[i];
    frozen_load_[link] = 0;
    free_load_[link] = links_[link].load;
    free_count_[link] = static_cast<int>(links_[link].jobs.size());
    link_position_[link] = static_cast<int>(i);
    ++link_stamp_[link];
    if (free_count_[link] > 0)
      heap_.push_back({level_of(link), static_cast<int>(i), link, link_stamp_[link]});
  }
  std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
  std::vector<int> touched;
  std::size_t unfrozen = set.size();
  while (unfrozen > 0) {
    int bottleneck = -1;
    double level = 1;
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
      const LevelEntry top = heap_.back();
      heap_.pop_back();
      // Stale, or without unfrozen instances (free_load_ may keep a rounding residue).
      if (top.stamp != link_stamp_[top.link] || free_count_[top.link] == 0) continue;
      if (top.level < 1) {
        level = top.level;
        bottleneck = top.link;
      }
      break;
    }
    if (bottleneck < 0) break;  // nothing binds below full speed
    level = std::max(level, 1e-12);
    touched.clear();
    for (int id : links_[bottleneck].jobs) {
      Job& job = jobs_[id];
      if (job.speed >= 0) continue;
      job.speed = level;
      --unfrozen;
      for (const auto& [link, u] : job.load)
        if (link_seen_[link]) {
          frozen_load_[link] += level * u;
          free_load_[link] -= u;
          --free_count_[link];
          touched.push_back(link);
        }
    }
    // Each touched link's entry anew, with its loads after the whole freeze.
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (int link : touched) {
      ++link_stamp_[link];
      if (free_count_[link] == 0) continue;
      heap_.push_back({level_of(link), link_position_[link], link, link_stamp_[link]});
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    }
  }
  for (std::size_t i = 0; i < set.size(); ++i) {
    Job& job = jobs_[set[i]];
    if (job.speed < 0) job.speed = 1;
    in_set_[set[i]] = 0;
    // New instances always get a finish time; others only when their speed moved.
    if (job.fresh || job.speed != old_speed[i]) {
      job.fresh = false;
      ++job.version;
      changed_.push_back(set[i]);
    }
  }
  for (int link : comp_links) link_seen_[link] = 0;
  return changed_;
}

}  // namespace muonbed
