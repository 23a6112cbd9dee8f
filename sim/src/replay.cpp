// The plan replay controller (see replay.hpp): per-rank stream cursors advanced by completions,
// collective instances keyed by (op, group leader), compute and transfers through Network, and
// the measurements of each step pattern.
#include "sim/src/replay.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include <simgrid/s4u/Engine.hpp>

#include "core/cost_model.hpp"
#include "core/errors.hpp"
#include "sim/src/network.hpp"

namespace sg4 = simgrid::s4u;

namespace muonbed::sim {

namespace {

constexpr std::uint32_t kComputeOwner = 0x80000000u;

struct OpInfo {
  OpKind kind = OpKind::barrier;
  int stream = 0;
  int period = 1;
  int pos = 0;  // index in its stream's op list
  bool compute = false;
  bool memory = false;
  bool collective = false;
  bool pair = false;                       // send / recv
  std::vector<std::pair<int, int>> fixed;  // (mesh dim, coordinate) of the box
  std::vector<int> group_size_of;          // per group dim (outermost first): its size
  std::vector<int> group_stride;           // and its rank stride
  std::vector<int> group_dims;
  int group_size = 1;
  std::vector<int> deps;
};

struct Acc {
  double last = 0;
  int n_compute = 0;
  int n_comm = 0;
  double compute = 0, comm = 0, exposed = 0, busy = 0, finish = 0;
};

struct TraceEvent {
  int rank;
  int stream;
  int op;
  int kind;  // 0 compute, 1 collective, 2 waiting for the other members
  double start;
  double end;
};

class Replay;

// Adapter giving one collective instance's algorithm access to the network.
class InstanceHost final : public CollectiveHost {
 public:
  InstanceHost(Replay& replay, std::uint32_t index) : replay_(replay), index_(index) {}
  void transfer(int src, int dst, double bytes, std::uint64_t tag) override;
  void account(int src, int dst, double bytes) override;
  void delay(double seconds, std::uint64_t tag) override;
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

struct Instance {
  int op = -1;
  int leader = -1;
  int expected = 0;
  int arrived = 0;
  double start = 0;
  double bytes = 0;
  std::vector<std::pair<int, double>> traced_arrivals;  // (rank, time) of traced members
  CollectiveSpec spec;
  std::unique_ptr<InstanceHost> host;
  std::unique_ptr<CollectiveAlgorithm> algorithm;
};

class Replay final : public CompletionSink {
 public:
  Replay(const StepPlan& plan, const ClusterSpec& cluster, const Topology& topology,
         const std::vector<sg4::Host*>& hosts, const ReplayOptions& options)
      : plan_(plan),
        cluster_(cluster),
        topo_(topology),
        mesh_(plan.mesh()),
        options_(options),
        network_(topology, hosts, options.step_fidelity, options.latency_in_links, *this) {
    world_ = mesh_.world_size();
    nd_ = mesh_.ndims();
    ns_ = std::max<int>(1, static_cast<int>(plan.streams.size()));
    coords_.resize(static_cast<std::size_t>(world_) * nd_);
    for (int r = 0; r < world_; ++r)
      for (int d = 0; d < nd_; ++d)
        coords_[static_cast<std::size_t>(r) * nd_ + d] = mesh_.coord(r, d);
    build_op_info();
    patterns_ = step_patterns(plan);
    pos_.assign(static_cast<std::size_t>(world_) * ns_, 0);
    busy_.assign(static_cast<std::size_t>(world_) * ns_, 0);
    ended_.assign(static_cast<std::size_t>(world_) * ns_, 0);
    streams_left_.assign(world_, 0);
    queued_.assign(world_, 0);
    acc_.assign(world_, Acc{});
    measured_.resize(plan.ops.size());
    traced_ = std::min(world_, std::max(0, options.trace_max_ranks));
  }

  void begin() { begin_pattern(0); }

  bool all_done() const { return pattern_ == static_cast<int>(patterns_.size()); }

