// The simulator's collective algorithms on bare platforms: closed-form latency + bandwidth times
// on uniform networks (within 1%), and step vs flow fidelity within 3% on a matrix of
// collectives, group sizes up to 256 and node layouts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "core/engine/cost_model.hpp"
#include "muonbed/config.hpp"
#include "sim/src/harness.hpp"
#include "tests/common/hand_clusters.hpp"

using namespace muonbed;
using namespace muonbed::sim;

namespace {

// Uniform: one GPU per node behind one switch, so every pair of ranks sees the same path:
// latency = NIC 4 us + switch 1 us, bandwidth = one 50 GB/s NIC.
ClusterSpec uniform_cluster() {
  ClusterSpec c = testing::single_switch_cluster("uniform", 1, 100,
                                                 {IntraNodeKind::nvswitch, 400, 2}, {1, 50, 4}, 1);
  c.gpu.hbm_GBps = 1000;
  return c;
}

// A 2-level fat tree of 4 nodes per leaf with switches of 0.5 us.
NetworkSpec fat_tree(TopologyKind topology) {
  NetworkSpec n;
  n.topology = topology;
  n.levels = 2;
  n.nodes_per_leaf = 4;
  n.switch_latency_us = 0.5;
  return n;
}

// DGX-like: 8 GPUs per node on NVSwitch, 8 rail NICs, a 2-level fat tree of 4 nodes per leaf.
ClusterSpec dgx_cluster(TopologyKind topology) {
  ClusterSpec c = uniform_cluster();
  c.name = "dgx-like";
  c.gpus_per_node = 8;
  c.intra.bandwidth_GBps = 450;
  c.nic = {8, 48, 4, /*rail_optimized=*/true};
  c.network = fat_tree(topology);
  return c;
}

// PCIe box: 4 GPUs per node over PCIe, 2 NICs shared by the 4 GPUs (not rail-optimized); a
// GPU's PCIe link carries its peer traffic and its NIC traffic alike.
ClusterSpec pcie_cluster() {
  ClusterSpec c = uniform_cluster();
  c.name = "pcie-like";
  c.gpus_per_node = 4;
  c.intra = {IntraNodeKind::pcie, 25, 5};
  c.nic = {2, 23, 5};
  c.network = fat_tree(TopologyKind::fat_tree);
  return c;
}

constexpr double kAlpha = 5e-6;  // uniform cluster path latency
constexpr double kBw = 50e9;     // uniform cluster path bandwidth

CollectiveSpec spec_of(OpKind kind, int n, double piece, int first = 0) {
  CollectiveSpec s;
  s.kind = kind;
  for (int i = 0; i < n; ++i) s.members.push_back(first + i);
  s.pieces.assign(n, piece);
  if (kind == OpKind::all_to_all) s.a2a.assign(n, std::vector<double>(n, piece));
  return s;
}

LoweringOptions step_options() {
  LoweringOptions o;
  o.step_fidelity = true;
  return o;
}
LoweringOptions flow_options() {
  LoweringOptions o;
  o.step_fidelity = false;
  return o;
}

double time_one(const ClusterSpec& c, int world, int gpn, const CollectiveSpec& s,
                const LoweringOptions& o) {
  return time_collectives(c, world, gpn, {s}, o).times.at(0);
}

}  // namespace

TEST_CASE("ring all-gather matches (n-1)(alpha + p/B) on a uniform network", "[sim][collectives]") {
  const ClusterSpec c = uniform_cluster();
  for (int n : {2, 5, 16}) {
    const double piece = 8e6;
    const double expected = (n - 1) * (kAlpha + piece / kBw);
    const double t = time_one(c, n, 1, spec_of(OpKind::all_gather, n, piece), step_options());
    INFO("n = " << n << ", simulated " << t << " s, closed form " << expected << " s");
    CHECK(t == Approx(expected).epsilon(0.01));
  }
}

