// Experiments with `model: {hf_config: ...}` (a config.json path relative to the experiment file,
// or the fields inline) and its overrides, the resolved configuration that carries the fields read
// (so it needs no config.json and reads back to the same point), the errors with file:line:column,
// and `parallel.dense_over_ep`.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/base/errors.hpp"
#include "core/experiment/experiment.hpp"
#include "core/model/hf_config.hpp"
#include "muonbed/config.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

std::string hf_data(const std::string& name) {
  return std::string(MUONBED_SOURCE_DIR) + "/tests/core/data/hf/" + name + ".json";
}

using testing::TempDir;

// Writes `text` to `name` under the test's folder (making its folders); returns the file's path.
std::string write_file(const TempDir& dir, const std::string& name, const std::string& text) {
  const fs::path file = dir.path() / name;
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
  return file.string();
}

ConfigError config_error(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError");
  return ConfigError({}, "", "");
}

void require_same_model(const Model& a, const Model& b) {
  CHECK(a.name == b.name);
  CHECK(a.num_layers == b.num_layers);
  REQUIRE(a.params.size() == b.params.size());
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    CHECK(a.params[i].name == b.params[i].name);
    CHECK(a.params[i].shape == b.params[i].shape);
    CHECK(a.params[i].role == b.params[i].role);
    CHECK(a.params[i].dtype == b.params[i].dtype);
  }
}

const DistributedParam& sharded_param(const ShardedModel& m, const std::string& name) {
  for (const DistributedParam& p : m.params)
    if (p.name == name) return p;
  FAIL("no parameter " << name);
  return m.params.front();
}

}  // namespace

