// The plan replay on SimGrid (see replay.hpp): the execution engine (core/engine/engine.hpp)
// decides when ops start; this handler starts compute and lowered collective algorithms through
// Network, reports their completions back to the engine from SimGrid's callbacks, and measures each
// step pattern with StepTimeline.
#include "sim/src/replay.hpp"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <unordered_map>

#include <simgrid/s4u/Engine.hpp>

#include "core/base/errors.hpp"
#include "core/base/progress.hpp"
#include "core/engine/cost_model.hpp"
#include "core/engine/engine.hpp"
#include "core/engine/timeline.hpp"
#include "core/plan/split_ns.hpp"
#include "sim/src/beside.hpp"
#include "sim/src/network.hpp"

namespace sg4 = simgrid::s4u;

namespace muonbed::sim {

namespace {

constexpr std::uint32_t kComputeOwner = 0x80000000u;
// Tags of a split Newton-Schulz instance's compute: this pattern in the top 16 bits, the member in
// the rest. The algorithms' tags differ there: kDelayTag and kLaunchTag are all ones, and pack()
// puts the ring channel (far below 0x5A5 = 1445) in the top 12 bits.
constexpr std::uint64_t kSplitComputeTag = 0x5A5Aull << 48;
constexpr std::uint64_t kTagPatternMask = 0xFFFFull << 48;

class Replay;

// Adapter giving one collective instance's algorithm access to the network.
class InstanceHost final : public CollectiveHost {
 public:
  InstanceHost(Replay& replay, std::uint32_t index) : replay_(replay), index_(index) {}
  void transfer(int src, int dst, double bytes, std::uint64_t tag) override;
  bool pooled_transfer(int root, const std::vector<int>& group, const std::vector<int>& remote,
                       bool to_root, double bytes, std::uint64_t tag) override;
  void account(int src, int dst, double bytes) override;
  void delay(double seconds, std::uint64_t tag) override;
  int new_alarm() override;
  void set_alarm(int alarm, double date, std::uint64_t tag) override;
  void free_alarm(int alarm) override;
  const Topology& topology() const override;
  double now() const override;
  void finished() override { finished_ = true; }
  bool is_finished() const { return finished_; }
  void reset() { finished_ = false; }

 private:
  Replay& replay_;
  std::uint32_t index_;
  bool finished_ = false;
};

// A running collective instance, in the slot of the engine's instance id (which is also the
// owner of its transfers on the network).
struct Instance {
  int op = -1;
  double start = 0;
  double bytes = 0;
  std::vector<std::pair<int, double>> traced_arrivals;  // (rank, time) of traced members
  CollectiveSpec spec;
  std::unique_ptr<InstanceHost> host;
  std::unique_ptr<CollectiveAlgorithm> algorithm;
  // split_newton_schulz: the all-reduces run so far (0: the norms; k: the Gram of step k), the
  // members' compute still running, and each member's compute per step.
  int split_round = -1;
  int split_pending = 0;
  std::vector<double> split_compute_s;
};

// The engine's OpHandler on SimGrid: compute ops and collective algorithms started on the
// Network, whose completion callbacks report back to the engine.
class Replay final : public OpHandler, public CompletionSink {
 public:
  Replay(const StepPlan& plan, const ClusterSpec& cluster, const Topology& topology,
         const std::vector<sg4::Host*>& hosts, const ReplayOptions& options)
      : plan_(plan),
        cluster_(cluster),
        topo_(topology),
        options_(options),
        network_(topology, hosts, options.step_fidelity, options.latency_in_links, *this,
                 options.net_fabric),
        index_(plan),
        engine_(index_, *this, index_.all_ranks()),
        timeline_(index_.world_size(), index_.num_ops(), options.trace_max_ranks),
        training_costs_(plan),
        piece_bytes_(plan),
        patterns_(step_patterns(plan)),
        host_comm_(plan, cluster),
        progress_(options.progress_label, "the plan's rank-ops simulated",
                  options.progress_label.empty() ? nullptr : &std::cerr,
                  options.progress_in_place ? ProgressLine::Options{} : ProgressLine::for_log()) {
    traced_ = std::min(index_.world_size(), std::max(0, options.trace_max_ranks));
    compute_started_.assign(static_cast<std::size_t>(traced_) * index_.num_streams(), 0.0);
    if (has_training_ops(plan)) timeline_.track_phases(plan);
    options_.lowering.pooled_rooted = network_.can_pool();
    // The progress line's measure: every (rank, op) the engine reaches over the patterns.
    if (!options.progress_label.empty())
      for (const StepPatternSpec& pattern : patterns_)
        for (const Op& op : plan.ops)
          if (index_.active(op.id, pattern.step)) rank_ops_ += op.ranks.count(plan.mesh());
  }

