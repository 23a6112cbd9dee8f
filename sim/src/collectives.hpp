// Collective algorithms as the simulator lowers them, NCCL-like, independent of SimGrid and of
// plans: an instance is a kind, its members (ranks, ascending) and their byte counts; the
// algorithm asks its host for transfers and delays and is told when each completes.
//
//   all_gather, reduce_scatter   ring, n-1 steps; all_reduce = reduce-scatter then all-gather
//                                on the same ring (2(n-1) steps). A group spanning nodes runs
//                                one channel per member on a node (the fewest any node has), and
//                                channel c enters node j at its local member (c - j) mod g and
//                                leaves from the one before it, so consecutive nodes are joined
//                                on the same rail and every NIC carries one channel: a node
//                                pushes g x NIC bandwidth (hierarchical, node-aware rings).
//                                Rings whose pieces are not even (ring_needs_pipelining) take
//                                the flow lowering at both fidelities: NCCL pipelines ring steps
//                                in slices, which whole-piece steps would not.
//   broadcast                    pipelined chain from the root along each channel's ring, data
//                                split over channels, each channel's share cut into chunks.
//   all_reduce with NVLS          where the cluster has intra_node.nvls and core's tuner
//                                (all_reduce_algorithm) picks it: flows sized as the NVSwitch
//                                reduction loads each GPU's NVLink (and, NVLS tree, its NIC).
//   all_to_all                   pairwise exchange: round t, member i sends to i+t (mod n); a
//                                member keeps kAllToAllPeersInFlight rounds in flight, a round
//                                being complete when its send and its receive are done (NVLink
//                                and NIC peers overlap, as NCCL posts every peer at once).
//   gather / scatter             direct transfers between the root and every member at once.
//   send / recv                  one transfer from the root to the peer.
//   barrier                      dissemination, a zero-byte message each way per level:
//                                2 ceil(log2 n) rounds.
// Fidelity step: each ring step / round / chunk is a transfer. Fidelity flow: a ring edge carries
// all its steps as one flow and the other n-2 (2n-3) step latencies are added as a delay; a chain
// hop carries all chunks at once, plus the pipeline fill (n+k-3) latencies and (n-2) chunk times;
// all-to-all rounds are merged into at most max(a2a_rounds, a2a_transfers / members) rounds
// (shifts grouped in contiguous ranges; a member that sends to at most that many peers sends a
// merged round as one flow per peer it sends to, any other member sends its range's bytes to its
// heaviest peer in the range, so skewed exchanges keep their receivers' load; the window of rounds
// in flight shrinks in proportion and the latency rounds the merge skips are added); cross-node
// senders to a root are bundled into at most `rooted_bundles` flows (the root's link is the
// bottleneck either way). Zero-byte messages cost their path latency. Every transfer occupies its
// links for its bytes over the link class's efficiency for the collective class
// (cluster.efficiency), and every instance of two or more members starts with the cluster's
// per-call launch overhead.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/engine/cost_model.hpp"
#include "core/plan/plan.hpp"
#include "sim/src/platform.hpp"

