#include "backends/gpu/op_times.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "backends/gpu/layout.hpp"
#include "core/base/errors.hpp"

namespace muonbed::gpu {
namespace {

// The union of intervals: sorted by start, overlapping ones merged.
double union_ms(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0, begin = 0, end = 0;
  bool open = false;
  for (const auto& [a, b] : intervals) {
    if (open && a <= end) {
      end = std::max(end, b);
      continue;
    }
    if (open) total += end - begin;
    begin = a;
    end = b;
    open = true;
  }
  if (open) total += end - begin;
  return total;
}

auto shape_key(const MatrixShape& s) {
  return std::make_tuple(s.batch, s.rows, s.cols);
}

}  // namespace

std::vector<MatrixShape> OpTimeSummary::ns_call_shapes() const {
  std::vector<MatrixShape> out;
  for (const NsGroupSummary& g : ns)
    for (const MatrixShape& s : g.calls)
      if (std::none_of(out.begin(), out.end(),
                       [&](const MatrixShape& o) { return shape_key(o) == shape_key(s); }))
        out.push_back(s);
  std::sort(out.begin(), out.end(), [](const MatrixShape& a, const MatrixShape& b) {
    return std::make_tuple(a.numel(), a.rows, a.cols) > std::make_tuple(b.numel(), b.rows, b.cols);
  });
  return out;
}

OpTimeSummary summarize_op_times(const StepPlan& plan, const RankProgram& program,
                                 const std::vector<DeviceOpTime>& times) {
  OpTimeSummary out;
  std::map<int, std::vector<std::pair<double, double>>> by_stream;
  std::map<std::pair<int, OpKind>, KindTimeSummary> by_kind;
  std::vector<std::pair<std::vector<MatrixShape>, NsGroupSummary>> groups;
  double first = 0, last = 0;
  for (const DeviceOpTime& t : times) {
    const RankOp* op = program.find(t.op);
    if (op == nullptr)
      throw ExecutionError("op time of plan op " + std::to_string(t.op) + ": rank " +
                           std::to_string(program.rank) + " has no part in it");
    if (t.stream < 0 || t.stream >= static_cast<int>(plan.streams.size()))
      throw ExecutionError("op time of plan op " + std::to_string(t.op) + ": stream " +
                           std::to_string(t.stream) + " is not one of the plan's " +
                           std::to_string(plan.streams.size()));
    // Events left from another step (an op inactive in this one) are not this step's work.
    if (t.start_ms < 0 || t.end_ms < t.start_ms) {
      ++out.ops_dropped;
      continue;
    }
    const double ms = t.end_ms - t.start_ms;
    first = out.ops_timed == 0 ? t.start_ms : std::min(first, t.start_ms);
    last = out.ops_timed == 0 ? t.end_ms : std::max(last, t.end_ms);
    ++out.ops_timed;
    by_stream[t.stream].emplace_back(t.start_ms, t.end_ms);
    KindTimeSummary& k = by_kind[{t.stream, op->kind}];
    if (k.ops == 0) {
      k.stream = plan.streams[static_cast<std::size_t>(t.stream)];
      k.kind = std::string(to_string(op->kind));
    }
    ++k.ops;
    k.ms += ms;
    k.max_ms = std::max(k.max_ms, ms);
    if (op->kind != OpKind::newton_schulz) continue;
    std::vector<MatrixShape> calls;
    for (const NsBatch& b : ns_batches(*op)) calls.push_back({b.batch, b.rows, b.cols});
    auto same = [&](const auto& g) {
      return std::equal(
          g.first.begin(), g.first.end(), calls.begin(), calls.end(),
          [](const MatrixShape& a, const MatrixShape& b) { return shape_key(a) == shape_key(b); });
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end()) {
      groups.push_back({calls, NsGroupSummary{calls, 0, 0}});
      it = groups.end() - 1;
    }
    ++it->second.ops;
    it->second.ms += ms;
  }
  out.window_ms = last - first;
  for (auto& [stream, intervals] : by_stream) {
    StreamTimeSummary s;
    s.stream = plan.streams[static_cast<std::size_t>(stream)];
    s.ops = static_cast<int>(intervals.size());
    s.first_ms = std::min_element(intervals.begin(), intervals.end())->first;
    s.last_ms = 0;
    for (const auto& iv : intervals) s.last_ms = std::max(s.last_ms, iv.second);
    s.busy_ms = union_ms(std::move(intervals));
    out.streams.push_back(std::move(s));
  }
  // By stream (plan order), then longest first.
  std::vector<std::pair<int, KindTimeSummary>> kinds;
  for (auto& [key, k] : by_kind) kinds.emplace_back(key.first, std::move(k));
  std::stable_sort(kinds.begin(), kinds.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.ms > b.second.ms;
  });
  for (auto& [stream, k] : kinds) out.kinds.push_back(std::move(k));
  for (auto& g : groups) out.ns.push_back(std::move(g.second));
  std::stable_sort(out.ns.begin(), out.ns.end(),
                   [](const NsGroupSummary& a, const NsGroupSummary& b) { return a.ms > b.ms; });
  return out;
}

}  // namespace muonbed::gpu