TEST_CASE("uneven ring all-gather and reduce-scatter are pipelined, not hop by hop",
          "[sim][collectives]") {
  // Two owners of 64 MB each, 14 members with nothing (owner_allgather's shape). NCCL slices the
  // ring, so each edge carries everything but its receiver's piece once, plus the latencies:
  // (n-1) alpha + (total - smallest piece) / B. Whole pieces moved one hop per ring step would
  // take 15 x 1.28 ms instead.
  const ClusterSpec c = uniform_cluster();
  const int n = 16;
  for (OpKind kind : {OpKind::all_gather, OpKind::reduce_scatter}) {
    CollectiveSpec s = spec_of(kind, n, 0);
    s.pieces[3] = s.pieces[11] = 64e6;
    const double expected = (n - 1) * kAlpha + 128e6 / kBw;
    for (const LoweringOptions& o : {step_options(), flow_options()}) {
      const double t = time_one(c, n, 1, s, o);
      INFO(to_string(kind) << (o.step_fidelity ? " step" : " flow") << ": simulated " << t
                           << " s, closed form " << expected << " s");
      CHECK(t == Approx(expected).epsilon(0.03));
    }
  }
  // Moderately uneven (quickstart's MLP chunk: the largest piece 1.75x the mean): 4 members of
  // 7 MB, 12 of 3 MB. Pipelined: 15 alpha + (64 - 3) MB / B = 1.295 ms; whole pieces hop by hop
  // would take 15 (alpha + 7 MB / B) = 2.175 ms. Both fidelities take the pipelined time.
  for (OpKind kind : {OpKind::all_gather, OpKind::reduce_scatter}) {
    CollectiveSpec s = spec_of(kind, n, 3e6);
    for (int i : {0, 5, 6, 12}) s.pieces[i] = 7e6;
    const double expected = (n - 1) * kAlpha + 61e6 / kBw;
    for (const LoweringOptions& o : {step_options(), flow_options()}) {
      const double t = time_one(c, n, 1, s, o);
      INFO(to_string(kind) << (o.step_fidelity ? " step" : " flow") << ": simulated " << t
                           << " s, closed form " << expected << " s");
      CHECK(t == Approx(expected).epsilon(0.03));
    }
  }
}

TEST_CASE("which rings need the pipelined lowering", "[sim][collectives]") {
  // Whole-piece steps take (n-1) p_max / B, the pipelined ring (S - p_min) / B: the rule is
  // their ratio against 1 + kEvenRingTolerance, checked on hand-computed piece lists.
  using P = std::vector<double>;
  CHECK_FALSE(ring_needs_pipelining(OpKind::all_gather, P{5, 5, 5, 5}));  // even: 15 = 15
  CHECK_FALSE(ring_needs_pipelining(OpKind::all_gather, P{0, 4, 4, 4}));  // 12 = 12 - 0
  CHECK_FALSE(ring_needs_pipelining(OpKind::all_gather, P{7, 3}));        // 7 = 10 - 3
  CHECK(ring_needs_pipelining(OpKind::all_gather, P{2, 1, 1}));           // 4 > 3
  CHECK(ring_needs_pipelining(OpKind::reduce_scatter, P{9, 0, 0, 0}));    // 27 > 9
  CHECK(ring_needs_pipelining(OpKind::all_gather, P{1003, 1000, 1000}));  // 2006 > 1.001 x 2003
  CHECK_FALSE(
      ring_needs_pipelining(OpKind::all_gather, P{1001, 1000, 1000}));    // 2002 < 1.001 x 2001
  CHECK_FALSE(ring_needs_pipelining(OpKind::all_reduce, P{9, 0, 0, 0}));  // one buffer
  // Near-even pieces keep whole-piece steps, which equal the closed form of the even ring.
  const ClusterSpec c = uniform_cluster();
  CollectiveSpec s = spec_of(OpKind::all_gather, 16, 8e6);
  s.pieces[4] = 8.004e6;  // 0.05 % larger: within the tolerance
  REQUIRE_FALSE(ring_needs_pipelining(s.kind, s.pieces));
  const double t = time_one(c, 16, 1, s, step_options());
  CHECK(t == Approx(15 * (kAlpha + 8.004e6 / kBw)).epsilon(0.01));
}

TEST_CASE("ring reduce-scatter and all-reduce match their closed forms", "[sim][collectives]") {
  const ClusterSpec c = uniform_cluster();
  const int n = 8;
  const double piece = 4e6;  // reduce-scatter output piece; all-reduce: whole buffer n * piece
  const double rs = time_one(c, n, 1, spec_of(OpKind::reduce_scatter, n, piece), step_options());
  CHECK(rs == Approx((n - 1) * (kAlpha + piece / kBw)).epsilon(0.01));
  const double ar = time_one(c, n, 1, spec_of(OpKind::all_reduce, n, n * piece), step_options());
  CHECK(ar == Approx(2 * (n - 1) * (kAlpha + piece / kBw)).epsilon(0.01));
}