  void check_finished() const {
    if (all_done()) return;
    // The engine ran out of events before every rank finished: a plan whose collective members
    // never all arrive, or a dependency that never completes.
    for (int r = 0; r < world_; ++r) {
      if (streams_left_[r] == 0) continue;
      for (int s = 0; s < ns_; ++s) {
        const std::size_t k = slot(r, s);
        if (ended_[k]) continue;
        const int op = stream_ops_[s][pos_[k]];
        std::string waiting;
        for (int d : info_[op].deps)
          if (contains(d, r) && !dep_done(r, d))
            waiting += (waiting.empty() ? "" : ", ") + std::to_string(d) + " ('" +
                       plan_.ops[d].label + "')";
        throw Error("sim: the plan deadlocked in step " + std::to_string(step_) + ": rank " +
                    std::to_string(r) + " waits at op " + std::to_string(op) + " ('" +
                    plan_.ops[op].label + "', " + std::string(to_string(plan_.ops[op].kind)) +
                    ") on stream '" + stream_name(s) +
                    (busy_[k] ? "' (started" + missing_members(r, op) + ")"
                              : "' (waiting for ops " + waiting + ")") +
                    "; fix: check the plan with `muonbed plan` (a collective some members "
                    "never reach, or a dependency that never completes)");
      }
    }
  }

  // For a collective op `op` that rank r has reached: the group members that never did, and
  // where each of them stopped (at most 8 named).
  std::string missing_members(int r, int op) const {
    const OpInfo& info = info_[op];
    if (!info.collective) return "";
    std::vector<int> group;
    if (info.pair) {
      const std::vector<int> all = members_of(leader_of(r, info), info);
      group = {all.at(plan_.ops[op].root), all.at(plan_.ops[op].peer)};
    } else {
      group = members_of(leader_of(r, info), info);
    }
    std::string out;
    int named = 0, missing = 0;
    for (int m : group) {
      const std::size_t k = slot(m, info.stream);
      const bool reached = !ended_[k] && stream_ops_[info.stream][pos_[k]] == op && busy_[k];
      if (reached) continue;
      ++missing;
      if (named++ >= 8) continue;
      out += (out.empty() ? "" : "; ") + std::string("rank ") + std::to_string(m);
      if (ended_[k] || streams_left_[m] == 0)
        out += " finished the stream";
      else
        out += " is at op " + std::to_string(stream_ops_[info.stream][pos_[k]]) + " ('" +
               plan_.ops[stream_ops_[info.stream][pos_[k]]].label + "')";
    }
    if (missing == 0) return "; every member arrived";
    if (missing > 8) out += "; and " + std::to_string(missing - 8) + " more";
    return "; " + std::to_string(missing) + " of " + std::to_string(group.size()) +
           " members never arrived: " + out;
  }

  ReplayOutput take_output() {
    ReplayOutput out;
    out.steps = std::move(steps_);
    out.collectives = std::move(collectives_);
    out.trace = make_trace();
    return out;
  }

  // CompletionSink
  void completed(std::uint32_t owner, std::uint64_t tag) override {
    if (owner & kComputeOwner) {
      compute_done(static_cast<int>(owner & ~kComputeOwner), static_cast<int>(tag));
    } else {
      Instance& inst = *instances_[owner];
      inst.algorithm->done(tag);
      if (inst.host->is_finished()) complete_instance(owner);
    }
    drain();
  }

  Network& network() { return network_; }
  const Network& network() const { return network_; }
  const Topology& topology() const { return topo_; }

 private:
  std::size_t slot(int r, int s) const { return static_cast<std::size_t>(r) * ns_ + s; }
  int coord(int r, int d) const { return coords_[static_cast<std::size_t>(r) * nd_ + d]; }
  std::string stream_name(int s) const {
    return s < static_cast<int>(plan_.streams.size()) ? plan_.streams[s] : std::to_string(s);
  }

  void build_op_info() {
    const int nops = static_cast<int>(plan_.ops.size());
    info_.resize(nops);
    stream_ops_.assign(ns_, {});
    for (int i = 0; i < nops; ++i) {
      const Op& op = plan_.ops[i];
      OpInfo& info = info_[i];
      info.kind = op.kind;
      if (op.stream < 0 || op.stream >= ns_)
        throw PlanError("sim: op " + std::to_string(i) + " uses stream " +
                        std::to_string(op.stream) + " of " + std::to_string(ns_));
      info.stream = op.stream;
      info.period = std::max(1, op.period);
      info.compute = is_compute(op.kind);
      info.memory = is_memory(op.kind);
      info.collective = is_collective(op.kind);
      info.pair = op.kind == OpKind::send || op.kind == OpKind::recv;
      for (int d = 0; d < nd_; ++d) {
        const int c = op.ranks.coord.at(d);
        if (c != RankBox::kAll) info.fixed.emplace_back(d, c);
      }
      info.group_size = 1;
      if (info.collective)
        for (int d = 0; d < nd_; ++d)
          if (op.group.contains(d)) {
            info.group_dims.push_back(d);
            info.group_size_of.push_back(mesh_.size(d));
            info.group_stride.push_back(mesh_.stride(d));
            info.group_size *= mesh_.size(d);
          }
      info.deps = op.deps;
      info.pos = static_cast<int>(stream_ops_[op.stream].size());
      stream_ops_[op.stream].push_back(i);
    }
  }

