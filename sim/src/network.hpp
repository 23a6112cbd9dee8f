// The simulator's side of SimGrid: transfers, compute and delays started without actors, with
// completions delivered to one sink. One controller drives the whole replay from completion
// callbacks (FACTS: an actor per rank with many pending communications hits slow paths).
//
//   transfer   after the path latency (an event; with NetworkConfig::
//              latency_weighted_sharing the links carry it instead, as SimGrid models TCP),
//              a SimGrid communication (Comm::sendto) between the two GPU hosts, except at flow
//              fidelity inside a node, where the node's NodeFabric shares the links after the
//              path latency has elapsed (not on multi-node PCIe clusters, whose GPU links also
//              carry NIC traffic), and between nodes with `net_fabric`, where the NetFabric
//              shares the platform's routes the same way; zero bytes cost the path latency (an
//              event).
//   pooled     flow fidelity with `net_fabric`: a root's transfers with many members on other
//              nodes as one pooled NetFabric flow, after the longest of their path latencies.
//   compute    step fidelity: an Exec on the GPU host (concurrent Execs share the GPU's speed);
//              flow fidelity: the same processor sharing computed here with events,
//              because SimGrid 3.32 pays a scan over all pending maestro-owned activities on
//              each completion (16,384 concurrent Execs took 5 s to finish).
//   delay      an event of muonbed's own queue (below).
// Timed events (path latencies before a flow starts, delays, the fabrics' next completions) wait
// in muonbed's own queue, by date and then order of scheduling, under a single SimGrid kernel timer
// armed at the earliest date: SimGrid 3.32's timers (a Fibonacci heap of type-erased tasks, one
// allocation each) took about 40 % of a 1,024-GPU all-to-all step at flow fidelity (perf). Events
// of one date run in the order they were scheduled, all before simulated time advances.
// Activities stay referenced until simulated time has advanced past their completion (dropping
// the last reference inside the completion callback crashed 3.32); then their slots are reused,
// so memory stays bounded by the activities in flight.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sim/src/net_fabric.hpp"
#include "sim/src/node_fabric.hpp"
#include "sim/src/platform.hpp"

namespace simgrid::s4u {
class Activity;
class Link;
}  // namespace simgrid::s4u
namespace simgrid::kernel::timer {
class Timer;
}

namespace muonbed::sim {

// Receives every completion: `owner` and `tag` are what the request carried.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  virtual void completed(std::uint32_t owner, std::uint64_t tag) = 0;
};

struct TrafficCounters {
  double intra_node_bytes = 0;
  double network_bytes = 0;
  std::vector<double> sent, received;  // per rank
};

class Network {
 public:
  // `latency_in_links`: the platform's links carry the path latencies (NetworkConfig::
  // latency_weighted_sharing); otherwise each transfer waits out its path latency with a timer.
  // `net_fabric` (flow fidelity only, where the node fabrics are used): flows between nodes
  // share the links in a NetFabric instead of SimGrid communications.
  Network(const Topology& topology, std::vector<simgrid::s4u::Host*> hosts, bool step_fidelity,
          bool latency_in_links, CompletionSink& sink, bool net_fabric = false);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  void transfer(int src, int dst, double bytes, std::uint32_t owner, std::uint64_t tag);
  // CollectiveHost::pooled_transfer; false (nothing posted) without the NetFabric or when the
  // members do not have NIC links of their own (GPUs sharing a NIC).
  bool pooled_transfer(int root, const std::vector<int>& group, const std::vector<int>& remote,
                       bool to_root, double bytes, std::uint32_t owner, std::uint64_t tag);
  bool can_pool() const { return net_fabric_ != nullptr; }
  // Counts `bytes` of logical traffic from src to dst (transfers are not counted by themselves).
  void account(int src, int dst, double bytes);
  void compute(int rank, double seconds, std::uint32_t owner, std::uint64_t tag);
  void delay(double seconds, std::uint32_t owner, std::uint64_t tag);
  // Alarms: a completion (owner, tag) at an exact date that can be moved or dropped. Moving one
  // (set_alarm again) or freeing it drops the event already scheduled, so nothing reaches an
  // owner that has finished (the replay reuses a finished collective's owner index).
  int new_alarm();
  void set_alarm(int alarm, double date, std::uint32_t owner, std::uint64_t tag);
  void free_alarm(int alarm);

