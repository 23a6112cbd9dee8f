// Flow-fidelity model of the links between nodes: NIC links, node uplinks and the switch fabric,
// with the routes SimGrid's platform gives (Host::route_to), shared max-min fairly, as SimGrid's
// CM02 model shares them when links carry no latency (Network waits out path latencies).
//
// Why: SimGrid 3.32 re-solves its max-min system and scans its pending activities on every
// completion; with muonbed's preset (rooted gathers and scatters over every node on 128
// communication lanes) ~10^5 flows are in flight and a 1,024-GPU step took minutes (perf: 95 %
// of the time in SimGrid's solver and activity bookkeeping). Here the links are re-shared once
// per simulated instant with changes, and a rooted collective over many nodes is one pooled
// flow instead of one flow per member:
//
//   plain flow    a route's links, each shared with weight 1 (one transfer).
//   pooled flow   k members' transfers to or from one root, all at one rate per member: weight
//                 k on the root's links (its NIC, its node's links: every member's transfer
//                 crosses them) and weight 1 on each member's own NIC link, where the pool (the
//                 NIC links of the collective's whole group, keyed once) carries it. This is the
//                 max-min allocation of the k transfers whenever they run at one rate, which
//                 holds while the root's links are their bottleneck (the root moves k pieces,
//                 every member one); a member held back by its own NIC holds the pooled flow
//                 back, where separate flows would let the others finish and free the root's
//                 links sooner (on the seeds' one-stream plan at 16,384 GPUs some small gathers
//                 overlapping a large one at a member take several times longer, the step
//                 +0.8 %: experiments/BENCHMARKS.md). Switch links count every member on the
//                 links all sampled members' routes share. tests/sim compares it with one
//                 SimGrid flow per member.
//
// A pool's NIC links that no plain flow uses this instant are identical (same capacity, same
// pooled load), so the progressive filling treats them as one entry: a solve costs the plain
// flows' links plus one entry per active pool, whatever the number of members.
//
// What share() recomputes: every rate, at every instant with a change, since a change can move
// any rate of its connected component. The merged all-to-all rounds of a 1,024-GPU step
// (scale_a2a_chunks, chunk_sizing count) keep ~3,800 flows live on ~650 links, mostly in one
// component, every route distinct, and each of 2 x 10^5 instants starts or ends one or two flows:
// re-solving only the touched component or merging equal flows would save little. What it keeps
// between instants instead, updated only for the links of the flows that started or ended: each
// link's live flows in order of arrival, their summed weight (whole numbers, so exact in any
// order), and the links sorted by their key before anything freezes (share per unit of weight,
// then first appearance among the flows); flows live in stable slots, their bytes left and rates
// in arrays of their own. Without pooled flows a solve walks that sorted list, merged with a small
// heap of the entries whose share grew since keyed, instead of rebuilding the per-link lists and
// heaping every link (perf: 87 % of such a step went there before), freezes a link's flows (in
// arrival order, as the full solve does) only until its weight is spent, and takes each flow's
// completion time as it freezes it. It takes the same steps in the same order as the full solve
// (ties between links resolve by first appearance either way), so the rates are the same to the
// bit: tests/sim/net_fabric_test.cpp checks it against the full solve, which share() still runs
// (rebuilding its lists, as before) while any pooled flow is live. A solve still visits every
// live flow once (freezing it), so its cost grows with the flows in flight.
#pragma once

#include <cstdint>
#include <vector>

namespace muonbed::sim {

class NetFabric {
 public:
  // A link of `capacity_Bps` bytes/s (one direction); returns its index.
  int add_link(double capacity_Bps);
  // A pool of distinct member links (see above); returns its index.
  int add_pool(const std::vector<int>& links);
  // A flow of `bytes` over `links` starts at `now`, with `weight` shares of each (a whole number
  // >= 1: the kept per-link sums of weights stay exact); with `pool` >= 0 it is a pooled flow of
  // `weight` members, using one share of each pool link.
  // The rates are recomputed by share(), which the caller runs before simulated time advances.
  void add(double now, const int* links, int nlinks, double bytes, double weight, int pool,
           std::uint64_t token);
  // Recomputes the rates (weighted max-min by progressive filling) and the next completion.
  void share();
  // Absolute time of the next completion, or a negative value when no flow is active.
  double next_completion() const { return next_; }
  // Progresses every flow to `now` and appends the tokens of completed flows to `done` (in the
  // order the flows were added); share() then re-shares the links.
  void advance(double now, std::vector<std::uint64_t>& done);
  bool empty() const { return live_.empty(); }

