// Step timeline accounting and Chrome traces (see core/engine/timeline.hpp).
#include "core/engine/timeline.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

namespace {

// Chrome traces run to a hundred megabytes (a training step's 64 traced ranks): they are written
// as text, with no JSON document in between (building one took seconds and ten times the
// memory). Strings are escaped by nlohmann-json, each op's label once; numbers take the shortest
// form that reads back as the same double.
void put_string(std::string& out, const std::string& text) {
  out += nlohmann::json(text).dump();
}

void put_number(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";  // what JSON allows; a trace time is never infinite
    return;
  }
  char buffer[32];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, ec == std::errc() ? end : buffer);
}

void put_number(std::string& out, long long value) {
  char buffer[24];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, ec == std::errc() ? end : buffer);
}

}  // namespace

std::string chrome_trace(const StepPlan& plan, const std::vector<TraceEvent>& events,
                         int traced_ranks, int gpus_per_node, int step, const std::string& note) {
  if (traced_ranks <= 0) return {};
  const int gpn = std::max(1, gpus_per_node);
  const int ns = std::max<int>(1, static_cast<int>(plan.streams.size()));
  const auto stream_name = [&](int s) {
    return s < static_cast<int>(plan.streams.size()) ? plan.streams[s] : std::to_string(s);
  };
  std::string out;
  // Room for the whole text at once (growing a 100 MB string copied it and touched its pages
  // twice): an event's fixed fields and numbers take under 168 bytes, plus its label.
  std::size_t room = 256 + static_cast<std::size_t>(traced_ranks) * ns * 96;
  for (const TraceEvent& e : events) room += 168 + plan.ops.at(e.op).label.size();
  out.reserve(room);
  out += "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"note\":";
  put_string(out, note);
  out += ",\"step\":";
  put_number(out, static_cast<long long>(step));
  out += ",\"traced_ranks\":";
  put_number(out, static_cast<long long>(traced_ranks));
  out += ",\"world_size\":";
  put_number(out, static_cast<long long>(plan.mesh().world_size()));
  out += "},\"traceEvents\":[";
  bool first = true;
  const auto next_event = [&]() {
    if (!first) out += ',';
    first = false;
  };
  for (int node = 0; node * gpn < traced_ranks; ++node) {
    next_event();
    out += "{\"args\":{\"name\":";
    put_string(out, "node " + std::to_string(node));
    out += "},\"name\":\"process_name\",\"ph\":\"M\",\"pid\":";
    put_number(out, static_cast<long long>(node));
    out += '}';
  }
  for (int r = 0; r < traced_ranks; ++r)
    for (int s = 0; s < ns; ++s) {
      next_event();
      out += "{\"args\":{\"name\":";
      put_string(out, "rank " + std::to_string(r) + " " + stream_name(s));
      out += "},\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":";
      put_number(out, static_cast<long long>(r / gpn));
      out += ",\"tid\":";
      put_number(out, static_cast<long long>(r) * ns + s);
      out += '}';
    }
  // Per op, its label and kind escaped (and the wait's label), made when first traced.
  std::vector<std::string> label_of(plan.ops.size()), wait_label_of(plan.ops.size()),
      kind_of(plan.ops.size());
  for (const TraceEvent& e : events) {
    const Op& op = plan.ops.at(e.op);
    std::string& kind = kind_of[e.op];
    if (kind.empty()) {
      kind = nlohmann::json(std::string(to_string(op.kind))).dump();
      label_of[e.op] = nlohmann::json(op.label).dump();
      wait_label_of[e.op] = nlohmann::json("wait: " + op.label).dump();
    }
    const char* cat = e.kind == TraceKind::compute      ? "compute"
                      : e.kind == TraceKind::collective ? "collective"
                                                        : "wait";
    next_event();
    out += "{\"args\":{\"kind\":";
    out += kind;
    out += ",\"op\":";
    put_number(out, static_cast<long long>(e.op));
    out += "},\"cat\":\"";
    out += cat;
    out += "\",\"dur\":";
    put_number(out, (e.end - e.start) * 1e6);
    out += ",\"name\":";
    out += e.kind == TraceKind::wait ? wait_label_of[e.op] : label_of[e.op];
    out += ",\"ph\":\"X\",\"pid\":";
    put_number(out, static_cast<long long>(e.rank / gpn));
    out += ",\"tid\":";
    put_number(out, static_cast<long long>(e.rank) * ns + e.stream);
    out += ",\"ts\":";
    put_number(out, e.start * 1e6);
    out += '}';
  }
  out += "]}\n";
  return out;
}

}  // namespace muonbed
