// Bad experiment files, one test per class of mistake: each must fail with a ConfigError that
// points at the right file:line:column (1-based) and names the offending value and the fix.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/experiment/experiment.hpp"

using namespace muonbed;
using Catch::Contains;

namespace {

// Lines 1-6 of most cases; the case's own lines start at line 7.
const std::string kBase =
    "name: t\n"                // 1
    "cluster: dgx-h100\n"      // 2
    "mesh:\n"                  // 3
    "  dims: {dp_shard: 8}\n"  // 4
    "model:\n"                 // 5
    "  preset: tiny-dense\n";  // 6

// Parses `yaml` as "bad.yaml" and checks the error's place (column 0: not checked) and words.
void expect_error(const std::string& yaml, int line, int column,
                  const std::vector<std::string>& words, const std::string& file = "bad.yaml") {
  INFO("YAML:\n" << yaml);
  try {
    parse_experiment(yaml, file);
  } catch (const ConfigError& e) {
    INFO("message: " << e.what());
    CHECK(e.where().file == file);
    CHECK(e.where().line == line);
    if (column > 0) CHECK(e.where().column == column);
    const std::string place = file + ":" + std::to_string(line) + ":";
    CHECK_THAT(std::string(e.what()), Catch::StartsWith(place));
    for (const std::string& w : words) CHECK_THAT(std::string(e.what()), Contains(w));
    CHECK_FALSE(e.fix().empty());
    return;
  }
  FAIL("expected a ConfigError");
}

}  // namespace

TEST_CASE("YAML syntax error reports the parser's line", "[experiments][errors]") {
  expect_error("name: t\nmesh: {dims: [1, 2}\nmodel: x\n", 2, 0,
               {"YAML syntax error", "fix the YAML"});
}

TEST_CASE("unknown top-level key suggests the closest", "[experiments][errors]") {
  expect_error(kBase + "stratgy:\n  name: owner\n", 7, 1,
               {"unknown key 'stratgy' at the top level", "did you mean 'strategy'?"});
}

TEST_CASE("unknown key in a section suggests the closest", "[experiments][errors]") {
  expect_error(kBase + "strategy:\n  prefetch: 2\n", 8, 3,
               {"unknown key 'prefetch' in strategy; did you mean 'prefetch_count'?",
                "valid keys in strategy"});
}

TEST_CASE("duplicate keys are an error", "[experiments][errors]") {
  expect_error(kBase + "name: u\n", 7, 1, {"key 'name' appears twice", "first at line 1"});
}

TEST_CASE("integer field given a word", "[experiments][errors]") {
  expect_error(
      kBase + "strategy:\n  prefetch_count: two\n", 8, 19,
      {"'strategy.prefetch_count' must be an integer, got 'two'", "whole number in 0..1024"});
}

TEST_CASE("boolean field given a word", "[experiments][errors]") {
  expect_error(kBase + "optimizer:\n  nesterov: maybe\n", 8, 13,
               {"'optimizer.nesterov' must be true or false, got 'maybe'"});
}

TEST_CASE("negative count", "[experiments][errors]") {
  expect_error(kBase + "strategy:\n  prefetch_count: -1\n", 8, 19,
               {"prefetch_count' = -1 must not be negative", "in 0..1024"});
}

TEST_CASE("zero timed steps, negative warm-up steps", "[experiments][errors]") {
  expect_error(kBase + "repeats: 0\n", 7, 10, {"'repeats' = 0 must be positive", "in 1..1000000"});
  expect_error(kBase + "steps: -1\n", 7, 8, {"'steps' = -1", "in 0..1000000"});
}

TEST_CASE("zero mesh dim size", "[experiments][errors]") {
  expect_error("name: t\nmesh:\n  dims: {dp_shard: 0}\nmodel: {preset: tiny-dense}\n", 3, 20,
               {"'mesh.dims.dp_shard' = 0 must be positive"});
}

