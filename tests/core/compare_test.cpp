// `muonbed compare` (core/results/compare.hpp): Kendall's tau and the error % against hand-computed
// cases, the report's summaries and rankings on hand-built records, and compare_experiment on
// real result files: a measured record beside the analytic one, and the refusals (missing
// results, results of another configuration, nothing measured) with the file and the fix.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/results/compare.hpp"
#include "core/results/results.hpp"
#include "core/results/run_point.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;
using Catch::Matchers::Contains;

TEST_CASE("Kendall's tau against hand-computed cases", "[core][compare]") {
  // Same order: every one of the 6 pairs concordant.
  CHECK(kendall_tau({1, 2, 3, 4}, {10, 20, 30, 40}) == Approx(1));
  // Reversed: all 6 discordant.
  CHECK(kendall_tau({1, 2, 3, 4}, {4, 3, 2, 1}) == Approx(-1));
  // One swap of neighbours: 5 concordant, 1 discordant -> 4/6.
  CHECK(kendall_tau({1, 2, 3, 4}, {1, 3, 2, 4}) == Approx(4.0 / 6));
  // Three values, one pair swapped: C = 2, D = 1 -> 1/3.
  CHECK(kendall_tau({1, 2, 3}, {2, 1, 3}) == Approx(1.0 / 3));
  // Ties (tau-b): a = {1, 1, 2}, b = {1, 2, 3}: pairs 3, ties in a 1, C = 2, D = 0 ->
  // 2 / sqrt((3 - 1) * 3) = 0.8165.
  CHECK(kendall_tau({1, 1, 2}, {1, 2, 3}) == Approx(2 / std::sqrt(6.0)));
  CHECK(kendall_tau({5}, {7}) == 1);
  CHECK(kendall_tau({}, {}) == 1);
  CHECK_THROWS_AS(kendall_tau({1, 2}, {1}), Error);
}

TEST_CASE("error % is (predicted - measured) / measured", "[core][compare]") {
  CHECK(error_percent(110, 100) == Approx(10));
  CHECK(error_percent(90, 100) == Approx(-10));
  CHECK(error_percent(0.05, 0.04) == Approx(25));
  CHECK_THROWS_AS(error_percent(1, 0), Error);
}

namespace {

ResultRecord record(const std::string& backend, double step_s, int ranks, bool over = false) {
  ResultRecord r;
  r.backend = backend;
  r.setup.mesh = "dp_shard=" + std::to_string(ranks);
  r.setup.model = "m";
  r.setup.world_size = ranks;
  r.step.average_s = step_s;
  if (backend == "mpi") {
    r.step.average_s = step_s * 1.5;  // compare takes the median of measured records
    r.step.measured.timed_steps = 5;
    r.step.measured.median_s = step_s;
    r.execution.library = "test";
    r.execution.oversubscribed = over;
  }
  for (int i = 0; i < ranks; ++i) {
    RankResult rr;
    rr.rank = i;
    rr.average.compute_s = step_s * (i + 1) / ranks;  // mean over ranks: step (n + 1) / (2 n)
    rr.average.idle_s = 0.001;
    r.ranks.push_back(rr);
  }
  return r;
}

PointRecords point(const std::string& label, double measured, double predicted, int ranks,
                   bool over = false) {
  PointRecords p;
  p.point = label;
  p.records["mpi"] = record("mpi", measured, ranks, over);
  p.records["analytic"] = record("analytic", predicted, ranks);
  return p;
}

}  // namespace