TEST_CASE("pairwise all-to-all matches ceil((n-1)/W) alpha + (n-1) b/B", "[sim][collectives]") {
  // W = kAllToAllPeersInFlight peers at once: their sends share the member's link and finish
  // together, then the next W pay their latency.
  const ClusterSpec c = uniform_cluster();
  for (int n : {4, 12, 20}) {
    const double per_peer = 2e6;
    const long windows = (n - 1 + kAllToAllPeersInFlight - 1) / kAllToAllPeersInFlight;
    const double expected = windows * kAlpha + (n - 1) * per_peer / kBw;
    for (const LoweringOptions& o : {step_options(), flow_options()}) {
      const double t = time_one(c, n, 1, spec_of(OpKind::all_to_all, n, per_peer), o);
      INFO("n = " << n << (o.step_fidelity ? " step" : " flow"));
      CHECK(t == Approx(expected).epsilon(0.01));
    }
  }
}

TEST_CASE("all-to-all window slots out of phase: each member as a queue of its rounds",
          "[sim][collectives]") {
  // Zero-byte rounds cost one path latency and are timed by the member itself (collectives.cpp,
  // Rounds::settle); rounds with bytes go to the network. Members send long rounds, so their
  // window slots fall out of phase and the rest of their rounds run in staggered periods; in the
  // third case one member has two long rounds in flight at once, which end together while its
  // other slots are in phase (a slot must not run ahead of the present then). Reference: each
  // member's rounds, in order, through `window` slots, each slot taking the next round when it
  // frees; a round lasts alpha, or alpha + bytes / B, two long rounds of one member starting
  // together in its first window share its link equally (different members' long rounds use
  // disjoint links). The collective ends with its last member.
  const ClusterSpec c = uniform_cluster();
  const int n = 64, window = kAllToAllPeersInFlight;
  const auto queue = [&](const std::vector<double>& rounds) {
    std::vector<double> slots(window, 0.0);  // when each slot frees
    double end = 0;
    for (double d : rounds) {
      double& slot = *std::min_element(slots.begin(), slots.end());
      slot += d;
      end = std::max(end, slot);
    }
    return end;
  };
  struct Long {
    int member, shift;
    double latencies;  // its duration in path latencies
  };
  std::vector<std::vector<Long>> cases = {{{0, 5, 3.7}, {7, 20, 2.2}},
                                          {{3, 1, 9.3}, {30, 38, 0.4}}};
  // And random ones (fixed seed): up to three members with one long round anywhere, or two in
  // the first window (of equal or different lengths).
  std::uint64_t seed = 12345;
  const auto next_random = [&seed](int below) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((seed >> 33) % static_cast<std::uint64_t>(below));
  };
  for (int k = 0; k < 40; ++k) {
    std::vector<Long> longs;
    for (int m = 0, members = 1 + next_random(3); m < members; ++m) {
      const int member = next_random(n);
      bool taken = false;
      for (const Long& l : longs) taken = taken || l.member == member;
      if (taken) continue;
      const double latencies = 1.1 + next_random(60) / 10.0;
      if (next_random(2) == 0) {
        longs.push_back({member, 1 + next_random(n - 1), latencies});
      } else {
        const int a = 1 + next_random(window), b = 1 + (a + next_random(window - 1)) % window;
        longs.push_back({member, a, latencies});
        longs.push_back(
            {member, b, next_random(2) == 0 ? latencies : 1.1 + next_random(60) / 10.0});
      }
    }
    cases.push_back(longs);
  }
  for (const std::vector<Long>& longs : cases) {
    CollectiveSpec s = spec_of(OpKind::all_to_all, n, 0);
    double expected = 0;
    for (int i = 0; i < n; ++i) {
      std::vector<double> rounds(n - 1, kAlpha);
      std::vector<Long> mine;
      for (const Long& l : longs)
        if (l.member == i) mine.push_back(l);
      REQUIRE(mine.size() <= 2);
      for (const Long& l : mine) {
        REQUIRE((mine.size() == 1 || l.shift <= window));  // shared: both start at once
        s.a2a[i][(i + l.shift) % n] = (l.latencies - 1) * kAlpha * kBw;
        rounds[l.shift - 1] = l.latencies * kAlpha;
      }
      if (mine.size() == 2) {  // one link shared equally: b1 <= b2 end at 2 b1 / B, (b1 + b2) / B
        const double b1 = std::min(mine[0].latencies, mine[1].latencies) - 1;
        const double b2 = std::max(mine[0].latencies, mine[1].latencies) - 1;
        for (const Long& l : mine)
          rounds[l.shift - 1] = kAlpha * (1 + (l.latencies - 1 == b1 ? 2 * b1 : b1 + b2));
      }
      expected = std::max(expected, queue(rounds));
    }
    const double uniform = std::ceil((n - 1.0) / window) * kAlpha;
    for (const LoweringOptions& o : {step_options(), flow_options()}) {
      const double t = time_one(c, n, 1, s, o);
      INFO((o.step_fidelity ? "step" : "flow") << ": simulated " << t << " s, queue " << expected
                                               << " s, without the long rounds " << uniform);
      CHECK(t == Approx(expected).epsilon(1e-9));
    }
    CHECK(expected >= uniform);
  }
}