TEST_CASE("empty mesh", "[experiments][errors]") {
  expect_error("name: t\nmesh:\n  dims: []\nmodel: {preset: tiny-dense}\n", 3, 9,
               {"'mesh.dims' is empty", "at least one dim"});
}

TEST_CASE("missing required section", "[experiments][errors]") {
  expect_error("name: t\nmodel: {preset: tiny-dense}\n", 1, 1,
               {"missing the required key 'mesh'", "mesh: {dims: {dp_shard: 8}}"});
}

TEST_CASE("section of the wrong kind", "[experiments][errors]") {
  expect_error(kBase + "strategy: owner\n", 7, 11,
               {"'strategy' must be a map, got a scalar 'owner'", "valid keys"});
}

TEST_CASE("mesh product differs from world_size", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh:\n  dims: {dp_shard: 4, tp: 2}\n  world_size: 16\nmodel: {preset: "
      "tiny-dense}\n",
      4, 15,
      {"the mesh has 8 ranks (dp_shard=4 x tp=2) but mesh.world_size is 16", "set world_size: 8"});
}

TEST_CASE("mesh larger than a fixed-size cluster", "[experiments][errors]") {
  expect_error(
      "name: t\ncluster: {preset: dgx-h100, nodes: 1}\nmesh:\n  dims: {dp_shard: 16}\nmodel: "
      "{preset: tiny-dense}\n",
      4, 9, {"needs 16 GPUs", "1 nodes x 8 GPUs", "nodes: 2"});
}

TEST_CASE("mesh gpus_per_node disagrees with the cluster", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh:\n  dims: {dp_shard: 8}\n  gpus_per_node: 4\nmodel: {preset: tiny-dense}\n", 4,
      18, {"mesh.gpus_per_node is 4 but cluster 'dgx-h100' has 8", "remove mesh.gpus_per_node"});
}

TEST_CASE("unknown mesh dim role", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh:\n  dims: [{name: data, size: 8, role: fsdpp}]\nmodel: {preset: "
      "tiny-dense}\n",
      3, 38,
      {"unknown value 'fsdpp' for 'mesh.dims[0].role'; did you mean 'fsdp'?",
       "replicate, fsdp, tp, ep, pp"});
}

TEST_CASE("user dim name without a role", "[experiments][errors]") {
  expect_error("name: t\nmesh:\n  dims: {data: 8}\nmodel: {preset: tiny-dense}\n", 3, 10,
               {"mesh dim 'data' has no role", "add role: one of replicate, fsdp"});
}

TEST_CASE("misspelled known dim name suggests the known one", "[experiments][errors]") {
  expect_error("name: t\nmesh:\n  dims: {dp_shrd: 8}\nmodel: {preset: tiny-dense}\n", 3, 10,
               {"mesh dim 'dp_shrd' has no role; did you mean 'dp_shard'?"});
}

TEST_CASE("duplicate mesh dim name", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh:\n  dims: [{name: tp, size: 2}, {name: tp, size: 4}]\nmodel: {preset: "
      "tiny-dense}\n",
      3, 38, {"mesh dim 'tp' appears twice (first at line 3)"});
}

TEST_CASE("unknown model preset lists the valid ones", "[experiments][errors]") {
  expect_error("name: t\nmesh: {dims: {dp_shard: 8}}\nmodel:\n  preset: llama-7\n", 4, 11,
               {"unknown model preset 'llama-7'; did you mean 'llama-7b'?",
                "gpt2-124m, llama-7b, llama-70b, deepseek-v3"});
}

TEST_CASE("model with two descriptions", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh: {dims: {dp_shard: 8}}\nmodel:\n  preset: llama-7b\n  dense: {hidden: 8}\n", 5,
      3,
      {"model has both 'preset' and 'dense'",
       "exactly one of preset, hf_config, dense, moe or params"});
}

TEST_CASE("preset override beyond the preset", "[experiments][errors]") {
  expect_error(kBase + "  layers: 5\n", 7, 11, {"'model.layers' = 5 is out of range", "in 1..2"});
}

