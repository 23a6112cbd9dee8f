// The backend registry and the point runner of core/results/run_point.hpp: analytic is built in,
// other backends are registered by name (again: replaced), unknown names are an error that lists
// the registered ones, and run_point writes what the backend returned.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/base/errors.hpp"
#include "core/experiment/backends.hpp"
#include "core/experiment/experiment.hpp"
#include "core/results/run_point.hpp"
#include "muonbed/config.hpp"
#include "tests/common/temp_dir.hpp"
#include "tests/common/tiny_experiment.hpp"

using namespace muonbed;

namespace {

Experiment tiny_point() {
  return testing::tiny_point("registry", "dgx-h100", 4, "analytic", "strategy: {name: owner}\n");
}

PointRun fake_run(const Experiment& experiment, const StepPlan& plan, const RunSettings& s) {
  PointRun run;
  run.record = analytic_record(plan, experiment.cluster);
  run.record.backend = "fake";
  run.record.provenance = make_provenance(&experiment, "");
  run.trace = nlohmann::json{{"traced_ranks", s.trace_max_ranks}}.dump();
  return run;
}

}  // namespace

TEST_CASE("a registration carries its backend's facts, checked against the shipped table",
          "[run_point]") {
  // A backend the table does not know becomes known by registering: experiments may name it,
  // and whether it measures is what it registered.
  CHECK(backend_facts("measured-double") == nullptr);
  register_backend(
      {{.name = "measured-double", .description = "a measured test double", .measures = true},
       &fake_run});
  REQUIRE(backend_facts("measured-double") != nullptr);
  CHECK(is_measured_backend("measured-double"));
  const std::vector<std::string> known = known_backend_names();
  CHECK(std::vector<std::string>(known.begin(), known.begin() + 4) ==
        std::vector<std::string>{"sim", "analytic", "mpi", "nccl"});
  CHECK(std::count(known.begin(), known.end(), "measured-double") == 1);
  // Registering it again with other facts replaces them (no second entry).
  register_backend({{.name = "measured-double", .description = "now predicted"}, &fake_run});
  CHECK(!is_measured_backend("measured-double"));
  const std::vector<std::string> again = known_backend_names();
  CHECK(std::count(again.begin(), again.end(), "measured-double") == 1);

  // A shipped name registers the table's entry; other facts for it are refused, naming both.
  BackendFacts wrong = *backend_facts("mpi");
  wrong.measures = false;
  CHECK_THROWS_WITH(register_backend({wrong, &fake_run}),
                    Catch::Contains("backend 'mpi' registers the facts") &&
                        Catch::Contains("predicted") && Catch::Contains("measured") &&
                        Catch::Contains("core/experiment/src/backends.cpp"));
  const BackendInfo* mpi = find_backend("mpi");  // the refused registration left nothing behind
  CHECK((mpi == nullptr || mpi->facts == *backend_facts("mpi")));
  CHECK(is_measured_backend("mpi"));
}

TEST_CASE("analytic is built in; other backends are registered by name", "[run_point]") {
  REQUIRE(find_backend("analytic") != nullptr);
  CHECK(registered_backends().front() == "analytic");
  CHECK(find_backend("no-such-backend") == nullptr);

  const Experiment e = tiny_point();
  const PointRun analytic = run_point(e, "analytic");
  CHECK(analytic.record.backend == "analytic");
  CHECK(!analytic.record.timestamp.empty());
  CHECK(analytic.record.provenance.experiment == "registry");
  CHECK(analytic.trace.empty());
  CHECK_THROWS_AS(run_point(e, "no-such-backend"), Error);
  CHECK_THROWS_WITH(run_point(e, "no-such-backend"), Catch::Contains("analytic"));

  register_backend({{.name = "fake", .description = "a test double"}, &fake_run});
  register_backend({{.name = "fake", .description = "registered twice"}, &fake_run});
  const auto names = registered_backends();
  CHECK(std::count(names.begin(), names.end(), "fake") == 1);
  CHECK(find_backend("fake")->facts.description == "registered twice");
  CHECK_THROWS_AS(register_backend({{.name = "broken", .description = "no run function"}, nullptr}),
                  Error);

  RunSettings settings;
  settings.trace_max_ranks = 3;
  Experiment out = e;
  // A folder of its own (two build trees or ctest jobs never share it), removed at the end.
  const testing::TempDir scratch("run-point");
  const std::filesystem::path dir = scratch.path() / "out";
  out.output_dir = dir.string();
  const PointRun fake = run_point(out, "fake", settings);
  CHECK(nlohmann::json::parse(fake.trace).at("traced_ranks") == 3);
  const std::string path = write_point(out, fake);
  CHECK(path == (dir / "default" / "fake.json").string());
  CHECK(std::filesystem::exists(dir / "default" / "fake.trace.json"));
  // A rerun without a trace leaves no trace of the older run beside the result.
  PointRun untraced = fake;
  untraced.trace.clear();
  write_point(out, untraced);
  CHECK(!std::filesystem::exists(dir / "default" / "fake.trace.json"));
}
