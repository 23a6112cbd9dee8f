// Links that concurrent collectives share, for the analytic model (cost_model.cpp's replay).
//
// Why: a collective's closed form (cost_model.hpp) prices one instance alone. In a step, several
// instances run at once (the dp groups of a dp x tp mesh all cross the same node's NICs; a
// gather's owner receives through one NIC while other gathers target it), and pricing each alone
// made the analytic estimate 2-3x faster than the simulator across nodes. Here every instance in
// flight holds its share of the links it crosses, the way the simulator's platform routes them
// (sim/src/platform.hpp): each GPU's NVLink or PCIe link per direction, the node's NIC links per
// direction (GPU l of a node uses NIC link l x links / gpus_per_node), the node's PCIe host bridge
// (one budget for both directions: every byte through it counts once), and under an
// oversubscribed fat tree each leaf's uplinks per direction.
//
// The model: an instance alone takes L + W seconds (its closed form: latency part L, bandwidth
// part W). Over W it needs occupancy o_r seconds of each link r (its bytes there over the link's
// capacity at the collective class's efficiency), so alone it loads r at u_r = o_r / W. Instances
// in flight progress at a speed s <= 1 (W shrinks at rate s) chosen max-min fairly (progressive
// filling: raise every unfrozen speed together; freeze the instances of a link once its load
// sum s u reaches 1), re-solved whenever an instance starts or ends its bandwidth part, only over
// the instances linked through saturated links. An instance whose own u exceeds 1 somewhere (its
// closed form assumes more than the link gives, e.g. two members behind one NIC) runs slower
// even alone. Latency L is paid after the bandwidth part, unshared.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/config/cluster.hpp"

namespace muonbed {

// The shareable links of a cluster of `world_size` ranks, rank r on GPU r % gpn of node r / gpn.
class ClusterLinks {
 public:
  ClusterLinks(const ClusterSpec& cluster, int world_size, int gpus_per_node);

  int count() const { return static_cast<int>(capacity_Bps_.size()); }
  double capacity_Bps(int link) const { return capacity_Bps_[link]; }

  int node_of(int rank) const { return rank / gpn_; }
  int leaf_of_node(int node) const { return npl_ > 0 ? node / npl_ : 0; }
  bool pcie() const { return pcie_; }
  bool has_bridge() const { return bridge_ >= 0; }
  bool has_leaves() const { return leaf_up_ >= 0; }

  int gpu_out(int rank) const { return rank * 2; }
  int gpu_in(int rank) const { return rank * 2 + 1; }
  int nic_out(int rank) const { return nic_ + 2 * nic_index(rank); }
  int nic_in(int rank) const { return nic_ + 2 * nic_index(rank) + 1; }
  int bridge(int node) const { return bridge_ + node; }
  int leaf_up(int leaf) const { return leaf_up_ + 2 * leaf; }
  int leaf_down(int leaf) const { return leaf_up_ + 2 * leaf + 1; }

 private:
  int nic_index(int rank) const {
    return node_of(rank) * nic_links_ + (rank % gpn_) * nic_links_ / gpn_;
  }

  int gpn_ = 1;
  int nodes_ = 1;
  int npl_ = 0;  // nodes per leaf where leaf uplinks are modelled, else 0
  int nic_links_ = 1;
  bool pcie_ = false;
  int nic_ = 0;
  int bridge_ = -1;
  int leaf_up_ = -1;
  std::vector<double> capacity_Bps_;
};

// One instance's use of the links: seconds of exclusive occupancy it needs on each.
using LinkOccupancy = std::vector<std::pair<int, double>>;

// Instances in flight and their max-min fair speeds (see the header comment).
class SharedLinks {
 public:
  explicit SharedLinks(int links);

  // Starts the bandwidth part (`work_s` alone-seconds, > 0) of instance `id` at time `now`.
  void add(int id, double now, double work_s, const LinkOccupancy& occupancy);
  // Ends it (its work is done); the instances it slowed are re-solved at the next resolve().
  void remove(int id);
  // Re-solves the speeds of every instance touched since the last call, at time `now`, and
  // returns the instances whose finish time changed (their finish_s() is the new one).
  const std::vector<int>& resolve(double now);
  bool pending() const { return !dirty_.empty(); }

  double finish_s(int id) const;
  std::uint64_t version(int id) const { return jobs_[id].version; }
  double speed(int id) const { return jobs_[id].speed; }

 private:
  struct Job {
    bool active = false;
    bool fresh = false;      // added since the last resolve
    double remaining_s = 0;  // alone-seconds of bandwidth work left at last_s
    double last_s = 0;
    double speed = 1;
    std::uint64_t version = 0;
    std::vector<std::pair<int, double>> load;  // link, u = occupancy / work
  };
  struct Link {
    std::vector<int> jobs;
    double load = 0;  // sum of u of its jobs (alone loads)
  };
  bool saturated(int link) const;

  std::vector<Job> jobs_;
  std::vector<Link> links_;
  std::vector<int> dirty_;  // jobs whose speed may change
  std::vector<int> changed_;
  std::vector<char> in_set_;  // scratch, per job
  std::vector<char> link_seen_;
  std::vector<double> frozen_load_;
  std::vector<double> free_load_;
  std::vector<int> free_count_;  // unfrozen instances on the link
  // resolve()'s lazy heap of fill levels: an entry is current while its stamp is the link's.
  struct LevelEntry {
    double level = 0;
    int position = 0;  // in the component's link order: ties go to the earlier link
    int link = 0;
    std::uint64_t stamp = 0;
    bool operator>(const LevelEntry& o) const {
      return level != o.level ? level > o.level : position > o.position;
    }
  };
  std::vector<int> link_position_;
  std::vector<std::uint64_t> link_stamp_;
  std::vector<LevelEntry> heap_;
};

}  // namespace muonbed