TEST_CASE("preset-only key with a dense model", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh: {dims: {dp_shard: 8}}\nmodel:\n  layers: 2\n  dense: {hidden: 64, layers: "
      "2, heads: 4, ffn: 128, vocab: 100}\n",
      4, 3, {"'model.layers' applies only with model.preset", "inside model.dense"});
}

TEST_CASE("dense model missing a required key", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh: {dims: {dp_shard: 8}}\nmodel:\n  dense: {hidden: 64, layers: 2, ffn: 128, "
      "vocab: 100}\n",
      4, 10, {"'model.dense' is missing the required key 'heads'", "heads: 32"});
}

TEST_CASE("kv_heads not dividing heads", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh: {dims: {dp_shard: 8}}\nmodel:\n  dense: {hidden: 64, layers: 2, heads: 4, "
      "kv_heads: 3, ffn: 128, vocab: 100}\n",
      4, 54, {"heads (4) is not a multiple of kv_heads (3)", "1, 2, 4"});
}

TEST_CASE("tp not dividing the attention heads", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh:\n  dims: {tp: 3}\nmodel:\n  dense: {hidden: 4096, layers: 2, heads: 32, "
      "kv_heads: 8, ffn: 11008, vocab: 1000}\n",
      3, 14, {"tp = 3 does not divide heads = 32 and kv_heads = 8", "1, 2, 4, 8"});
}

TEST_CASE("experts not divisible by ep", "[experiments][errors]") {
  expect_error("name: t\nmesh:\n  dims: {ep: 3}\nmodel: {preset: tiny-moe}\n", 3, 14,
               {"ep = 3 does not divide the 8 experts", "1, 2, 4, 8"});
}

TEST_CASE("ep on a model without experts", "[experiments][errors]") {
  expect_error("name: t\nmesh:\n  dims: {ep: 2}\nmodel: {preset: tiny-dense}\n", 3, 14,
               {"has no expert stacks", "dp_replicate"});
}

TEST_CASE("more pipeline stages than layers", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh:\n  dims: {pp: 4}\nmodel: {preset: tiny-dense}\n", 3, 14,
      {"pp = 4 pipeline stages but model 'tiny-dense' has only 2 layers", "at most 2 stages"});
}

TEST_CASE("tp_dim_per_param naming an unknown parameter", "[experiments][errors]") {
  expect_error(kBase + "parallel:\n  tp_dim_per_param: {layers.0.attn.oo: 1}\n", 8, 22,
               {"names 'layers.0.attn.oo', which is not a parameter of model 'tiny-dense'",
                "did you mean 'layers.0.attn.o'?", "muonbed validate --params"});
}

TEST_CASE("tp_dim_per_param dim out of range", "[experiments][errors]") {
  expect_error(
      kBase + "parallel:\n  tp_dim_per_param: {layers.0.attn.o: 2}\n", 8, 39,
      {"tp_dim_per_param['layers.0.attn.o'] = 2 is out of range for shape [64, 64]", "0..1"});
}

TEST_CASE("fsdp_tensor_dim out of range", "[experiments][errors]") {
  expect_error(kBase + "parallel:\n  fsdp_tensor_dim: 2\n", 8, 20,
               {"'parallel.fsdp_tensor_dim' = 2 is out of range", "in 0..1"});
}

TEST_CASE("force_adamw naming an unknown parameter", "[experiments][errors]") {
  expect_error(kBase + "optimizer:\n  routing: {force_adamw: [layers.9.attn.q]}\n", 8, 27,
               {"optimizer.routing.force_adamw names 'layers.9.attn.q'"});
}

TEST_CASE("momentum of 1 or more", "[experiments][errors]") {
  expect_error(kBase + "optimizer:\n  momentum: 1.5\n", 8, 13,
               {"'optimizer.momentum' = 1.5 is out of range", "<= 1"});
  expect_error(kBase + "optimizer:\n  momentum: 1\n", 8, 13, {"must be below 1", "[0, 1)"});
}

