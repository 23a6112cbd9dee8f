// The results schema: JSON round trip, atomic writes, record assembly invariants, the analytic
// backend's record, the seed-claims table, and a small simulated experiment pinned as a golden
// file.
//
// Golden file: tests/sim/golden/small_fsdp_tp.json. Every field is compared except the
// timestamp, the checksum (it covers the timestamp) and the provenance fields that depend on the
// machine or checkout (git_hash, host_name, muonbed_version, experiment_file, and the resolved
// configuration's header line naming the file); numbers to a relative 1e-9. After an intended
// change of the simulator, regenerate it, review the diff, and run the test again:
//   MUONBED_UPDATE_GOLDEN=1 ./build/sim_tests "[golden]"   (reports the change and fails)
//   git diff tests/sim/golden/; ./build/sim_tests "[golden]"
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/base/sha256.hpp"
#include "core/experiment/experiment.hpp"
#include "core/results/run_point.hpp"
#include "muonbed/config.hpp"
#include "sim/simulate.hpp"
#include "tests/common/temp_dir.hpp"
#include "tests/golden_json.hpp"

using namespace muonbed;

namespace {

// Every test here may run points on "sim": registered as the CLI does.
Experiment point(const std::string& yaml) {
  register_sim_backend();
  auto points =
      parse_experiment(yaml, std::string(MUONBED_SOURCE_DIR) + "/experiments/sim_test.yaml");
  REQUIRE(points.size() == 1);
  return points[0];
}

const char* kSmall = R"(
name: small_fsdp_tp
cluster: dgx-h100
mesh: {dims: [{name: dp_shard, size: 2}, {name: tp, size: 8}]}
model: {dense: {hidden: 1024, layers: 4, heads: 8, kv_heads: 8, ffn: 4096, vocab: 8192}}
strategy: {name: owner, prefetch_count: 1, grad_sync: {enabled: true, level_periods: [1, 2]}}
backend: [sim]
sim: {fidelity: step}
)";

}  // namespace

TEST_CASE("the sim backend registers itself with the point runner", "[sim][results]") {
  register_sim_backend();
  register_sim_backend();  // again: harmless
  REQUIRE(find_backend("sim") != nullptr);
  const auto names = registered_backends();
  CHECK(std::count(names.begin(), names.end(), "sim") == 1);
  const PointRun run = run_point(point(kSmall), "sim");
  CHECK(run.record.backend == "sim");
  CHECK(run.cost.what == "simulation");
  CHECK(run.cost.messages > 0);
  CHECK(!run.trace.empty());
}

TEST_CASE("result records round-trip through JSON exactly", "[sim][results]") {
  const Experiment e = point(kSmall);
  PointRun run = run_point(e, "analytic");
  const std::string text = result_to_json(run.record);
  CHECK(result_to_json(result_from_json(text)) == text);
  CHECK_THROWS_WITH(result_from_json("{\"schema_version\": 99}"), Catch::Contains("schema"));
  // The bound is in every record, and records written before it existed still read.
  CHECK(run.record.bound.step_s > 0);
  CHECK(run.record.bound.ratio == Approx(run.record.step.average_s / run.record.bound.step_s));
  // A record without it (written before it existed), re-signed as result_to_json signs.
  auto old = nlohmann::ordered_json::parse(text);
  old.erase("bound");
  old["checksum"] = "";
  std::string unsigned_text = old.dump(1) + "\n";
  const std::string field = "\"checksum\": \"";
  unsigned_text.insert(unsigned_text.rfind(field) + field.size(), sha256_hex(unsigned_text));
  const ResultRecord back = result_from_json(unsigned_text);
  CHECK(back.bound.step_s == 0);
  CHECK(back.step.average_s == run.record.step.average_s);
}

TEST_CASE("records hold every rank and consistent per-rank times", "[sim][results]") {
  const Experiment e = point(kSmall);
  for (const char* backend : {"analytic", "sim"}) {
    const ResultRecord r = run_point(e, backend).record;
    INFO(backend);
    REQUIRE(r.ranks.size() == 16);
    CHECK(r.setup.world_size == 16);
    CHECK(r.setup.nodes == 2);
    CHECK(r.setup.hyper_period == 2);
    CHECK(r.step.worst_s >= r.step.average_s);
    for (const RankResult& rank : r.ranks) {
      // compute + exposed communication + idle = the step, per rank.
      const TimeBreakdown& w = rank.worst;
      CHECK(w.compute_s + w.exposed_comm_s + w.idle_s == Approx(r.step.worst_s).epsilon(1e-9));
      CHECK(rank.memory.peak_bytes == rank.memory.static_bytes + rank.memory.peak_transient_bytes);
    }
    CHECK(!r.collectives.empty());
    for (const CollectiveResult& c : r.collectives) {
      CHECK(c.time_s <= c.max_time_s * (1 + 1e-12));
      if (c.time_s > 0) CHECK(c.algbw_GBps == Approx(c.bytes / c.time_s / 1e9));
    }
    CHECK(r.traffic.network_bytes.average > 0);
    CHECK(r.traffic.intra_node_bytes.average > 0);
  }
}