  void begin() { begin_pattern(0); }

  bool all_done() const { return pattern_ == static_cast<int>(patterns_.size()); }

  // The engine ran out of events before every rank finished: a plan whose collective members
  // never all arrive, or a dependency that never completes.
  void check_finished() const {
    if (all_done()) return;
    throw Error("sim: the plan deadlocked in step " + std::to_string(step_) + ": " +
                engine_.stall_report() +
                "; fix: check the plan with `muonbed plan` (a collective some members never "
                "reach, or a dependency that never completes)");
  }

  ReplayOutput take_output() {
    ReplayOutput out;
    out.steps = std::move(steps_);
    out.collectives = std::move(collectives_);
    auto write = [&plan = plan_, events = std::move(worst_trace_), traced = traced_,
                  gpus_per_node = topo_.gpus_per_node(), step = worst_step_]() {
      return chrome_trace(plan, events, traced, gpus_per_node, step,
                          "ranks 0.." + std::to_string(traced - 1) +
                              " of the worst step; pid = node, tid = rank x streams + "
                              "stream; times in microseconds from the step's start");
    };
    out.trace = beside(std::move(write), false);
    return out;
  }

  // OpHandler
  void reached(int rank, int /*op*/) override {
    timeline_.touch_finish(rank, rel_now());
    progress_.update(++reached_, rank_ops_);
  }

  void end_progress() { progress_.finish(); }

  void start_compute(int rank, int op) override {
    const Op& o = plan_.ops[op];
    const ComputeCost cost = compute_cost(plan_, o, rank, cluster_, &training_costs_);
    const double seconds = cost.seconds + host_comm_.compute_started(rank, rel_now());
    timeline_.add_flops(cost.flops);
    timeline_.begin(rank, Activity::compute, rel_now(), op);
    if (rank < traced_) compute_started_[trace_slot(rank, o.stream)] = rel_now();
    network_.compute(rank, seconds, kComputeOwner | static_cast<std::uint32_t>(rank),
                     static_cast<std::uint64_t>(op));
  }

  void arrived(int rank, int op) override {
    if (rank < traced_)
      arrivals_[instance_key(op, index_.leader(op, rank))].emplace_back(rank, rel_now());
  }