TEST_CASE("hf_config: a path relative to the experiment file, and the resolved point",
          "[experiments][hf]") {
  TempDir dir("hf-exp-path");
  fs::create_directories(dir.path() / "models" / "Qwen3-30B-A3B");
  fs::copy_file(hf_data("Qwen3-30B-A3B"), dir.path() / "models" / "Qwen3-30B-A3B" / "config.json");
  const std::string file = write_file(dir, "study/exp.yaml",
                                      "name: hf\n"
                                      "mesh: {dims: {ep: 8}}\n"
                                      "model:\n"
                                      "  hf_config: ../models/Qwen3-30B-A3B/config.json\n"
                                      "  layers: 4\n"
                                      "backend: analytic\n");
  const std::vector<Experiment> points = load_experiment(file);
  REQUIRE(points.size() == 1);
  const Experiment& e = points[0];
  CHECK(e.model.name == "Qwen3-30B-A3B");
  CHECK(e.model.num_layers == 4);
  // The full model's count (tests/core/hf_config_test.cpp) less 44 of its 48 blocks.
  constexpr std::int64_t block = 2 * 32 * 128 * 2048LL + 2 * 4 * 128 * 2048LL + 2 * 128 +
                                 128 * 2048LL + 128 * 3 * 2048LL * 768 + 2 * 2048;
  CHECK(e.model.numel() == 30'532'122'624LL - 44 * block);
  // The resolved configuration holds the fields read, not the path: it parses on its own, to the
  // same model, and resolving it again gives the same text.
  CHECK_THAT(e.resolved_yaml, Contains("hf_config:") && Contains("model_type: \"qwen3_moe\"") &&
                                  Contains("num_experts: 128") && Contains("layers: 4") &&
                                  Contains("name: Qwen3-30B-A3B") && !Contains("config.json") &&
                                  !Contains("rope_theta"));
  const Experiment again = parse_experiment(e.resolved_yaml, "elsewhere/resolved.yaml").at(0);
  require_same_model(e.model, again.model);
  auto body = [](const std::string& yaml) { return yaml.substr(yaml.find('\n')); };
  CHECK(body(again.resolved_yaml) == body(e.resolved_yaml));
  // The expert stacks split over ep = 8 (128 / 8 = 16 experts per slice).
  CHECK(sharded_param(shard_model(e), "layers.3.moe.experts.up[ep=7]").shape ==
        std::vector<std::int64_t>{16, 768, 2048});

  // A sweep over config files: each point its own model.
  fs::copy_file(hf_data("Qwen3-8B"), dir.path() / "models" / "qwen3-8b.json");
  const std::string sweep = write_file(dir, "study/sweep.yaml",
                                       "name: hf\n"
                                       "mesh: {dims: {dp_shard: 8}}\n"
                                       "model: {hf_config: ../models/qwen3-8b.json, layers: 2}\n"
                                       "backend: analytic\n"
                                       "sweep:\n"
                                       "  model.hf_config: [../models/qwen3-8b.json, "
                                       "../models/Qwen3-30B-A3B/config.json]\n");
  const std::vector<Experiment> swept = load_experiment(sweep);
  REQUIRE(swept.size() == 2);
  CHECK(swept[0].model.name == "qwen3-8b");
  CHECK(swept[1].model.name == "Qwen3-30B-A3B");
  CHECK(swept[0].point_label == "model.hf_config=../models/qwen3-8b.json");
}

TEST_CASE("hf_config: inline fields and overrides", "[experiments][hf]") {
  const std::string yaml =
      "name: inline\n"
      "mesh: {dims: {dp_shard: 2, ep: 2, tp: 2}}\n"
      "model:\n"
      "  hf_config:\n"
      "    model_type: deepseek_v3\n"
      "    hidden_size: 256\n"
      "    intermediate_size: 512\n"
      "    moe_intermediate_size: 64\n"
      "    num_hidden_layers: 6\n"
      "    num_attention_heads: 4\n"
      "    vocab_size: 1000\n"
      "    q_lora_rank: 96\n"
      "    kv_lora_rank: 32\n"
      "    qk_nope_head_dim: 16\n"
      "    qk_rope_head_dim: 8\n"
      "    v_head_dim: 16\n"
      "    n_routed_experts: 16\n"
      "    n_shared_experts: 1\n"
      "    first_k_dense_replace: 1\n"
      "    torch_dtype: bfloat16\n"
      "  name: tiny-mla\n"
      "  layers: 3\n"
      "  experts: 8\n"
      "  dtype: fp32\n"
      "backend: analytic\n";
  const Experiment e = parse_experiment(yaml, "inline.yaml").at(0);
  CHECK(e.model.name == "tiny-mla");
  CHECK(e.model.num_layers == 3);
  // Built by the model code from the same numbers: the experiment adds nothing of its own.
  MoeSpec spec;
  spec.base.name = "x";
  spec.base.hidden = 256;
  spec.base.ffn = 512;
  spec.base.layers = 3;
  spec.base.heads = 4;
  spec.base.vocab = 1000;
  spec.base.mla = MlaSpec{96, 32, 16, 8, 16};
  spec.base.dtype = DType::fp32;
  spec.experts = 8;
  spec.expert_ffn = 64;
  spec.shared_experts = 1;
  spec.dense_layers = 1;
  CHECK(e.model.numel() == make_moe(spec).numel());
  const ShardedModel m = shard_model(e);
  // MLA under TP: q_b and kv_b column-parallel by heads, the down-projections replicated.
  CHECK(sharded_param(m, "layers.1.attn.q_b").layout.placements()[2] == Placement::shard(0));
  CHECK(sharded_param(m, "layers.1.attn.kv_b").layout.placements()[2] == Placement::shard(0));
  CHECK(sharded_param(m, "layers.1.attn.q_a").layout.placements()[2] == Placement::replicate());
  CHECK(sharded_param(m, "layers.1.attn.kv_a").layout.placements()[2] == Placement::replicate());
  CHECK(sharded_param(m, "layers.1.attn.o").layout.placements()[2] == Placement::shard(1));
  // The resolved point reads back the same, with the overrides kept apart from the fields.
  CHECK_THAT(e.resolved_yaml, Contains("experts: 8") && Contains("n_routed_experts: 16") &&
                                  Contains("dtype: fp32") && Contains("q_lora_rank: 96"));
  const Experiment again = parse_experiment(e.resolved_yaml, "r.yaml").at(0);
  require_same_model(e.model, again.model);

  // QK-clip does not cover MLA: an error, not a clip of nothing.
  const ConfigError clip = config_error([&] {
    parse_experiment(yaml + "optimizer: {qk_clip: {enabled: true, head_dim: 24}}\n", "clip.yaml");
  });
  CHECK_THAT(std::string(clip.what()),
             Contains("clip.yaml:26:") && Contains("multi-head latent attention"));
  CHECK(clip.fix() == "set qk_clip: {enabled: false}");
}

TEST_CASE("hf_config: errors point at the experiment and name the config's field",
          "[experiments][hf]") {
  TempDir dir("hf-exp-errors");
  // A field missing from a config file: the error is at the hf_config value, names the file and
  // the field, and says what to add.
  write_file(dir, "cfg/no_layers.json",
             "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, "
             "\"num_attention_heads\": 4, \"vocab_size\": 100}");
  const std::string missing =
      write_file(dir, "missing.yaml",
                 "name: t\nmesh: {dims: {dp_shard: 2}}\nmodel:\n  hf_config: cfg/no_layers.json\n");
  ConfigError e = config_error([&] { load_experiment(missing); });
  CHECK(e.where().file == missing);
  CHECK(e.where().line == 4);
  CHECK(e.where().column == 14);
  CHECK_THAT(std::string(e.what()),
             Contains("cfg/no_layers.json: field 'num_hidden_layers' is missing"));
  CHECK_THAT(e.fix(), Contains("\"num_hidden_layers\":"));

  // A missing file: the resolved path and the hint that it is relative to the experiment.
  const std::string absent = write_file(
      dir, "absent.yaml", "name: t\nmesh: {dims: {dp_shard: 2}}\nmodel: {hf_config: nope.json}\n");
  e = config_error([&] { load_experiment(absent); });
  CHECK(e.where().line == 3);
  CHECK_THAT(std::string(e.what()), Contains("nope.json") && Contains("cannot be opened"));
  CHECK_THAT(e.fix(), Contains("experiment file's folder"));

  // Inline: a mistyped field is reported at its own line and column.
  const std::string inline_head =
      "name: t\n"                      // 1
      "mesh: {dims: {dp_shard: 2}}\n"  // 2
      "model:\n"                       // 3
      "  hf_config:\n"                 // 4
      "    model_type: mistral\n"      // 5
      "    hidden_size: \"64\"\n"      // 6
      "    intermediate_size: 128\n"   // 7
      "    num_hidden_layers: 2\n"     // 8
      "    num_attention_heads: 4\n"   // 9
      "    vocab_size: 100\n";         // 10
  e = config_error([&] { parse_experiment(inline_head, "inline.yaml"); });
  CHECK(e.where().line == 6);
  CHECK(e.where().column == 18);
  CHECK_THAT(std::string(e.what()),
             Contains("model.hf_config (inline): field 'hidden_size' is \"64\" (a string), not an "
                      "integer"));

  // An unknown model_type names the supported ones.
  std::string unknown = inline_head;
  unknown.replace(unknown.find("mistral"), 7, "falcon");
  unknown.replace(unknown.find("\"64\""), 4, "64");
  e = config_error([&] { parse_experiment(unknown, "unknown.yaml"); });
  CHECK(e.where().line == 5);
  CHECK_THAT(std::string(e.what()), Contains("\"falcon\", which muonbed does not read"));
  CHECK_THAT(e.fix(), Contains("qwen3_moe") && Contains("deepseek_v3") && Contains("gemma3"));

  // Overrides: experts on a dense config at the experts key; experts without hf_config.
  std::string dense = unknown;
  dense.replace(dense.find("falcon"), 6, "mistral");
  e = config_error([&] { parse_experiment(dense + "  experts: 4\n", "experts.yaml"); });
  CHECK(e.where().line == 11);
  CHECK_THAT(std::string(e.what()), Contains("model.experts cannot apply") && Contains("dense"));
  e = config_error([&] {
    parse_experiment(
        "name: t\nmesh: {dims: {dp_shard: 2}}\nmodel: {preset: tiny-moe, experts: 4}\n",
        "preset.yaml");
  });
  CHECK_THAT(std::string(e.what()), Contains("'model.experts' applies only with model.hf_config"));
  e = config_error([&] {
    parse_experiment("name: t\nmesh: {dims: {dp_shard: 2}}\nmodel: {hf_config: [a, b]}\n",
                     "l.yaml");
  });
  CHECK_THAT(std::string(e.what()), Contains("must be a path or a map"));

  // TP must divide the config's heads and KV heads (Qwen3-30B-A3B: 32 and 4).
  fs::copy_file(hf_data("Qwen3-30B-A3B"), dir.path() / "q.json");
  const std::string tp = write_file(
      dir, "tp.yaml", "name: t\nmesh: {dims: {dp_shard: 2, tp: 8}}\nmodel: {hf_config: q.json}\n");
  e = config_error([&] { load_experiment(tp); });
  CHECK_THAT(std::string(e.what()),
             Contains("tp = 8 does not divide heads = 32 and kv_heads = 4") && Contains("1, 2, 4"));
}

TEST_CASE("parallel.dense_over_ep shards dense weights over fsdp x ep", "[experiments][hf]") {
  const std::string base =
      "name: t\n"
      "mesh: {dims: {dp_shard: 2, ep: 4}}\n"
      "model: {preset: tiny-moe}\n"
      "backend: analytic\n";
  const Experiment replicated = parse_experiment(base, "r.yaml").at(0);
  CHECK(replicated.parallel.dense_over_ep == DenseOverEp::replicate);
  CHECK_THAT(replicated.resolved_yaml, !Contains("dense_over_ep"));  // the default, as before
  const Experiment sharded =
      parse_experiment(base + "parallel: {dense_over_ep: shard}\n", "s.yaml").at(0);
  CHECK(sharded.parallel.dense_over_ep == DenseOverEp::shard);
  CHECK_THAT(sharded.resolved_yaml, Contains("dense_over_ep: shard"));
  const ShardedModel r = shard_model(replicated), s = shard_model(sharded);
  CHECK(sharded_param(r, "layers.1.attn.q").layout.placements() ==
        std::vector<Placement>{Placement::shard(0), Placement::replicate()});
  CHECK(sharded_param(s, "layers.1.attn.q").layout.placements() ==
        std::vector<Placement>{Placement::shard(0), Placement::shard(0)});
  // Expert slices are the same either way.
  CHECK(sharded_param(s, "layers.1.moe.experts.up[ep=2]").layout.placements() ==
        sharded_param(r, "layers.1.moe.experts.up[ep=2]").layout.placements());
  // Each rank holds a quarter of the dense bytes it held before (tiny-moe's dims divide by 8).
  std::int64_t dense_r = 0, dense_s = 0;
  for (const DistributedParam& p : r.params)
    if (p.shape.size() < 3) dense_r += p.layout.shard_numel(r.mesh, 5);
  for (const DistributedParam& p : s.params)
    if (p.shape.size() < 3) dense_s += p.layout.shard_numel(s.mesh, 5);
  CHECK(dense_r == 4 * dense_s);
  // The option travels through the resolved point; a different option, a different point.
  const Experiment again = parse_experiment(sharded.resolved_yaml, "again.yaml").at(0);
  CHECK(again.parallel.dense_over_ep == DenseOverEp::shard);
  CHECK(again.sharded_key != replicated.sharded_key);

  const ConfigError e = config_error(
      [&] { parse_experiment(base + "parallel: {dense_over_ep: fsdp}\n", "bad.yaml"); });
  CHECK(e.where().line == 5);
  CHECK_THAT(std::string(e.what()), Contains("fsdp") && Contains("replicate, shard"));
}
