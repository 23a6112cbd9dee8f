// The collective algorithms of collectives.hpp as small state machines driven by completions.
#include "sim/src/collectives.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "core/base/errors.hpp"
#include "core/engine/cost_model.hpp"
#include "sim/src/equal_rounds.hpp"

namespace muonbed::sim {

namespace {

// Tags: three fields, sized for the inputs core accepts: a channel (12 bits; a ring has at most
// one channel per GPU of a node, and clusters have at most 1,024 GPUs per node), a position or
// member (25 bits; meshes have at most 2^24 ranks), a step, round or chunk (27 bits; an
// all-reduce ring has 2(n-1) steps). A field that does not fit would alias another transfer's
// completion, so pack() refuses it rather than mis-time the collective.
constexpr int kBitsB = 25, kBitsC = 27;
constexpr std::uint64_t kMaxA =
    (std::uint64_t{1} << (64 - kBitsB - kBitsC)) - 2;  // all ones: delay
constexpr std::uint64_t kMaxB = (std::uint64_t{1} << kBitsB) - 1;
constexpr std::uint64_t kMaxC = (std::uint64_t{1} << kBitsC) - 1;
constexpr std::uint64_t kDelayTag = ~std::uint64_t{0};
constexpr std::uint64_t kLaunchTag = ~std::uint64_t{0} - 1;  // no pack() result has these top bits
std::uint64_t pack(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  if (a > kMaxA || b > kMaxB || c > kMaxC)
    throw Error("internal: collective tag fields out of range (channel " + std::to_string(a) +
                ", member " + std::to_string(b) + ", step " + std::to_string(c) + ")");
  return (a << (kBitsB + kBitsC)) | (b << kBitsC) | c;
}
int field_a(std::uint64_t t) {
  return static_cast<int>(t >> (kBitsB + kBitsC));
}
int field_b(std::uint64_t t) {
  return static_cast<int>((t >> kBitsC) & kMaxB);
}
int field_c(std::uint64_t t) {
  return static_cast<int>(t & kMaxC);
}

// The largest sum of `length` consecutive entries of the cyclic sequence w.
double max_cyclic_window(const std::vector<double>& w, long length) {
  const long n = static_cast<long>(w.size());
  if (n == 0 || length <= 0) return 0;
  double total = 0;
  for (double x : w) total += x;
  const long cycles = length / n, rest = length % n;
  double best = 0;
  if (rest > 0) {
    double window = 0;
    for (long i = 0; i < rest; ++i) window += w[i];
    best = window;
    for (long start = 1; start < n; ++start) {
      window += w[(start + rest - 1) % n] - w[start - 1];
      best = std::max(best, window);
    }
  }
  return cycles * total + best;
}

// Per-step (or per-chunk) transfer time of an edge at flow fidelity. The uncontended time
// (nominal path bandwidth) underestimates the step model when several channels share a link;
// the time implied by the edge's flow (which shared the link for its whole life) overestimates
// it when latency dominates, because the step model's channels drift apart and overlap only
// partly. Their mean tracked the step model within 3% over tests/sim's matrix of collectives.
double step_transfer_time(double uncontended, double from_flow) {
  return 0.5 * (uncontended + std::max(uncontended, from_flow));
}

// What a transfer of `bytes` costs on the wire: the link class it crosses (the NICs when it leaves
// the node) moves the collective class's traffic at cluster.efficiency's share of its bandwidth,
// so a transfer occupies its links for bytes / efficiency. Traffic is still counted in logical
// bytes (CollectiveHost::account).
double wire_bytes(const Topology& topo, int src, int dst, double bytes, CollectiveClass cls) {
  const EfficiencySpec& e = topo.cluster().efficiency;
  const double f =
      topo.node_of(src) == topo.node_of(dst) ? e.intra_node.of(cls) : e.network.of(cls);
  return f > 0 ? bytes / f : bytes;
}

// Largest path latency from a sample of members to the member `shift` places after them.
double shift_latency(const std::vector<int>& members, int shift, const Topology& topo) {
  const int n = static_cast<int>(members.size());
  const int samples = std::min(n, 32);
  double a = 0;
  for (int k = 0; k < samples; ++k) {
    const int i = static_cast<int>(static_cast<long>(k) * n / samples);
    a = std::max(a, topo.path(members[i], members[(i + shift) % n]).latency_s);
  }
  return a;
}

// ---- Rings: all_gather, reduce_scatter, all_reduce
// -----------------------------------------------

class Ring final : public CollectiveAlgorithm {
 public:
  Ring(const CollectiveSpec& spec, CollectiveHost& host, const LoweringOptions& options)
      : spec_(spec),
        host_(host),
        step_mode_(options.step_fidelity && !ring_needs_pipelining(spec.kind, spec.pieces)) {
    n_ = static_cast<int>(spec.members.size());
    rings_ = ring_channels(spec.members, host.topology());
    channels_ = static_cast<int>(rings_.size());
    steps_ = spec.kind == OpKind::all_reduce ? 2 * (n_ - 1) : n_ - 1;
    total_ = 0;
    for (double p : spec.pieces) total_ += p;
  }

  void start() override {
    if (n_ < 2) return host_.finished();
    if (step_mode_) {
      for (int c = 0; c < channels_; ++c)
        for (int i = 0; i < n_; ++i) post(c, i, 0);
      return;
    }
    start_ = host_.now();
    const std::size_t edges = static_cast<std::size_t>(channels_) * n_;
    latency_.resize(edges);
    uncontended_.resize(edges);
    flow_time_.assign(edges, 0);
    for (int c = 0; c < channels_; ++c)
      for (int i = 0; i < n_; ++i) {
        const int src = member(c, i), dst = member(c, (i + 1) % n_);
        const PathInfo path = host_.topology().path(src, dst);
        const std::size_t e = static_cast<std::size_t>(c) * n_ + i;
        const double bytes = edge_bytes(c, i);
        const double wire = wire_bytes(host_.topology(), src, dst, bytes, CollectiveClass::ring);
        latency_[e] = path.latency_s;
        uncontended_[e] = path.bandwidth_Bps > 0 ? wire / steps_ / path.bandwidth_Bps : 0;
        ++outstanding_;
        host_.account(src, dst, bytes);
        host_.transfer(src, dst, wire, pack(c, i, 0));
      }
  }