namespace muonbed::sim {

struct CollectiveSpec {
  OpKind kind = OpKind::barrier;
  std::vector<int> members;  // ranks, ascending (group order)
  int root = 0;              // gather/scatter/broadcast/send: member index of the root
  int peer = 1;              // send/recv: member index of the receiver
  // Bytes per member: all_gather its contribution; reduce_scatter its output piece; all_reduce,
  // broadcast, send: the whole buffer (taken from the root / member 0); gather/scatter its piece.
  std::vector<double> pieces;
  // all_to_all: a2a[i][j] = bytes member i sends member j.
  std::vector<std::vector<double>> a2a;
};

struct LoweringOptions {
  bool step_fidelity = true;
  double broadcast_chunk_bytes = kBroadcastChunkBytes;
  int broadcast_max_chunks = kBroadcastMaxChunks;
  int a2a_rounds = 64;                      // as SimOptions::flow_all_to_all_rounds ...
  long a2a_transfers = 65536;               // ... and flow_all_to_all_transfers
  int a2a_window = kAllToAllPeersInFlight;  // all-to-all rounds a member keeps in flight
  int rooted_bundles = 64;
  // Flow fidelity: a gather or scatter with more than pooled_members members on other nodes
  // than the root moves their pieces as one pooled flow (CollectiveHost::pooled_transfer)
  // instead of bundles, where the host supports it (pooled_rooted).
  bool pooled_rooted = false;
  int pooled_members = 8;
};

// What an algorithm may ask of the simulator.
class CollectiveHost {
 public:
  virtual ~CollectiveHost() = default;
  // A transfer of `bytes` from src to dst (ranks) for timing; zero bytes cost the path latency.
  // At flow fidelity one transfer may stand in for several messages, so transfers are not
  // counted as traffic: algorithms report the messages NCCL would send through account().
  virtual void transfer(int src, int dst, double bytes, std::uint64_t tag) = 0;
  // Flow fidelity, LoweringOptions::pooled_rooted: the transfers between `root` and each of
  // `remote` (ranks on other nodes than the root's; `group`: the collective's members), `bytes`
  // in all, to the root or from it, as one pooled flow (sim/src/net_fabric.hpp). Returns false
  // when the host cannot pool them (the caller then posts the transfers itself).
  virtual bool pooled_transfer(int /*root*/, const std::vector<int>& /*group*/,
                               const std::vector<int>& /*remote*/, bool /*to_root*/,
                               double /*bytes*/, std::uint64_t /*tag*/) {
    return false;
  }
  virtual void account(int src, int dst, double bytes) = 0;
  virtual void delay(double seconds, std::uint64_t tag) = 0;
  // An alarm: a completion with `tag` at simulated time `date` (not before now()), exactly that
  // double, which set_alarm() moves and free_alarm() drops (an algorithm that times some
  // messages itself, all-to-all's zero-byte rounds, wakes at dates it computed). An alarm's
  // scheduled completion never arrives once moved or freed; free every alarm before the
  // algorithm is destroyed. Without alarms of its own a host delays (a moved alarm then still
  // completes; the algorithm must ignore it).
  virtual int new_alarm() { return 0; }
  virtual void set_alarm(int /*alarm*/, double date, std::uint64_t tag) {
    delay(date - now(), tag);
  }
  virtual void free_alarm(int /*alarm*/) {}
  virtual const Topology& topology() const = 0;
  virtual double now() const = 0;  // simulated time, seconds
  // Called once, when the algorithm has finished.
  virtual void finished() = 0;
};

class CollectiveAlgorithm {
 public:
  virtual ~CollectiveAlgorithm() = default;
  virtual void start() = 0;
  // The transfer or delay posted with `tag` completed.
  virtual void done(std::uint64_t tag) = 0;
};

std::unique_ptr<CollectiveAlgorithm> make_algorithm(const CollectiveSpec& spec,
                                                    CollectiveHost& host,
                                                    const LoweringOptions& options);

// Flow fidelity: the rounds an all-to-all of `members` keeps (members - 1 when not merged).
int all_to_all_rounds(int members, const LoweringOptions& options);

// Whether an all_gather or reduce_scatter of these member pieces takes the flow lowering at step
// fidelity too. Whole-piece ring steps carry each piece hop by hop, so the largest one's n-1 hops
// take (n-1) p_max / B, where NCCL's ring, pipelined in slices, moves each edge's S - p_min bytes
// in (S - p_min) / B plus a short fill (the analytic model's time, core/engine/cost_model.hpp).
// The two agree only when the pieces are even: a ring whose (n-1) p_max exceeds S - p_min by more
// than kEvenRingTolerance is lowered as edge flows (the pipelined limit) at both fidelities.
// Examples: owner_allgather's chunks, where a few owners hold whole matrices (p_max up to S), or
// quickstart's MLP chunk (p_max = 1.75 S/n: whole-piece steps took 75 % longer).
constexpr double kEvenRingTolerance = 1e-3;
bool ring_needs_pipelining(OpKind kind, const std::vector<double>& pieces);

// Ring orders: per channel, a permutation of member indices (see above). Exposed for tests.
std::vector<std::vector<int>> ring_channels(const std::vector<int>& members,
                                            const Topology& topology);

}  // namespace muonbed::sim