TEST_CASE("compare_points: errors, summaries and rankings by hand", "[core][compare]") {
  // 2 ranks: measured 100, 200, 400 ms; predicted 110 (+10 %), 180 (-10 %), 420 (+5 %): same
  // order. 4 ranks (oversubscribed): measured 100, 200; predicted 300 (+200 %), 150 (-25 %):
  // order swapped.
  const std::vector<PointRecords> points = {
      point("strategy.name=a,mesh.dp_shard=2", 0.100, 0.110, 2),
      point("strategy.name=b,mesh.dp_shard=2", 0.200, 0.180, 2),
      point("strategy.name=c,mesh.dp_shard=2", 0.400, 0.420, 2),
      point("strategy.name=a,mesh.dp_shard=4", 0.100, 0.300, 4, true),
      point("strategy.name=b,mesh.dp_shard=4", 0.200, 0.150, 4, true),
  };
  const CompareReport r = compare_points(points);
  REQUIRE(r.points.size() == 5);
  CHECK(r.points[0].strategy == "a");
  CHECK(r.points[0].measured.step_s == Approx(0.100));  // the median, not the average
  CHECK(r.points[0].predicted.at(0).error_pct == Approx(10));
  CHECK(r.points[1].predicted.at(0).error_pct == Approx(-10));
  CHECK(r.points[2].predicted.at(0).error_pct == Approx(5));
  CHECK(r.points[3].predicted.at(0).error_pct == Approx(200));
  // Mean over ranks of compute: step (1 + 2) / (2 x 2) on 2 ranks.
  CHECK(r.points[0].measured.phases.compute_s == Approx(0.100 * 3 / 4));
  CHECK(r.points[0].measured.phases.idle_s == Approx(0.001));

  REQUIRE(r.summaries.size() == 2);
  const ErrorSummary& all = r.summaries[0];
  const ErrorSummary& real = r.summaries[1];
  CHECK(all.scope == "all points");
  CHECK(all.points == 5);
  CHECK(all.median_abs_pct == Approx(10));  // |errors| 5, 10, 10, 25, 200
  CHECK(all.max_abs_pct == Approx(200));
  CHECK(real.scope == "not oversubscribed");
  CHECK(real.points == 3);
  CHECK(real.median_abs_pct == Approx(10));  // 5, 10, 10
  CHECK(real.max_abs_pct == Approx(10));
  CHECK(real.mean_signed_pct == Approx(5.0 / 3));

  REQUIRE(r.rankings.size() == 2);
  CHECK(r.rankings[0].group == "mesh.dp_shard=2");  // the label without its strategy part
  CHECK(r.rankings[0].tau == Approx(1));
  CHECK(r.rankings[0].preserved);
  CHECK(r.rankings[0].strategies == std::vector<std::string>{"a", "b", "c"});
  CHECK(r.rankings[1].tau == Approx(-1));
  CHECK_FALSE(r.rankings[1].preserved);
  CHECK(r.rankings[1].oversubscribed);
  // The swapped pair: measured a 100 < b 200 (100 % apart), predicted a 300 > b 150 (100 % the
  // other way); the preserved group has none.
  CHECK(r.rankings[0].swapped.empty());
  REQUIRE(r.rankings[1].swapped.size() == 1);
  CHECK(r.rankings[1].swapped[0].measured_faster == "a");
  CHECK(r.rankings[1].swapped[0].measured_slower == "b");
  CHECK(r.rankings[1].swapped[0].measured_gap_pct == Approx(100));
  CHECK(r.rankings[1].swapped[0].predicted_gap_pct == Approx(100));

  const auto j = compare_json(r);
  CHECK(j["points"].size() == 5);
  CHECK(j["rankings"][1]["kendall_tau"] == Approx(-1));
  CHECK(j["rankings"][1]["swapped"][0]["measured_gap_pct"] == Approx(100));
  CHECK_THAT(compare_table(r), Contains("DIFFERS"));
  CHECK_THAT(compare_table(r),
             Contains("swapped: a < b measured 100.0 % apart, predicted 100.0 % the other way"));
}

TEST_CASE("compare_points refuses points it cannot compare", "[core][compare]") {
  PointRecords only_predicted;
  only_predicted.point = "p";
  only_predicted.records["analytic"] = record("analytic", 0.1, 2);
  CHECK_THROWS_WITH(compare_points({only_predicted}), Contains("no point has a measured result"));
  PointRecords only_measured;
  only_measured.point = "p";
  only_measured.records["mpi"] = record("mpi", 0.1, 2);
  CHECK_THROWS_WITH(compare_points({only_measured}), Contains("no predicted one"));
}

namespace {

const char* kExperiment = R"(name: cmp
cluster: local-cpu
mesh: {dims: {dp_shard: 2}}
model: {preset: tiny-dense}
strategy: {name: owner}
backend: [mpi, analytic]
sweep:
  strategy.name: [sequential, owner]
output: %OUT%
)";

