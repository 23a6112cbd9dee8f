// The collective algorithms driven by a contention-free host instead of SimGrid: every transfer
// takes its path's latency plus bytes / bandwidth and nothing shares a link. That is enough to
// check what does not depend on contention, at sizes SimGrid would make slow:
//   - every transfer in flight carries a distinct tag (completions are routed by tag; an aliased
//     tag would finish the wrong step), including rings of hundreds of channels;
//   - each algorithm finishes exactly once;
//   - the traffic it reports is the logical exchange, identical at both fidelities, even where
//     flow fidelity times several messages with one stand-in transfer.
#include <catch2/catch.hpp>

#include <map>
#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "sim/src/collectives.hpp"

using namespace muonbed;
using namespace muonbed::sim;

namespace {

struct Traffic {
  std::vector<double> sent, received;
  double intra = 0, network = 0;
};

class ContentionFreeHost final : public CollectiveHost {
 public:
  explicit ContentionFreeHost(const Topology& topology) : topology_(topology) {
    traffic.sent.assign(topology.world_size(), 0);
    traffic.received.assign(topology.world_size(), 0);
  }

  void transfer(int src, int dst, double bytes, std::uint64_t tag) override {
    if (!in_flight_.insert(tag).second) ++duplicate_tags;
    const PathInfo path = topology_.path(src, dst);
    const double seconds =
        path.latency_s + (bytes > 0 && path.bandwidth_Bps > 0 ? bytes / path.bandwidth_Bps : 0);
    events_.push({now_ + seconds, sequence_++, tag, true});
  }
  void account(int src, int dst, double bytes) override {
    if (!(bytes > 0) || src == dst) return;
    (topology_.node_of(src) == topology_.node_of(dst) ? traffic.intra : traffic.network) += bytes;
    traffic.sent[src] += bytes;
    traffic.received[dst] += bytes;
  }
  void delay(double seconds, std::uint64_t tag) override {
    events_.push({now_ + seconds, sequence_++, tag, false});
  }
  const Topology& topology() const override { return topology_; }
  double now() const override { return now_; }
  void finished() override { ++finish_calls; }

  void run(CollectiveAlgorithm& algorithm) {
    algorithm.start();
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      now_ = e.time;
      if (e.is_transfer) in_flight_.erase(e.tag);
      algorithm.done(e.tag);
    }
  }

  int finish_calls = 0;
  int duplicate_tags = 0;
  Traffic traffic;

 private:
  struct Event {
    double time;
    long sequence;
    std::uint64_t tag;
    bool is_transfer;
    bool operator>(const Event& o) const {
      return std::tie(time, sequence) > std::tie(o.time, o.sequence);
    }
  };
  const Topology& topology_;
  double now_ = 0;
  long sequence_ = 0;
  std::set<std::uint64_t> in_flight_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
};

ClusterSpec cluster_with(int gpus_per_node) {
  ClusterSpec c;
  c.name = "lowering";
  c.gpus_per_node = gpus_per_node;
  c.nodes = 0;
  c.gpu.peak_tflops = 100;
  c.intra.kind = IntraNodeKind::nvswitch;
  c.intra.bandwidth_GBps = 400;
  c.intra.latency_us = 2;
  c.nic.count_per_node = gpus_per_node;
  c.nic.bandwidth_GBps = 50;
  c.nic.latency_us = 4;
  c.nic.rail_optimized = true;
  c.network.topology = TopologyKind::single_switch;
  c.network.switch_latency_us = 1;
  return c;
}

LoweringOptions fidelity(bool step) {
  LoweringOptions o;
  o.step_fidelity = step;
  o.a2a_rounds = 8;      // force merged rounds on small groups
  o.rooted_bundles = 3;  // and bundled senders
  return o;
}

// Member i's piece: distinct and uneven, so a mix-up between members shows in the traffic.
double piece_of(int i) {
  return 1e5 * (1 + i % 7);
}

CollectiveSpec make_spec(OpKind kind, int n) {
  CollectiveSpec s;
  s.kind = kind;
  for (int i = 0; i < n; ++i) s.members.push_back(i);
  for (int i = 0; i < n; ++i) s.pieces.push_back(piece_of(i));
  s.root = n / 3;
  s.peer = n - 1;
  if (kind == OpKind::all_to_all) {
    // Skewed like Muon's shards-to-owners exchange: most bytes go to every fifth member.
    s.a2a.assign(n, std::vector<double>(n, 0));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (i != j) s.a2a[i][j] = (j % 5 == 0 ? 3e6 : 1e4) * (1 + (i + j) % 3);
  }
  return s;
}

Traffic run_one(const Topology& topology, const CollectiveSpec& spec, bool step) {
  ContentionFreeHost host(topology);
  const LoweringOptions options = fidelity(step);
  auto algorithm = make_algorithm(spec, host, options);
  host.run(*algorithm);
  INFO(to_string(spec.kind) << ", " << spec.members.size() << " members, "
                            << (step ? "step" : "flow") << " fidelity");
  CHECK(host.duplicate_tags == 0);
  CHECK(host.finish_calls == 1);
  return host.traffic;
}