  bool contains(int op, int r) const {
    for (const auto& [d, c] : info_[op].fixed)
      if (coord(r, d) != c) return false;
    return true;
  }
  bool active(int op) const { return step_ % info_[op].period == 0; }

  // Has rank r completed (or, for an inactive op, passed with its deps done) op d?
  bool dep_done(int r, int d) const {
    const OpInfo& di = info_[d];
    if (pos_[slot(r, di.stream)] <= di.pos) return false;
    if (active(d)) return true;
    for (int dd : di.deps)
      if (contains(dd, r) && !dep_done(r, dd)) return false;
    return true;
  }
  bool deps_ok(int r, int op) const {
    for (int d : info_[op].deps)
      if (contains(d, r) && !dep_done(r, d)) return false;
    return true;
  }

  void schedule(int r) {
    if (!queued_[r]) {
      queued_[r] = 1;
      queue_.push_back(r);
    }
  }
  void drain() {
    if (draining_) return;
    draining_ = true;
    while (head_ < queue_.size()) {
      const int r = queue_[head_++];
      queued_[r] = 0;
      for (int s = 0; s < ns_; ++s) advance(r, s);
    }
    queue_.clear();
    head_ = 0;
    draining_ = false;
    if (pattern_active_ && ranks_left_ == 0) end_pattern();
  }

  double rel_now() const { return network_.now() - t0_; }

  void touch(int r) {
    Acc& a = acc_[r];
    const double t = rel_now();
    const double dt = t - a.last;
    if (dt > 0) {
      if (a.n_compute > 0) a.compute += dt;
      if (a.n_comm > 0) a.comm += dt;
      if (a.n_comm > 0 && a.n_compute == 0) a.exposed += dt;
      if (a.n_compute > 0 || a.n_comm > 0) a.busy += dt;
    }
    a.last = std::max(a.last, t);
  }

  // Moves stream s of rank r forward until it starts an op that takes time or blocks.
  void advance(int r, int s) {
    const std::size_t k = slot(r, s);
    if (busy_[k] || ended_[k]) return;
    const std::vector<int>& list = stream_ops_[s];
    int& pos = pos_[k];
    while (true) {
      while (pos < static_cast<int>(list.size()) && !contains(list[pos], r)) ++pos;
      if (pos == static_cast<int>(list.size())) {
        ended_[k] = 1;
        if (--streams_left_[r] == 0) --ranks_left_;
        return;
      }
      const int op = list[pos];
      const OpInfo& info = info_[op];
      if (!active(op)) {  // passes through without occupying the stream
        ++pos;
        schedule(r);  // other streams of r may depend on it
        continue;
      }
      if (!deps_ok(r, op)) return;  // re-checked when something of this rank completes
      acc_[r].finish = std::max(acc_[r].finish, rel_now());
      if (info.memory) {
        ++pos;
        schedule(r);  // completed at once; other streams of r may depend on it
        continue;
      }
      busy_[k] = 1;
      if (info.compute) {
        start_compute(r, s, op);
      } else {
        arrive(r, op);
      }
      return;
    }
  }

  // Completion of the op at the head of stream s of rank r.
  void finish_op(int r, int s) {
    const std::size_t k = slot(r, s);
    busy_[k] = 0;
    ++pos_[k];
    acc_[r].finish = std::max(acc_[r].finish, rel_now());
    schedule(r);
  }

  // ---- compute ----
  void start_compute(int r, int s, int op) {
    const Op& o = plan_.ops[op];
    const double seconds = compute_time(plan_, o, r, cluster_);
    flops_ += op_flops(plan_, o, r);
    touch(r);
    ++acc_[r].n_compute;
    if (r < traced_) compute_started_[slot(r, s)] = rel_now();
    network_.compute(r, seconds, kComputeOwner | static_cast<std::uint32_t>(r),
                     static_cast<std::uint64_t>(s));
  }