  void start_collective(const CollectiveInstance& instance) override {
    const std::uint32_t id = static_cast<std::uint32_t>(instance.id);
    while (instances_.size() <= id) {
      instances_.push_back(std::make_unique<Instance>());
      instances_.back()->host =
          std::make_unique<InstanceHost>(*this, static_cast<std::uint32_t>(instances_.size() - 1));
    }
    Instance& inst = *instances_[id];
    inst.op = instance.op;
    inst.traced_arrivals.clear();
    if (auto it = arrivals_.find(instance_key(instance.op, instance.leader));
        it != arrivals_.end()) {
      inst.traced_arrivals = std::move(it->second);
      arrivals_.erase(it);
    }
    const Op& o = plan_.ops[instance.op];
    inst.split_round = -1;
    if (o.kind == OpKind::split_newton_schulz) return start_split(inst, id, instance);
    host_comm_.collective_started(instance.op, instance.participants);
    CollectiveSpec& spec = inst.spec;
    spec = CollectiveSpec{};
    spec.kind = o.kind;
    spec.members = instance.participants;  // the group; send/recv: {sender, receiver}
    const int n = static_cast<int>(spec.members.size());
    double bytes = 0;
    switch (o.kind) {
      case OpKind::send:
      case OpKind::recv: {
        spec.root = 0;
        spec.peer = 1;
        bytes = static_cast<double>(piece_bytes_(instance.op, spec.members[0]));
        spec.pieces = {bytes, 0};
        break;
      }
      case OpKind::all_gather:
      case OpKind::reduce_scatter:
      case OpKind::gather:
      case OpKind::scatter: {
        spec.root = std::max(0, o.root);
        spec.pieces.resize(n);
        for (int i = 0; i < n; ++i) {
          spec.pieces[i] = static_cast<double>(piece_bytes_(instance.op, spec.members[i]));
          bytes += spec.pieces[i];
        }
        if (o.kind == OpKind::reduce_scatter)
          bytes = static_cast<double>(collective_bytes(plan_, o, instance.leader));
        break;
      }
      case OpKind::all_reduce:
      case OpKind::broadcast: {
        spec.root = std::max(0, o.root);
        bytes = static_cast<double>(piece_bytes_(instance.op, spec.members[0]));
        spec.pieces.assign(n, bytes);
        break;
      }
      case OpKind::all_to_all: {
        // bytes_sent of every member, built from the instance's transfers at once (whole
        // numbers of bytes: the same sums in any order).
        spec.a2a.assign(n, std::vector<double>(n, 0.0));
        for (const PairBytes& t : all_to_all_transfers(plan_, o, spec.members))
          spec.a2a[t.from][t.to] += static_cast<double>(t.bytes);
        bytes = static_cast<double>(collective_bytes(plan_, o, instance.leader));
        break;
      }
      default:  // barrier
        break;
    }
    inst.bytes = bytes;
    inst.start = rel_now();
    for (int m : spec.members) timeline_.begin(m, Activity::communication, inst.start, inst.op);
    inst.host->reset();
    inst.algorithm = make_algorithm(spec, *inst.host, options_.lowering);
    inst.algorithm->start();
    if (inst.host->is_finished()) complete_instance(id);
  }

  // CompletionSink
  void completed(std::uint32_t owner, std::uint64_t tag) override {
    if (owner & kComputeOwner) {
      compute_done(static_cast<int>(owner & ~kComputeOwner), static_cast<int>(tag));
    } else {
      Instance& inst = *instances_[owner];
      if (inst.split_round >= 0 && (tag & kTagPatternMask) == kSplitComputeTag) {
        if (--inst.split_pending == 0) start_split_all_reduce(inst, owner);
      } else {
        inst.algorithm->done(tag);
        if (inst.host->is_finished()) after_all_reduce(owner);
      }
    }
    if (pattern_active_ && engine_.step_done()) end_pattern();
  }

  Network& network() { return network_; }
  const Network& network() const { return network_; }
  const Topology& topology() const { return topo_; }

 private:
  double rel_now() const { return network_.now() - t0_; }
  std::size_t trace_slot(int rank, int stream) const {
    return static_cast<std::size_t>(rank) * index_.num_streams() + stream;
  }
  std::int64_t instance_key(int op, int leader) const {
    return static_cast<std::int64_t>(op) * index_.world_size() + leader;
  }

  void compute_done(int rank, int op) {
    const double now = rel_now();
    host_comm_.compute_finished(rank, now);
    timeline_.end(rank, Activity::compute, now, op);
    if (rank < traced_) {
      const int stream = index_.stream(op);
      timeline_.trace(
          {rank, stream, op, TraceKind::compute, compute_started_[trace_slot(rank, stream)], now});
    }
    timeline_.touch_finish(rank, now);
    engine_.finish_compute(rank, op);
  }

