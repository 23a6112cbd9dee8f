// Careless or hostile experiment and cluster files: every quantity outside its physical range,
// every size product that would overflow, input that YAML would silently ignore or take the last
// of, and paths that are not files. Each must be a ConfigError at the offending file:line:column
// that names the range or the reason and the fix; never a wrong number, a crash or a hang.
// (tests/experiments/hostile/cases.tsv runs the same classes through the muonbed CLI.)
#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/experiment/experiment.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;
using Catch::Contains;

namespace {

const std::string kHead =
    "name: t\n"                // 1
    "cluster: dgx-h100\n"      // 2
    "mesh:\n"                  // 3
    "  dims: {dp_shard: 8}\n"  // 4
    "model:\n";                // 5

// Parses `yaml` and requires a ConfigError at `line` (and `column` when > 0) with `words`.
void expect_error(const std::string& yaml, int line, int column,
                  const std::vector<std::string>& words) {
  INFO("YAML:\n" << yaml.substr(0, 2000));
  try {
    parse_experiment(yaml, "bad.yaml");
  } catch (const ConfigError& e) {
    INFO("message: " << e.what());
    CHECK(e.where().file == "bad.yaml");
    CHECK(e.where().line == line);
    if (column > 0) CHECK(e.where().column == column);
    for (const std::string& w : words) CHECK_THAT(std::string(e.what()), Contains(w));
    CHECK_FALSE(e.fix().empty());
    return;
  }
  FAIL("expected a ConfigError");
}

std::string cluster_with(const std::string& override) {
  return "name: t\ncluster: {preset: dgx-h100, " + override +
         "}\nmesh: {dims: {dp_shard: 8}}\nmodel: {preset: tiny-dense}\n";
}

}  // namespace

TEST_CASE("shapes whose element counts overflow 64 bits are refused", "[experiments][hostile]") {
  // 2^32 x 2^31 wrapped to a negative parameter count before.
  expect_error(kHead + "  params: [{name: w, shape: [4294967296, 2147483648]}]\n", 6, 30,
               {"shape[0]' = 4294967296 is out of range", "1..16777216"});
  // Each dim allowed, the product is not: 2^24 x 2^24 x 2^24 = 2^72.
  expect_error(kHead + "  params: [{name: w, shape: [16777216, 16777216, 16777216]}]\n", 6, 0,
               {"tensor 'w'", "more than 1099511627776 (2^40) elements"});
  // The model's total: 17 tensors of 2^40 elements exceed 2^44.
  std::string many = kHead + "  params:\n";
  for (int i = 0; i < 17; ++i)
    many += "    - {name: w" + std::to_string(i) + ", shape: [1048576, 1048576]}\n";
  expect_error(many, 23, 26, {"more than 17592186044416 (2^44", "reached at tensor 'w16'"});
}

TEST_CASE("model widths have physical ranges", "[experiments][hostile]") {
  expect_error(kHead + "  dense: {hidden: 1e12, layers: 2, heads: 8, vocab: 100, ffn: 64}\n", 6, 19,
               {"'model.dense.hidden' = 1e12 is out of range", "1..16777216"});
  expect_error(kHead + "  dense: {hidden: 1024, layers: 100000, heads: 8, vocab: 100, ffn: 64}\n",
               6, 0, {"'model.dense.layers' = 100000 is out of range", "1..1000"});
  // heads x head_dim is a derived extent: 65536 x 65536 = 2^32.
  expect_error(kHead +
                   "  dense: {hidden: 64, layers: 1, heads: 65536, kv_heads: 65536, "
                   "head_dim: 65536, vocab: 100, ffn: 64}\n",
               6, 0, {"a dim of 4294967296 is outside 1..16777216"});
  expect_error(kHead +
                   "  moe: {hidden: 64, layers: 2, heads: 8, vocab: 100, experts: 1000000, "
                   "expert_ffn: 64}\n",
               6, 0, {"'model.moe.experts' = 1000000 is out of range", "1..65536"});
}

TEST_CASE("grad-sync level periods keep a countable hyper-period", "[experiments][hostile]") {
  // Four coprime periods near 2^20: their lcm is ~1.2e24, which wrapped in int before.
  expect_error(kHead +
                   "  preset: tiny-dense\nstrategy:\n  grad_sync:\n    enabled: true\n"
                   "    level_periods: [1048573, 1048571]\n",
               10, 30, {"repeat only every 1099503239183 steps", "more than 1048576 (2^20)"});
  // A large but countable hyper-period is fine, and the plan reports it exactly.
  const auto points = parse_experiment(kHead +
                                           "  preset: tiny-dense\nstrategy:\n  grad_sync:\n"
                                           "    enabled: true\n    level_periods: [1024, 729]\n",
                                       "ok.yaml");
  CHECK(plan_experiment(points.at(0)).hyper_period() == 1024 * 729);
}