  void compute_done(int r, int s) {
    touch(r);
    --acc_[r].n_compute;
    const std::size_t k = slot(r, s);
    if (r < traced_)
      trace_.push_back({r, s, stream_ops_[s][pos_[k]], 0, compute_started_[k], rel_now()});
    finish_op(r, s);
  }

  // ---- collectives ----
  int leader_of(int r, const OpInfo& info) const {
    int leader = r;
    for (std::size_t i = 0; i < info.group_dims.size(); ++i)
      leader -= coord(r, info.group_dims[i]) * info.group_stride[i];
    return leader;
  }
  int group_index_of(int r, const OpInfo& info) const {
    int index = 0;
    for (std::size_t i = 0; i < info.group_dims.size(); ++i)
      index = index * info.group_size_of[i] + coord(r, info.group_dims[i]);
    return index;
  }
  std::vector<int> members_of(int leader, const OpInfo& info) const {
    std::vector<int> members(info.group_size);
    const int ng = static_cast<int>(info.group_dims.size());
    for (int idx = 0; idx < info.group_size; ++idx) {
      int rest = idx, rank = leader;
      for (int i = ng - 1; i >= 0; --i) {
        rank += (rest % info.group_size_of[i]) * info.group_stride[i];
        rest /= info.group_size_of[i];
      }
      members[idx] = rank;
    }
    return members;
  }

  void arrive(int r, int op) {
    const OpInfo& info = info_[op];
    const Op& o = plan_.ops[op];
    if (info.pair) {
      const int me = group_index_of(r, info);
      if (me != o.root && me != o.peer) {  // not part of this transfer: passes through
        finish_op(r, info.stream);
        return;
      }
    }
    const int leader = leader_of(r, info);
    const std::int64_t key = static_cast<std::int64_t>(op) * world_ + leader;
    auto [it, inserted] = open_.try_emplace(key, 0u);
    if (inserted) it->second = new_instance(op, leader, info.pair ? 2 : info.group_size);
    const std::uint32_t index = it->second;
    Instance& inst = *instances_[index];
    ++inst.arrived;
    if (r < traced_) inst.traced_arrivals.emplace_back(r, rel_now());
    if (inst.arrived == inst.expected) {
      open_.erase(it);
      start_instance(index);
    }
  }

  std::uint32_t new_instance(int op, int leader, int expected) {
    std::uint32_t index;
    if (!free_instances_.empty()) {
      index = free_instances_.back();
      free_instances_.pop_back();
    } else {
      index = static_cast<std::uint32_t>(instances_.size());
      instances_.push_back(std::make_unique<Instance>());
      instances_.back()->host = std::make_unique<InstanceHost>(*this, index);
    }
    Instance& inst = *instances_[index];
    inst.op = op;
    inst.leader = leader;
    inst.expected = expected;
    inst.arrived = 0;
    inst.traced_arrivals.clear();
    inst.host->reset();
    return index;
  }