TEST_CASE("custom coefficients of the wrong length", "[experiments][errors]") {
  expect_error(kBase + "optimizer:\n  ns_steps: 2\n  ns_coefficients: [[3.4445, -4.775, 2.0315]]\n",
               9, 20, {"ns_coefficients lists 1 steps but ns_steps is 2", "ns_steps: 1"});
  expect_error(kBase + "optimizer:\n  ns_coefficients: [[1, 2]]\n", 8, 21,
               {"has 2 numbers, not 3", "[a, b, c]"});
  expect_error(kBase + "optimizer:\n  ns_coefficients: []\n", 8, 20, {"empty list"});
  expect_error(kBase + "optimizer:\n  ns_coefficients: kellr\n", 8, 20,
               {"unknown value 'kellr'", "keller"});
}

TEST_CASE("optimizer keys of earlier versions name their new spelling", "[experiments][errors]") {
  expect_error(kBase + "optimizer:\n  adamw_lr: 1e-3\n", 8, 3,
               {"'optimizer.adamw_lr' was renamed", "adamw: {lr: ...}"});
  expect_error(kBase + "optimizer:\n  update_scale: original\n", 8, 3,
               {"'optimizer.update_scale' was renamed", "adjust_lr_fn"});
  expect_error(kBase + "optimizer:\n  coefficients: keller\n", 8, 3,
               {"was renamed", "ns_coefficients"});
}

TEST_CASE("AdamW betas and momentum forms are checked", "[experiments][errors]") {
  expect_error(kBase + "optimizer:\n  adamw: {betas: [0.9]}\n", 8, 18,
               {"'optimizer.adamw.betas' has 1 values", "[0.9, 0.999]"});
  expect_error(kBase + "optimizer:\n  adamw: {betas: [0.9, 1]}\n", 8, 24, {"must be below 1"});
  expect_error(kBase + "optimizer:\n  momentum_form: ema\n", 8, 18,
               {"unknown value 'ema'", "lerp", "classic"});
}

TEST_CASE("unknown strategy lists the valid ones", "[experiments][errors]") {
  expect_error(kBase + "strategy: {name: ownr}\n", 7, 18,
               {"unknown value 'ownr' for 'strategy.name'; did you mean 'owner'?",
                "sequential, replicated, owner, all_to_all, owner_allgather"});
}

TEST_CASE("unknown assign policy lists the valid ones", "[experiments][errors]") {
  expect_error(kBase + "strategy: {assign: fastest}\n", 7, 20,
               {"unknown value 'fastest' for 'strategy.assign'", "round_robin", "flop_balanced"});
}

TEST_CASE("unknown gather policy", "[experiments][errors]") {
  expect_error(kBase + "strategy: {gather: hierarchcal}\n", 7, 20,
               {"unknown gather policy 'hierarchcal'; did you mean 'hierarchical'?"});
}

TEST_CASE("explicit owners without assign: explicit", "[experiments][errors]") {
  expect_error(kBase + "strategy:\n  explicit_owners: {layers.0.attn.q: 0}\n", 8, 3,
               {"'strategy.explicit_owners' is given but strategy.assign is 'flop_balanced'",
                "set assign: explicit"});
}

TEST_CASE("assign: explicit without owners", "[experiments][errors]") {
  expect_error(kBase + "strategy:\n  assign: explicit\n", 8, 11,
               {"strategy.assign: explicit needs 'explicit_owners'"});
}

TEST_CASE("explicit owner rank outside the mesh", "[experiments][errors]") {
  expect_error(kBase + "strategy:\n  assign: explicit\n  explicit_owners: {layers.0.attn.q: 8}\n",
               9, 38, {"explicit_owners.layers.0.attn.q' = 8 is out of range", "in 0..7"});
}

TEST_CASE("explicit owner of an unknown matrix", "[experiments][errors]") {
  expect_error(kBase + "strategy:\n  assign: explicit\n  explicit_owners: {layers.0.attn.qq: 1}\n",
               9, 21,
               {"explicit_owners names 'layers.0.attn.qq', which is not a Muon matrix",
                "did you mean 'layers.0.attn.q'?"});
}