TEST_CASE("a skewed all-to-all is bound by its owners' links at both fidelities",
          "[sim][collectives][fidelity]") {
  // Muon's shards-to-owners exchange: 96 members each send 4 MB to two owners, nothing else.
  // Each owner takes one piece per round. Flow fidelity merges the 95 rounds into 64 and must
  // still deliver every piece to its owner, not to another member of the merged range.
  const ClusterSpec c = uniform_cluster();
  const int n = 96;
  const double b = 4e6;
  CollectiveSpec s = spec_of(OpKind::all_to_all, n, 0);
  for (int i = 0; i < n; ++i)
    for (int owner : {0, 40})
      if (i != owner) s.a2a[i][owner] = b;
  const double ingress = (n - 1) * b / kBw;  // what each owner must take in
  const double step = time_one(c, n, 1, s, step_options());
  const double flow = time_one(c, n, 1, s, flow_options());
  INFO("owner ingress bound " << ingress << " s, step " << step << " s, flow " << flow << " s");
  CHECK(step >= ingress);
  CHECK(flow >= ingress);  // sending merged rounds to the range's first peer broke this (-20%)
  // Measured -4.7% (experiments/BENCHMARKS.md): merged rounds overlap the owners' pieces a bit.
  CHECK(flow == Approx(step).epsilon(0.06));
}

TEST_CASE("whole matrices to consecutive owners: each owner's own NIC bounds the exchange",
          "[sim][collectives][fidelity]") {
  // Megatron's chunked exchange over many ranks: the owners of a chunk's matrices are
  // consecutive ranks (here ranks 0-7, one node, one rail NIC each), and every other member
  // sends each owner its shard of the owner's matrix, skewed (owner k's matrix is k+1 units).
  // 512 members: flow fidelity merges the 511 rounds into 128, so a merged round spans about
  // four consecutive peers, often several owners. Hand estimate: the busiest owner (7) takes
  // 8 MB from each of the 504 members on other nodes through its one 48 GB/s NIC, while the
  // NVLink part (7 members) runs beside it, plus one path latency (every remote member sends
  // at once): 504 x 8 MB / 48 GB/s = 84 ms. Piling a merged range's owners onto its heaviest
  // one (the rule before) made flow fidelity take 184 ms.
  const ClusterSpec c = dgx_cluster(TopologyKind::fat_tree);
  const int n = 512, owners = 8;
  const double unit = 1e6;
  CollectiveSpec s = spec_of(OpKind::all_to_all, n, 0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < owners; ++k)
      if (i != k) s.a2a[i][k] = (k + 1) * unit;
  const double nic = 48e9;
  const double hand = (n - owners) * owners * unit / nic;  // 84 ms
  REQUIRE(hand == Approx(0.084));
  LoweringOptions flow = flow_options();
  REQUIRE(all_to_all_rounds(n, flow) < n - 1);  // the case under test: merged rounds
  const double step = time_one(c, n, 8, s, step_options());
  const double merged = time_one(c, n, 8, s, flow);
  INFO("hand estimate " << hand << " s, step " << step << " s, flow " << merged << " s");
  CHECK(step >= hand);
  CHECK(merged >= hand);
  // Latencies are microseconds against 84 ms of bandwidth: both within 2 % of the hand figure.
  CHECK(step == Approx(hand).epsilon(0.02));
  CHECK(merged == Approx(hand).epsilon(0.02));
}