std::string experiment_text(const std::string& out, const std::string& cluster = "local-cpu") {
  std::string text = kExperiment;
  text.replace(text.find("%OUT%"), 5, out);
  if (cluster != "local-cpu") text.replace(text.find("local-cpu"), 9, cluster);
  return text;
}

// The test edits files it has read as a command would: each write starts a new "command".
void write(const std::string& path, const std::string& text) {
  forget_input_files();
  write_file_atomically(path, text);
}

// Writes each point's analytic result, and an "mpi" record made from it (times x `scale`):
// result files that compare reads exactly as it reads real ones.
// `output`: another results folder, as `muonbed run FILE --output DIR` writes there.
void write_results(const std::string& file, double scale, const std::string& output = "",
                   bool predicted = true, const std::string& measured_backend = "mpi") {
  for (Experiment point : load_experiment(file)) {
    if (!output.empty()) point.output_dir = output;
    PointRun run = run_point(point, "analytic");
    if (predicted) write_point(point, run);
    PointRun measured = run;
    ResultRecord& m = measured.record;
    m.backend = measured_backend;
    m.fidelity = "measured";
    m.step.average_s *= scale;
    m.step.worst_s *= scale;
    m.step.measured.timed_steps = 3;
    m.step.measured.median_s = m.step.average_s;
    m.step.measured.min_s = m.step.average_s;
    m.step.measured.p95_s = m.step.worst_s;
    m.execution.library = "test";
    write_point(point, measured);
  }
}

// A training result of `step` over its AdamW twin's `adamw` (seconds), overhead from the two.
TrainingResult& set_training(ResultRecord& r, double step, double adamw) {
  r.training.present = true;
  r.training.step_s = step;
  r.training.adamw_step_s = adamw;
  r.training.muon_overhead = step / adamw - 1;
  return r.training;
}

}  // namespace