TEST_CASE("grad_sync with no levels", "[experiments][errors]") {
  expect_error(kBase + "strategy:\n  grad_sync: {enabled: true, level_periods: []}\n", 8, 45,
               {"'strategy.grad_sync.level_periods' is empty", "level_periods: [1, 2, 4]"});
}

TEST_CASE("unknown backend lists the valid ones", "[experiments][errors]") {
  expect_error(kBase + "backend: [sim, gpu]\n", 7, 16,
               {"unknown value 'gpu' for 'backend[1]'", "sim, analytic, mpi, nccl"});
}

TEST_CASE("backend listed twice", "[experiments][errors]") {
  expect_error(kBase + "backend: [sim, sim]\n", 7, 16, {"backend 'sim' is listed twice"});
}

TEST_CASE("unknown sim fidelity", "[experiments][errors]") {
  expect_error(kBase + "sim: {fidelity: exact}\n", 7, 17,
               {"unknown value 'exact' for 'sim.fidelity'", "step, flow, auto"});
}

TEST_CASE("unknown cluster suggests the closest file", "[experiments][errors]") {
  expect_error(
      "name: t\ncluster: dgx-h900\nmesh: {dims: {dp_shard: 8}}\nmodel: {preset: tiny-dense}\n", 2,
      10, {"cluster 'dgx-h900' not found; did you mean 'dgx-h100'?", "a100-pcie-4x"});
}

TEST_CASE("cluster override breaking a cross-field rule", "[experiments][errors]") {
  expect_error(
      "name: t\ncluster:\n  preset: dgx-h100\n  nic: {count_per_node: 4}\nmesh: {dims: "
      "{dp_shard: 8}}\nmodel: {preset: tiny-dense}\n",
      4, 8, {"rail_optimized needs one NIC per GPU", "count_per_node: 8"});
}

TEST_CASE("cluster override with an unknown key", "[experiments][errors]") {
  expect_error(
      "name: t\ncluster:\n  preset: dgx-h100\n  gpu: {peak: 900}\nmesh: {dims: {dp_shard: "
      "8}}\nmodel: {preset: tiny-dense}\n",
      4, 9, {"unknown key 'peak' in cluster.gpu; did you mean 'peak_tflops'?"});
}

TEST_CASE("efficiency curve not increasing", "[experiments][errors]") {
  expect_error(
      "name: t\ncluster:\n  preset: dgx-h100\n  gpu: {gemm_efficiency: {4096: 0.8, 1024: 0.4}}\n"
      "mesh: {dims: {dp_shard: 8}}\nmodel: {preset: tiny-dense}\n",
      4, 38, {"must increase: 1024 follows 4096"});
}

TEST_CASE("error inside a referenced cluster file points into that file", "[experiments][errors]") {
  const std::string dir = MUONBED_TEST_DATA_DIR;
  try {
    parse_experiment(
        "name: t\ncluster: bad-cluster.yaml\nmesh: {dims: {dp_shard: 8}}\nmodel: "
        "{preset: tiny-dense}\n",
        dir + "/exp.yaml");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    INFO(e.what());
    CHECK(e.where().file == dir + "/bad-cluster.yaml");
    CHECK(e.where().line == 7);
    CHECK(e.where().column == 16);
    CHECK_THAT(std::string(e.what()), Contains("'gpu.peak_tflops' = -5 must be positive"));
  }
}

TEST_CASE("sweep key outside the schema", "[experiments][errors]") {
  expect_error(
      kBase + "sweep:\n  strategy.nme: [owner]\n", 8, 3,
      {"unknown sweep key 'strategy.nme'; did you mean 'strategy.name'?", "mesh.<dim name>"});
}

TEST_CASE("sweep over a mesh dim that does not exist", "[experiments][errors]") {
  expect_error(kBase + "sweep:\n  mesh.dp_shrd: [2, 4]\n", 8, 3,
               {"unknown sweep key 'mesh.dp_shrd'; did you mean 'mesh.dp_shard'?"});
}

