// The record of a measured run built from every rank's op intervals (backends/ranks/record.hpp),
// on the host without MPI: the shape of the CUDA loopback's timings (every rank on one clock, one
// host, no cores of their own), checked against a hand-made case.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "backends/ranks/record.hpp"
#include "core/plan/program.hpp"
#include "core/results/results.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

namespace {

StepPlan two_rank_owner_plan() {
  const ShardedModel sharded = testing::make_model(testing::topologies()[1]);  // FSDP
  StrategyOptions options;
  options.name = "owner";
  return build_plan(sharded, options, PlanSettings{});
}

// Rank r's ops of a step one after another, op k of its program from k ms to k + 1 ms, shifted
// by `late` seconds; the rank finishes at its last op's end.
mpi::StepTimings timings(const StepPlan& plan, int r, int step, double late) {
  const RankProgram program = lower_rank_program(plan, r);
  mpi::StepTimings st;
  st.step = step;
  for (std::size_t k = 0; k < program.ops.size(); ++k) {
    const double start = late + 1e-3 * static_cast<double>(k);
    st.ops.push_back({program.ops[k].op, start, start + 1e-3});
    st.finish = std::max(st.finish, start + 1e-3);
  }
  st.bytes_sent = 1000.0 * (r + 1);
  st.intra_host_bytes = st.bytes_sent;
  st.handlers_s = 2e-3;
  return st;
}

}  // namespace

TEST_CASE("a measured record from one-clock timings: steps, notes, placement", "[record]") {
  const StepPlan plan = two_rank_owner_plan();
  const int world = plan.mesh().world_size();
  REQUIRE(world >= 2);
  // Three timed steps; rank 1 runs 4, 1 and 2 ms late: the step is its finish.
  const double lates[] = {4e-3, 1e-3, 2e-3};
  std::vector<std::vector<mpi::StepTimings>> ranks(static_cast<std::size_t>(world));
  for (int i = 0; i < 3; ++i)
    for (int r = 0; r < world; ++r)
      ranks[static_cast<std::size_t>(r)].push_back(timings(plan, r, 2 + i, r == 1 ? lates[i] : 0));
  double longest = 0;
  for (int r = 0; r < world; ++r)
    longest =
        std::max(longest, ranks[static_cast<std::size_t>(r)][0].finish - (r == 1 ? lates[0] : 0));

  mpi::MeasureSettings settings;
  settings.warmup_steps = 2;
  settings.timed_steps = 3;
  settings.backend = "cuda_loopback";
  settings.step_clock = "on the one GPU's clock";
  settings.notes = {"cuda_loopback: every rank on one GPU"};
  mpi::RanksPlacement placement;
  placement.host_of.assign(static_cast<std::size_t>(world), 0);
  placement.hosts = {"gpu-host"};
  placement.cores_of_host = {world};
  ExecutionInfo execution;
  execution.library = "NVIDIA H200";
  const mpi::Measured m = mpi::measured_record(plan, ranks, placement, settings, execution);
  const ResultRecord& r = m.record;
  CHECK(r.backend == "cuda_loopback");
  CHECK(r.fidelity == "measured");
  CHECK(r.execution.library == "NVIDIA H200");
  CHECK(r.execution.mpi_standard.empty());
  CHECK_FALSE(r.execution.oversubscribed);
  CHECK(r.setup.nodes == 1);
  // Steps: the slowest rank's finish, each step (rank 1 late by 4, 1, 2 ms).
  REQUIRE(m.step_times_s.size() == 3);
  for (int i = 0; i < 3; ++i)
    CHECK(m.step_times_s[static_cast<std::size_t>(i)] == Approx(longest + lates[i]));
  CHECK(r.step.measured.timed_steps == 3);
  CHECK(r.step.measured.median_s == Approx(longest + 2e-3));
  CHECK(r.step.worst_s == Approx(longest + 4e-3));
  const auto has_note = [&](const std::string& text) {
    return std::any_of(r.notes.begin(), r.notes.end(),
                       [&](const std::string& n) { return n.find(text) != std::string::npos; });
  };
  CHECK(has_note("a step's time is its slowest rank's, on the one GPU's clock"));
  CHECK(has_note("cuda_loopback: every rank on one GPU"));
  CHECK_FALSE(has_note("oversubscribed"));
  // The overhead fraction: the issuing thread's 2 ms over the average step.
  CHECK(r.execution.overhead_fraction == Approx(2e-3 / r.step.average_s));

  // The record is one the results reader takes back (its checks of a measured record).
  const ResultRecord back = result_from_json(result_to_json(r));
  CHECK(back.backend == "cuda_loopback");
  CHECK(back.step.measured.median_s == Approx(r.step.measured.median_s));

  // The same ranks given one core: said out loud.
  placement.cores_of_host = {1};
  const mpi::Measured crowded = mpi::measured_record(plan, ranks, placement, settings, execution);
  CHECK(crowded.record.execution.oversubscribed);
  CHECK(std::any_of(crowded.record.notes.begin(), crowded.record.notes.end(),
                    [](const std::string& n) { return n.find("warning: oversubscribed") == 0; }));
}
