// The execution semantics of core/plan/plan.hpp, implemented once. Every interpreter of a plan (the
// analytic model, the SimGrid replay, the loopback and MPI executors, the GPU executor) drives
// this engine and supplies only what an op costs or does, like nccl-tests' one harness with one
// run function per collective.
//
//   PlanIndex   per-op facts computed once per plan: which ranks take part, the op's position in
//               its stream, and group arithmetic (instance leader, member index, members); and,
//               per rank, its own ops on each stream and its own deps of each op, so that a rank
//               of a big mesh does not scan the ops of every other rank.
//   Engine      a cursor over the streams of the ranks one process executes (every rank for the
//               analytic model, the simulator and the loopback executor; its own rank for an MPI
//               or NCCL process). It starts each op as soon as the semantics allow and calls the
//               backend's OpHandler; the backend reports completions back, synchronously (loopback)
//               or later (simulated or real time). Single-threaded: call it from one thread.
//
// Semantics (plan.hpp): per rank, the ops of one stream run one at a time in plan order; an op
// starts when its earlier ops on the stream have completed and its deps (those the rank takes
// part in) have completed on the rank; a collective instance starts when all its members have
// reached it and completes for all of them; an op inactive in this step (period) takes no time,
// does not occupy its stream and counts as completed once its own deps are; alloc and release
// complete at once. send/recv involve the pair (root, peer) only; the other members of the group
// pass through. An instance of a collective is named by (op, leader): the lowest rank of the
// group instance.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/plan/plan.hpp"

namespace muonbed {

enum class OpClass { compute, collective, memory };

class PlanIndex {
 public:
  // Throws PlanError for ops the semantics cannot run (a stream, box, group, root or dep out of
  // range); validate_plan gives the fuller diagnosis.
  explicit PlanIndex(const StepPlan& plan);

  const StepPlan& plan() const { return *plan_; }
  const DeviceMesh& mesh() const { return plan_->model.mesh; }
  int world_size() const { return world_; }
  // 0 .. world_size-1: the local ranks of an engine that executes every rank.
  std::vector<int> all_ranks() const;
  int num_streams() const { return static_cast<int>(stream_ops_.size()); }
  int num_ops() const { return static_cast<int>(info_.size()); }

  const std::vector<int>& stream_ops(int stream) const { return stream_ops_.at(stream); }
  int stream(int op) const { return info_[op].stream; }
  int position(int op) const { return info_[op].position; }  // in its stream's op list
  OpClass op_class(int op) const { return info_[op].cls; }
  bool is_pair(int op) const { return info_[op].pair; }
  bool active(int op, int step) const { return step % info_[op].period == 0; }
  const std::vector<int>& deps(int op) const { return plan_->ops[op].deps; }

  int coord(int rank, int dim) const { return coords_[static_cast<std::size_t>(rank) * nd_ + dim]; }
  bool contains(int op, int rank) const;
  // The first position >= `pos` in stream `stream`'s op list whose op contains `rank` (the list's
  // size if none): the same as testing contains() position by position, without touching the
  // ops of other ranks.
  int next_position(int stream, int rank, int pos) const;
  // Calls fn(begin, end) on runs of int deps of `op` that together are exactly its deps that
  // contain `rank`, each once, in an order fixed by (op, rank); stops early when fn returns false
  // and then returns false.
  template <typename Fn>
  bool for_each_rank_dep(int op, int rank, Fn&& fn) const;

  // Group arithmetic of collective ops (a compute or memory op's group is the rank itself).
  int group_size(int op) const { return info_[op].group_size; }
  int leader(int op, int rank) const;       // lowest rank of rank's group instance
  int group_index(int op, int rank) const;  // rank's position in it (world-rank order)
  int member(int op, int leader, int index) const;
  std::vector<int> members(int op, int leader) const;
  // The ranks that take part in the instance of `op` led by `leader`: the group, or for send/recv
  // the pair {root, peer}.
  std::vector<int> participants(int op, int leader) const;
  // Calls fn(leader) for every instance of a collective op, leaders ascending.
  template <typename Fn>
  void for_each_instance(int op, Fn&& fn) const;