  void start_instance(std::uint32_t index) {
    Instance& inst = *instances_[index];
    const Op& o = plan_.ops[inst.op];
    const OpInfo& info = info_[inst.op];
    CollectiveSpec& spec = inst.spec;
    spec = CollectiveSpec{};
    spec.kind = o.kind;
    const std::vector<int> group = members_of(inst.leader, info);
    const int n = static_cast<int>(group.size());
    double bytes = 0;
    switch (o.kind) {
      case OpKind::send:
      case OpKind::recv: {
        spec.members = {group.at(o.root), group.at(o.peer)};
        spec.root = 0;
        spec.peer = 1;
        bytes = static_cast<double>(piece_bytes(plan_, o, spec.members[0]));
        spec.pieces = {bytes, 0};
        break;
      }
      case OpKind::all_gather:
      case OpKind::reduce_scatter:
      case OpKind::gather:
      case OpKind::scatter: {
        spec.members = group;
        spec.root = std::max(0, o.root);
        spec.pieces.resize(n);
        for (int i = 0; i < n; ++i) {
          spec.pieces[i] = static_cast<double>(piece_bytes(plan_, o, group[i]));
          bytes += spec.pieces[i];
        }
        if (o.kind == OpKind::reduce_scatter)
          bytes = static_cast<double>(collective_bytes(plan_, o, inst.leader));
        break;
      }
      case OpKind::all_reduce:
      case OpKind::broadcast: {
        spec.members = group;
        spec.root = std::max(0, o.root);
        bytes = static_cast<double>(piece_bytes(plan_, o, group[0]));
        spec.pieces.assign(n, bytes);
        break;
      }
      case OpKind::all_to_all: {
        spec.members = group;
        spec.a2a.resize(n);
        for (int i = 0; i < n; ++i) {
          const auto sent = bytes_sent(plan_, o, group[i]);
          spec.a2a[i].assign(sent.begin(), sent.end());
        }
        bytes = static_cast<double>(collective_bytes(plan_, o, inst.leader));
        break;
      }
      default:  // barrier
        spec.members = group;
        break;
    }
    inst.bytes = bytes;
    inst.start = rel_now();
    for (int m : spec.members) {
      touch(m);
      ++acc_[m].n_comm;
    }
    inst.algorithm = make_algorithm(spec, *inst.host, options_.lowering);
    inst.algorithm->start();
    if (inst.host->is_finished()) complete_instance(index);
  }

  void complete_instance(std::uint32_t index) {
    Instance& inst = *instances_[index];
    const OpInfo& info = info_[inst.op];
    const double now = rel_now();
    CollectiveMeasurement& m = measured_[inst.op];
    m.op = inst.op;
    m.group_size = static_cast<int>(inst.spec.members.size());
    ++m.instances;
    m.bytes_sum += inst.bytes;
    const double duration = now - inst.start;
    m.time_sum += duration;
    m.time_max = std::max(m.time_max, duration);
    const auto [lo, hi] = std::minmax_element(inst.spec.members.begin(), inst.spec.members.end());
    if (topo_.node_of(*lo) != topo_.node_of(*hi)) m.crosses_nodes = true;
    for (const auto& [r, arrived] : inst.traced_arrivals) {
      if (inst.start > arrived) trace_.push_back({r, info.stream, inst.op, 2, arrived, inst.start});
      trace_.push_back({r, info.stream, inst.op, 1, inst.start, now});
    }
    for (int r : inst.spec.members) {
      touch(r);
      --acc_[r].n_comm;
      finish_op(r, info.stream);
    }
    inst.algorithm.reset();
    free_instances_.push_back(index);
  }

  // ---- step patterns ----
  void begin_pattern(int p) {
    pattern_ = p;
    step_ = patterns_[p].step;
    t0_ = network_.now();
    std::fill(pos_.begin(), pos_.end(), 0);
    std::fill(busy_.begin(), busy_.end(), 0);
    std::fill(ended_.begin(), ended_.end(), 0);
    std::fill(streams_left_.begin(), streams_left_.end(), ns_);
    ranks_left_ = world_;
    std::fill(acc_.begin(), acc_.end(), Acc{});
    for (auto& m : measured_) m = CollectiveMeasurement{};
    flops_ = 0;
    trace_.clear();
    compute_started_.assign(static_cast<std::size_t>(traced_) * ns_, 0.0);
    network_.reset_traffic();
    pattern_active_ = true;
    for (int r = 0; r < world_; ++r) schedule(r);
    drain();
  }

  void end_pattern() {
    pattern_active_ = false;
    StepMeasurement m;
    m.step = patterns_[pattern_].step;
    m.count = patterns_[pattern_].count;
    for (const Acc& a : acc_) m.time_s = std::max(m.time_s, a.finish);
    m.ranks.resize(world_);
    for (int r = 0; r < world_; ++r) {
      touch(r);
      const Acc& a = acc_[r];
      m.ranks[r] = {a.compute, a.comm, a.exposed, std::max(0.0, m.time_s - a.busy), a.finish};
    }
    const TrafficCounters& t = network_.traffic();
    m.bytes_sent = t.sent;
    m.bytes_received = t.received;
    m.intra_node_bytes = t.intra_node_bytes;
    m.network_bytes = t.network_bytes;
    m.flops = flops_;
    std::vector<CollectiveMeasurement> colls;
    for (const auto& c : measured_)
      if (c.instances > 0) colls.push_back(c);
    if (steps_.empty() || m.time_s > worst_time_) {
      worst_time_ = m.time_s;
      worst_trace_ = trace_;
    }
    steps_.push_back(std::move(m));
    collectives_.push_back(std::move(colls));
    if (pattern_ + 1 < static_cast<int>(patterns_.size())) {
      begin_pattern(pattern_ + 1);
    } else {
      pattern_ = static_cast<int>(patterns_.size());
    }
  }