TEST_CASE("cluster numbers have physical ranges", "[experiments][hostile]") {
  // Each of these aborted SimGrid, blamed a deadlock, or printed 309-digit step times.
  expect_error(
      cluster_with("intra_node: {bandwidth_GBps: 1e308}"), 2, 0,
      {"'cluster.intra_node.bandwidth_GBps' = 1e308 is out of range", ">= 0.01 and <= 100000"});
  expect_error(cluster_with("nic: {bandwidth_GBps: 1e-300}"), 2, 0,
               {"nic.bandwidth_GBps' = 1e-300 is out of range"});
  expect_error(cluster_with("gpu: {peak_tflops: 1e300}"), 2, 0,
               {"peak_tflops' = 1e300 is out of range", "<= 100000"});
  expect_error(cluster_with("gpu: {hbm_GBps: 1e-300}"), 2, 0, {"hbm_GBps' = 1e-300"});
  expect_error(cluster_with("gpu: {gemm_efficiency: {1024: 1e-300}}"), 2, 0,
               {"1e-300 is out of range", ">= 0.001 and <= 1"});
  expect_error(cluster_with("intra_node: {latency_us: 1e300}"), 2, 0,
               {"latency_us' = 1e300 is out of range", "<= 100000"});
  expect_error(cluster_with("network: {oversubscription: 1e9}"), 2, 0, {"oversubscription"});
  expect_error(cluster_with("gpu: {peak_tflops: -5}"), 2, 0, {"must be positive"});
  // 0 still means "the PCIe switch does not limit"; tiny values do not.
  expect_error(
      "name: t\ncluster: {preset: a100-pcie-4x, intra_node: {pcie_switch_GBps: 1e-9}}\n"
      "mesh: {dims: {dp_shard: 4}}\nmodel: {preset: tiny-dense}\n",
      2, 0, {"use 0 (the host bridge does not limit)"});
  CHECK_NOTHROW(parse_experiment(
      "name: t\ncluster: {preset: a100-pcie-4x, intra_node: {pcie_switch_GBps: 0}}\n"
      "mesh: {dims: {dp_shard: 4}}\nmodel: {preset: tiny-dense}\n",
      "ok.yaml"));
}

TEST_CASE("meshes are bounded where plan and simulation still finish", "[experiments][hostile]") {
  expect_error(
      "name: t\ncluster: {preset: dgx-h100, nodes: 0}\nmesh: {dims: {dp_shard: 32768}}\n"
      "model: {preset: tiny-dense}\n",
      3, 0, {"out of range", "1..16384"});
  expect_error(
      "name: t\ncluster: {preset: dgx-h100, nodes: 0}\n"
      "mesh: {dims: {dp_shard: 4096, tp: 8}}\nmodel: {preset: tiny-dense}\n",
      3, 0, {"more than 16384 ranks"});
}

TEST_CASE("duplicate keys in name maps are errors, not last-one-wins", "[experiments][hostile]") {
  const std::string params = "  params: [{name: a, shape: [8, 8]}, {name: b, shape: [8, 8]}]\n";
  expect_error(
      "name: t\nmesh: {dims: {dp_shard: 2}}\nmodel:\n" + params +
          "strategy: {name: owner, assign: explicit, explicit_owners: {a: 0, b: 1, a: 1}}\n",
      5, 73, {"key 'a' appears twice in 'strategy.explicit_owners'", "first at line 5"});
  expect_error("name: t\nmesh: {dims: {dp_shard: 2}}\nmodel:\n" + params +
                   "parallel: {tp_dim_per_param: {a: 0, a: 1}}\n",
               5, 37, {"key 'a' appears twice in 'parallel.tp_dim_per_param'"});
  expect_error("name: t\nmesh: {dims: {dp_shard: 2}}\nmodel:\n" + params +
                   "parallel: {tp_dim_per_param: {[a]: 0}}\n",
               5, 0, {"is a list"});
}