 private:
  // A key names a rank box's fixed coordinates: the pattern (which dims are fixed) times the world
  // size plus the fixed coordinates' linear index. An op contains a rank iff the rank's key for
  // the op's pattern (rank_keys_) is the op's key; so ops listed per key are each rank's own.
  struct KeyRange {
    std::int64_t key = 0;
    int begin = 0, end = 0;  // into the flat list it belongs to
  };
  // Up to this many ops or deps are tested one by one before the key index is used.
  static constexpr int kProbe = 16;
  const KeyRange* find_key(const std::vector<KeyRange>& ranges, int begin, int end,
                           std::int64_t key) const;
  std::int64_t rank_key(int rank, int pattern) const {
    return rank_keys_[static_cast<std::size_t>(rank) * patterns_.size() + pattern];
  }
  void index_by_key();

  struct Info {
    OpClass cls = OpClass::compute;
    int stream = 0;
    int position = 0;
    int period = 1;
    bool pair = false;
    std::vector<std::pair<int, int>> fixed;  // (dim, coord) of the box's fixed dims
    std::vector<int> group_dims;             // outermost first
    std::vector<int> group_sizes;
    std::vector<int> group_strides;
    int group_size = 1;
    std::vector<int> outer_dims;  // free dims of the box outside the group
    int pattern = 0;              // index into patterns_
    std::int64_t key = 0;
  };
  const StepPlan* plan_;
  int world_ = 1;
  int nd_ = 0;
  std::vector<int> coords_;  // rank * nd + dim
  std::vector<Info> info_;
  std::vector<std::vector<int>> stream_ops_;
  std::vector<std::uint64_t> patterns_;  // the fixed dims of each pattern, one bit per dim
  std::vector<std::int64_t> rank_keys_;  // rank * patterns + pattern
  // Per stream: the patterns its ops use, and its positions grouped by key (keys ascending,
  // positions ascending within a key).
  std::vector<std::vector<int>> stream_patterns_;
  std::vector<std::vector<KeyRange>> stream_keys_;
  std::vector<std::vector<int>> stream_positions_;
  // Per op: its deps grouped by the dep's key, in dep_keys_[dep_key_begin_[op] ..
  // dep_key_begin_[op + 1]) over grouped_deps_.
  std::vector<int> dep_key_begin_;
  std::vector<KeyRange> dep_keys_;
  std::vector<int> grouped_deps_;
};

// One collective instance the engine asks a backend to run.
struct CollectiveInstance {
  int id = -1;  // handle for Engine::finish_collective, valid until then
  int op = -1;
  int leader = -1;
  std::vector<int> participants;  // world ranks, ascending group order (pair: {root, peer})
};

// What a backend does with the ops the engine starts. Every call means "now" on the backend's
// clock. A handler may report completions from inside these calls (the engine queues them).
class OpHandler {
 public:
  virtual ~OpHandler() = default;
  // `rank` reached active op `op` with its deps complete (any kind; called before the call
  // below that starts it, and also for members that pass through a send/recv).
  virtual void reached(int /*rank*/, int /*op*/) {}
  // Compute op `op` starts on `rank`; report its end with Engine::finish_compute(rank, op).
  virtual void start_compute(int rank, int op) = 0;
  // Every local participant has reached the instance; report its end with finish_collective.
  virtual void start_collective(const CollectiveInstance& instance) = 0;
  // `rank` reached collective `op` (it waits until the instance starts).
  virtual void arrived(int /*rank*/, int /*op*/) {}
  // alloc or release `op` reached on `rank`; it completes at once.
  virtual void memory(int /*rank*/, int /*op*/) {}
  // `rank` finished every op of the step.
  virtual void rank_done(int /*rank*/) {}
};

class Engine {
 public:
  // `local_ranks`: the ranks this process executes. A collective instance starts when its local
  // participants have all arrived (in one process that is every participant; in an MPI rank, the
  // rank itself: the library matches the others).
  Engine(const PlanIndex& index, OpHandler& handler, std::vector<int> local_ranks);

  // Starts step `step` (its active ops follow from the periods). The previous step must be done.
  void begin_step(int step);
  void finish_compute(int rank, int op);
  void finish_collective(int instance);

  int step() const { return step_; }
  bool step_done() const { return ranks_left_ == 0; }
  const std::vector<int>& local_ranks() const { return local_; }
  const PlanIndex& index() const { return index_; }
  // The op at the head of each unfinished stream of each local rank and what it waits for (deps
  // not completed, collective members missing), at most `max_ranks` ranks: for deadlock reports.
  std::string stall_report(int max_ranks = 8) const;
  // The op `rank`'s stream `stream` is at (-1 when the stream is done).
  int head(int rank, int stream) const;
  bool busy(int rank, int stream) const;