TEST_CASE("compare_experiment reads checked results and refuses wrong ones", "[core][compare]") {
  testing::TempDir dir("compare");
  const std::string file = dir / "cmp.yaml";
  const std::string out = dir / "out";
  write(file, experiment_text(out));

  SECTION("missing results name the files and the fix") {
    CHECK_THROWS_WITH(compare_experiment(file),
                      Contains("missing") && Contains("mpi.json") && Contains("muonbed run"));
  }
  SECTION("measured beside predicted") {
    write_results(file, 1.25);
    const CompareReport r = compare_experiment(file);
    REQUIRE(r.points.size() == 2);
    for (const ComparedPoint& p : r.points) {
      REQUIRE(p.predicted.size() == 1);
      CHECK(p.predicted[0].backend == "analytic");
      CHECK(p.predicted[0].error_pct == Approx(-20));  // 1 / 1.25 - 1
    }
    REQUIRE(r.rankings.size() == 1);
    CHECK(r.rankings[0].preserved);
  }
  SECTION("several runs: the median over runs, their spread, every run's file required") {
    const std::string out2 = dir / "run2", out3 = dir / "run3";
    write_results(file, 1.25);
    write_results(file, 1.0, out2, false);  // measured only: predictions come from the first
    CHECK_THROWS_WITH(compare_experiment(file, std::vector<std::string>{out, out2, out3}),
                      Contains("run3") && Contains("mpi.json") &&
                          Contains("muonbed run " + file + " --output " + out3));
    write_results(file, 2.0, out3, false);
    const CompareReport r = compare_experiment(file, std::vector<std::string>{out, out2, out3});
    REQUIRE(r.points.size() == 2);
    CHECK(r.run_dirs == std::vector<std::string>{out, out2, out3});
    CHECK(r.output_dir == out);
    for (const ComparedPoint& p : r.points) {
      REQUIRE(p.runs_s.size() == 3);
      CHECK(p.runs_s[1] / p.runs_s[0] == Approx(1.0 / 1.25));
      CHECK(p.spread_pct == Approx(100));                       // (2.0 - 1.0) / 1.0
      CHECK(p.predicted[0].error_pct == Approx(-20));           // the median run: x1.25
      CHECK(p.measured.path.find("run") == std::string::npos);  // the median run is the first
    }
    const std::string table = compare_table(r);
    CHECK_THAT(table, Contains("median over 3 runs") && Contains("spread") &&
                          Contains("median 100.0 %, max 100.0 %"));
    // Two runs: the median is the mean of the two, the lower one lends its details.
    const CompareReport two = compare_experiment(file, std::vector<std::string>{out, out2});
    CHECK(two.points[0].predicted[0].error_pct == Approx(100 * (1 / 1.125 - 1)));
    CHECK_THAT(two.points[0].measured.path, Contains("run2"));
    CHECK_THROWS_WITH(compare_experiment(file, std::vector<std::string>{out, out2, out + "/"}),
                      Contains("given twice") && Contains("fix:"));
  }
  SECTION("a measured backend the file does not list (run --backend nccl) is compared") {
    std::string text = experiment_text(out);
    text.replace(text.find("backend: [mpi, analytic]"), 24, "backend: [analytic]");
    write(file, text);
    // Before: the file lists only analytic, so compare looked for nothing else and said
    // "nothing to compare: no point has a measured result".
    write_results(file, 1.25, "", true, "nccl");
    const CompareReport r = compare_experiment(file);
    REQUIRE(r.points.size() == 2);
    for (const ComparedPoint& p : r.points) {
      CHECK(p.measured.backend == "nccl");
      REQUIRE(p.predicted.size() == 1);
      CHECK(p.predicted[0].error_pct == Approx(-20));
    }
  }
  SECTION("a copied results folder counts once, with a note") {
    const std::string copy = dir / "copy";
    write_results(file, 1.25);
    std::filesystem::copy(out, copy, std::filesystem::copy_options::recursive);
    const CompareReport r = compare_experiment(file, std::vector<std::string>{out, copy});
    CHECK(r.run_dirs == std::vector<std::string>{out});
    REQUIRE(r.notes.size() == 1);
    CHECK_THAT(r.notes[0],
               Contains("'" + copy + "'") && Contains("a copy") && Contains("'" + out + "'"));
    for (const ComparedPoint& p : r.points) CHECK(p.runs_s.empty());
    CHECK_THAT(compare_table(r), Contains("note: results folder"));
  }
  SECTION("a median outside its own samples, or an absurd step, is refused naming the file") {
    for (Experiment point : load_experiment(file)) {
      PointRun run = run_point(point, "analytic");
      write_point(point, run);
      ResultRecord& m = run.record;
      m.backend = "mpi";
      m.fidelity = "measured";
      m.step.measured.timed_steps = 3;
      m.step.measured.min_s = m.step.average_s;
      m.step.measured.p95_s = m.step.average_s * 1.1;
      m.step.measured.median_s = m.step.average_s * 5;  // outside [min, p95]
      m.execution.library = "test";
      write_point(point, run);
    }
    CHECK_THROWS_WITH(compare_experiment(file), Contains("mpi.json") &&
                                                    Contains("outside its own samples") &&
                                                    Contains("--force"));
    write_results(file, 1.0);  // good records again, then an absurd prediction
    for (Experiment point : load_experiment(file)) {
      PointRun run = run_point(point, "analytic");
      run.record.step.average_s = run.record.step.worst_s = 3e9;  // 95 years per step
      write_point(point, run);
    }
    CHECK_THROWS_WITH(compare_experiment(file),
                      Contains("analytic.json") && Contains("outside (0, 1e6 s]"));
  }
  SECTION("results of another configuration are refused") {
    write_results(file, 1.0);
    write(file, experiment_text(out, "dgx-h100"));  // same points, another cluster
    CHECK_THROWS_WITH(compare_experiment(file),
                      Contains("another configuration") && Contains("muonbed run"));
  }
  SECTION("an edited result fails its checksum") {
    write_results(file, 1.0);
    const Experiment first = load_experiment(file).front();
    const std::string path = result_path(first, "mpi");
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t at = text.find("\"average_s\": ");
    REQUIRE(at != std::string::npos);
    text.insert(at + 14, "1");  // a different number, the checksum unchanged
    write(path, text);
    CHECK_THROWS_WITH(compare_experiment(file), Contains("mpi.json") && Contains("--force"));
  }
}