  double now() const;
  TrafficCounters& traffic() { return traffic_; }
  void reset_traffic();

  // Flow fidelity between nodes: "" when every inter-node route net_route composes equals
  // SimGrid's route_to, else the first pair that differs (tests).
  std::string check_net_routes();

  std::int64_t simgrid_transfers() const { return simgrid_transfers_; }
  std::int64_t node_flows() const { return node_flows_; }
  std::int64_t timers() const { return timers_; }
  std::int64_t computes() const { return computes_; }

 private:
  struct Slot;
  struct Proc;
  struct RoutePart {  // a part of inter-node routes: net_part_links_[first, first + count)
    std::uint32_t first = 0;
    std::int32_t count = -1;  // -1: not yet known
  };
  void on_activity(const simgrid::s4u::Activity& activity);
  void start_comm(int src, int dst, double bytes, std::uint32_t owner, std::uint64_t tag);
  void release_completed();
  std::uint32_t take_slot();
  void fabric_add(int node, int src_local, int dst_local, double bytes, std::uint32_t owner,
                  std::uint64_t tag);
  void fabric_reschedule(int node);
  void fabric_fire(int node);
  std::uint32_t take_token(std::uint32_t owner, std::uint64_t tag);
  // The inter-node route from src to dst as fabric link indices, valid until the next call.
  std::pair<const int*, int> net_route(int src, int dst);
  RoutePart& net_between(int node_a, int node_b);
  void learn_net_route(int src, int dst);
  int net_link(const simgrid::s4u::Link* link);
  // A member's own NIC link: toward the network (`up`) or from it.
  int member_link(int rank, bool up);
  void net_add(const int* links, int nlinks, double bytes, double weight, int pool,
               std::uint32_t owner, std::uint64_t tag);
  void net_share_soon();
  void net_reschedule();
  void net_fire();
  void proc_reschedule(int rank);
  void proc_fire(int rank);
  void proc_progress(Proc& p, double now);

  // A fabric's or a processor's pending wake-up: armed at `date`, superseded when `version` moves.
  struct WakeUp {
    bool armed = false;
    double date = -1;
    std::int32_t version = 0;
  };
  // The event queue. An event is what runs at its date: its kind and the fields that kind reads.
  enum class EventKind : std::uint8_t {
    completion,    // sink_.completed(owner, tag)
    comm_start,    // start_comm(a, b, bytes, owner, tag)
    fabric_add,    // fabric_add(node a, local b, local c, bytes, owner, tag)
    net_add,       // net_add(route of a -> b, bytes, owner, tag)
    pooled_add,    // net_add(pooled_starts_[a], ...)
    proc_fire,     // proc_fire(rank a) if version c is still the rank's
    fabric_fire,   // fabric_fire(node a) if version c is still the node's
    net_fire,      // net_fire() if version c is still current
    net_share,     // the NetFabric's re-sharing of this instant
    fabric_share,  // node a's NodeFabric re-sharing of this instant
    alarm,         // alarm a's completion if version c is still the alarm's
  };
  struct Event {
    double date;
    EventKind kind;
    std::int32_t a = 0, b = 0, c = 0;
    std::uint32_t owner = 0;
    std::uint64_t tag = 0;
    double bytes = 0;
  };
  void schedule(const Event& event);
  void wake_at(WakeUp& wakeup, double next, EventKind kind, int id);
  void run_events();
  void arm();
  void dispatch(const Event& event);
  // One bucket of events per distinct date, in the order they were scheduled (many share a date:
  // a window of rounds posted at once), the dates in a min-heap.
  std::vector<double> event_dates_;
  struct DateHash {
    std::size_t operator()(double date) const {
      std::uint64_t x;
      std::memcpy(&x, &date, sizeof x);
      x ^= x >> 33;  // the bits of a double that differ sit low in the mantissa: mix them up
      x *= 0xff51afd7ed558ccdull;
      x ^= x >> 33;
      return static_cast<std::size_t>(x);
    }
  };
  std::unordered_map<double, std::uint32_t, DateHash> bucket_of_date_;
  double last_date_ = -1;  // the date scheduled last and its bucket (runs of one date are common)
  std::uint32_t last_bucket_ = 0;
  std::vector<std::vector<Event>> buckets_;
  std::vector<std::uint32_t> free_buckets_;
  simgrid::kernel::timer::Timer* armed_ = nullptr;
  double armed_date_ = -1;
  bool running_events_ = false;
  // A pooled flow's links and weight until its latency has elapsed.
  struct PooledStart {
    std::vector<int> links;
    double weight;
    int pool;
  };
  std::vector<PooledStart> pooled_starts_;
  std::vector<std::uint32_t> free_pooled_starts_;