  // The step model's critical path: step t of an edge needs step t-1 of the edge before it, so
  // the last block travels `steps` consecutive edges, each costing its latency plus one step's
  // transfer; the flows give the bandwidth bound. The collective ends at the later of the two.
  double chain_time() const {
    double chain = 0;
    std::vector<double> w(n_);
    for (int c = 0; c < channels_; ++c) {
      for (int i = 0; i < n_; ++i) {
        const std::size_t e = static_cast<std::size_t>(c) * n_ + i;
        const double from_flow = std::max(0.0, flow_time_[e] - latency_[e]) / steps_;
        w[i] = latency_[e] + step_transfer_time(uncontended_[e], from_flow);
      }
      chain = std::max(chain, max_cyclic_window(w, steps_));
    }
    return chain;
  }

  void done(std::uint64_t tag) override {
    if (tag == kDelayTag) return host_.finished();
    --outstanding_;
    const int c = field_a(tag), i = field_b(tag), t = field_c(tag);
    if (step_mode_) {
      if (t + 1 < steps_) post(c, (i + 1) % n_, t + 1);
    } else {
      flow_time_[static_cast<std::size_t>(c) * n_ + i] = host_.now() - start_;
    }
    if (outstanding_ == 0) {
      if (!step_mode_) {
        const double tail = chain_time() - (host_.now() - start_);
        if (tail > 0) return host_.delay(tail, kDelayTag);
      }
      host_.finished();
    }
  }

 private:
  int member(int c, int pos) const { return spec_.members[rings_[c][pos]]; }
  double piece_at(int c, int pos) const { return spec_.pieces[rings_[c][pos]]; }

  // Bytes position i of channel c sends in step t.
  double chunk(int c, int i, int t) const {
    switch (spec_.kind) {
      case OpKind::all_gather:  // the contribution that started at position i - t
        return piece_at(c, ((i - t) % n_ + n_) % n_) / channels_;
      case OpKind::reduce_scatter:  // the partial sum of the block of position i - t - 1
        return piece_at(c, ((i - t - 1) % n_ + n_) % n_) / channels_;
      default:  // all_reduce: equal blocks of the whole buffer
        return spec_.pieces[0] / (static_cast<double>(n_) * channels_);
    }
  }
  // All steps of edge i -> i+1 of channel c together.
  double edge_bytes(int c, int i) const {
    switch (spec_.kind) {
      case OpKind::all_gather:
        return (total_ - piece_at(c, (i + 1) % n_)) / channels_;
      case OpKind::reduce_scatter:
        return (total_ - piece_at(c, i)) / channels_;
      default:
        return steps_ * spec_.pieces[0] / (static_cast<double>(n_) * channels_);
    }
  }
  void post(int c, int i, int t) {
    ++outstanding_;
    const int src = member(c, i), dst = member(c, (i + 1) % n_);
    const double bytes = chunk(c, i, t);
    host_.account(src, dst, bytes);
    host_.transfer(src, dst, wire_bytes(host_.topology(), src, dst, bytes, CollectiveClass::ring),
                   pack(c, i, t));
  }

  const CollectiveSpec& spec_;
  CollectiveHost& host_;
  bool step_mode_;
  int n_ = 0;
  int channels_ = 1;
  int steps_ = 0;
  double total_ = 0;
  double start_ = 0;
  std::vector<double> latency_, uncontended_, flow_time_;  // flow: per channel x edge
  std::vector<std::vector<int>> rings_;
  long outstanding_ = 0;
};

// ---- Broadcast: pipelined chains
// -----------------------------------------------------------------

// Both fidelities run the chunked chain: its cost is linear in members x chunks, and no
// one-flow-per-hop shortcut matched it within 3% (how much the channels' fills contend for the
// NVLink links varies with the layout).
class Broadcast final : public CollectiveAlgorithm {
 public:
  Broadcast(const CollectiveSpec& spec, CollectiveHost& host, const LoweringOptions& options)
      : spec_(spec), host_(host) {
    n_ = static_cast<int>(spec.members.size());
    const auto rings = ring_channels(spec.members, host.topology());
    channels_ = static_cast<int>(rings.size());
    for (const auto& ring : rings) {
      const auto at = std::find(ring.begin(), ring.end(), spec.root);
      std::vector<int> chain(at, ring.end());
      chain.insert(chain.end(), ring.begin(), at);
      chains_.push_back(std::move(chain));
    }
    bytes_ = spec.pieces.at(spec.root) / channels_;
    const double want =
        options.broadcast_chunk_bytes > 0 ? std::ceil(bytes_ / options.broadcast_chunk_bytes) : 1.0;
    chunks_ = static_cast<int>(
        std::clamp(want, 1.0, static_cast<double>(std::max(1, options.broadcast_max_chunks))));
  }

  void start() override {
    if (n_ < 2) return host_.finished();
    const std::size_t hops = static_cast<std::size_t>(channels_) * (n_ - 1);
    next_.assign(hops, 0);
    avail_.assign(hops, 0);
    busy_.assign(hops, 0);
    for (int c = 0; c < channels_; ++c) {
      avail_[index(c, 0)] = chunks_;
      try_send(c, 0);
    }
  }

  void done(std::uint64_t tag) override {
    const int c = field_a(tag), h = field_b(tag);
    busy_[index(c, h)] = 0;
    ++next_[index(c, h)];
    if (h + 1 < n_ - 1) {
      ++avail_[index(c, h + 1)];
      try_send(c, h + 1);
    }
    try_send(c, h);
    if (++completed_ == static_cast<long>(channels_) * (n_ - 1) * chunks_) host_.finished();
  }

 private:
  std::size_t index(int c, int h) const { return static_cast<std::size_t>(c) * (n_ - 1) + h; }
  // A hop forwards one chunk at a time, as soon as it has received it.
  void try_send(int c, int h) {
    const std::size_t k = index(c, h);
    if (busy_[k] || next_[k] >= chunks_ || next_[k] >= avail_[k]) return;
    busy_[k] = 1;
    const int src = spec_.members[chains_[c][h]], dst = spec_.members[chains_[c][h + 1]];
    host_.account(src, dst, bytes_ / chunks_);
    host_.transfer(src, dst,
                   wire_bytes(host_.topology(), src, dst, bytes_ / chunks_, CollectiveClass::ring),
                   pack(c, h, next_[k]));
  }