TEST_CASE("compare_points: the speed probe flags a profile of another machine and drift",
          "[core][compare]") {
  // Point a: the machine ran the probe at 10 and 12 ms where the profile says 11 ms: ratio 1,
  // drift +20 % -> a drift warning. Point b: 20 and 21 ms against 10: ratio 2.05, drift +5 % -> a
  // machine warning. Point c: 9.5 and 10.2 against 10: ratio 0.985, drift +7.4 % -> steady. Point
  // d: no probe.
  std::vector<PointRecords> points = {
      point("strategy.name=a,mesh.dp_shard=2", 0.100, 0.110, 2),
      point("strategy.name=b,mesh.dp_shard=2", 0.200, 0.100, 2),
      point("strategy.name=c,mesh.dp_shard=2", 0.400, 0.420, 2),
      point("strategy.name=d,mesh.dp_shard=2", 0.300, 0.240, 2),
  };
  const auto probe = [&](int i, double before_ms, double after_ms, double predicted_ms = 10) {
    ExecutionInfo& e = points[static_cast<std::size_t>(i)].records["mpi"].execution;
    e.probe_shape = {1, 192, 688};
    e.probe_predicted_s = predicted_ms * 1e-3;
    e.probe_before_s = before_ms * 1e-3;
    e.probe_after_s = after_ms * 1e-3;
  };
  probe(0, 10, 12, 11);
  probe(1, 20, 21);
  probe(2, 9.5, 10.2);
  for (auto& p : points) p.records["mpi"].setup.cluster = "local-cpu";

  const CompareReport r = compare_points(points);
  REQUIRE(r.points.size() == 4);
  CHECK(r.points[0].probe_ratio == Approx(1.0));
  CHECK(r.points[0].probe_drift == Approx(0.2));
  REQUIRE(r.points[0].probe_warnings.size() == 1);
  CHECK_THAT(r.points[0].probe_warnings[0], Contains("speed changed while the point ran"));
  CHECK_THAT(r.points[0].probe_warnings[0], Contains("10.000 ms before the steps and 12.000 ms"));
  CHECK(r.points[1].probe_ratio == Approx(2.05));
  REQUIRE(r.points[1].probe_warnings.size() == 1);
  CHECK_THAT(r.points[1].probe_warnings[0], Contains("2.05x the 10.000 ms of cluster profile "
                                                     "'local-cpu'"));
  CHECK_THAT(r.points[1].probe_warnings[0], Contains("Newton-Schulz 192x688"));
  CHECK_THAT(r.points[1].probe_warnings[0], Contains("fix: recalibrate here"));
  CHECK(r.points[2].probe_ratio == Approx(0.985));
  CHECK(r.points[2].probe_warnings.empty());
  CHECK(r.points[3].probe_ratio == 0);  // no probe: nothing to say
  CHECK(r.points[3].probe_warnings.empty());

  // The steady scope keeps probed points without warnings: c alone (+5 %).
  REQUIRE(r.summaries.size() == 3);
  CHECK(r.summaries[2].scope == "steady machine");
  CHECK(r.summaries[2].points == 1);
  CHECK(r.summaries[2].max_abs_pct == Approx(5));
  CHECK(r.summaries[1].points == 4);

  const std::string table = compare_table(r);
  CHECK_THAT(table, Contains("machine"));
  CHECK_THAT(table, Contains("2.05x!"));
  CHECK_THAT(table, Contains("0.98x "));
  CHECK_THAT(table, Contains("0.98x to 2.05x over 3 points"));
  CHECK_THAT(table, Contains("1.00x!"));
  CHECK_THAT(table, Contains("! 2 points outside 1 +- 10 %"));
  const nlohmann::ordered_json j = compare_json(r);
  CHECK(j["points"][1]["measured"]["speed_probe_ratio"].get<double>() == Approx(2.05));
  CHECK(j["points"][1]["measured"]["warnings"].size() == 1);
  CHECK_FALSE(j["points"][3]["measured"].contains("speed_probe_ratio"));

  // Without any probe (files written before it) there is no machine column or steady scope.
  const CompareReport old = compare_points({point("strategy.name=a,mesh.dp_shard=2", 0.1, 0.1, 2)});
  CHECK(old.summaries.size() == 2);
  CHECK_THAT(compare_table(old), !Contains("machine"));
}