  // split_newton_schulz (core/plan/split_ns.hpp): the norm all-reduce, then per NS step the
  // members' compute (split_ns_cost's, an equal share per step, each on its GPU) and the all-reduce
  // of the Grams, on the same all_reduce algorithm as plan all_reduce ops. Its time counts as
  // compute, as in the analytic model.
  void start_split(Instance& inst, std::uint32_t id, const CollectiveInstance& instance) {
    const Op& o = plan_.ops[instance.op];
    inst.spec = CollectiveSpec{};
    inst.spec.kind = OpKind::all_reduce;
    inst.spec.members = instance.participants;
    inst.bytes = static_cast<double>(collective_bytes(plan_, o, instance.leader));
    inst.split_compute_s.clear();
    for (int m : inst.spec.members) {
      double seconds = 0;
      for (int p : o.params) seconds += split_ns_cost(plan_, o, p, m, cluster_).compute_s;
      inst.split_compute_s.push_back(seconds / std::max(1, o.ns_steps));
      timeline_.add_flops(op_flops(plan_, o, m));
    }
    inst.start = rel_now();
    for (int m : inst.spec.members) timeline_.begin(m, Activity::compute, inst.start, inst.op);
    inst.split_round = 0;
    start_split_all_reduce(inst, id);
  }

  void start_split_all_reduce(Instance& inst, std::uint32_t id) {
    const Op& o = plan_.ops[inst.op];
    const SplitNsExchange x = split_ns_exchange(plan_, o, inst.spec.members.front());
    const double bytes =
        inst.split_round == 0
            ? static_cast<double>(x.norm_elements * bytes_of(DType::fp32))
            : static_cast<double>(x.gram_elements * bytes_of(plan_.settings.comm_dtype()));
    inst.spec.pieces.assign(inst.spec.members.size(), bytes);
    inst.host->reset();
    inst.algorithm = make_algorithm(inst.spec, *inst.host, options_.lowering);
    inst.algorithm->start();
    if (inst.host->is_finished()) after_all_reduce(id);
  }

  void after_all_reduce(std::uint32_t id) {
    Instance& inst = *instances_[id];
    if (inst.split_round < 0 || inst.split_round == plan_.ops[inst.op].ns_steps)
      return complete_instance(id);
    ++inst.split_round;
    inst.split_pending = static_cast<int>(inst.spec.members.size());
    for (std::size_t i = 0; i < inst.spec.members.size(); ++i)
      network_.compute(inst.spec.members[i], inst.split_compute_s[i], id,
                       kSplitComputeTag | static_cast<std::uint64_t>(i));
  }

  void complete_instance(std::uint32_t id) {
    Instance& inst = *instances_[id];
    const int stream = index_.stream(inst.op);
    const double now = rel_now();
    const auto [lo, hi] = std::minmax_element(inst.spec.members.begin(), inst.spec.members.end());
    timeline_.collective(inst.op, static_cast<int>(inst.spec.members.size()), inst.bytes,
                         now - inst.start, topo_.node_of(*lo) != topo_.node_of(*hi));
    for (const auto& [r, arrived] : inst.traced_arrivals) {
      if (inst.start > arrived)
        timeline_.trace({r, stream, inst.op, TraceKind::wait, arrived, inst.start});
      timeline_.trace({r, stream, inst.op, TraceKind::collective, inst.start, now});
    }
    const Activity activity = inst.split_round >= 0 ? Activity::compute : Activity::communication;
    for (int r : inst.spec.members) {
      timeline_.end(r, activity, now, inst.op);
      timeline_.touch_finish(r, now);
    }
    inst.split_round = -1;
    inst.algorithm.reset();
    engine_.finish_collective(static_cast<int>(id));
  }

  // ---- step patterns ----
  void begin_pattern(int p) {
    pattern_ = p;
    step_ = patterns_[p].step;
    t0_ = network_.now();
    timeline_.begin_step();
    host_comm_.begin_step();
    std::fill(compute_started_.begin(), compute_started_.end(), 0.0);
    network_.reset_traffic();
    pattern_active_ = true;
    engine_.begin_step(step_);
    if (engine_.step_done()) end_pattern();
  }