  const CollectiveSpec& spec_;
  CollectiveHost& host_;
  int n_ = 0;
  int channels_ = 1;
  int chunks_ = 1;
  double bytes_ = 0;
  long completed_ = 0;
  std::vector<std::vector<int>> chains_;
  std::vector<int> next_, avail_;
  std::vector<char> busy_;
};

// ---- Pairwise exchange rounds: all_to_all and the dissemination barrier
// ---------------------------

// Round r of member i sends to member i + shift(r). All-to-all: a member keeps up to `window`
// sends to peers on its node and `window` sends to other nodes in flight (kAllToAllPeersInFlight;
// NCCL posts a grouped send/recv to every peer at once and runs them over its channels), each in
// round order, posting the next one of a kind whenever one of that kind completes: NVLink and
// NIC peers overlap instead of going in lockstep. A member is done when all its sends are (every
// receive is some member's send). Barrier: each level waits for the member's message
// of the level before (a window of one, gated on receiving too).
class Rounds final : public CollectiveAlgorithm {
 public:
  Rounds(const CollectiveSpec& spec, CollectiveHost& host, const LoweringOptions& options)
      : spec_(spec), host_(host) {
    n_ = static_cast<int>(spec.members.size());
    barrier_ = spec.kind == OpKind::barrier;
    if (n_ < 2) return;
    std::vector<int> shifts;  // the logical rounds
    if (barrier_) {
      // Dissemination with a message each way per level (to i + 2^k, then back to i - 2^k):
      // 2 ceil(log2 n) latencies, as the analytic model counts a barrier.
      for (int s = 1; s < n_; s *= 2) {
        shifts.push_back(s);
        shifts.push_back(n_ - s);
      }
    } else {
      for (int s = 1; s < n_; ++s) shifts.push_back(s);
    }
    const int logical = static_cast<int>(shifts.size());
    const int window = barrier_ ? 1 : std::max(1, options.a2a_window);
    window_ = window;
    if (options.step_fidelity) {
      for (int s : shifts) groups_.push_back({s, s, s});
    } else if (barrier_) {
      // Flow: the barrier is its rounds' latencies only.
      for (int s : shifts) tail_ += shift_latency(spec.members, s, host.topology());
      return;
    } else {
      // Contiguous ranges of shifts; a merged round carries the range's bytes of each member
      // to its heaviest peer in the range. The window shrinks with the merge so that the same
      // share of the exchange is in flight; the latency rounds the merge skips are added.
      const int rounds = all_to_all_rounds(n_, options);
      double latency = 0;
      for (int r = 0; r < rounds; ++r) {
        const int lo = shifts[static_cast<std::size_t>(r) * logical / rounds];
        const int hi = shifts[static_cast<std::size_t>(r + 1) * logical / rounds - 1];
        groups_.push_back({lo, lo, hi});
      }
      if (rounds < logical) {
        for (int s : shifts) latency += shift_latency(spec.members, s, host.topology());
        window_ = std::max(
            1, static_cast<int>(std::lround(static_cast<double>(window) * rounds / logical)));
        const long exact = (logical + window - 1) / window;
        const long merged = (rounds + window_ - 1) / window_;
        tail_ = std::max(0L, exact - merged) * latency / logical;
        // A member that sends to at most `rounds` peers (a shard to each of a few owners) sends
        // a merged round as one flow per peer it sends to: within the budget of transfers, and
        // the owners' pieces stay on their own links. Sent all to the range's heaviest peer,
        // the pieces of several owners in one range (owners are often consecutive ranks) piled
        // onto one owner's NIC: megatron's chunked exchange over 1,024 ranks took 56 % longer
        // than at step fidelity (experiments/BENCHMARKS.md, training-step section).
        split_.assign(n_, 0);
        for (int i = 0; i < n_; ++i) {
          int peers = 0;
          for (int j = 0; j < n_; ++j) peers += j != i && spec.a2a[i][j] > 0;
          split_[i] = peers <= rounds;
        }
        pending_.assign(static_cast<std::size_t>(n_) * rounds, 0);
      }
    }
    plain_ = !barrier_ && split_.empty();
  }

  // A moved wake-up must not reach the replay once the collective is done (its owner index is
  // reused): the host drops the alarms' pending completions.
  ~Rounds() override {
    for (int alarm : alarm_)
      if (alarm >= 0) host_.free_alarm(alarm);
  }

