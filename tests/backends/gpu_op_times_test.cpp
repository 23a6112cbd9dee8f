// The op-time summary of a timed GPU step (backends/gpu/op_times.hpp), on the host: op times made
// up for a real rank program, checked against sums written out here op by op, a hand-computed
// union of overlapping intervals, and the Newton-Schulz groups against the executor's batches.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <tuple>

#include "backends/gpu/layout.hpp"
#include "backends/gpu/op_times.hpp"
#include "core/base/errors.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

namespace {

StepPlan owner_plan() {
  const auto topologies = testing::topologies();
  const ShardedModel sharded = testing::make_model(topologies[1]);  // FSDP
  StrategyOptions options;
  options.name = "owner";
  return build_plan(sharded, options, PlanSettings{});
}

// Op k of the program (program order) runs from 10 k to 10 k + (k % 7) + 1 ms on its stream.
std::vector<gpu::DeviceOpTime> made_up_times(const StepPlan& plan, const RankProgram& program) {
  std::vector<gpu::DeviceOpTime> out;
  for (std::size_t k = 0; k < program.ops.size(); ++k) {
    const int op = program.ops[k].op;
    const double start = 10.0 * static_cast<double>(k);
    out.push_back({op, plan.ops.at(static_cast<std::size_t>(op)).stream, start,
                   start + static_cast<double>(k % 7) + 1});
  }
  return out;
}

}  // namespace

TEST_CASE("op times: per stream, per kind and per NS group, against op-by-op sums",
          "[gpu-op-times]") {
  const StepPlan plan = owner_plan();
  const RankProgram program = lower_rank_program(plan, 0);
  const std::vector<gpu::DeviceOpTime> times = made_up_times(plan, program);
  REQUIRE(times.size() > 4);
  const gpu::OpTimeSummary s = gpu::summarize_op_times(plan, program, times);

  // The references, op by op (the made-up ops never overlap: busy = sum).
  std::map<std::pair<std::string, std::string>, std::pair<int, double>> kind_ref;
  std::map<std::string, double> stream_ref;
  int ns_ops = 0;
  double ns_ms = 0;
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> ns_shapes;
  for (std::size_t k = 0; k < program.ops.size(); ++k) {
    const RankOp& op = program.ops[k];
    const std::string stream = plan.streams.at(static_cast<std::size_t>(times[k].stream));
    const double ms = static_cast<double>(k % 7) + 1;
    auto& [n, sum] = kind_ref[{stream, std::string(to_string(op.kind))}];
    ++n;
    sum += ms;
    stream_ref[stream] += ms;
    if (op.kind == OpKind::newton_schulz) {
      ++ns_ops;
      ns_ms += ms;
      for (const gpu::NsBatch& b : gpu::ns_batches(op)) ns_shapes.insert({b.batch, b.rows, b.cols});
    }
  }
  REQUIRE(ns_ops > 0);

  CHECK(s.ops_timed == static_cast<int>(times.size()));
  CHECK(s.ops_dropped == 0);
  CHECK(s.window_ms == Approx(10.0 * static_cast<double>(times.size() - 1) +
                              static_cast<double>((times.size() - 1) % 7) + 1));
  REQUIRE(s.kinds.size() == kind_ref.size());
  for (const gpu::KindTimeSummary& k : s.kinds) {
    INFO(k.stream << " " << k.kind);
    const auto& [n, sum] = kind_ref.at({k.stream, k.kind});
    CHECK(k.ops == n);
    CHECK(k.ms == Approx(sum));
    CHECK(k.max_ms <= 7);
  }
  REQUIRE(s.streams.size() == stream_ref.size());
  for (const gpu::StreamTimeSummary& st : s.streams)
    CHECK(st.busy_ms == Approx(stream_ref.at(st.stream)));
  // Kinds come grouped by stream, in the plan's stream order, longest first within a stream.
  for (std::size_t i = 1; i < s.kinds.size(); ++i) {
    const auto index = [&](const std::string& name) {
      return std::find(plan.streams.begin(), plan.streams.end(), name) - plan.streams.begin();
    };
    CHECK(index(s.kinds[i - 1].stream) <= index(s.kinds[i].stream));
    if (s.kinds[i - 1].stream == s.kinds[i].stream) CHECK(s.kinds[i - 1].ms >= s.kinds[i].ms);
  }

  // NS groups: every NS op in exactly one group, each group's calls the executor's batches.
  int grouped = 0;
  double grouped_ms = 0;
  for (const gpu::NsGroupSummary& g : s.ns) {
    grouped += g.ops;
    grouped_ms += g.ms;
    CHECK_FALSE(g.calls.empty());
  }
  CHECK(grouped == ns_ops);
  CHECK(grouped_ms == Approx(ns_ms));
  const std::vector<MatrixShape> shapes = s.ns_call_shapes();
  CHECK(shapes.size() == ns_shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    CHECK(ns_shapes.count({shapes[i].batch, shapes[i].rows, shapes[i].cols}) == 1);
    if (i > 0) CHECK(shapes[i - 1].numel() >= shapes[i].numel());
  }
}

TEST_CASE("op times: a hand-made case of overlaps, stale events and bad ops", "[gpu-op-times]") {
  const StepPlan plan = owner_plan();
  const RankProgram program = lower_rank_program(plan, 0);
  REQUIRE(program.ops.size() >= 4);
  const int a = program.ops[0].op, b = program.ops[1].op, c = program.ops[2].op,
            d = program.ops[3].op;
  // Three intervals on stream 0: [0, 2] and [1, 3] overlap (union 3), [5, 6] (1): busy 4 over a
  // window of 6; one op with events from another step (start before the step's start).
  const std::vector<gpu::DeviceOpTime> times = {
      {a, 0, 0, 2}, {b, 0, 1, 3}, {c, 0, 5, 6}, {d, 0, -4, -1}};
  const gpu::OpTimeSummary s = gpu::summarize_op_times(plan, program, times);
  CHECK(s.ops_timed == 3);
  CHECK(s.ops_dropped == 1);
  CHECK(s.window_ms == Approx(6));
  REQUIRE(s.streams.size() == 1);
  CHECK(s.streams[0].busy_ms == Approx(4));
  CHECK(s.streams[0].first_ms == Approx(0));
  CHECK(s.streams[0].last_ms == Approx(6));
  CHECK(s.streams[0].ops == 3);

  // An op the rank has no part in, and a stream the plan lacks, are refused by name.
  int foreign = -1;
  for (std::size_t op = 0; op < plan.ops.size() && foreign < 0; ++op)
    if (program.find(static_cast<int>(op)) == nullptr) foreign = static_cast<int>(op);
  if (foreign >= 0)
    CHECK_THROWS_WITH(gpu::summarize_op_times(plan, program, {{foreign, 0, 0, 1}}),
                      Catch::Contains("has no part in it"));
  CHECK_THROWS_WITH(
      gpu::summarize_op_times(plan, program, {{a, static_cast<int>(plan.streams.size()), 0, 1}}),
      Catch::Contains("is not one of the plan's"));
}