  nlohmann::json make_trace() const {
    if (traced_ == 0) return nullptr;
    nlohmann::json events = nlohmann::json::array();
    const int gpn = topo_.gpus_per_node();
    for (int node = 0; node * gpn < traced_; ++node)
      events.push_back({{"name", "process_name"},
                        {"ph", "M"},
                        {"pid", node},
                        {"args", {{"name", "node " + std::to_string(node)}}}});
    for (int r = 0; r < traced_; ++r)
      for (int s = 0; s < ns_; ++s)
        events.push_back(
            {{"name", "thread_name"},
             {"ph", "M"},
             {"pid", r / gpn},
             {"tid", r * ns_ + s},
             {"args", {{"name", "rank " + std::to_string(r) + " " + stream_name(s)}}}});
    for (const TraceEvent& e : worst_trace_) {
      const Op& op = plan_.ops[e.op];
      const char* cat = e.kind == 0 ? "compute" : e.kind == 1 ? "collective" : "wait";
      events.push_back({{"name", e.kind == 2 ? "wait: " + op.label : op.label},
                        {"cat", cat},
                        {"ph", "X"},
                        {"ts", e.start * 1e6},
                        {"dur", (e.end - e.start) * 1e6},
                        {"pid", e.rank / gpn},
                        {"tid", e.rank * ns_ + e.stream},
                        {"args", {{"op", e.op}, {"kind", std::string(to_string(op.kind))}}}});
    }
    nlohmann::json out;
    out["displayTimeUnit"] = "ms";
    out["otherData"] = {{"step", steps_.empty() ? 0 : step_of_worst()},
                        {"traced_ranks", traced_},
                        {"world_size", world_},
                        {"note", "ranks 0.." + std::to_string(traced_ - 1) +
                                     " of the worst step; pid = node, tid = rank x streams + "
                                     "stream; times in microseconds from the step's start"}};
    out["traceEvents"] = std::move(events);
    return out;
  }
  int step_of_worst() const {
    const StepMeasurement* worst = &steps_.front();
    for (const auto& s : steps_)
      if (s.time_s > worst->time_s) worst = &s;
    return worst->step;
  }

  const StepPlan& plan_;
  const ClusterSpec& cluster_;
  const Topology& topo_;
  const DeviceMesh& mesh_;
  ReplayOptions options_;
  Network network_;

  int world_ = 0, nd_ = 0, ns_ = 1;
  std::vector<int> coords_;
  std::vector<OpInfo> info_;
  std::vector<std::vector<int>> stream_ops_;
  std::vector<StepPatternSpec> patterns_;
  int pattern_ = 0;
  int step_ = 0;
  bool pattern_active_ = false;
  double t0_ = 0;

  std::vector<int> pos_;
  std::vector<char> busy_, ended_;
  std::vector<int> streams_left_;
  int ranks_left_ = 0;
  std::vector<char> queued_;
  std::vector<int> queue_;
  std::size_t head_ = 0;
  bool draining_ = false;
  std::vector<Acc> acc_;

  std::unordered_map<std::int64_t, std::uint32_t> open_;
  std::vector<std::unique_ptr<Instance>> instances_;
  std::vector<std::uint32_t> free_instances_;

  std::vector<CollectiveMeasurement> measured_;
  double flops_ = 0;
  int traced_ = 0;
  std::vector<double> compute_started_;
  std::vector<TraceEvent> trace_, worst_trace_;
  double worst_time_ = 0;

  std::vector<StepMeasurement> steps_;
  std::vector<std::vector<CollectiveMeasurement>> collectives_;
};

void InstanceHost::transfer(int src, int dst, double bytes, std::uint64_t tag) {
  replay_.network().transfer(src, dst, bytes, index_, tag);
}
void InstanceHost::account(int src, int dst, double bytes) {
  replay_.network().account(src, dst, bytes);
}
void InstanceHost::delay(double seconds, std::uint64_t tag) {
  replay_.network().delay(seconds, index_, tag);
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