  void start() override {
    if (n_ < 2 || groups_.empty()) {
      if (tail_ > 0) return host_.delay(tail_, kDelayTag);
      return host_.finished();
    }
    const std::size_t r = groups_.size();
    lo_.assign(n_, 0);
    next_.assign(n_, 0);
    inflight_.assign(n_, 0);
    if (!barrier_) {
      next_cross_.assign(n_, 0);
      inflight_cross_.assign(n_, 0);
      // Which rounds leave the member's node, which carry bytes and the latency of their path,
      // once: the rounds are scanned for the next one of a kind, and the (mostly) zero-byte
      // rounds of a skewed exchange are timed without reading the byte matrix, whose rows miss
      // the cache (perf: half of a 1,024-member exchange went there). Merged rounds keep each
      // round's destination and bytes too: post() rescanning the merged shifts for them took a
      // sixth of a 1,024-GPU megatron step (flow). A path's latency depends on the two nodes
      // only, so a member's rounds take their flags (but the bytes') from a table by destination
      // node, made for its node (members of one node are consecutive, mostly).
      const Topology& t = host_.topology();
      const bool merged = !plain_;
      round_flags_.resize(static_cast<std::size_t>(n_) * r);
      if (merged) {
        target_.assign(static_cast<std::size_t>(n_) * r, 0);
        round_bytes_.assign(static_cast<std::size_t>(n_) * r, 0);
      }
      // Each member's node, once: node_of() divides, and the loop below asks it for n x rounds
      // destinations (a third of this function's time at 1,024 members).
      member_node_.resize(static_cast<std::size_t>(n_));
      for (int j = 0; j < n_; ++j) member_node_[j] = t.node_of(spec_.members[j]);
      node_block_end_.resize(static_cast<std::size_t>(n_));
      for (int j = n_ - 1; j >= 0; --j)
        node_block_end_[j] =
            j + 1 < n_ && member_node_[j + 1] == member_node_[j] ? node_block_end_[j + 1] : j + 1;
      const int nodes = 1 + *std::max_element(member_node_.begin(), member_node_.end());
      constexpr signed char kUnknown = -1;
      std::vector<signed char> by_node;  // flags of a path to each node (kUnknown: not yet)
      int table_node = -1;               // the node by_node is for
      for (int i = 0; i < n_; ++i) {
        const int src = spec_.members[i];
        const int node = member_node_[i];
        if (node != table_node) {
          by_node.assign(static_cast<std::size_t>(nodes), kUnknown);
          table_node = node;
        }
        const std::vector<double>& row = spec_.a2a[i];
        char* const flags = round_flags_.data() + static_cast<std::size_t>(i) * r;
        // The flags of the path to `target`'s node, looked up the first time.
        const auto path_to = [&](int target) {
          const int dst_node = member_node_[target];
          signed char& path = by_node[dst_node];
          if (path == kUnknown) {
            const double latency = t.path(src, spec_.members[target]).latency_s;
            path = static_cast<signed char>((latency_class(latency) << kLatencyShift) |
                                            (dst_node != node ? kCrosses : 0));
          }
          return path;
        };
        if (!merged) {
          // Every logical round kept: round k goes to member i + 1 + k (mod n), so the rounds
          // run over the members after i, then those before, in blocks of one node, each with
          // one path (perf: looking the path up per round was most of this function).
          std::size_t k = 0;
          for (const auto& [from, to] : {std::pair{i + 1, n_}, std::pair{0, i}})
            for (int block = from; block < to;) {
              const int end = std::min(to, node_block_end_[block]);
              const char path = static_cast<char>(path_to(block));
              for (int target = block; target < end; ++target, ++k)
                flags[k] = static_cast<char>(path | (row[target] > 0 ? kCarriesBytes : 0));
              block = end;
            }
          if (k != r)
            throw Error("internal: an all-to-all keeping every round has " + std::to_string(r) +
                        " rounds for " + std::to_string(n_) + " members");
          continue;
        }
        for (std::size_t k = 0; k < r; ++k) {
          const Group& g = groups_[k];
          const int target = peer(i, target_shift(i, g));
          const double carried = bytes(i, g);
          target_[static_cast<std::size_t>(i) * r + k] = target;
          round_bytes_[static_cast<std::size_t>(i) * r + k] = carried;
          flags[k] = static_cast<char>(path_to(target) | (carried > 0 ? kCarriesBytes : 0));
        }
      }
    }
    if (barrier_) {
      sent_.assign(static_cast<std::size_t>(n_) * r, 0);
      awaited_.assign(static_cast<std::size_t>(n_) * r, 0);
      for (std::size_t k = 0; k < r; ++k)
        for (int i = 0; i < n_; ++i) {
          const int j = (i + target_shift(i, groups_[k])) % n_;
          ++awaited_[static_cast<std::size_t>(j) * r + k];
        }
    }
    if (plain_) {
      zero_.assign(2 * static_cast<std::size_t>(n_), {});
      wake_date_.assign(2 * static_cast<std::size_t>(n_), -1);
      wake_version_.assign(2 * static_cast<std::size_t>(n_), 0);
      alarm_.assign(2 * static_cast<std::size_t>(n_), -1);
      for (int i = 0; i < n_; ++i)
        for (const bool cross : {true, false}) run_kind(i, cross);
      return;
    }
    for (int i = 0; i < n_; ++i) advance(i);
  }

  void done(std::uint64_t tag) override {
    if (tag == kDelayTag) return host_.finished();
    const int i = field_b(tag), r = field_c(tag);
    if (plain_) {
      const auto a = static_cast<std::uint64_t>(field_a(tag));
      if (a == kWakeCross || a == kWakeLocal) {
        const std::size_t k = kind_index(i, a == kWakeCross);
        if ((static_cast<std::uint64_t>(wake_version_[k]) & kMaxC) != static_cast<std::uint64_t>(r))
          return;  // moved since
        wake_date_[k] = -1;
        return run_kind(i, a == kWakeCross);
      }
      const bool cross = crosses(i, r);  // a round with bytes
      --(cross ? inflight_cross_ : inflight_)[i];
      return run_kind(i, cross);
    }
    if (!barrier_) {
      if (!pending_.empty() && --pending_[static_cast<std::size_t>(i) * groups_.size() + r] > 0)
        return;  // the other flows of a split round are still under way
      --(crosses(i, r) ? inflight_cross_ : inflight_)[i];
      return advance(i);
    }
    --inflight_[i];
    const std::size_t rounds = groups_.size();
    const int j = (i + target_shift(i, groups_[r])) % n_;
    sent_[static_cast<std::size_t>(i) * rounds + r] = 1;
    --awaited_[static_cast<std::size_t>(j) * rounds + r];
    advance(i);
    if (j != i) advance(j);
  }

 private:
  struct Group {
    int target;  // shift of the destination
    int lo, hi;  // logical shifts merged into this round
  };

  // Where member i sends a merged round: its heaviest peer among the merged shifts (the first on
  // ties). Skewed exchanges (Muon's shards to owners) then keep each owner's ingress on the
  // owner's links instead of spreading it over the range's first peers.
  int target_shift(int i, const Group& g) const {
    if (barrier_ || g.lo == g.hi) return g.target;
    const std::vector<double>& row = spec_.a2a[i];
    int best = g.lo;
    double most = row[peer(i, g.lo)];
    for (int s = g.lo + 1; s <= g.hi; ++s) {
      const double b = row[peer(i, s)];
      if (b > most) {
        most = b;
        best = s;
      }
    }
    return best;
  }