TEST_CASE("explicit owners are checked completely at validation", "[experiments][hostile]") {
  const std::string head =
      "name: t\nmesh: {dims: {dp_shard: 2}}\nmodel:\n"
      "  params: [{name: a, shape: [8, 8]}, {name: b, shape: [8, 8]}, {name: c, shape: [8, 8]}]\n";
  // Partial: passed validation and failed only at run time, without a location.
  expect_error(head + "strategy:\n  name: owner\n  assign: explicit\n  explicit_owners: {a: 0}\n",
               8, 20, {"gives no owner to 2 of 3 Muon matrices: 'b', 'c'", "flop_balanced"});
  expect_error(head +
                   "strategy: {name: owner, assign: explicit, explicit_owners: {a: 0, b: 1, "
                   "c: 0, d: 1}}\n",
               5, 0, {"names 'd', which is not a Muon matrix"});
  // An owner holding no piece of its matrix (pipeline stage 1 holds none of stage 0's).
  expect_error(
      "name: t\nmesh: {dims: {pp: 2}}\nmodel:\n"
      "  params: [{name: a, shape: [8, 8], layer: 0}, {name: b, shape: [8, 8], layer: 1}]\n"
      "strategy: {name: owner, assign: explicit, explicit_owners: {a: 1, b: 1}}\n",
      5, 64, {"explicit owner 1 of 'a' holds no piece of it"});
  const auto points =
      parse_experiment(head +
                           "strategy: {name: owner, assign: explicit, explicit_owners: "
                           "{a: 0, b: 1, c: 1}}\n",
                       "ok.yaml");
  CHECK(plan_experiment(points.at(0)).assignment.owner == std::vector<int>{0, 1, 1});
}

TEST_CASE("nothing in the file is silently ignored", "[experiments][hostile]") {
  const std::string one = "name: a\nmesh: {dims: {dp_shard: 2}}\nmodel: {preset: tiny-dense}\n";
  expect_error(one + "---\nname: b\n", 4, 1, {"a second YAML document starts here"});
  expect_error(one + "# end\n\n---\n# the second\nname: b\n", 6, 1, {"second YAML document"});
  // An empty trailing document holds nothing to ignore.
  CHECK(parse_experiment(one + "---\n", "ok.yaml").size() == 1);
  CHECK(parse_experiment("---\n" + one + "...\n", "ok.yaml").size() == 1);
  // Binary data.
  expect_error(one + std::string("# x\0y\n", 6), 4, 4, {"NUL byte", "binary"});
  // Text yaml-cpp cannot start a document with: its LoadAll looped forever on these (found by
  // the fuzzer); trailing junk after a flow map was silently dropped.
  expect_error(", b\n", 1, 1, {"YAML syntax error: unexpected ', b'"});
  expect_error("# a comment\n, 000's\nname: x\n", 2, 1, {"unexpected ', 000's'"});
  expect_error("{name: x, mesh: {dims: {dp_shard: 2}}, model: {preset: tiny-dense}}, junk\n", 1, 68,
               {"unexpected ', junk' after the end of the document"});
}

TEST_CASE("names and paths that end up in file names are checked", "[experiments][hostile]") {
  const std::string rest = "mesh: {dims: {dp_shard: 2}}\nmodel: {preset: tiny-dense}\n";
  expect_error("name: " + std::string(300, 'x') + "\n" + rest, 1, 7, {"more than 200"});
  expect_error("name: \"a\\nb\"\n" + rest, 1, 7, {"control character"});
  expect_error("name: t\n" + rest + "output: out/" + std::string(300, 'y') + "\n", 4, 9,
               {"folder name of 300 bytes", "at most 255"});
  expect_error("name: t\n" + rest + "output: \"out\\0x\"\n", 4, 9, {"control character"});
}

TEST_CASE("input files that are not experiment files", "[experiments][hostile]") {
  testing::TempDir dir("input");
  auto error_of = [](const std::string& path) -> std::string {
    try {
      load_experiment(path);
    } catch (const ConfigError& e) {
      CHECK_FALSE(e.fix().empty());
      return e.what();
    }
    return "no error";
  };
  CHECK_THAT(error_of(dir.path().string()), Contains("is a folder, not an experiment file"));
  CHECK_THAT(error_of(dir / "missing.yaml"), Contains("No such file or directory"));
  CHECK_THAT(error_of(""), Contains("path is empty"));
  // An endless device is refused after 1 MiB, not read until memory runs out.
  CHECK_THAT(error_of("/dev/zero"), Contains("larger than 1 MiB"));
  {
    std::ofstream big(dir / "big.yaml");
    big << "name: t\nsweep: {strategy.prefetch_count: [" << std::string(2 << 20, ' ') << "]}\n";
  }
  CHECK_THAT(error_of(dir / "big.yaml"), Contains("larger than 1 MiB"));
}