TEST_CASE("pipelined chain broadcast matches (n+k-2)(alpha + s/(kB))", "[sim][collectives]") {
  const ClusterSpec c = uniform_cluster();
  LoweringOptions o = step_options();
  o.broadcast_chunk_bytes = 1e6;
  o.broadcast_max_chunks = 16;
  for (int n : {2, 6, 10}) {
    const double bytes = 8e6;  // 8 chunks of 1 MB
    const int k = 8;
    CollectiveSpec s = spec_of(OpKind::broadcast, n, bytes);
    s.root = n / 2;
    const double expected = (n - 1 + k - 1) * (kAlpha + bytes / k / kBw);
    const double t = time_one(c, n, 1, s, o);
    INFO("n = " << n);
    CHECK(t == Approx(expected).epsilon(0.01));
  }
}

TEST_CASE("gather and scatter are bound by the root's link", "[sim][collectives]") {
  const ClusterSpec c = uniform_cluster();
  const int n = 9;
  const double piece = 3e6;
  for (OpKind kind : {OpKind::gather, OpKind::scatter}) {
    CollectiveSpec s = spec_of(kind, n, piece);
    s.root = 4;
    CHECK(time_one(c, n, 1, s, step_options()) ==
          Approx(kAlpha + (n - 1) * piece / kBw).epsilon(0.01));
  }
}

TEST_CASE("a node-spanning ring uses every NIC of the node", "[sim][collectives]") {
  // 4 nodes x 8 GPUs: 8 channels, each crossing nodes on its own rail, so the ring's inter-node
  // bandwidth is 8 NICs x 48 GB/s per node: bus bandwidth ~ 384 GB/s, not one NIC's 48.
  const ClusterSpec c = dgx_cluster(TopologyKind::single_switch);
  const int n = 32;
  const double piece = 32e6;
  const double t = time_one(c, n, 8, spec_of(OpKind::all_gather, n, piece), step_options());
  const double busbw = (n - 1) * piece / t;
  INFO("bus bandwidth " << busbw / 1e9 << " GB/s");
  CHECK(busbw > 0.85 * 8 * 48e9);
  CHECK(busbw < 8 * 48e9 * 1.001);
}

TEST_CASE("step and flow fidelity agree within 3%", "[sim][collectives][fidelity]") {
  // Layouts x group sizes up to 256: one node; 8-GPU nodes behind one switch or a fat tree
  // (8 channels per ring); one GPU per node in a fat tree (single-channel rings up to 256);
  // PCIe nodes, whose GPU links carry both peer and NIC traffic.
  ClusterSpec thin_tree = uniform_cluster();
  thin_tree.network.topology = TopologyKind::fat_tree;
  thin_tree.network.levels = 2;
  thin_tree.network.nodes_per_leaf = 16;
  struct Layout {
    const char* name;
    ClusterSpec cluster;
    int gpn;
    std::vector<int> sizes;
  };
  const std::vector<Layout> layouts = {
      {"one node", dgx_cluster(TopologyKind::single_switch), 8, {2, 8}},
      {"dgx single switch", dgx_cluster(TopologyKind::single_switch), 8, {16, 64}},
      {"dgx fat tree", dgx_cluster(TopologyKind::fat_tree), 8, {64}},
      {"one gpu per node, fat tree", thin_tree, 1, {32, 256}},
      {"pcie nodes, fat tree", pcie_cluster(), 4, {4, 16}},
  };
  const std::vector<OpKind> kinds = {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce,
                                     OpKind::all_to_all, OpKind::broadcast,      OpKind::gather,
                                     OpKind::scatter};
  for (const Layout& layout : layouts) {
    for (int n : layout.sizes) {
      // Per-member pieces of a few MB: the sizes of Muon's matrix shards. All-to-all sends a
      // 32 MB buffer per member; broadcast and all-reduce move 256 MB (a layer's gradients).
      std::vector<CollectiveSpec> specs;
      for (OpKind kind : kinds) {
        double piece = 4e6;
        if (kind == OpKind::all_to_all) piece = 32e6 / n;
        if (kind == OpKind::broadcast || kind == OpKind::all_reduce) piece = 256e6;
        CollectiveSpec s = spec_of(kind, n, piece);
        s.root = n / 3;
        specs.push_back(s);
      }
      // A bandwidth-bound all-to-all too (128 MB per member): its neighbouring rounds overlap
      // and contend as members drift apart, which merged rounds would change.
      specs.push_back(spec_of(OpKind::all_to_all, n, 128e6 / n));
      const HarnessResult step =
          time_collectives(layout.cluster, n, layout.gpn, specs, step_options());
      const HarnessResult flow =
          time_collectives(layout.cluster, n, layout.gpn, specs, flow_options());
      for (std::size_t i = 0; i < specs.size(); ++i) {
        INFO(layout.name << ", n = " << n << ", " << to_string(specs[i].kind) << ": step "
                         << step.times[i] << " s, flow " << flow.times[i] << " s");
        CHECK(flow.times[i] == Approx(step.times[i]).epsilon(0.03));
      }
    }
  }
}