  double bytes(int i, const Group& g) const {
    if (barrier_) return 0;
    const std::vector<double>& row = spec_.a2a[i];
    double b = 0;
    for (int s = g.lo; s <= g.hi; ++s) b += row[peer(i, s)];
    return b;
  }
  // (i + s) % n for 0 <= s < n, without the division.
  int peer(int i, int s) const { return i + s < n_ ? i + s : i + s - n_; }
  void post(int i, int r) {
    const Group& g = groups_[r];  // (plain_: zero-byte rounds never come here, see settle())
    const int src = spec_.members[i];
    if (!barrier_) {  // the logical messages of the rounds this one stands for
      const std::vector<double>& row = spec_.a2a[i];
      for (int s = g.lo; s <= g.hi; ++s) {
        const int j = peer(i, s);
        if (row[j] > 0) host_.account(src, spec_.members[j], row[j]);  // account() skips the rest
      }
    }
    if (!barrier_ && !split_.empty()) {
      std::size_t& pending = pending_[static_cast<std::size_t>(i) * groups_.size() + r];
      pending = 1;  // a round without bytes: the one zero-byte message below
      if (split_[i]) {
        int flows = 0;
        for (int s = g.lo; s <= g.hi; ++s) {
          const int j = peer(i, s);
          const double b = spec_.a2a[i][j];
          if (!(b > 0)) continue;
          host_.transfer(
              src, spec_.members[j],
              wire_bytes(host_.topology(), src, spec_.members[j], b, CollectiveClass::all_to_all),
              pack(static_cast<std::uint64_t>(flows), i, r));
          ++flows;
        }
        if (flows > 0) {
          pending = static_cast<std::size_t>(flows);
          return;
        }
      }
    }
    if (barrier_) {
      ++inflight_[i];
      const int dst = spec_.members[peer(i, target_shift(i, g))];
      return host_.transfer(src, dst,
                            wire_bytes(host_.topology(), src, dst, 0, CollectiveClass::all_to_all),
                            pack(0, i, r));
    }
    const std::size_t at = static_cast<std::size_t>(i) * groups_.size() + r;
    const int target = plain_ ? peer(i, g.target) : target_[at];
    const double carried = plain_ ? spec_.a2a[i][target] : round_bytes_[at];
    const int dst = spec_.members[target];
    host_.transfer(src, dst,
                   wire_bytes(host_.topology(), src, dst, carried, CollectiveClass::all_to_all),
                   pack(0, i, r));
  }
  // ---- All-to-all without merged rounds' splits: the zero-byte rounds are timed here.
  // A round without bytes is a message of its path's latency only, and it touches nothing shared,
  // so each member's kind (its rounds inside the node, or to other nodes) keeps the completion
  // times of its zero-byte rounds in flight itself (zero_) and only the rounds with bytes go to
  // the host. Its window behaves as before: a slot that frees (a zero-byte round at its time, a
  // round with bytes at its completion) takes the kind's next round at once; a zero-byte round
  // ends at that instant plus its latency, the same double the host's timer would give. A
  // skewed exchange (Muon's shards to a few owners) is mostly such rounds: a timer per round, or
  // per window of them, took most of a 1,024-GPU megatron step's simulation.

  // Takes zero-byte rounds of member i's kind for the slots in `zero` (completion times of its
  // zero-byte rounds in flight, a min-heap) that free at or before `until`, in order of those
  // times, from round `next` on. Stops at the first slot that reaches a round with bytes and
  // returns its free time (the slot leaves `zero`); -1 when no slot is due by `until`. A slot with
  // no round left leaves `zero`; last_freed_ is the latest free time seen.
  // A run of consecutive rounds alike (zero-byte, one latency) is taken in closed form, to the
  // same doubles as one round at a time (take_equal_rounds); where that declines, one at a time.
  double take_zero_rounds(int i, bool cross, std::vector<double>& zero, int& next, double until) {
    const int rounds = static_cast<int>(groups_.size());
    const char* flags = round_flags_.data() + static_cast<std::size_t>(i) * rounds;
    while (!zero.empty() && zero.front() <= until) {
      while (next < rounds && ((flags[next] & kCrosses) != 0) != cross) ++next;
      if (next == rounds) {
        last_freed_ = std::max(last_freed_, pop_time(zero));
        continue;
      }
      const char f = flags[next];
      if (f & kCarriesBytes) {
        const double freed = pop_time(zero);
        last_freed_ = std::max(last_freed_, freed);
        return freed;
      }
      const double latency = latencies_[static_cast<std::size_t>(f) >> kLatencyShift];
      if (const int run = rounds_alike(flags, next, rounds); run > 1) {
        if (const long taken = take_equal_rounds(zero, latency, run, until); taken > 0) {
          next += static_cast<int>(taken);
          continue;
        }
      }
      const double freed = pop_time(zero);
      push_time(zero, freed + latency);
      ++next;
    }
    return -1;
  }

  // How many rounds from `at` on (before `end`) have the flags of round `at`: eight at a time.
  static int rounds_alike(const char* flags, int at, int end) {
    const auto f = static_cast<unsigned char>(flags[at]);
    const std::uint64_t all_f = 0x0101010101010101ull * f;
    int k = at + 1;
    for (std::uint64_t eight; k + 8 <= end; k += 8) {
      std::memcpy(&eight, flags + k, sizeof eight);
      if (eight != all_f) break;
    }
    while (k < end && static_cast<unsigned char>(flags[k]) == f) ++k;
    return k - at;
  }

  // Takes the kind's rounds up to `now`: every slot free at or before it takes the next round; a
  // round with bytes is posted only at `now` (run_kind() arranged to be called then).
  void settle(int i, bool cross, double now) {
    std::vector<double>& zero = zero_[kind_index(i, cross)];
    const int inflight = (cross ? inflight_cross_ : inflight_)[i];
    for (int free = window_ - inflight - static_cast<int>(zero.size()); free > 0; --free)
      push_time(zero, now);
    int& next = (cross ? next_cross_ : next_)[i];
    for (double freed; (freed = take_zero_rounds(i, cross, zero, next, now)) >= 0;) {
      if (freed < now)
        throw Error("internal: all-to-all round posted after its slot freed (member " +
                    std::to_string(i) + ")");
      ++(cross ? inflight_cross_ : inflight_)[i];
      post(i, next++);
    }
  }