 private:
  struct Open {
    int arrived = 0;
    int expected = 0;
  };
  std::size_t slot(int local, int stream) const {
    return static_cast<std::size_t>(local) * ns_ + stream;
  }
  int dep_blocker(int rank, int local, int dep) const;
  bool head_deps_ok(int rank, int local, int stream, int op);
  void sleep_until_moves(std::size_t slot, std::size_t on);
  void moved(std::size_t slot);
  void schedule(int local);
  void drain();
  void advance(int local, int stream);
  void complete(int rank, int stream);
  void arrive(int rank, int op);
  std::string missing_members(int rank, int op) const;

  const PlanIndex& index_;
  OpHandler& handler_;
  std::vector<int> local_;
  std::vector<int> local_of_;  // world rank -> local index, -1 if not local
  int ns_ = 1;
  int step_ = 0;
  std::vector<int> pos_;
  // Per stream slot: the head op whose deps were last checked and how many of them were complete
  // (a dep, once complete, stays complete in a step): an op with thousands of deps is not
  // rescanned from its first dep on every completion of its rank.
  std::vector<int> dep_op_, dep_next_;
  std::vector<char> busy_, ended_;
  // Streams blocked on a dep sleep until the stream of that dep moves: per slot, whether it
  // sleeps, the first slot sleeping on it and the next slot on the same list (-1 ends a list).
  std::vector<char> sleeping_;
  std::vector<int> first_sleeper_, sleeper_next_;
  // Per local rank, one bit per stream: neither busy, ended nor sleeping, the only streams drain()
  // needs to advance (a rank of the muonbed preset has 130 streams, most of them busy or ended;
  // testing each one's flags on every completion was a fifth of `muonbed plan` at 16,384 ranks).
  int words_ = 1;
  std::vector<std::uint64_t> waiting_;
  void set_state(std::size_t slot, bool busy, bool ended);
  int next_waiting(int local, int from) const;
  std::vector<int> streams_left_;
  int ranks_left_ = 0;
  std::vector<char> queued_;
  std::vector<int> queue_;
  std::size_t head_ = 0;
  bool draining_ = false;
  std::unordered_map<std::int64_t, int> open_;  // op * world + leader -> instance id
  std::vector<CollectiveInstance> instances_;
  std::vector<Open> counts_;
  std::vector<int> free_;
};

template <typename Fn>
void PlanIndex::for_each_instance(int op, Fn&& fn) const {
  const Info& info = info_[op];
  // Odometer over the box's free dims outside the group, innermost fastest: leaders ascending.
  int base = 0;
  for (const auto& [d, c] : info.fixed) base += c * mesh().stride(d);
  std::vector<int> digit(info.outer_dims.size(), 0);
  int rank = base;
  while (true) {
    fn(rank);
    int i = static_cast<int>(info.outer_dims.size()) - 1;
    for (; i >= 0; --i) {
      const int d = info.outer_dims[i];
      if (++digit[i] < mesh().size(d)) {
        rank += mesh().stride(d);
        break;
      }
      rank -= (mesh().size(d) - 1) * mesh().stride(d);
      digit[i] = 0;
    }
    if (i < 0) return;
  }
}

template <typename Fn>
bool PlanIndex::for_each_rank_dep(int op, int rank, Fn&& fn) const {
  const std::vector<int>& deps = plan_->ops[op].deps;
  if (static_cast<int>(deps.size()) <= kProbe) {  // few: testing each is cheaper
    for (const int& d : deps)
      if (contains(d, rank) && !fn(&d, &d + 1)) return false;
    return true;
  }
  const int begin = dep_key_begin_[op], end = dep_key_begin_[op + 1];
  // Deps fix dims of their own: one range per pattern at most matches the rank.
  for (int p = 0; p < static_cast<int>(patterns_.size()); ++p) {
    const KeyRange* r = find_key(dep_keys_, begin, end, rank_key(rank, p));
    if (r && !fn(grouped_deps_.data() + r->begin, grouped_deps_.data() + r->end)) return false;
  }
  return true;
}

}  // namespace muonbed