// ---- The calibrated model (issue 12): each test below fails on the simulator before it.

TEST_CASE("a multi-node all-to-all reaches one NIC's bandwidth, NVLink peers overlapped",
          "[sim][collectives][all_to_all]") {
  // 2 and 4 nodes of 8 GPUs, one 48 GB/s NIC per GPU: each GPU's NIC carries its peers on other
  // nodes, NVLink the rest at the same time, so the exchange takes the NIC part's time and busbw
  // = 48 x (n-1)/(n-8). Rounds in lockstep ran every round at NIC speed (busbw = one NIC).
  const ClusterSpec c = dgx_cluster(TopologyKind::single_switch);
  for (int n : {16, 32}) {
    const double per_peer = 8e6, S = per_peer * n;
    for (const LoweringOptions& o : {step_options(), flow_options()}) {
      const double t = time_one(c, n, 8, spec_of(OpKind::all_to_all, n, per_peer), o);
      const double nic_bound = (n - 8) * per_peer / 48e9;
      const double busbw = S / t * (n - 1) / n;
      INFO("n = " << n << (o.step_fidelity ? " step " : " flow ") << t << " s, NIC part "
                  << nic_bound << " s, busbw " << busbw / 1e9 << " GB/s");
      CHECK(t >= nic_bound);
      CHECK(t < 1.03 * nic_bound + 10 * kAlpha);
      CHECK(busbw == Approx(48e9 * (n - 1) / (n - 8)).epsilon(0.05));
    }
  }
}

TEST_CASE("transfers run at the link class's efficiency for the collective class",
          "[sim][collectives][efficiency]") {
  // Uniform network (every path one NIC): ring at 0.5, all-to-all at 0.25, p2p at 0.8.
  ClusterSpec c = uniform_cluster();
  c.efficiency.network = {0.5, 0.25, 0.8, 1.0};
  const int n = 8;
  const double piece = 8e6;
  CHECK(time_one(c, n, 1, spec_of(OpKind::all_gather, n, piece), step_options()) ==
        Approx((n - 1) * (kAlpha + piece / (0.5 * kBw))).epsilon(0.01));
  CHECK(time_one(c, n, 1, spec_of(OpKind::all_to_all, n, piece), step_options()) ==
        Approx(kAlpha + (n - 1) * piece / (0.25 * kBw)).epsilon(0.01));
  CollectiveSpec g = spec_of(OpKind::gather, n, piece);
  g.root = 2;
  CHECK(time_one(c, n, 1, g, step_options()) ==
        Approx(kAlpha + (n - 1) * piece / (0.8 * kBw)).epsilon(0.01));
  // Inside a node the intra-node efficiencies apply.
  ClusterSpec d = dgx_cluster(TopologyKind::single_switch);
  d.efficiency.intra_node = {0.8, 1, 1, 1};
  CHECK(time_one(d, 8, 8, spec_of(OpKind::reduce_scatter, 8, piece), step_options()) ==
        Approx(7 * (2e-6 + piece / (0.8 * 450e9))).epsilon(0.01));
}

TEST_CASE("every collective starts with the per-call launch overhead",
          "[sim][collectives][launch]") {
  ClusterSpec c = uniform_cluster();
  const CollectiveSpec ag = spec_of(OpKind::all_gather, 6, 1e6);
  const double bare = time_one(c, 6, 1, ag, step_options());
  c.launch_overhead.collective_us = 12;
  for (const LoweringOptions& o : {step_options(), flow_options()})
    CHECK(time_one(c, 6, 1, ag, o) == Approx(bare + 12e-6).epsilon(1e-6));
}