  // After settle(): when the kind must act next without news from the host, from its zero-byte
  // rounds run forward on a copy: when a slot reaches a round with bytes, or (no round with bytes
  // in flight, none left) when its last zero-byte round ends. -1: nothing due.
  double next_due(int i, bool cross) {
    std::vector<double>& zero = scratch_times_;
    zero = zero_[kind_index(i, cross)];
    int next = (cross ? next_cross_ : next_)[i];
    last_freed_ = -1;
    const double reached =
        take_zero_rounds(i, cross, zero, next, std::numeric_limits<double>::infinity());
    if (reached >= 0) return reached;
    return (cross ? inflight_cross_ : inflight_)[i] == 0 ? last_freed_ : -1;
  }

  // Settles the kind at the host's present and arranges its next wake-up on the kind's alarm
  // (a host without alarms delays instead: a moved wake-up is then recognized by its version).
  void run_kind(int i, bool cross) {
    const double now = host_.now();
    settle(i, cross, now);
    const std::size_t k = kind_index(i, cross);
    const double due = next_due(i, cross);
    if (due > now && due != wake_date_[k]) {  // settle() left nothing due at `now`
      wake_date_[k] = due;
      ++wake_version_[k];
      if (alarm_[k] < 0) alarm_[k] = host_.new_alarm();
      host_.set_alarm(alarm_[k], due,
                      pack(cross ? kWakeCross : kWakeLocal, i,
                           static_cast<std::uint64_t>(wake_version_[k]) & kMaxC));
    }
    const int rounds = static_cast<int>(groups_.size());
    if (lo_[i] != rounds && kind_done(i, cross) && kind_done(i, !cross)) {
      lo_[i] = rounds;
      member_done();
    }
  }

  bool kind_done(int i, bool cross) const {
    const int rounds = static_cast<int>(groups_.size());
    int next = (cross ? next_cross_ : next_)[i];
    while (next < rounds && crosses(i, next) != cross) ++next;
    return next == rounds && zero_[kind_index(i, cross)].empty() &&
           (cross ? inflight_cross_ : inflight_)[i] == 0;
  }

  std::size_t kind_index(int i, bool cross) const {
    return 2 * static_cast<std::size_t>(i) + (cross ? 1 : 0);
  }
  // The index of `latency` in latencies_ (added if new): round flags keep it.
  int latency_class(double latency) {
    for (std::size_t k = 0; k < latencies_.size(); ++k)
      if (latencies_[k] == latency) return static_cast<int>(k);
    if (latencies_.size() == kLatencyClasses)
      throw Error("internal: an all-to-all with more than " + std::to_string(kLatencyClasses) +
                  " distinct path latencies");
    latencies_.push_back(latency);
    return static_cast<int>(latencies_.size()) - 1;
  }
  // A min-heap of completion times (at most a window of them).
  static void push_time(std::vector<double>& heap, double t) {
    heap.push_back(t);
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  }
  static double pop_time(std::vector<double>& heap) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const double t = heap.back();
    heap.pop_back();
    return t;
  }
  // Field a of a wake-up's tag (field c: its version); rounds with bytes have field a 0.
  static constexpr std::uint64_t kWakeCross = kMaxA, kWakeLocal = kMaxA - 1;

  // Whether member i's round r goes to another node, and whether it carries bytes (all_to_all).
  static constexpr char kCrosses = 1, kCarriesBytes = 2;
  static constexpr int kLatencyShift = 2;  // bits 2-6: the index of the round's path latency
  static constexpr std::size_t kLatencyClasses = 32;
  char round_flags(int i, int r) const {
    return round_flags_[static_cast<std::size_t>(i) * groups_.size() + r];
  }
  bool crosses(int i, int r) const { return (round_flags(i, r) & kCrosses) != 0; }

  // Posts member i's next rounds while the window allows; the barrier first retires the levels
  // whose send and receive are both done.
  void advance(int i) {
    const int rounds = static_cast<int>(groups_.size());
    int& lo = lo_[i];
    const bool was_done = lo == rounds;
    if (barrier_) {
      const std::size_t base = static_cast<std::size_t>(i) * rounds;
      while (lo < rounds && lo < next_[i] && sent_[base + lo] && awaited_[base + lo] == 0) ++lo;
      while (next_[i] < rounds && next_[i] < lo + window_) post(i, next_[i]++);
    } else {
      for (const bool cross : {true, false}) {
        int& next = (cross ? next_cross_ : next_)[i];
        int& inflight = (cross ? inflight_cross_ : inflight_)[i];
        while (true) {
          while (next < rounds && crosses(i, next) != cross) ++next;
          if (next == rounds || inflight >= window_) break;
          ++inflight;
          post(i, next++);
        }
      }
      if (next_[i] == rounds && next_cross_[i] == rounds && inflight_[i] == 0 &&
          inflight_cross_[i] == 0)
        lo = rounds;
    }
    if (!was_done && lo == rounds) member_done();
  }

  void member_done() {
    if (++members_done_ == n_) {
      if (tail_ > 0) return host_.delay(tail_, kDelayTag);
      host_.finished();
    }
  }

