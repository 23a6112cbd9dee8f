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

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/experiment.hpp"
#include "muonbed/config.hpp"
#include "sim/run_point.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;

namespace {

Experiment point(const std::string& yaml) {
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

// Compares two JSON values; numbers to a relative tolerance; reports the first difference.
bool same(const nlohmann::json& a, const nlohmann::json& b, const std::string& path,
          std::string& why) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    if (std::fabs(x - y) <= 1e-9 * std::max(std::fabs(x), std::fabs(y))) return true;
    why = path + ": " + a.dump() + " vs " + b.dump();
    return false;
  }
  if (a.type() != b.type()) {
    why = path + ": type differs";
    return false;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) {
      why = path + ": keys differ";
      return false;
    }
    for (auto it = a.begin(); it != a.end(); ++it) {
      if (!b.contains(it.key())) {
        why = path + "." + it.key() + ": missing";
        return false;
      }
      if (!same(it.value(), b.at(it.key()), path + "." + it.key(), why)) return false;
    }
    return true;
  }
  if (a.is_array()) {
    if (a.size() != b.size()) {
      why = path + ": " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " items";
      return false;
    }
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!same(a[i], b[i], path + "[" + std::to_string(i) + "]", why)) return false;
    return true;
  }
  if (a != b) {
    why = path + ": " + a.dump() + " vs " + b.dump();
    return false;
  }
  return true;
}

nlohmann::json comparable(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text);
  j.erase("timestamp");
  j.erase("checksum");
  for (const char* key : {"git_hash", "host_name", "muonbed_version", "experiment_file"})
    j["provenance"].erase(key);
  // The resolved configuration's header names the file it came from: an absolute path.
  std::string config = j["provenance"]["resolved_config"].get<std::string>();
  if (config.rfind("# resolved configuration of", 0) == 0)
    config = config.substr(config.find('\n') + 1);
  j["provenance"]["resolved_config"] = config;
  return j;
}

}  // namespace

TEST_CASE("result records round-trip through JSON exactly", "[sim][results]") {
  const Experiment e = point(kSmall);
  PointRun run = run_point(e, "analytic");
  const std::string text = result_to_json(run.record);
  CHECK(result_to_json(result_from_json(text)) == text);
  CHECK_THROWS_WITH(result_from_json("{\"schema_version\": 99}"), Catch::Contains("schema"));
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
  const std::string golden = std::string(MUONBED_SIM_GOLDEN_DIR) + "/small_fsdp_tp.json";
  std::string pinned_text;
  {
    std::ifstream in(golden);
    std::stringstream text;
    text << in.rdbuf();
    pinned_text = text.str();
  }
  const std::string fresh = result_to_json(run.record);
  std::string why;
  const bool equal =
      !pinned_text.empty() && same(comparable(pinned_text), comparable(fresh), "", why);
  if (std::getenv("MUONBED_UPDATE_GOLDEN") != nullptr) {
    // Update mode never passes: it rewrites the file from this run and fails, so the new golden
    // is only accepted by a later run that compares against it (after the diff is reviewed).
    ResultRecord pinned = run.record;
    pinned.timestamp = "";
    pinned.provenance.git_hash = "";
    pinned.provenance.host_name = "";
    pinned.provenance.experiment_file = "";
    // The header line names the checkout's absolute path: keep the part below the checkout.
    std::string& config = pinned.provenance.resolved_config;
    const std::string source = std::string(MUONBED_SOURCE_DIR) + "/";
    if (const std::size_t at = config.find(source);
        at != std::string::npos && at < config.find('\n'))
      config.erase(at, source.size());
    write_file_atomically(golden, result_to_json(pinned));
    FAIL("rewrote " << golden << (equal ? " (no change)" : " (first change: " + why + ")")
                    << "; review `git diff`, then run again without MUONBED_UPDATE_GOLDEN");
  }
  REQUIRE_FALSE(pinned_text.empty());
  // The golden is muonbed's own output, not an edited file.
  CHECK(verify_checksum(pinned_text));
  INFO("first difference: " << why);
  CHECK(equal);
  // The comparison sees the numbers: a changed step time must fail it.
  nlohmann::json changed = nlohmann::json::parse(fresh);
  changed["step"]["average_s"] = changed["step"]["average_s"].get<double>() * (1 + 1e-6);
  std::string ignored;
  CHECK_FALSE(same(comparable(pinned_text), comparable(changed.dump()), "", ignored));
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