TEST_CASE("compare_points: runs combined by hand", "[core][compare]") {
  // One point measured in three runs at 100, 130 and 110 ms (predicted 121 ms): the median run
  // is the third, 110 ms: error +10 %, spread 30 %, its phases; the probe warned in run 2 only.
  PointRecords p = point("strategy.name=a,mesh.dp_shard=2", 0.100, 0.121, 2);
  p.more_runs = {record("mpi", 0.130, 2), record("mpi", 0.110, 2)};
  p.more_run_paths = {"run2/mpi.json", "run3/mpi.json"};
  p.more_run_traces = {"", "run3/mpi.trace.json"};
  ExecutionInfo& warned = p.more_runs[0].execution;
  warned.probe_shape = {1, 64, 64};
  warned.probe_predicted_s = 1e-3;
  warned.probe_before_s = 1e-3;
  warned.probe_after_s = 1.5e-3;
  const CompareReport r = compare_points({p});
  REQUIRE(r.points.size() == 1);
  const ComparedPoint& c = r.points[0];
  CHECK(c.runs_s == std::vector<double>{0.100, 0.130, 0.110});
  CHECK(c.measured.step_s == Approx(0.110));
  CHECK(c.spread_pct == Approx(30));
  CHECK(c.noise_pct == Approx(30));  // with runs, their spread
  CHECK(c.predicted[0].error_pct == Approx(10));
  CHECK(c.measured.path == "run3/mpi.json");
  CHECK(c.measured_trace == "run3/mpi.trace.json");
  CHECK(c.measured.phases.compute_s == Approx(0.110 * 3 / 4));  // the median run's
  CHECK(c.probe_ratio == 0);                                    // the median run has no probe
  REQUIRE(c.probe_warnings.size() == 2);  // run 2: off the profile (1.25x) and drifting (+50 %)
  CHECK_THAT(c.probe_warnings[0], Contains("run 2: warning: this machine"));
  CHECK_THAT(c.probe_warnings[1], Contains("run 2: warning: the machine's speed changed"));
  const nlohmann::ordered_json j = compare_json(r);
  CHECK(j["points"][0]["measured"]["runs_s"].size() == 3);
  CHECK(j["points"][0]["measured"]["spread_pct"].get<double>() == Approx(30));
  // One run: no runs, no spread column.
  CHECK(compare_points({point("strategy.name=a,mesh.dp_shard=2", 0.1, 0.1, 2)})
            .points[0]
            .runs_s.empty());
}

TEST_CASE("compare_points: a swap inside the measurement's noise is named so", "[core][compare]") {
  // Mesh 2: a 100 ms, b 104 ms measured (4 % apart), predicted the other way; a's timed steps
  // have a standard deviation of 5 ms: noise 2 x 5 / 100 = 10 % > 4 % -> within noise.
  // Mesh 4: c 100 ms, d 150 ms (50 % apart), predicted the other way, noise 2 x 1 / 150 =
  // 1.3 % -> a real disagreement.
  std::vector<PointRecords> points = {
      point("strategy.name=a,mesh.dp_shard=2", 0.100, 0.120, 2),
      point("strategy.name=b,mesh.dp_shard=2", 0.104, 0.110, 2),
      point("strategy.name=c,mesh.dp_shard=4", 0.100, 0.200, 4),
      point("strategy.name=d,mesh.dp_shard=4", 0.150, 0.140, 4),
  };
  points[0].records["mpi"].step.measured.stddev_s = 0.005;
  points[3].records["mpi"].step.measured.stddev_s = 0.001;
  const CompareReport r = compare_points(points);
  CHECK(r.points[0].noise_pct == Approx(10));
  CHECK(r.points[1].noise_pct == 0);
  REQUIRE(r.rankings.size() == 2);
  REQUIRE(r.rankings[0].swapped.size() == 1);
  CHECK(r.rankings[0].swapped[0].noise_pct == Approx(10));
  CHECK(r.rankings[0].swapped[0].within_noise);
  CHECK(r.rankings[0].preserved_within_noise);
  REQUIRE(r.rankings[1].swapped.size() == 1);
  CHECK(r.rankings[1].swapped[0].noise_pct == Approx(2.0 / 150 * 100));
  CHECK_FALSE(r.rankings[1].swapped[0].within_noise);
  CHECK_FALSE(r.rankings[1].preserved_within_noise);
  const std::string table = compare_table(r);
  CHECK_THAT(table, Contains("DIFFERS within noise"));
  CHECK_THAT(table, Contains("noise 10.0 %: within it, the measurement cannot order them"));
  CHECK_THAT(table, Contains("noise 1.3 %\n"));
  const auto j = compare_json(r);
  CHECK(j["rankings"][0]["swapped"][0]["within_noise"].get<bool>());
  CHECK_FALSE(j["rankings"][1]["preserved_within_noise"].get<bool>());
  // Combined runs: the runs' spread is the noise (see "runs combined by hand").
}