TEST_CASE("a huge sweep is refused before its values are compared", "[experiments][hostile]") {
  // 20,000 values with the first two equal: the point limit is reported, not the duplicate
  // (the duplicate check used to run first, quadratic in the list's length).
  std::string values = "0, 0";
  for (int i = 2; i < 20000; ++i) values += ", " + std::to_string(i);
  expect_error(
      kHead + "  preset: tiny-dense\nsweep:\n  strategy.small_param_threshold: [" + values + "]\n",
      8, 35, {"more than 10000 points", "1 x 20000 values"});
  // Points x model tensors are bounded too (each point builds and checks its model).
  std::string many = "0";
  for (int i = 1; i < 10000; ++i) many += ", " + std::to_string(i);
  expect_error(
      "name: t\ncluster: {preset: dgx-h100, nodes: 0}\nmesh: {dims: {dp_shard: 8}}\n"
      "model: {dense: {hidden: 64, layers: 1000, heads: 4, vocab: 64, ffn: 64}}\n"
      "sweep:\n  strategy.small_param_threshold: [" +
          many + "]\n",
      6, 0, {"10000 points of a model with 9003 tensors", "exceeds the limit"});
}

TEST_CASE("sweep points are parsed from one tree, edited and restored", "[experiments][hostile]") {
  // Overrides of keys the file has, lacks, or holds as a scalar; mesh dims in map form keep
  // their order (tp innermost) in every point.
  const auto points = parse_experiment(
      "name: t\ncluster: dgx-h100\nmesh: {dims: {dp_shard: 2, tp: 4}}\n"
      "model: {preset: tiny-dense}\nstrategy: owner_allgather\n"
      "sweep:\n  mesh.dp_shard: [1, 2]\n  strategy.name: [owner, sequential]\n"
      "  strategy.prefetch_count: [0, 3]\n",
      "ok.yaml");
  REQUIRE(points.size() == 8);
  for (const Experiment& e : points) {
    INFO(e.point_label);
    REQUIRE(e.mesh.ndims() == 2);
    CHECK(e.mesh.dim(1).name == "tp");
    CHECK(e.mesh.dim(1).size == 4);
    CHECK(e.mesh.dim(0).size == std::stoi(e.overrides.at("mesh.dp_shard")));
    CHECK(e.strategy.name == e.overrides.at("strategy.name"));
    // Sequential reads no prefetch: its points carry the default (core/plan/strategy.hpp).
    CHECK(e.strategy.prefetch_count ==
          (e.strategy.name == "sequential" ? 1
                                           : std::stoi(e.overrides.at("strategy.prefetch_count"))));
  }
  // Each point equals the same file written without a sweep (nothing leaks between points).
  const auto single = parse_experiment(
      "name: t\ncluster: dgx-h100\nmesh: {dims: {dp_shard: 1, tp: 4}}\n"
      "model: {preset: tiny-dense}\nstrategy: {name: sequential}\n",
      "ok.yaml");
  const Experiment& swept = points.at(2);  // dp_shard=1, sequential, prefetch 0
  REQUIRE(swept.point_label ==
          "mesh.dp_shard=1,strategy.name=sequential,strategy.prefetch_count=0");
  const auto body = [](const std::string& yaml) { return yaml.substr(yaml.find('\n')); };
  CHECK(body(swept.resolved_yaml) == body(single.at(0).resolved_yaml));
  // Points that agree on mesh and model share one sharded model; others do not.
  CHECK(points[0].sharded == points[1].sharded);
  CHECK(points[0].sharded != points[4].sharded);
  // An error in a swept value still points at the value in `sweep:`.
  expect_error(kHead + "  preset: tiny-dense\nsweep:\n  strategy.prefetch_count: [1, -1]\n", 8, 32,
               {"must not be negative", "sweep point strategy.prefetch_count=-1"});
}

TEST_CASE("a sharded model taken from the parse matches a fresh one", "[experiments][hostile]") {
  auto points = parse_experiment(
      "name: t\nmesh: {dims: {dp_shard: 2, tp: 2}}\nmodel: {preset: tiny-moe}\n"
      "sweep: {strategy.name: [owner, sequential]}\n",
      "ok.yaml");
  REQUIRE(points.size() == 2);
  const ShardedModel cached = shard_model(points[0]);
  // Changing what the sharding depends on after parsing is noticed (no stale reuse).
  Experiment changed = points[0];
  changed.mesh = DeviceMesh({{"dp_shard", 4, DimRole::fsdp}}, 8);
  const ShardedModel fresh = shard_model(changed);
  CHECK(fresh.mesh.world_size() == 4);
  CHECK(cached.mesh.world_size() == 4);
  CHECK(fresh.mesh.ndims() == 1);
  CHECK(cached.mesh.ndims() == 2);
}