  const Topology& topology_;
  std::vector<simgrid::s4u::Host*> hosts_;
  bool step_fidelity_;
  bool node_fabric_ = false;  // intra-node transfers use NodeFabric instead of SimGrid
  bool latency_in_links_;
  CompletionSink& sink_;
  TrafficCounters traffic_;

  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_slots_;
  std::vector<std::uint32_t> completed_slots_;

  // Flow fidelity: per-node fabrics and per-rank processor sharing, each with its pending timer.
  struct FabricToken {
    std::uint32_t owner;
    std::uint64_t tag;
  };
  std::vector<std::unique_ptr<NodeFabric>> fabrics_;
  std::vector<WakeUp> fabric_wakeups_;
  std::vector<char> fabric_share_pending_;  // per node: a fabric_share event is scheduled
  std::vector<FabricToken> fabric_tokens_;
  std::vector<std::uint32_t> free_fabric_tokens_;
  std::vector<std::uint64_t> finished_scratch_;
  std::vector<Proc> procs_;

  // Flow fidelity between nodes: the NetFabric, routes by (src, dst) rank pair as link indices,
  // and its one pending timer; `net_share_pending_` batches the re-sharing of one instant.
  std::unique_ptr<NetFabric> net_fabric_;
  std::unordered_map<const simgrid::s4u::Link*, int> net_link_index_;
  // Routes in parts (net_route): per rank its links to its node's gateway and back, per node
  // pair the links between the gateways; links of all parts in net_part_links_.
  std::vector<RoutePart> net_up_, net_down_;  // per rank
  static constexpr int kDenseBetweenNodes = 1024;
  std::vector<RoutePart> net_between_;  // per node pair, up to 1,024 nodes
  std::unordered_map<std::uint64_t, RoutePart> net_between_map_;  // more nodes
  std::vector<int> net_part_links_;
  std::vector<int> net_route_scratch_;
  WakeUp net_wakeup_;
  bool net_share_pending_ = false;
  std::vector<std::uint64_t> net_done_;
  std::vector<int> member_up_, member_down_;          // per rank, -1: not yet known
  std::unordered_map<std::uint64_t, int> net_pools_;  // group hash -> pool, -1: cannot pool

  struct Alarm {
    WakeUp wake;
    std::uint32_t owner = 0;
    std::uint64_t tag = 0;
  };
  std::vector<Alarm> alarms_;
  std::vector<std::uint32_t> free_alarms_;

  std::int64_t simgrid_transfers_ = 0;
  std::int64_t node_flows_ = 0;
  std::int64_t timers_ = 0;
  std::int64_t computes_ = 0;
};

}  // namespace muonbed::sim