 private:
  struct Flow {
    std::uint32_t first;  // links: link_pool_[first, first + count)
    std::uint32_t count;
    int pool;
    double size;
    double weight;
    std::uint64_t seq;  // order of arrival (live flows keep it: live_ is sorted by it)
    std::uint64_t token;
  };
  struct Pool {
    std::vector<int> links;
    std::vector<int> shared;  // its links that are in other pools too
    double min_capacity = 0;
    // per share_with_pools()
    std::uint32_t stamp = 0;
    double unfrozen = 0;        // pooled flows not yet frozen
    double frozen_rate = 0;     // their per-member rates, summed, once frozen
    std::uint32_t special = 0;  // its links with their own heap entry
    std::vector<std::uint32_t> flows;
  };
  struct HeapEntry {
    double level;
    std::uint32_t id;  // active link (local index), or pool | kPoolBit
    bool operator>(const HeapEntry& o) const {
      return level != o.level ? level > o.level : id > o.id;
    }
  };
  // A link's place in the progressive filling without pools: its share per unit of weight, then
  // where it first appears among the live flows (arrival, then position in the route), which is
  // the order share_with_pools() numbers links in, so that ties resolve the same way.
  struct LinkKey {
    double level;
    std::uint64_t rank;  // seq << kRouteBits | position in that flow's route
    int link;
    bool operator<(const LinkKey& o) const {
      return level != o.level ? level < o.level : rank < o.rank;
    }
    bool operator>(const LinkKey& o) const { return o < *this; }
  };
  // What share_plain() reads of a flow as it freezes it, in one cache line per slot: the stamp
  // of the solve that froze it, its weight and its route (when it has at most kInlineLinks
  // links; longer routes are read from link_pool_). Flows sit in slots in no useful order, and
  // reaching the Flow, its stamp and its route in link_pool_ missed the cache three times per
  // flow frozen (perf: most of a 1,024-GPU all-to-all step).
  static constexpr std::uint32_t kInlineLinks = 12;
  struct alignas(64) FrozenView {
    std::uint32_t stamp;
    std::uint32_t count;
    double weight;
    int links[kInlineLinks];
  };
  Flow& live(std::size_t i) { return flows_[live_[i]]; }
  void progress(double now);
  void compact_pool();
  void touch_links(const Flow& f, std::uint32_t slot, bool added);
  void pack_link(int l);
  void update_order();
  void share_plain();
  void share_with_pools();
  double link_level(std::uint32_t a) const;
  void freeze(std::uint32_t flow, double level);

  double last_ = 0;
  double next_ = -1;
  double next_completion_ = 0;  // while share() runs: the earliest completion so far
  // Flows by slot (stable while the flow lives; finished slots are reused), live_ the live ones
  // in order of arrival. What every event touches lies apart, by slot: the bytes left, the rate
  // of the whole flow (weight x the per-share rate; 0 in a free slot) and the stamp of the
  // share_plain() solve that froze it.
  std::vector<Flow> flows_;
  std::vector<double> remaining_, rate_;
  std::vector<double> done_below_;  // flow_finished()'s bound on the bytes left, by slot
  std::vector<FrozenView> view_;
  // Free slots are a min-heap: a new flow takes the lowest, so that the slots in use stay
  // packed below slots_in_use_ and progress() and the views span the live flows rather than
  // the most ever live (a 1,024-GPU all-to-all step: ~2,000 live flows in ~8,000 slots).
  std::vector<std::uint32_t> live_, free_slots_;
  std::vector<char> slot_free_;
  std::uint32_t slots_in_use_ = 0;
  std::uint64_t next_seq_ = 0;
  std::size_t live_pooled_ = 0;
  std::vector<int> link_pool_;
  std::vector<double> capacity_;
  std::vector<std::vector<int>> pools_of_link_;
  std::vector<Pool> pools_;
  // Kept across share() calls: per link its live flows' slots in order of arrival (one entry per
  // occurrence in a route; an ended flow's entries stay, marked gone, until half of the list is
  // gone) and their summed weight, and the links with live flows sorted by their
  // key before any flow freezes (order_); links whose flows changed wait in dirty_links_.
  // An entry of a link's list: the flow's slot (kGone once it ended) and the link's place in
  // its route; link_at_ (beside link_pool_) is each route place's index in its link's list.
  struct OnLink {
    std::uint32_t slot;
    std::uint32_t k;
  };
  static constexpr std::uint32_t kGone = 0xffffffffu;
  std::vector<std::vector<OnLink>> flows_of_link_;
  std::vector<std::uint32_t> gone_of_link_;  // per link: its list's gone entries
  std::vector<std::uint32_t> link_at_;
  std::vector<double> link_weight_;
  std::vector<char> link_dirty_;
  std::vector<int> dirty_links_;
  std::vector<LinkKey> order_, order_scratch_, fresh_keys_;
  // scratch for share_plain(): per link its residual capacity and unfrozen weight, and the
  // links whose share grew since they were keyed
  struct LinkState {
    double residual;
    double weight;
  };
  std::vector<LinkState> plain_links_;
  std::vector<LinkKey> regrown_;
  // scratch for share_with_pools(): the links with their own entry (active_, local_ maps back)
  std::vector<int> active_;
  std::vector<std::uint32_t> local_, link_stamp_;
  std::uint32_t stamp_ = 0;
  std::vector<int> active_pools_;
  std::vector<double> residual_, weights_;
  std::vector<std::uint32_t> by_link_start_, by_link_, cursor_;
  std::vector<char> frozen_;
  std::vector<HeapEntry> heap_;
};

}  // namespace muonbed::sim
