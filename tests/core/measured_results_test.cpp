// The keys only measured backends write (core/results/results.hpp): step statistics over the timed
// steps and the execution block. They round-trip through JSON, and records without them (analytic,
// simulated, older files) neither write nor need them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/experiment/experiment.hpp"
#include "core/results/results.hpp"
#include "core/results/run_point.hpp"
#include "muonbed/config.hpp"
#include "tests/common/tiny_experiment.hpp"

using namespace muonbed;

namespace {

ResultRecord analytic_tiny() {
  return run_point(testing::tiny_point("measured", "local-cpu", 2, "analytic"), "analytic").record;
}

}  // namespace

TEST_CASE("step statistics: median, nearest-rank p95, population stddev, min", "[results]") {
  const StepStatistics s = step_statistics({4, 1, 3, 2, 10}, 2);  // mean 4
  CHECK(s.warmup_steps == 2);
  CHECK(s.timed_steps == 5);
  CHECK(s.median_s == 3);
  CHECK(s.p95_s == 10);  // ceil(0.95 * 5) = 5th of 5
  CHECK(s.min_s == 1);
  CHECK(s.stddev_s == Approx(std::sqrt((0 + 9 + 1 + 4 + 36) / 5.0)));
  const StepStatistics even = step_statistics({1, 2, 3, 4}, 0);
  CHECK(even.median_s == 2.5);
  CHECK(even.p95_s == 4);
  std::vector<double> twenty;
  for (int i = 1; i <= 20; ++i) twenty.push_back(i);
  CHECK(step_statistics(twenty, 0).p95_s == 19);  // ceil(0.95 * 20) = 19th
  CHECK(step_statistics({}, 1).timed_steps == 0);
}

TEST_CASE("measured keys round-trip and stay out of other records", "[results]") {
  ResultRecord r = analytic_tiny();
  const std::string plain = result_to_json(r);
  CHECK(plain.find("timed_steps") == std::string::npos);
  CHECK(plain.find("\"execution\"") == std::string::npos);
  CHECK(plain.find("measured_peak_bytes") == std::string::npos);  // nothing measured
  REQUIRE(r.ranks.size() == 2);
  CHECK(result_from_json(plain).ranks[1].memory.measured_peak_bytes == -1);
  CHECK(result_to_json(result_from_json(plain)) == plain);
  // The deterministic backends say that the measured backends' settings do not apply to them.
  CHECK(std::find(r.notes.begin(), r.notes.end(), std::string(kDeterministicNote)) !=
        r.notes.end());

  r.backend = "mpi";
  r.step.measured = step_statistics({0.5, 0.25, 0.75}, 2);
  r.execution.library = "Open MPI v4.1.4";
  r.execution.mpi_standard = "MPI 3.1";
  r.execution.launcher = "mpirun";
  r.execution.hosts = {"a", "b"};
  r.execution.ranks_per_host = {1, 1};
  r.execution.blas = "OpenBLAS 0.3.21";
  r.execution.blas_threads = 1;
  r.execution.compute_threads = 1;
  r.execution.engine_s = 0.001;
  r.execution.overhead_fraction = 0.01;
  const std::string without_probe = result_to_json(r);
  CHECK(without_probe.find("speed_probe") == std::string::npos);  // not taken: absent
  CHECK_FALSE(result_from_json(without_probe).execution.has_speed_probe());
  // The executor pool's peak per rank, beside rank_memory's figures.
  r.ranks[0].memory.measured_peak_bytes = 123456789012;
  r.ranks[1].memory.measured_peak_bytes = 0;
  r.execution.probe_shape = {1, 192, 688};
  r.execution.probe_predicted_s = 0.006;
  r.execution.probe_before_s = 0.0115;
  r.execution.probe_after_s = 0.0112;
  const std::string text = result_to_json(r);
  CHECK(text.find("\"median_s\": 0.5") != std::string::npos);
  const ResultRecord back = result_from_json(text);
  CHECK(back.execution.has_speed_probe());
  CHECK(back.execution.probe_shape == std::vector<std::int64_t>{1, 192, 688});
  CHECK(back.execution.probe_predicted_s == 0.006);
  CHECK(back.execution.probe_before_s == 0.0115);
  CHECK(back.execution.probe_after_s == 0.0112);
  CHECK(back.step.measured.timed_steps == 3);
  CHECK(back.step.measured.warmup_steps == 2);
  CHECK(back.execution.hosts == std::vector<std::string>{"a", "b"});
  CHECK(back.execution.ranks_per_host == std::vector<int>{1, 1});
  CHECK(back.ranks[0].memory.measured_peak_bytes == 123456789012);
  CHECK(back.ranks[1].memory.measured_peak_bytes == 0);
  CHECK(back.ranks[1].memory.peak_bytes == r.ranks[1].memory.peak_bytes);
  CHECK(result_to_json(back) == text);
}