TEST_CASE("sweep with an empty list", "[experiments][errors]") {
  expect_error(kBase + "sweep:\n  strategy.name: []\n", 8, 18,
               {"sweep 'strategy.name' has an empty list", "at least one value"});
}

TEST_CASE("sweep value that is not a list", "[experiments][errors]") {
  expect_error(kBase + "sweep:\n  strategy.name: owner\n", 8, 18,
               {"sweep 'strategy.name' must be a list of values, got a scalar 'owner'"});
}

TEST_CASE("overlapping sweep keys", "[experiments][errors]") {
  expect_error(kBase + "sweep:\n  strategy: [{name: owner}]\n  strategy.name: [owner]\n", 9, 3,
               {"sweep keys 'strategy' and 'strategy.name' overlap"});
}

TEST_CASE("zipped lists of unequal length", "[experiments][errors]") {
  expect_error(kBase +
                   "sweep:\n"                                   // 7
                   "  zip:\n"                                   // 8
                   "    mesh.dp_shard: [8, 16, 32]\n"           // 9
                   "    strategy.name: [owner, all_to_all]\n",  // 10
               10, 20,
               {"equal lengths: 'mesh.dp_shard' has 3 values, 'strategy.name' has 2",
                "one value per point (3 here)"});
}

TEST_CASE("a zipped key that overlaps a cartesian one", "[experiments][errors]") {
  expect_error(kBase +
                   "sweep:\n"                                                   // 7
                   "  strategy.name: [owner, all_to_all]\n"                     // 8
                   "  zip: {strategy: [{name: owner}], mesh.dp_shard: [8]}\n",  // 9
               9, 9, {"sweep keys 'strategy.name' and 'strategy' overlap", "zip"});
}

TEST_CASE("a key in two zip groups", "[experiments][errors]") {
  expect_error(kBase +
                   "sweep:\n"                                                         // 7
                   "  zip:\n"                                                         // 8
                   "    - {mesh.dp_shard: [8, 16], strategy.name: [owner, owner]}\n"  // 9
                   "    - {mesh.dp_shard: [4]}\n",                                    // 10
               10, 8, {"sweep keys 'mesh.dp_shard' and 'mesh.dp_shard' overlap"});
}

TEST_CASE("a zip group that repeats a combination", "[experiments][errors]") {
  expect_error(
      kBase +
          "sweep:\n"                                     // 7
          "  zip:\n"                                     // 8
          "    mesh.dp_shard: [8, 16, 8]\n"              // 9
          "    strategy.name: [owner, owner, owner]\n",  // 10
      9, 28,
      {"lists the combination 'mesh.dp_shard=8, strategy.name=owner' twice", "values 1 and 3"});
}

TEST_CASE("a zip that is no map of lists", "[experiments][errors]") {
  expect_error(kBase + "sweep:\n  zip: [8, 16]\n", 8, 9,
               {"'sweep.zip[0]' must be a non-empty map of keys whose lists vary together"});
  expect_error(kBase + "sweep:\n  zip: {}\n", 8, 8, {"'sweep.zip' must be a non-empty map"});
  expect_error(kBase + "sweep:\n  zip: {mesh.dp_shard: 8}\n", 8, 24,
               {"sweep 'mesh.dp_shard' must be a list of values, got a scalar '8'"});
  expect_error(kBase + "sweep:\n  zip: {strategy.nme: [owner]}\n", 8, 9,
               {"unknown sweep key 'strategy.nme'; did you mean 'strategy.name'?"});
}

TEST_CASE("a bad swept value points at the sweep list", "[experiments][errors]") {
  expect_error(kBase + "sweep:\n  strategy.name: [owner, bogus]\n", 8, 26,
               {"unknown value 'bogus' for 'strategy.name'", "in sweep point strategy.name=bogus"});
}

