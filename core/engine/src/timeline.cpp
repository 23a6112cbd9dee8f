// Step timeline accounting and Chrome traces (see core/engine/timeline.hpp).
#include "core/engine/timeline.hpp"

#include <algorithm>

#include "core/base/errors.hpp"

namespace muonbed {

StepTimeline::StepTimeline(int world_size, int num_ops, int traced_ranks)
    : world_(world_size), traced_(std::clamp(traced_ranks, 0, world_size)) {
  ranks_.resize(static_cast<std::size_t>(world_));
  collectives_.resize(static_cast<std::size_t>(num_ops));
}

void StepTimeline::begin_step() {
  std::fill(ranks_.begin(), ranks_.end(), RankAccount{});
  std::fill(collectives_.begin(), collectives_.end(), CollectiveMeasurement{});
  events_.clear();
  flops_ = 0;
}

// Adds the time since the rank's last event to the classes active over it.
void StepTimeline::touch(int rank, double t) {
  RankAccount& a = ranks_[rank];
  const double dt = t - a.last;
  if (dt > 0) {
    if (a.n_compute > 0) a.compute += dt;
    if (a.n_comm > 0) a.comm += dt;
    if (a.n_comm > 0 && a.n_compute == 0) a.exposed += dt;
    if (a.n_compute > 0 || a.n_comm > 0) a.busy += dt;
    for (int p = 0; p < kStepPhases; ++p)
      if (a.n_phase[p] > 0) a.phase_busy[p] += dt;
  }
  a.last = std::max(a.last, t);
}

void StepTimeline::track_phases(const StepPlan& plan) {
  phase_of_op_.clear();
  for (const Op& op : plan.ops) phase_of_op_.push_back(static_cast<int>(step_phase(op)));
}

void StepTimeline::begin(int rank, Activity activity, double t, int op) {
  touch(rank, t);
  ++(activity == Activity::compute ? ranks_[rank].n_compute : ranks_[rank].n_comm);
  if (op >= 0 && op < static_cast<int>(phase_of_op_.size()))
    ++ranks_[rank].n_phase[phase_of_op_[op]];
}

void StepTimeline::end(int rank, Activity activity, double t, int op) {
  touch(rank, t);
  int& n = activity == Activity::compute ? ranks_[rank].n_compute : ranks_[rank].n_comm;
  if (n <= 0)
    throw Error("timeline: rank " + std::to_string(rank) + " ends an activity it never began");
  --n;
  if (op >= 0 && op < static_cast<int>(phase_of_op_.size())) {
    RankAccount& a = ranks_[rank];
    const int p = phase_of_op_[op];
    if (a.n_phase[p] > 0) --a.n_phase[p];
    a.phase_end[p] = std::max(a.phase_end[p], t);
  }
}

void StepTimeline::touch_finish(int rank, double t) {
  ranks_[rank].finish = std::max(ranks_[rank].finish, t);
}

void StepTimeline::trace(const TraceEvent& event) {
  if (event.rank < traced_) events_.push_back(event);
}

void StepTimeline::collective(int op, int group_size, double bytes, double duration,
                              bool crosses_nodes) {
  CollectiveMeasurement& m = collectives_.at(op);
  m.op = op;
  m.group_size = group_size;
  ++m.instances;
  m.bytes_sum += bytes;
  m.time_sum += duration;
  m.time_max = std::max(m.time_max, duration);
  if (crosses_nodes) m.crosses_nodes = true;
}

StepMeasurement StepTimeline::measurement(int step, int count) {
  StepMeasurement m;
  m.step = step;
  m.count = count;
  for (const RankAccount& a : ranks_) m.time_s = std::max(m.time_s, a.finish);
  m.ranks.resize(static_cast<std::size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    touch(r, ranks_[r].last);  // nothing is open at the end of a step
    const RankAccount& a = ranks_[r];
    m.ranks[r] = {a.compute, a.comm, a.exposed, std::max(0.0, m.time_s - a.busy), a.finish};
  }
  if (!phase_of_op_.empty()) {
    m.phase_busy_s.resize(static_cast<std::size_t>(world_));
    m.phase_end_s.resize(static_cast<std::size_t>(world_));
    for (int r = 0; r < world_; ++r) {
      m.phase_busy_s[r] = ranks_[r].phase_busy;
      m.phase_end_s[r] = ranks_[r].phase_end;
    }
  }
  m.flops = flops_;
  return m;
}

std::vector<CollectiveMeasurement> StepTimeline::collectives() const {
  std::vector<CollectiveMeasurement> out;
  for (const CollectiveMeasurement& c : collectives_)
    if (c.instances > 0) out.push_back(c);
  return out;
}

nlohmann::json chrome_trace(const StepPlan& plan, const std::vector<TraceEvent>& events,
                            int traced_ranks, int gpus_per_node, int step,
                            const std::string& note) {
  if (traced_ranks <= 0) return nullptr;
  const int gpn = std::max(1, gpus_per_node);
  const int ns = std::max<int>(1, static_cast<int>(plan.streams.size()));
  const auto stream_name = [&](int s) {
    return s < static_cast<int>(plan.streams.size()) ? plan.streams[s] : std::to_string(s);
  };
  nlohmann::json out_events = nlohmann::json::array();
  for (int node = 0; node * gpn < traced_ranks; ++node)
    out_events.push_back({{"name", "process_name"},
                          {"ph", "M"},
                          {"pid", node},
                          {"args", {{"name", "node " + std::to_string(node)}}}});
  for (int r = 0; r < traced_ranks; ++r)
    for (int s = 0; s < ns; ++s)
      out_events.push_back(
          {{"name", "thread_name"},
           {"ph", "M"},
           {"pid", r / gpn},
           {"tid", r * ns + s},
           {"args", {{"name", "rank " + std::to_string(r) + " " + stream_name(s)}}}});
  for (const TraceEvent& e : events) {
    const Op& op = plan.ops.at(e.op);
    const char* cat = e.kind == TraceKind::compute      ? "compute"
                      : e.kind == TraceKind::collective ? "collective"
                                                        : "wait";
    out_events.push_back({{"name", e.kind == TraceKind::wait ? "wait: " + op.label : op.label},
                          {"cat", cat},
                          {"ph", "X"},
                          {"ts", e.start * 1e6},
                          {"dur", (e.end - e.start) * 1e6},
                          {"pid", e.rank / gpn},
                          {"tid", e.rank * ns + e.stream},
                          {"args", {{"op", e.op}, {"kind", std::string(to_string(op.kind))}}}});
  }
  nlohmann::json out;
  out["displayTimeUnit"] = "ms";
  out["otherData"] = {{"step", step},
                      {"traced_ranks", traced_ranks},
                      {"world_size", plan.mesh().world_size()},
                      {"note", note}};
  out["traceEvents"] = std::move(out_events);
  return out;
}

}  // namespace muonbed