  const CollectiveSpec& spec_;
  CollectiveHost& host_;
  int n_ = 0;
  bool barrier_ = false;
  int window_ = 1;
  double tail_ = 0;
  int members_done_ = 0;
  std::vector<Group> groups_;
  std::vector<int> lo_, next_;  // per member: oldest incomplete round (rounds = done), next to post
  std::vector<int> inflight_;   // per member: sends in flight (all_to_all: inside the node)
  std::vector<int> next_cross_, inflight_cross_;  // all_to_all: the same for other nodes
  std::vector<char> round_flags_;    // all_to_all, per member and round: kCrosses, kCarriesBytes
  std::vector<int> member_node_;     // all_to_all: each member's node
  std::vector<int> node_block_end_;  // all_to_all: the first member after j on another node
  std::vector<int> target_;          // merged rounds, per member and round: the destination member
  std::vector<double> round_bytes_;  // merged rounds, per member and round: the bytes it carries
  std::vector<char> split_;  // flow, merged rounds: per member, one flow per peer in a round
  std::vector<std::size_t> pending_;  // flow, merged rounds: per member and round, flows not done
  bool plain_ = false;  // all_to_all without merged rounds: zero-byte rounds timed here (settle())
  std::vector<std::vector<double>>
      zero_;                       // plain_, per member and kind: its zero-byte rounds' ends
  std::vector<double> wake_date_;  // plain_, per member and kind: pending wake-up, or -1
  std::vector<int> wake_version_;  // plain_, per member and kind
  std::vector<int> alarm_;         // plain_, per member and kind: the host's alarm, or -1
  std::vector<double> scratch_times_;
  double last_freed_ = -1;
  std::vector<double> latencies_;  // all_to_all: the distinct path latencies of its rounds
  std::vector<char> sent_;         // barrier, per member and level: its send is done
  std::vector<int> awaited_;       // barrier, per member and level: messages not yet received
};

// ---- NVLS all-reduce: NVLink SHARP inside nodes, NVLS tree across them ----------------------

// The NVSwitch reduces, so each GPU moves S (g+1)/g over its NVLink per direction (its share of
// every block up for reduction, the reduced blocks back by multicast): a flow of that size to its
// neighbour on the node loads every GPU's links in both directions exactly so. Across N nodes
// (NVLS tree) the node results are combined rail by rail: each GPU moves 2(N-1)/N S/g over its
// NIC, a flow to its rail peer on the next node. All flows run at once (NCCL pipelines the
// phases); the fixed latencies come after: the NVLS latency and, across nodes, the remaining
// 2(N-1)-1 inter-node steps (the flows paid one each). Both fidelities lower it this way.
class Nvls final : public CollectiveAlgorithm {
 public:
  Nvls(const CollectiveSpec& spec, CollectiveHost& host, const NvlsParams& params)
      : spec_(spec), host_(host), params_(params) {}

  void start() override {
    const Topology& topo = host_.topology();
    const EfficiencySpec& eff = topo.cluster().efficiency;
    std::vector<std::vector<int>> nodes;  // members are ascending: a node's members are a run
    for (int r : spec_.members) {
      if (nodes.empty() || topo.node_of(r) != topo.node_of(nodes.back().front()))
        nodes.emplace_back();
      nodes.back().push_back(r);
    }
    const double S = spec_.pieces.at(0);
    const int big_n = static_cast<int>(nodes.size());
    const double g = static_cast<double>(nodes.front().size());
    const double intra = S * (g + 1) / g;
    const double net = big_n > 1 ? 2.0 * (big_n - 1) / big_n * S / g : 0.0;
    std::uint64_t k = 0;
    for (int j = 0; j < big_n; ++j) {
      const std::vector<int>& local = nodes[j];
      for (std::size_t i = 0; i < local.size(); ++i) {
        const int src = local[i], dst = local[(i + 1) % local.size()];
        host_.account(src, dst, intra);
        ++outstanding_;
        host_.transfer(src, dst, intra / std::max(1e-12, eff.intra_node.nvls), pack(0, 0, k++));
        if (big_n > 1) {
          const int peer = nodes[(j + 1) % big_n][i];
          host_.account(src, peer, net);
          ++outstanding_;
          host_.transfer(src, peer, net / std::max(1e-12, eff.network.nvls), pack(0, 0, k++));
        }
      }
    }
    tail_ = params_.latency_s + (big_n > 1 ? (2.0 * (big_n - 1) - 1) * params_.step_latency_s : 0);
  }

  void done(std::uint64_t tag) override {
    if (tag == kDelayTag) return host_.finished();
    if (--outstanding_ > 0) return;
    if (tail_ > 0) return host_.delay(tail_, kDelayTag);
    host_.finished();
  }

 private:
  const CollectiveSpec& spec_;
  CollectiveHost& host_;
  NvlsParams params_;
  long outstanding_ = 0;
  double tail_ = 0;
};

// ---- The per-call launch overhead, before any algorithm ---------------------------------------

class Launched final : public CollectiveAlgorithm {
 public:
  Launched(std::unique_ptr<CollectiveAlgorithm> inner, CollectiveHost& host, double seconds)
      : inner_(std::move(inner)), host_(host), seconds_(seconds) {}
  void start() override { host_.delay(seconds_, kLaunchTag); }
  void done(std::uint64_t tag) override {
    if (tag == kLaunchTag) return inner_->start();
    inner_->done(tag);
  }

 private:
  std::unique_ptr<CollectiveAlgorithm> inner_;
  CollectiveHost& host_;
  double seconds_;
};

// ---- Rooted: gather, scatter, send/recv ---------------------------------------------------------

class Rooted final : public CollectiveAlgorithm {
 public:
  Rooted(const CollectiveSpec& spec, CollectiveHost& host, const LoweringOptions& options)
      : spec_(spec), host_(host), options_(options) {}

  void start() override {
    const int n = static_cast<int>(spec_.members.size());
    const bool to_root = spec_.kind == OpKind::gather;
    const int root_rank = spec_.members.at(spec_.root);
    struct Part {
      int rank;
      double bytes;
    };
    std::vector<Part> parts;
    if (spec_.kind == OpKind::send || spec_.kind == OpKind::recv) {
      const double b = spec_.pieces.at(spec_.root);
      parts.push_back({spec_.members.at(spec_.peer), b});
      host_.account(root_rank, parts[0].rank, b);
    } else {
      const Topology& topo = host_.topology();
      std::vector<Part> remote;
      for (int i = 0; i < n; ++i) {
        if (i == spec_.root || !(spec_.pieces[i] > 0)) continue;
        // Counted per member: remote members' messages are timed in bundles below.
        if (to_root)
          host_.account(spec_.members[i], root_rank, spec_.pieces[i]);
        else
          host_.account(root_rank, spec_.members[i], spec_.pieces[i]);
        if (topo.node_of(spec_.members[i]) == topo.node_of(root_rank))
          parts.push_back({spec_.members[i], spec_.pieces[i]});
        else
          remote.push_back({spec_.members[i], spec_.pieces[i]});
      }
      if (!options_.step_fidelity && options_.pooled_rooted &&
          static_cast<int>(remote.size()) > std::max(1, options_.pooled_members)) {
        // One pooled flow for every remote member (collectives.hpp, net_fabric.hpp).
        std::vector<int> ranks;
        ranks.reserve(remote.size());
        double bytes = 0;
        for (const Part& p : remote) {
          ranks.push_back(p.rank);
          bytes += p.bytes;
        }
        // Every remote member is on another node: the network's efficiency applies to all.
        const double wire = wire_bytes(topo, ranks[0], root_rank, bytes, CollectiveClass::p2p);
        if (host_.pooled_transfer(root_rank, spec_.members, ranks, to_root, wire,
                                  pack(0, 0, parts.size()))) {
          pooled_ = 1;
          remote.clear();
        }
      }
      const int bundles = options_.step_fidelity ? static_cast<int>(remote.size())
                                                 : std::min(static_cast<int>(remote.size()),
                                                            std::max(1, options_.rooted_bundles));
      const std::size_t m = remote.size();
      for (int b = 0; b < bundles; ++b) {
        const std::size_t lo = b * m / bundles, hi = (b + 1) * m / bundles;
        Part p{remote[lo].rank, 0};
        for (std::size_t i = lo; i < hi; ++i) p.bytes += remote[i].bytes;
        parts.push_back(p);
      }
    }
    if (parts.empty() && pooled_ == 0) return host_.finished();
    outstanding_ = static_cast<long>(parts.size()) + pooled_;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const bool send_from_root = !to_root;
      const int src = send_from_root ? root_rank : parts[i].rank;
      const int dst = send_from_root ? parts[i].rank : root_rank;
      host_.transfer(src, dst,
                     wire_bytes(host_.topology(), src, dst, parts[i].bytes, CollectiveClass::p2p),
                     pack(0, 0, i));
    }
  }

