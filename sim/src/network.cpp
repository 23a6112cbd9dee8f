// SimGrid transfers, compute and timers for the replay (see network.hpp).
#include "sim/src/network.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include <simgrid/kernel/Timer.hpp>
#include <simgrid/s4u.hpp>

#include "core/base/errors.hpp"

namespace sg4 = simgrid::s4u;
using simgrid::kernel::timer::Timer;

namespace muonbed::sim {

namespace {
// Work (seconds at full speed) below which a processor-shared job counts as done.
constexpr double kDoneSeconds = 1e-15;
constexpr std::uintptr_t kExecBit = 1;  // activity data: (slot + 1) << 1 | is_exec
}  // namespace

struct Network::Slot {
  sg4::ActivityPtr activity;
  std::uint32_t owner = 0;
  std::uint64_t tag = 0;
};

struct Network::Proc {
  struct Job {
    double remaining;
    std::uint32_t owner;
    std::uint64_t tag;
  };
  double last = 0;
  std::vector<Job> jobs;
  WakeUp wakeup;
};

Network::Network(const Topology& topology, std::vector<sg4::Host*> hosts, bool step_fidelity,
                 bool latency_in_links, CompletionSink& sink, bool net_fabric)
    : topology_(topology),
      hosts_(std::move(hosts)),
      step_fidelity_(step_fidelity),
      latency_in_links_(latency_in_links),
      sink_(sink) {
  traffic_.sent.assign(topology.world_size(), 0);
  traffic_.received.assign(topology.world_size(), 0);
  // A PCIe GPU's link to the switch also carries its NIC traffic (platform.cpp routes NIC DMA
  // over it), so with several PCIe nodes the node's links are not private to intra-node flows:
  // those stay in SimGrid, where they share the links with the network flows.
  node_fabric_ = !step_fidelity_ && !(topology.pcie() && topology.nodes() > 1);
  if (node_fabric_) {
    const int gpn = topology.gpus_per_node();
    for (int n = 0; n < topology.nodes(); ++n)
      fabrics_.push_back(
          std::make_unique<NodeFabric>(gpn, topology.intra_link_Bps(), topology.bridge_Bps()));
    fabric_wakeups_.assign(topology.nodes(), WakeUp{});
    fabric_share_pending_.assign(topology.nodes(), 0);
    // Links carrying latency (latency-weighted sharing) share unequally in SimGrid: keep those
    // flows there.
    if (net_fabric && topology.nodes() > 1 && !latency_in_links_)
      net_fabric_ = std::make_unique<NetFabric>();
  }
  if (!step_fidelity_) procs_.resize(topology.world_size());
  sg4::Activity::on_completion_cb([this](const sg4::Activity& a) { on_activity(a); });
  sg4::Engine::on_time_advance_cb([this](double) { release_completed(); });
}

Network::~Network() = default;

double Network::now() const {
  return sg4::Engine::get_clock();
}

void Network::reset_traffic() {
  traffic_.intra_node_bytes = 0;
  traffic_.network_bytes = 0;
  std::fill(traffic_.sent.begin(), traffic_.sent.end(), 0.0);
  std::fill(traffic_.received.begin(), traffic_.received.end(), 0.0);
}

std::uint32_t Network::take_slot() {
  if (!free_slots_.empty()) {
    const std::uint32_t s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  slots_.emplace_back();
  return static_cast<std::uint32_t>(slots_.size() - 1);
}

void Network::release_completed() {
  for (std::uint32_t s : completed_slots_) {
    slots_[s].activity = nullptr;
    free_slots_.push_back(s);
  }
  completed_slots_.clear();
}

void Network::on_activity(const sg4::Activity& activity) {
  const auto data = reinterpret_cast<std::uintptr_t>(activity.get_data<void>());
  if (data == 0) return;  // not ours
  const std::uint32_t s = static_cast<std::uint32_t>((data >> 1) - 1);
  completed_slots_.push_back(s);
  sink_.completed(slots_[s].owner, slots_[s].tag);
}

void Network::delay(double seconds, std::uint32_t owner, std::uint64_t tag) {
  ++timers_;
  schedule({.date = now() + std::max(0.0, seconds),
            .kind = EventKind::completion,
            .owner = owner,
            .tag = tag});
}

int Network::new_alarm() {
  if (!free_alarms_.empty()) {
    const std::uint32_t a = free_alarms_.back();
    free_alarms_.pop_back();
    return static_cast<int>(a);
  }
  alarms_.emplace_back();
  return static_cast<int>(alarms_.size()) - 1;
}

void Network::set_alarm(int alarm, double date, std::uint32_t owner, std::uint64_t tag) {
  Alarm& a = alarms_[static_cast<std::size_t>(alarm)];
  a.owner = owner;
  a.tag = tag;
  wake_at(a.wake, std::max(now(), date), EventKind::alarm, alarm);
}

void Network::free_alarm(int alarm) {
  Alarm& a = alarms_[static_cast<std::size_t>(alarm)];
  ++a.wake.version;  // drops a scheduled event; versions only grow, so a reuse never matches it
  a.wake.armed = false;
  a.wake.date = -1;
  free_alarms_.push_back(static_cast<std::uint32_t>(alarm));
}

// ---- The event queue
// ------------------------------------------------------------------------------

void Network::schedule(const Event& event) {
  if (event.date != last_date_) {
    auto [at, added] = bucket_of_date_.try_emplace(event.date, 0);
    if (added) {
      if (free_buckets_.empty()) {
        at->second = static_cast<std::uint32_t>(buckets_.size());
        buckets_.emplace_back();
      } else {
        at->second = free_buckets_.back();
        free_buckets_.pop_back();
      }
      event_dates_.push_back(event.date);
      std::push_heap(event_dates_.begin(), event_dates_.end(), std::greater<>{});
    }
    last_date_ = event.date;
    last_bucket_ = at->second;
  }
  buckets_[last_bucket_].push_back(event);
  if (!running_events_) arm();
}

// One SimGrid timer at the earliest event's date (a timer at the current date runs before
// simulated time advances).
void Network::arm() {
  if (event_dates_.empty()) return;
  const double date = event_dates_.front();
  if (armed_ != nullptr && armed_date_ == date) return;
  if (armed_ != nullptr) armed_->remove();
  armed_date_ = date;
  armed_ = Timer::set(date, [this] {
    armed_ = nullptr;
    run_events();
  });
}

// Every event due, date by date, each date's in the order scheduled; events a dispatch schedules
// for the same date join its bucket and run in this pass.
void Network::run_events() {
  running_events_ = true;
  const double t = now();
  while (!event_dates_.empty() && event_dates_.front() <= t) {
    const double date = event_dates_.front();
    const std::uint32_t bucket = bucket_of_date_.at(date);
    for (std::size_t i = 0; i < buckets_[bucket].size(); ++i) {
      const Event e = buckets_[bucket][i];  // a copy: dispatch may grow the bucket
      dispatch(e);
    }
    buckets_[bucket].clear();
    free_buckets_.push_back(bucket);
    bucket_of_date_.erase(date);
    if (last_date_ == date) last_date_ = -1;
    std::pop_heap(event_dates_.begin(), event_dates_.end(), std::greater<>{});
    event_dates_.pop_back();
  }
  running_events_ = false;
  arm();
}

void Network::dispatch(const Event& e) {
  switch (e.kind) {
    case EventKind::completion:
      sink_.completed(e.owner, e.tag);
      return;
    case EventKind::comm_start:
      start_comm(e.a, e.b, e.bytes, e.owner, e.tag);
      return;
    case EventKind::fabric_add:
      fabric_add(e.a, e.b, e.c, e.bytes, e.owner, e.tag);
      return;
    case EventKind::net_add: {
      const auto [links, count] = net_route(e.a, e.b);
      net_add(links, count, e.bytes, 1, -1, e.owner, e.tag);
      return;
    }
    case EventKind::pooled_add: {
      const PooledStart& p = pooled_starts_[static_cast<std::size_t>(e.a)];
      net_add(p.links.data(), static_cast<int>(p.links.size()), e.bytes, p.weight, p.pool, e.owner,
              e.tag);
      free_pooled_starts_.push_back(static_cast<std::uint32_t>(e.a));
      return;
    }
    case EventKind::proc_fire:
      if (procs_[e.a].wakeup.armed && procs_[e.a].wakeup.version == e.c) proc_fire(e.a);
      return;
    case EventKind::fabric_fire:
      if (fabric_wakeups_[e.a].armed && fabric_wakeups_[e.a].version == e.c) fabric_fire(e.a);
      return;
    case EventKind::net_fire:
      if (net_wakeup_.armed && net_wakeup_.version == e.c) net_fire();
      return;
    case EventKind::fabric_share:
      fabric_share_pending_[static_cast<std::size_t>(e.a)] = 0;
      fabrics_[static_cast<std::size_t>(e.a)]->share();
      fabric_reschedule(e.a);
      return;
    case EventKind::alarm: {
      Alarm& a = alarms_[static_cast<std::size_t>(e.a)];
      if (!a.wake.armed || a.wake.version != e.c) return;
      a.wake.armed = false;
      a.wake.date = -1;
      sink_.completed(a.owner, a.tag);
      return;
    }
    case EventKind::net_share:
      net_share_pending_ = false;
      net_fabric_->share();
      net_reschedule();
      return;
  }
}

// Moves `w` to `next` (negative: none): an event of `kind` for `id`, which fires only if `w`
// has not moved since.
void Network::wake_at(WakeUp& w, double next, EventKind kind, int id) {
  if (w.armed && w.date == next) return;
  ++w.version;
  w.armed = next >= 0;
  if (!w.armed) return;
  w.date = next;
  schedule({.date = next, .kind = kind, .a = id, .c = w.version});
}

void Network::account(int src, int dst, double bytes) {
  if (!(bytes > 0) || src == dst) return;
  (topology_.node_of(src) == topology_.node_of(dst) ? traffic_.intra_node_bytes
                                                    : traffic_.network_bytes) += bytes;
  traffic_.sent[src] += bytes;
  traffic_.received[dst] += bytes;
}

void Network::transfer(int src, int dst, double bytes, std::uint32_t owner, std::uint64_t tag) {
  const int src_node = topology_.node_of(src), dst_node = topology_.node_of(dst);
  const PathInfo path = topology_.path(src, dst);
  if (!(bytes >= 1) || src == dst) {  // a zero-byte message: its latency only
    delay(path.latency_s, owner, tag);
    return;
  }
  if (node_fabric_ && src_node == dst_node) {
    ++node_flows_;
    const int src_local = topology_.local_of(src), dst_local = topology_.local_of(dst);
    ++timers_;
    schedule({.date = now() + path.latency_s,
              .kind = EventKind::fabric_add,
              .a = src_node,
              .b = src_local,
              .c = dst_local,
              .owner = owner,
              .tag = tag,
              .bytes = bytes});
    return;
  }
  if (net_fabric_) {
    ++node_flows_;
    ++timers_;
    schedule({.date = now() + path.latency_s,
              .kind = EventKind::net_add,
              .a = src,
              .b = dst,
              .owner = owner,
              .tag = tag,
              .bytes = bytes});
    return;
  }
  ++simgrid_transfers_;
  // With latencies in the links the route pays them, except the switches it passes beyond one
  // per tree level (Topology::latency_beyond_links), waited out first.
  const double wait = latency_in_links_ ? topology_.latency_beyond_links(src, dst) : path.latency_s;
  if (!(wait > 0)) return start_comm(src, dst, bytes, owner, tag);
  ++timers_;
  schedule({.date = now() + wait,
            .kind = EventKind::comm_start,
            .a = src,
            .b = dst,
            .owner = owner,
            .tag = tag,
            .bytes = bytes});
}

void Network::start_comm(int src, int dst, double bytes, std::uint32_t owner, std::uint64_t tag) {
  const std::uint32_t s = take_slot();
  sg4::CommPtr comm = sg4::Comm::sendto_init(hosts_[src], hosts_[dst]);
  comm->set_payload_size(static_cast<std::uint64_t>(std::llround(bytes)));
  comm->set_data(reinterpret_cast<void*>(static_cast<std::uintptr_t>(s + 1) << 1));
  slots_[s] = {comm, owner, tag};
  comm->start();
}

void Network::compute(int rank, double seconds, std::uint32_t owner, std::uint64_t tag) {
  ++computes_;
  if (!(seconds > 0)) {
    delay(0, owner, tag);
    return;
  }
  if (step_fidelity_) {
    sg4::Host* host = hosts_[rank];
    const std::uint32_t s = take_slot();
    sg4::ExecPtr exec = sg4::Exec::init();
    exec->set_host(host);
    exec->set_flops_amount(seconds * host->get_speed());
    exec->set_data(reinterpret_cast<void*>((static_cast<std::uintptr_t>(s + 1) << 1) | kExecBit));
    slots_[s] = {exec, owner, tag};
    exec->start();
    return;
  }
  Proc& p = procs_[rank];
  proc_progress(p, now());
  p.jobs.push_back({seconds, owner, tag});
  proc_reschedule(rank);
}

// ---- Processor sharing (flow fidelity)
// ------------------------------------------------------------

void Network::proc_progress(Proc& p, double t) {
  if (!p.jobs.empty() && t > p.last) {
    const double work = (t - p.last) / static_cast<double>(p.jobs.size());
    for (auto& j : p.jobs) j.remaining -= work;
  }
  p.last = std::max(p.last, t);
}

void Network::proc_reschedule(int rank) {
  Proc& p = procs_[rank];
  double next = -1;
  if (!p.jobs.empty()) {
    double least = std::numeric_limits<double>::infinity();
    for (const auto& j : p.jobs) least = std::min(least, j.remaining);
    next = p.last + std::max(0.0, least) * static_cast<double>(p.jobs.size());
  }
  wake_at(p.wakeup, next, EventKind::proc_fire, rank);
}

void Network::proc_fire(int rank) {
  Proc& p = procs_[rank];
  p.wakeup.armed = false;
  const double t = now();
  proc_progress(p, t);
  std::vector<Proc::Job> done;
  std::size_t keep = 0;
  for (std::size_t i = 0; i < p.jobs.size(); ++i) {
    if (p.jobs[i].remaining <= kDoneSeconds * (1 + t))
      done.push_back(p.jobs[i]);
    else
      p.jobs[keep++] = p.jobs[i];
  }
  p.jobs.resize(keep);
  proc_reschedule(rank);
  for (const auto& j : done) sink_.completed(j.owner, j.tag);
}

// ---- Node fabrics (flow fidelity)
// ----------------------------------------------------------------

std::uint32_t Network::take_token(std::uint32_t owner, std::uint64_t tag) {
  std::uint32_t token;
  if (!free_fabric_tokens_.empty()) {
    token = free_fabric_tokens_.back();
    free_fabric_tokens_.pop_back();
    fabric_tokens_[token] = {owner, tag};
  } else {
    token = static_cast<std::uint32_t>(fabric_tokens_.size());
    fabric_tokens_.push_back({owner, tag});
  }
  return token;
}

void Network::fabric_add(int node, int src_local, int dst_local, double bytes, std::uint32_t owner,
                         std::uint64_t tag) {
  const std::uint32_t token = take_token(owner, tag);
  fabrics_[node]->add(now(), src_local, dst_local, bytes, token);
  // Re-share once for every flow that starts on the node in this instant (an event at the
  // current date runs before simulated time advances).
  if (fabric_share_pending_[static_cast<std::size_t>(node)]) return;
  fabric_share_pending_[static_cast<std::size_t>(node)] = 1;
  schedule({.date = now(), .kind = EventKind::fabric_share, .a = node});
}

void Network::fabric_reschedule(int node) {
  wake_at(fabric_wakeups_[node], fabrics_[node]->next_completion(), EventKind::fabric_fire, node);
}

void Network::fabric_fire(int node) {
  fabric_wakeups_[node].armed = false;
  finished_scratch_.clear();
  fabrics_[node]->advance(now(), finished_scratch_);
  fabric_reschedule(node);
  // Deliver after the fabric is consistent: a completion may start new flows on this node.
  const std::vector<std::uint64_t> done = finished_scratch_;
  for (std::uint64_t token : done) {
    const FabricToken t = fabric_tokens_[token];
    free_fabric_tokens_.push_back(static_cast<std::uint32_t>(token));
    sink_.completed(t.owner, t.tag);
  }
}

// ---- Inter-node fabric (flow fidelity) -----------------------------------------------------

// SimGrid routes hierarchically (platform.cpp): a GPU's links to its node zone's gateway, the
// cluster zone's route between the two node zones, the other gateway's links to the GPU. Each part
// is asked of SimGrid once (per rank, per node pair) instead of once per rank pair: a 1,024-GPU
// all-to-all has a million pairs, and route_to per pair took a tenth of its simulation. The parts
// compose to exactly the route SimGrid gives (tests/sim/replay_test.cpp checks every pair).
std::pair<const int*, int> Network::net_route(int src, int dst) {
  if (net_up_.empty()) {
    net_up_.assign(topology_.world_size(), RoutePart{});
    net_down_.assign(topology_.world_size(), RoutePart{});
    if (topology_.nodes() <= kDenseBetweenNodes)
      net_between_.assign(static_cast<std::size_t>(topology_.nodes()) * topology_.nodes(),
                          RoutePart{});
  }
  const RoutePart* up = &net_up_[static_cast<std::size_t>(src)];
  const RoutePart* down = &net_down_[static_cast<std::size_t>(dst)];
  const RoutePart* between = &net_between(topology_.node_of(src), topology_.node_of(dst));
  if (up->count < 0 || down->count < 0 || between->count < 0) {
    learn_net_route(src, dst);
    between = &net_between(topology_.node_of(src), topology_.node_of(dst));
  }
  net_route_scratch_.clear();
  for (const RoutePart* part : {up, between, down})
    net_route_scratch_.insert(net_route_scratch_.end(), net_part_links_.begin() + part->first,
                              net_part_links_.begin() + part->first + part->count);
  return {net_route_scratch_.data(), static_cast<int>(net_route_scratch_.size())};
}

Network::RoutePart& Network::net_between(int node_a, int node_b) {
  const auto key = static_cast<std::size_t>(node_a) * topology_.nodes() + node_b;
  if (!net_between_.empty()) return net_between_[key];
  return net_between_map_[key];
}

void Network::learn_net_route(int src, int dst) {
  std::vector<sg4::Link*> links;
  double latency = 0;
  hosts_[src]->route_to(hosts_[dst], links, &latency);
  // The node zones' links lead and trail; the cluster zone's lie between.
  std::size_t lead = 0, trail = 0;
  while (lead < links.size() && is_node_link(*links[lead])) ++lead;
  while (trail < links.size() - lead && is_node_link(*links[links.size() - 1 - trail])) ++trail;
  const auto keep = [&](RoutePart& part, std::size_t from, std::size_t to) {
    const auto first = static_cast<std::uint32_t>(net_part_links_.size());
    for (std::size_t k = from; k < to; ++k) net_part_links_.push_back(net_link(links[k]));
    if (part.count >= 0) {  // known: the platform must route hierarchically
      if (!std::equal(net_part_links_.begin() + part.first,
                      net_part_links_.begin() + part.first + part.count,
                      net_part_links_.begin() + first, net_part_links_.end()))
        throw Error("internal: SimGrid's route from rank " + std::to_string(src) + " to rank " +
                    std::to_string(dst) + " is not its node parts' composition");
      net_part_links_.resize(first);
      return;
    }
    part = {first, static_cast<std::int32_t>(to - from)};
  };
  keep(net_up_[static_cast<std::size_t>(src)], 0, lead);
  keep(net_between(topology_.node_of(src), topology_.node_of(dst)), lead, links.size() - trail);
  keep(net_down_[static_cast<std::size_t>(dst)], links.size() - trail, links.size());
}

std::string Network::check_net_routes() {
  if (!net_fabric_) return "no inter-node fabric";
  const int world = topology_.world_size();
  // In a scrambled order, so that parts are learned from varied pairs before being reused.
  for (int k = 0; k < world * world; ++k) {
    const int src = static_cast<int>((static_cast<std::int64_t>(k) * 7919) % world);
    const int dst = (k / world + src) % world;
    if (topology_.node_of(src) == topology_.node_of(dst)) continue;
    const auto [links, count] = net_route(src, dst);
    const std::vector<int> composed(links, links + count);
    std::vector<sg4::Link*> simgrid;
    double latency = 0;
    hosts_[src]->route_to(hosts_[dst], simgrid, &latency);
    std::vector<int> expected;
    for (const sg4::Link* link : simgrid) expected.push_back(net_link(link));
    if (composed != expected)
      return "ranks " + std::to_string(src) + " -> " + std::to_string(dst) + ": " +
             std::to_string(composed.size()) + " links composed, SimGrid's route has " +
             std::to_string(expected.size()) +
             (composed.size() == expected.size() ? " (others)" : "");
  }
  return "";
}

int Network::net_link(const sg4::Link* link) {
  auto [at, added] = net_link_index_.try_emplace(link, 0);
  if (added) at->second = net_fabric_->add_link(link->get_bandwidth());
  return at->second;
}

int Network::member_link(int rank, bool up) {
  std::vector<int>& known = up ? member_up_ : member_down_;
  if (known.empty()) known.assign(topology_.world_size(), -1);
  if (known[rank] < 0) {
    // The first link toward (the last link from) a GPU on another node: the rank's NIC link.
    const int other = (rank + topology_.gpus_per_node()) % topology_.world_size();
    std::vector<sg4::Link*> links;
    double latency = 0;
    if (up)
      hosts_[rank]->route_to(hosts_[other], links, &latency);
    else
      hosts_[other]->route_to(hosts_[rank], links, &latency);
    if (links.empty()) throw Error("internal: no route between ranks on different nodes");
    known[rank] = net_link(up ? links.front() : links.back());
  }
  return known[rank];
}

bool Network::pooled_transfer(int root, const std::vector<int>& group,
                              const std::vector<int>& remote, bool to_root, double bytes,
                              std::uint32_t owner, std::uint64_t tag) {
  if (!net_fabric_ || remote.size() < 2) return false;
  // The pool: the NIC links of the whole group, whatever the root (members send to a root on
  // them, or receive); the root's node's own links then carry one share more each, which is
  // small beside the many members pooling is for.
  std::uint64_t key = 1469598103934665603ull ^ (to_root ? 1 : 2);
  for (int r : group) key = (key ^ static_cast<std::uint64_t>(r)) * 1099511628211ull;
  key ^= static_cast<std::uint64_t>(group.size()) << 40;
  auto it = net_pools_.find(key);
  if (it == net_pools_.end()) {
    std::vector<int> links;
    links.reserve(group.size());
    for (int r : group) links.push_back(member_link(r, to_root));
    std::vector<int> sorted = links;
    std::sort(sorted.begin(), sorted.end());
    const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    it = net_pools_.emplace(key, distinct ? net_fabric_->add_pool(links) : -1).first;
  }
  if (it->second < 0) return false;
  // The root's side: the links every member's route crosses (sampled at three members).
  std::vector<int> common;
  double latency = 0;
  const std::size_t m = remote.size();
  for (const std::size_t at : {std::size_t{0}, m / 2, m - 1}) {
    const int member = remote[at];
    const auto [links, count] = to_root ? net_route(member, root) : net_route(root, member);
    if (at == 0) {
      common.assign(links, links + count);
    } else {
      std::vector<int> kept;
      for (int l : common)
        if (std::find(links, links + count, l) != links + count) kept.push_back(l);
      common.swap(kept);
    }
  }
  for (int r : remote) latency = std::max(latency, topology_.path(r, root).latency_s);
  ++node_flows_;
  ++timers_;
  std::uint32_t start;
  if (!free_pooled_starts_.empty()) {
    start = free_pooled_starts_.back();
    free_pooled_starts_.pop_back();
  } else {
    start = static_cast<std::uint32_t>(pooled_starts_.size());
    pooled_starts_.emplace_back();
  }
  pooled_starts_[start] = {std::move(common), static_cast<double>(m), it->second};
  schedule({.date = now() + latency,
            .kind = EventKind::pooled_add,
            .a = static_cast<std::int32_t>(start),
            .owner = owner,
            .tag = tag,
            .bytes = bytes});
  return true;
}

void Network::net_add(const int* links, int nlinks, double bytes, double weight, int pool,
                      std::uint32_t owner, std::uint64_t tag) {
  net_fabric_->add(now(), links, nlinks, bytes, weight, pool, take_token(owner, tag));
  net_share_soon();
}

// Re-shares once for everything that starts or ends in this instant: a timer at the current
// date runs before simulated time advances.
void Network::net_share_soon() {
  if (net_share_pending_) return;
  net_share_pending_ = true;
  schedule({.date = now(), .kind = EventKind::net_share});
}

void Network::net_reschedule() {
  wake_at(net_wakeup_, net_fabric_->next_completion(), EventKind::net_fire, 0);
}

void Network::net_fire() {
  net_wakeup_.armed = false;
  finished_scratch_.clear();
  net_fabric_->advance(now(), finished_scratch_);
  net_share_soon();
  net_done_.swap(finished_scratch_);
  for (std::uint64_t token : net_done_) {
    const FabricToken t = fabric_tokens_[token];
    free_fabric_tokens_.push_back(static_cast<std::uint32_t>(token));
    sink_.completed(t.owner, t.tag);
  }
}

}  // namespace muonbed::sim