TEST_CASE("compare_points: a training step's overhead and share, by hand", "[core][compare]") {
  // Measured: step 150 ms, AdamW step 100 ms (+50 %), 30 ms of it the exposed optimizer (20 %);
  // analytic: 120 ms over 100 ms (+20 %), 24 ms exposed (20 %): 30 percentage points under.
  PointRecords p = point("default", 0.150, 0.120, 2);
  set_training(p.records["mpi"], 0.150, 0.100).exposed_optimizer_s = 0.030;
  set_training(p.records["analytic"], 0.120, 0.100).exposed_optimizer_s = 0.024;
  const CompareReport r = compare_points({p});
  REQUIRE(r.points.size() == 1);
  const ComparedTraining& m = r.points[0].measured.training;
  REQUIRE(m.present);
  CHECK(m.muon_overhead_pct == Approx(50));
  CHECK(m.optimizer_share_pct == Approx(20));
  const ComparedTraining& a = r.points[0].predicted.at(0).training;
  CHECK(a.muon_overhead_pct == Approx(20));
  CHECK(a.overhead_error_pp == Approx(-30));
  const std::string table = compare_table(r);
  CHECK_THAT(table, Contains("training step"));
  CHECK_THAT(table, Contains("-30.0 pp"));
  const auto j = compare_json(r);
  CHECK(j["points"][0]["predicted"][0]["training"]["overhead_error_pp"].get<double>() ==
        Approx(-30));
  CHECK(j["points"][0]["measured"]["training"]["muon_overhead_pct"].get<double>() == Approx(50));
  // Points without a training step show no training table.
  CHECK_THAT(compare_table(compare_points({point("default", 0.1, 0.1, 2)})),
             !Contains("training step"));
}

TEST_CASE("compare_points: a training overhead over runs is the median of the runs' overheads",
          "[core][compare]") {
  // Three runs of one training point, each with its own (paired) AdamW step:
  //   run 1: step 120 ms over AdamW 100 ms: +20 %
  //   run 2: step 130 ms over AdamW 125 ms: +4 %   <- the median step (120 < 130 < 150)
  //   run 3: step 150 ms over AdamW 100 ms: +50 %
  // The median-step run's overhead would be +4 %; the median of the runs' overheads is +20 %,
  // their spread 50 - 4 = 46 pp. Analytic predicts 110 over 100 ms: +10 %, 10 pp under.
  PointRecords p = point("default", 0.120, 0.110, 2);
  const auto train = [](ResultRecord& r, double step, double adamw, double pair_spread) {
    TrainingResult& t = set_training(r, step, adamw);
    if (pair_spread > 0) {
      t.overhead_pairs = 10;
      t.overhead_spread = pair_spread;
    }
  };
  train(p.records["mpi"], 0.120, 0.100, 0.03);
  train(p.records["analytic"], 0.110, 0.100, 0);
  p.more_runs = {record("mpi", 0.130, 2), record("mpi", 0.150, 2)};
  train(p.more_runs[0], 0.130, 0.125, 0.02);
  train(p.more_runs[1], 0.150, 0.100, 0.05);
  p.more_run_paths = {"run2/mpi.json", "run3/mpi.json"};
  p.more_run_traces = {"", ""};
  const CompareReport r = compare_points({p});
  REQUIRE(r.points.size() == 1);
  const ComparedPoint& c = r.points[0];
  CHECK(c.measured.path == "run2/mpi.json");  // the median step's run lends the rest ...
  REQUIRE(c.runs_overhead_pct.size() == 3);
  CHECK(c.runs_overhead_pct[0] == Approx(20));
  CHECK(c.runs_overhead_pct[1] == Approx(4));
  CHECK(c.runs_overhead_pct[2] == Approx(50));
  CHECK(c.measured.training.muon_overhead_pct == Approx(20));  // ... but not its overhead
  CHECK(c.overhead_spread_pp == Approx(46));
  CHECK(c.predicted.at(0).training.overhead_error_pp == Approx(10 - 20));
  const std::string table = compare_table(r);
  CHECK_THAT(table, Contains("median of the runs' Muon +"));
  CHECK_THAT(table, Contains("46.0 pp"));
  CHECK_THAT(table, Contains("-10.0 pp"));
  const auto j = compare_json(r);
  CHECK(j["points"][0]["measured"]["training"]["muon_overhead_pct"].get<double>() == Approx(20));
  CHECK(j["points"][0]["measured"]["training"]["overhead_spread_pp"].get<double>() == Approx(46));
  CHECK(j["points"][0]["measured"]["training"]["runs_muon_overhead_pct"].size() == 3);

  // One paired run: its overhead as recorded, its per-pair spread (3 pp) as the overhead's noise.
  PointRecords one = point("default", 0.120, 0.110, 2);
  train(one.records["mpi"], 0.120, 0.100, 0.03);
  train(one.records["analytic"], 0.110, 0.100, 0);
  const CompareReport single = compare_points({one});
  CHECK(single.points[0].runs_overhead_pct.empty());
  CHECK(single.points[0].measured.training.muon_overhead_pct == Approx(20));
  CHECK(single.points[0].measured.training.overhead_pair_spread_pp == Approx(3));
  CHECK_THAT(compare_table(single), Contains("3.0 pp"));
  CHECK_THAT(compare_table(single), !Contains("median of the runs' Muon +"));
}