  void done(std::uint64_t) override {
    if (--outstanding_ == 0) host_.finished();
  }

 private:
  const CollectiveSpec& spec_;
  CollectiveHost& host_;
  LoweringOptions options_;
  long outstanding_ = 0;
  long pooled_ = 0;  // 1 when the remote members move as one pooled flow
};

}  // namespace

int all_to_all_rounds(int members, const LoweringOptions& options) {
  const long logical = std::max(1, members - 1);
  const long budget =
      std::max<long>(options.a2a_rounds, options.a2a_transfers / std::max(1, members));
  return static_cast<int>(std::max(1L, std::min(logical, budget)));
}

bool ring_needs_pipelining(OpKind kind, const std::vector<double>& pieces) {
  if (kind != OpKind::all_gather && kind != OpKind::reduce_scatter) return false;
  const std::size_t n = pieces.size();
  if (n < 2) return false;
  double total = 0, largest = 0, smallest = pieces.front();
  for (double p : pieces) {
    total += p;
    largest = std::max(largest, p);
    smallest = std::min(smallest, p);
  }
  return static_cast<double>(n - 1) * largest > (1 + kEvenRingTolerance) * (total - smallest);
}

std::vector<std::vector<int>> ring_channels(const std::vector<int>& members,
                                            const Topology& topology) {
  const int n = static_cast<int>(members.size());
  // Runs of members per node (members are ascending, so a node's members are contiguous).
  std::vector<std::vector<int>> nodes;
  for (int i = 0; i < n; ++i) {
    if (i == 0 || topology.node_of(members[i]) != topology.node_of(members[i - 1]))
      nodes.emplace_back();
    nodes.back().push_back(i);
  }
  if (nodes.size() <= 1) {
    std::vector<int> identity(n);
    for (int i = 0; i < n; ++i) identity[i] = i;
    return {identity};
  }
  int channels = n;
  for (const auto& local : nodes) channels = std::min(channels, static_cast<int>(local.size()));
  std::vector<std::vector<int>> rings(channels);
  for (int c = 0; c < channels; ++c) {
    rings[c].reserve(n);
    for (std::size_t j = 0; j < nodes.size(); ++j) {
      const auto& local = nodes[j];
      const int g = static_cast<int>(local.size());
      const int start = ((c - static_cast<int>(j)) % g + g) % g;
      for (int k = 0; k < g; ++k) rings[c].push_back(local[(start + k) % g]);
    }
  }
  return rings;
}

namespace {

std::unique_ptr<CollectiveAlgorithm> lower(const CollectiveSpec& spec, CollectiveHost& host,
                                           const LoweringOptions& options) {
  switch (spec.kind) {
    case OpKind::all_reduce:
      if (spec.members.size() >= 2 && host.topology().cluster().intra.nvls) {
        const LinkParams link =
            link_for_group(host.topology().cluster(), host.topology().gpus_per_node(), spec.members,
                           OpKind::all_reduce);
        const int n = static_cast<int>(spec.members.size());
        if (all_reduce_algorithm(n, spec.pieces.at(0), link) != AllReduceAlgorithm::ring)
          return std::make_unique<Nvls>(spec, host, link.nvls);
      }
      return std::make_unique<Ring>(spec, host, options);
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
      return std::make_unique<Ring>(spec, host, options);
    case OpKind::broadcast:
      return std::make_unique<Broadcast>(spec, host, options);
    case OpKind::all_to_all:
    case OpKind::barrier:
      return std::make_unique<Rounds>(spec, host, options);
    case OpKind::gather:
    case OpKind::scatter:
    case OpKind::send:
    case OpKind::recv:
      return std::make_unique<Rooted>(spec, host, options);
    default:
      throw Error("internal: '" + std::string(to_string(spec.kind)) + "' is not a collective");
  }
}

}  // namespace

std::unique_ptr<CollectiveAlgorithm> make_algorithm(const CollectiveSpec& spec,
                                                    CollectiveHost& host,
                                                    const LoweringOptions& options) {
  const std::size_t n = spec.members.size();
  const bool needs_pieces = spec.kind != OpKind::barrier && spec.kind != OpKind::all_to_all;
  if (needs_pieces && spec.pieces.size() != n)
    throw Error("internal: collective of " + std::to_string(n) + " members has " +
                std::to_string(spec.pieces.size()) + " piece sizes");
  std::unique_ptr<CollectiveAlgorithm> algorithm = lower(spec, host, options);
  const double launch = host.topology().cluster().launch_overhead.collective_us * 1e-6;
  if (n >= 2 && launch > 0) return std::make_unique<Launched>(std::move(algorithm), host, launch);
  return algorithm;
}

}  // namespace muonbed::sim