  void end_pattern() {
    pattern_active_ = false;
    StepMeasurement m = timeline_.measurement(patterns_[pattern_].step, patterns_[pattern_].count);
    const TrafficCounters& t = network_.traffic();
    m.bytes_sent = t.sent;
    m.bytes_received = t.received;
    m.intra_node_bytes = t.intra_node_bytes;
    m.network_bytes = t.network_bytes;
    if (steps_.empty() || m.time_s > worst_time_) {
      worst_time_ = m.time_s;
      worst_step_ = m.step;
      worst_trace_ = timeline_.events();
    }
    steps_.push_back(std::move(m));
    collectives_.push_back(timeline_.collectives());
    if (pattern_ + 1 < static_cast<int>(patterns_.size())) {
      begin_pattern(pattern_ + 1);
    } else {
      pattern_ = static_cast<int>(patterns_.size());
    }
  }

  const StepPlan& plan_;
  const ClusterSpec& cluster_;
  const Topology& topo_;
  ReplayOptions options_;
  Network network_;
  PlanIndex index_;
  Engine engine_;
  StepTimeline timeline_;
  TrainingCosts training_costs_;  // forward / backward ops priced once per rank (training.hpp)
  PieceBytes piece_bytes_;        // members' pieces sized once per op signature and rank

  std::vector<StepPatternSpec> patterns_;
  HostCommCharge host_comm_;  // CPU ranks' message handling on their compute (cost_model.hpp)
  ProgressLine progress_;
  std::int64_t rank_ops_ = 0;  // what the progress line counts ...
  std::int64_t reached_ = 0;   // ... and how many the engine reached so far
  int pattern_ = 0;
  int step_ = 0;
  bool pattern_active_ = false;
  double t0_ = 0;

  std::vector<std::unique_ptr<Instance>> instances_;
  std::unordered_map<std::int64_t, std::vector<std::pair<int, double>>> arrivals_;

  int traced_ = 0;
  std::vector<double> compute_started_;  // traced rank x stream
  std::vector<TraceEvent> worst_trace_;
  double worst_time_ = 0;
  int worst_step_ = 0;

  std::vector<StepMeasurement> steps_;
  std::vector<std::vector<CollectiveMeasurement>> collectives_;
};

void InstanceHost::transfer(int src, int dst, double bytes, std::uint64_t tag) {
  replay_.network().transfer(src, dst, bytes, index_, tag);
}
bool InstanceHost::pooled_transfer(int root, const std::vector<int>& group,
                                   const std::vector<int>& remote, bool to_root, double bytes,
                                   std::uint64_t tag) {
  return replay_.network().pooled_transfer(root, group, remote, to_root, bytes, index_, tag);
}
void InstanceHost::account(int src, int dst, double bytes) {
  replay_.network().account(src, dst, bytes);
}
void InstanceHost::delay(double seconds, std::uint64_t tag) {
  replay_.network().delay(seconds, index_, tag);
}
int InstanceHost::new_alarm() {
  return replay_.network().new_alarm();
}
void InstanceHost::set_alarm(int alarm, double date, std::uint64_t tag) {
  replay_.network().set_alarm(alarm, date, index_, tag);
}
void InstanceHost::free_alarm(int alarm) {
  replay_.network().free_alarm(alarm);
}
const Topology& InstanceHost::topology() const {
  return replay_.topology();
}
double InstanceHost::now() const {
  return replay_.network().now();
}

}  // namespace

ReplayOutput replay_plan(const StepPlan& plan, const ClusterSpec& cluster, const Topology& topology,
                         const std::vector<sg4::Host*>& hosts, const ReplayOptions& options,
                         SimulationStats& stats) {
  if (plan.ops.empty()) throw PlanError("sim: the plan has no ops");
  auto replay = std::make_unique<Replay>(plan, cluster, topology, hosts, options);
  replay->begin();
  sg4::Engine::get_instance()->run();
  replay->end_progress();
  replay->check_finished();
  stats.simgrid_transfers = replay->network().simgrid_transfers();
  stats.node_flows = replay->network().node_flows();
  stats.timers = replay->network().timers();
  stats.computes = replay->network().computes();
  ReplayOutput out = replay->take_output();
  // The replay holds SimGrid activities: leave it to process exit (the engine cannot be torn down
  // cleanly in 3.32 while activities are referenced, and the child process exits right after).
  (void)replay.release();
  return out;
}

}  // namespace muonbed::sim