TEST_CASE("compare_points: every rank on one GPU is shown, marked, and not a check",
          "[core][compare]") {
  // Two points measured on 2 CPU ranks (mpi): +10 % and -10 %. Two measured as 8 logical ranks on
  // one GPU (cuda_loopback): +200 % and -50 % against their 8-GPU predictions. A point measured
  // both ways is compared on its real ranks.
  const auto on_one_gpu = [](const std::string& label, double measured, double predicted) {
    PointRecords p;
    p.point = label;
    p.records["cuda_loopback"] = record("mpi", measured, 8);
    p.records["cuda_loopback"].backend = "cuda_loopback";
    p.records["analytic"] = record("analytic", predicted, 8);
    return p;
  };
  std::vector<PointRecords> points = {
      point("strategy.name=a,mesh.dp_shard=2", 0.100, 0.110, 2),
      point("strategy.name=b,mesh.dp_shard=2", 0.200, 0.180, 2),
      on_one_gpu("strategy.name=a,mesh.dp_shard=8", 0.100, 0.300),
      on_one_gpu("strategy.name=b,mesh.dp_shard=8", 0.200, 0.100),
  };
  PointRecords both = point("strategy.name=c,mesh.dp_shard=2", 0.400, 0.420, 2);
  both.records["cuda_loopback"] = record("mpi", 9.0, 2);
  both.records["cuda_loopback"].backend = "cuda_loopback";
  points.push_back(both);
  const CompareReport r = compare_points(points);
  REQUIRE(r.points.size() == 5);
  CHECK_FALSE(r.points[0].one_device);
  CHECK(r.points[2].one_device);
  CHECK(r.points[2].not_a_check());
  CHECK(r.points[2].measured.backend == "cuda_loopback");
  CHECK(r.points[4].measured.backend == "mpi");  // the real ranks first
  CHECK(r.points[4].measured.step_s == Approx(0.400));
  REQUIRE(r.summaries.size() == 2);
  CHECK(r.summaries[0].points == 5);
  CHECK(r.summaries[1].points == 3);  // 10, 10, 5: the one-GPU points left out
  CHECK(r.summaries[1].scope == "not oversubscribed, not one device");
  CHECK(r.summaries[1].max_abs_pct == Approx(10));
  REQUIRE(r.rankings.size() == 2);
  CHECK(r.rankings[1].group == "mesh.dp_shard=8");
  CHECK(r.rankings[1].one_device);  // not a check either, and not called oversubscribed
  CHECK_FALSE(r.rankings[1].oversubscribed);
  CHECK_FALSE(r.rankings[0].one_device);
  const std::string table = compare_table(r);
  CHECK_THAT(table, Contains("+ every rank on ONE device (cuda_loopback)"));
  CHECK(compare_json(r)["points"][2]["one_device"] == true);
}