TEST_CASE("a swept mesh size that breaks a layout rule points at the sweep list",
          "[experiments][errors]") {
  expect_error(
      "name: t\nmesh:\n  dims: {pp: 1, dp_shard: 2}\nmodel: {preset: tiny-dense}\n"
      "sweep:\n  mesh.pp: [1, 2, 3]\n",
      6, 19, {"pp = 3 pipeline stages", "in sweep point mesh.pp=3"});
}

TEST_CASE("explicit params: bad placement text", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh: {dims: {dp_shard: 2}}\nmodel:\n  params:\n    - {name: w, shape: [8, 8], "
      "placements: {dp_shard: S0}}\n",
      5, 55, {"bad placement 'S0' for mesh dim 'dp_shard'", "R (replicate), S(d)"});
}

TEST_CASE("explicit params: placement on a tensor dim the shape lacks", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh: {dims: {dp_shard: 2}}\nmodel:\n  params:\n    - {name: w, shape: [8, 8], "
      "placements: {dp_shard: S(2)}}\n",
      5, 55, {"placement 'S(2)' shards tensor dim 2 but the shape [8, 8] has 2 dims", "0..1"});
}

TEST_CASE("explicit params: placement naming an unknown mesh dim", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh: {dims: {dp_shard: 2}}\nmodel:\n  params:\n    - {name: w, shape: [8, 8], "
      "placements: {dp_shrd: R}}\n",
      5, 45, {"unknown key 'dp_shrd' in model.params[0].placements; did you mean 'dp_shard'?"});
}

TEST_CASE("explicit params: zero extent in a shape", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh: {dims: {dp_shard: 2}}\nmodel:\n  params:\n    - {name: w, shape: [8, 0]}\n",
      5, 28, {"'model.params[0].shape[1]' = 0 must be positive"});
}

TEST_CASE("explicit params: duplicate names", "[experiments][errors]") {
  expect_error(
      "name: t\nmesh: {dims: {dp_shard: 2}}\nmodel:\n  params:\n    - {name: w, shape: [8, 8]}\n"
      "    - {name: w, shape: [4]}\n",
      6, 14, {"parameter name 'w' appears twice (first at line 5)"});
}

TEST_CASE("missing experiment file", "[experiments][errors]") {
  try {
    load_experiment("/nonexistent/dir/exp.yaml");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.where().file == "/nonexistent/dir/exp.yaml");
    CHECK_THAT(std::string(e.what()), Contains("cannot open experiment file"));
    CHECK_THAT(e.fix(), Contains("check the path"));
  }
}

TEST_CASE("tab indentation is named as the cause", "[experiments][errors]") {
  expect_error("name: t\nmesh:\n\tdims: {dp_shard: 2}\n", 3, 0,
               {"YAML syntax error", "line 3 is indented with a tab; use spaces"});
}

TEST_CASE("a file that is not a map", "[experiments][errors]") {
  expect_error("- mesh\n- model\n", 1, 1, {"the file must be a map, got a list [mesh, model]"});
}

TEST_CASE("split_ns: a strategy without staged gathers, an unknown key, a bad group size",
          "[experiments][errors][split_ns]") {
  expect_error(kBase + "strategy:\n  name: all_to_all\n  split_ns: true\n", 9, 3,
               {"'strategy.split_ns' needs a strategy whose staged gathers", "(sequential, owner)",
                "not 'all_to_all'"});
  expect_error(kBase + "strategy:\n  split_ns: {members: 4}\n", 8, 0,
               {"unknown key 'members' in strategy.split_ns", "max_members"});
  expect_error(kBase + "strategy:\n  split_ns: {max_members: 1}\n", 8, 0, {"max_members"});
  // The map form enables it; the scalar form too; the plan then splits.
  const auto points = parse_experiment(
      kBase + "strategy:\n  split_ns: {threshold: 0, max_members: 4}\n", "good.yaml");
  REQUIRE(points.size() == 1);
  CHECK(points[0].strategy.split_ns.enabled);
  CHECK(points[0].strategy.split_ns.max_members == 4);
  CHECK(points[0].strategy.split_ns.threshold == 0);
}