TEST_CASE("all-reduce runs NVLS where core's tuner picks it, timed as the analytic model",
          "[sim][collectives][nvls]") {
  ClusterSpec c = testing::with_nvls(dgx_cluster(TopologyKind::single_switch));
  c.launch_overhead.collective_us = 8;
  const DeviceMesh mesh({{"dp", 32, DimRole::replicate}}, 8);
  for (int n : {4, 8, 16}) {
    for (double bytes : {1e6, 64e6, 1e9}) {
      const CollectiveSpec s = spec_of(OpKind::all_reduce, n, bytes);
      const LinkParams link = link_for_group(c, mesh, s.members, OpKind::all_reduce);
      const double analytic = collective_time(OpKind::all_reduce, n, bytes, link);
      for (const LoweringOptions& o : {step_options(), flow_options()}) {
        const double t = time_one(c, n, 8, s, o);
        INFO("n = " << n << ", " << bytes << " B, "
                    << to_string(all_reduce_algorithm(n, bytes, link))
                    << (o.step_fidelity ? " step " : " flow ") << t << " s, analytic " << analytic);
        CHECK(t == Approx(analytic).epsilon(0.03));
      }
    }
  }
  // NVLS at 1 GB on 8 GPUs: busbw 2 (n-1)/n S / t near 480 GB/s (nccl-tests#212).
  const double t8 = time_one(c, 8, 8, spec_of(OpKind::all_reduce, 8, 1e9), step_options());
  CHECK(1e9 / t8 * 14 / 8 == Approx(479e9).epsilon(0.01));
}

TEST_CASE("simulator and analytic model agree on bare collectives on dgx-h100",
          "[sim][collectives][analytic]") {
  // The shipped profile, every collective kind, 1 MiB to 1 GiB, on one node, 2 and 4 nodes.
  // On one node they agree exactly (broadcast and all) but for NVLink contention; at 1 GiB
  // within 5% everywhere (broadcast's chains are the least exact). Below, across nodes, the
  // analytic model adds every ring step's latency to the bandwidth term while the simulator's
  // ring edges run ahead of each other (NCCL's steps pipeline too): the simulator is up to 35%
  // faster (a 16 MiB ring over 4 nodes); broadcast chains contend for NVLink in ways the closed
  // form approximates (-6% to +8%).
  const ClusterSpec c =
      load_cluster_file(std::string(MUONBED_SOURCE_DIR) + "/experiments/clusters/dgx-h100.yaml");
  const DeviceMesh mesh({{"dp", 32, DimRole::replicate}}, 8);
  double lowest = 1, highest = 1;
  for (int n : {8, 16, 32}) {
    for (double S : {1048576.0, 16777216.0, 1073741824.0}) {
      std::vector<CollectiveSpec> specs;
      for (OpKind kind : {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce,
                          OpKind::all_to_all, OpKind::broadcast, OpKind::gather, OpKind::scatter}) {
        const bool whole = kind == OpKind::all_reduce || kind == OpKind::broadcast;
        CollectiveSpec s = spec_of(kind, n, whole ? S : S / n);
        s.root = 1;
        specs.push_back(s);
      }
      const HarnessResult sim = time_collectives(c, n, 8, specs, step_options());
      for (std::size_t i = 0; i < specs.size(); ++i) {
        const LinkParams link = link_for_group(c, mesh, specs[i].members, specs[i].kind);
        const double analytic = collective_time(specs[i].kind, n, S, link);
        const double ratio = sim.times[i] / analytic;
        INFO(to_string(specs[i].kind) << " on " << n << " GPUs, " << S << " B: sim " << sim.times[i]
                                      << " s, analytic " << analytic << " s");
        if (S >= 1e9) {
          CHECK(ratio == Approx(1).epsilon(0.05));
        } else {
          CHECK(ratio <= 1.10);
          CHECK(ratio >= 0.65);
          lowest = std::min(lowest, ratio);
          highest = std::max(highest, ratio);
        }
      }
    }
  }
  std::cout << "sim / analytic below 1 GiB on dgx-h100: " << lowest << " to " << highest << "\n";
}
