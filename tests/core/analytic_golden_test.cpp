// Golden results of the analytic backend: small experiments covering FSDP x TP across two nodes
// with level-scheduled gradient sync (two step patterns), pipeline stages, expert parallelism
// with all-to-all, and HSDP on PCIe nodes, each pinned as the record the analytic backend writes.
// They were recorded before the analytic model moved onto the execution engine
// (core/engine/engine.hpp) and catch any later change of its figures.
//
// Golden files: tests/core/golden/analytic_*.json. Every field is compared except the timestamp
// and the provenance fields that depend on the machine or checkout (tests/golden_json.hpp);
// numbers to a relative 1e-12, which allows summing the same busy intervals in another order
// and nothing else. After an intended change of the analytic model, regenerate them and review
// the diff:
//   MUONBED_UPDATE_GOLDEN=1 ./build/core_tests "[golden]"
#include <catch2/catch.hpp>

#include <string>

#include "core/experiment/experiment.hpp"
#include "core/results/results.hpp"
#include "muonbed/config.hpp"
#include "tests/golden_json.hpp"

using namespace muonbed;

namespace {

struct GoldenCase {
  const char* name;
  const char* yaml;
};

const GoldenCase kCases[] = {
    {"analytic_fsdp_tp", R"(
name: analytic_fsdp_tp
cluster: dgx-h100
mesh: {dims: [{name: dp_shard, size: 2}, {name: tp, size: 8}]}
model: {dense: {hidden: 1024, layers: 4, heads: 8, kv_heads: 8, ffn: 4096, vocab: 8192}}
strategy: {name: owner, prefetch_count: 1, grad_sync: {enabled: true, level_periods: [1, 2]}}
backend: [analytic]
)"},
    {"analytic_pp", R"(
name: analytic_pp
cluster: {preset: dgx-h100, nodes: 2}
mesh: {dims: [{name: pp, size: 2}, {name: dp_shard, size: 8}]}
model: {preset: tiny-dense}
strategy: {name: owner, assign: stage_local}
backend: [analytic]
)"},
    {"analytic_moe", R"(
name: analytic_moe
cluster: {preset: dgx-h100, nodes: 2}
mesh: {dims: [{name: ep, size: 4}, {name: dp_shard, size: 4}]}
model: {preset: tiny-moe}
strategy: {name: all_to_all, assign: flop_balanced}
backend: [analytic]
)"},
    {"analytic_hsdp_pcie", R"(
name: analytic_hsdp_pcie
cluster: {preset: a100-pcie-4x, nodes: 2}
mesh: {dims: [{name: dp_replicate, size: 2}, {name: dp_shard, size: 4}]}
model: {preset: gpt2-124m}
strategy: {name: owner_allgather}
backend: [analytic]
)"},
};

}  // namespace

TEST_CASE("small experiments match their golden analytic results", "[analytic][golden]") {
  for (const GoldenCase& c : kCases) {
    INFO(c.name);
    const auto points =
        parse_experiment(c.yaml, std::string(MUONBED_SOURCE_DIR) + "/experiments/golden.yaml");
    REQUIRE(points.size() == 1);
    const Experiment& e = points[0];
    ResultRecord record = analytic_record(plan_experiment(e), e.cluster);
    record.provenance = make_provenance(&e, "");
    testing::check_golden_record(
        record, std::string(MUONBED_SOURCE_DIR) + "/tests/core/golden/" + c.name + ".json", 1e-12);
  }
}