// What each member must receive, from the collective's definition (not from the algorithm).
std::vector<double> expected_received(const CollectiveSpec& s, const Topology& topology) {
  const int n = static_cast<int>(s.members.size());
  std::vector<double> r(topology.world_size(), 0);
  double total = 0;
  for (double p : s.pieces) total += p;
  for (int i = 0; i < n; ++i) {
    switch (s.kind) {
      case OpKind::all_gather:
        r[s.members[i]] = total - s.pieces[i];
        break;
      case OpKind::all_reduce:
        r[s.members[i]] = 2.0 * (n - 1) / n * s.pieces[0];
        break;
      case OpKind::broadcast:
        r[s.members[i]] = i == s.root ? 0 : s.pieces[s.root];
        break;
      case OpKind::gather:
        if (i != s.root) r[s.members[s.root]] += s.pieces[i];
        break;
      case OpKind::scatter:
        r[s.members[i]] = i == s.root ? 0 : s.pieces[i];
        break;
      case OpKind::all_to_all:
        for (int j = 0; j < n; ++j)
          if (j != i) r[s.members[i]] += s.a2a[j][i];
        break;
      default:
        break;
    }
  }
  return r;
}

void check_received(const Traffic& t, const std::vector<double>& want) {
  for (std::size_t r = 0; r < want.size(); ++r) {
    INFO("rank " << r);
    CHECK(t.received[r] == Approx(want[r]).epsilon(1e-12).margin(1e-6));
  }
}

}  // namespace

TEST_CASE("collectives report their logical traffic at both fidelities", "[sim][lowering]") {
  // 3 nodes x 4 GPUs: rings of 4 channels cross nodes, bundles mix nodes.
  const int gpn = 4, n = 12;
  const Topology topology(cluster_with(gpn), n, gpn);
  const std::vector<OpKind> kinds = {
      OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::broadcast,
      OpKind::gather,     OpKind::scatter,        OpKind::all_to_all, OpKind::send};
  for (OpKind kind : kinds) {
    const CollectiveSpec spec = make_spec(kind, n);
    const Traffic step = run_one(topology, spec, true);
    const Traffic flow = run_one(topology, spec, false);
    INFO(to_string(kind));
    if (kind != OpKind::reduce_scatter && kind != OpKind::send) {
      check_received(step, expected_received(spec, topology));
      check_received(flow, expected_received(spec, topology));
    }
    // The fidelities differ in timing only: same bytes per rank and per link class.
    for (int r = 0; r < n; ++r) {
      CHECK(flow.sent[r] == Approx(step.sent[r]).epsilon(1e-12).margin(1e-6));
      CHECK(flow.received[r] == Approx(step.received[r]).epsilon(1e-12).margin(1e-6));
    }
    CHECK(flow.intra == Approx(step.intra).epsilon(1e-12).margin(1e-6));
    CHECK(flow.network == Approx(step.network).epsilon(1e-12).margin(1e-6));
  }
}

TEST_CASE("direct exchanges split their traffic by link class from the messages themselves",
          "[sim][lowering]") {
  const int gpn = 4, n = 12;
  const Topology topology(cluster_with(gpn), n, gpn);
  const CollectiveSpec a2a = make_spec(OpKind::all_to_all, n);
  double intra = 0, network = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      (topology.node_of(i) == topology.node_of(j) ? intra : network) += a2a.a2a[i][j];
  for (bool step : {true, false}) {
    const Traffic t = run_one(topology, a2a, step);
    CHECK(t.intra == Approx(intra));
    CHECK(t.network == Approx(network));
  }
  const CollectiveSpec gather = make_spec(OpKind::gather, n);
  const int root_node = topology.node_of(gather.root);
  intra = network = 0;
  for (int i = 0; i < n; ++i)
    if (i != gather.root) (topology.node_of(i) == root_node ? intra : network) += gather.pieces[i];
  for (bool step : {true, false}) {
    const Traffic t = run_one(topology, gather, step);
    CHECK(t.intra == Approx(intra));
    CHECK(t.network == Approx(network));
  }
}

TEST_CASE("rings of hundreds of channels keep their transfers apart", "[sim][lowering]") {
  // Two nodes of 300 GPUs (an NVLink domain larger than 256): 300 channels per ring.
  const int gpn = 300, n = 600;
  const Topology topology(cluster_with(gpn), n, gpn);
  // Step fidelity's ring has channels x members x steps transfers (54M here): broadcast and
  // all-to-all run at step fidelity, rings at flow fidelity, where each edge is one flow.
  for (OpKind kind : {OpKind::broadcast, OpKind::all_to_all}) {
    const Traffic t = run_one(topology, make_spec(kind, n), true);
    if (kind == OpKind::broadcast)
      check_received(t, expected_received(make_spec(kind, n), topology));
  }
  for (OpKind kind :
       {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::broadcast}) {
    const CollectiveSpec spec = make_spec(kind, n);
    const Traffic t = run_one(topology, spec, false);
    if (kind != OpKind::reduce_scatter) check_received(t, expected_received(spec, topology));
  }
}