TEST_CASE("results are written atomically where result_path says", "[sim][results]") {
  Experiment e = point(kSmall);
  const testing::TempDir scratch("sim-results");  // unique: build trees never share it
  const auto dir = scratch.path() / "out";
  e.output_dir = dir.string();
  const PointRun run = run_point(e, "sim");
  const std::string path = write_point(e, run);
  CHECK(path == (dir / "default" / "sim.json").string());
  CHECK(std::filesystem::exists(dir / "default" / "sim.trace.json"));
  const ResultRecord back = read_result_file(path);
  CHECK(back.step.average_s == run.record.step.average_s);
  for (const auto& entry : std::filesystem::directory_iterator(dir / "default"))
    CHECK(entry.path().string().find(kTempMarker) == std::string::npos);
  // What was written verifies: point identity and checksum.
  CHECK(back.provenance.point_id == point_identity(e.name, "", "sim", e.resolved_yaml));
  CHECK(back.checksum.size() == 64);
}

TEST_CASE("a small simulated experiment matches its golden result", "[sim][results][golden]") {
  const Experiment e = point(kSmall);
  const PointRun run = run_point(e, "sim");
  testing::check_golden_record(run.record,
                               std::string(MUONBED_SIM_GOLDEN_DIR) + "/small_fsdp_tp.json", 1e-9);
}

TEST_CASE("seed claims table puts claims beside predictions", "[sim][results]") {
  std::vector<ResultRecord> records;
  for (const char* strategy : {"{name: sequential}", "{name: owner, prefetch_count: 0}",
                               "{name: owner, prefetch_count: 2}"}) {
    Experiment e = point(std::string(R"(
name: claims
cluster: dgx-h100
mesh: {dims: {dp_shard: 8}}
model: {dense: {hidden: 1024, layers: 2, heads: 8, kv_heads: 8, ffn: 4096, vocab: 4096}}
strategy: )") + strategy +
                         "\n");
    records.push_back(run_point(e, "analytic").record);
  }
  const std::string table = seed_claims_table(records);
  CHECK_THAT(table, Catch::Contains("16-24x"));
  CHECK_THAT(table, Catch::Contains("analytic"));
  CHECK_THAT(table, !Catch::Contains(" - "));  // all three configurations were recognized
}

TEST_CASE("a training point's AdamW twin simulated beside it is the twin simulated alone",
          "[sim][results][training]") {
  // run_plan hands the sim backend the twin (every parameter on AdamW); it runs in a process of
  // its own beside the point's. Its step must be the one the twin gives as a point of its own.
  const Experiment e =
      point(std::string(kSmall) + "training: {tokens_per_step: 16384, seq_len: 1024}\n");
  const PointRun run = run_point(e, "sim");
  REQUIRE(run.record.training.present);
  Experiment twin = e;
  twin.parallel.routing.everything_to_adamw = true;
  twin.sharded = nullptr;
  const PointRun alone = run_point(twin, "sim");  // an AdamW point has no twin of its own
  CHECK_FALSE(alone.adamw_twin.has_value());
  CHECK(run.record.training.adamw_step_s == alone.record.comparable_step_s());
  CHECK(run.record.training.adamw_step_s < run.record.comparable_step_s());  // Muon costs more
  CHECK(run.record.training.muon_overhead ==
        run.record.comparable_step_s() / alone.record.comparable_step_s() - 1);
  // simulate_each returns each plan's own simulation, in the order given.
  const StepPlan muon_plan = plan_experiment(e), adamw_plan = plan_experiment(twin);
  SimOptions step;
  step.fidelity = "step";
  step.trace_max_ranks = 0;
  const auto both = simulate_each({&adamw_plan, &muon_plan}, e.cluster, {step, step});
  REQUIRE(both.size() == 2);
  CHECK(both[0].record.comparable_step_s() ==
        simulate(adamw_plan, e.cluster, step).record.comparable_step_s());
  CHECK(both[1].record.comparable_step_s() ==
        simulate(muon_plan, e.cluster, step).record.comparable_step_s());
  CHECK_THROWS_WITH(simulate_each({&muon_plan}, e.cluster, {step, step}),
                    Catch::Contains("1 plans but 2 option sets"));
}
