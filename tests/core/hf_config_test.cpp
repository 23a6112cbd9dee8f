// Tests of models read from Hugging Face config.json files (core/model/hf_config.hpp). The
// configs in tests/core/data/hf/ are the published files of each model (the fields that shape
// parameters exactly as released). Every count is checked twice: against a formula written here
// from the architecture, independently of make_dense / make_moe, and that formula against the
// published headline (static_assert), with what the published figure includes beyond muonbed's
// model said beside it. Then structure (roles, MLA shapes, layer patterns), overrides, the
// record of fields read (read back to the same model), and the errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/model/hf_config.hpp"
#include "muonbed/config.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;
using i64 = std::int64_t;

namespace {

std::string data_path(const std::string& name) {
  return std::string(MUONBED_SOURCE_DIR) + "/tests/core/data/hf/" + name + ".json";
}

HfModel load(const std::string& name, const HfOverrides& overrides = {}) {
  return load_hf_config(data_path(name), overrides);
}

std::string file_text(const std::string& name) {
  std::ifstream in(data_path(name));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

const Parameter& param(const Model& m, const std::string& name) {
  for (const Parameter& p : m.params)
    if (p.name == name) return p;
  FAIL("no parameter " << name);
  return m.params.front();
}

bool has(const Model& m, const std::string& name) {
  return std::any_of(m.params.begin(), m.params.end(),
                     [&](const Parameter& p) { return p.name == name; });
}

using Shape = std::vector<i64>;

// Architecture formulas, written from the papers and model code, not from muonbed's builder.
// Attention with grouped-query heads: q and o of heads x head_dim, k and v of kv x head_dim.
constexpr i64 gqa(i64 hidden, i64 heads, i64 kv, i64 head_dim) {
  return 2 * heads * head_dim * hidden + 2 * kv * head_dim * hidden;
}
constexpr i64 gated_mlp(i64 hidden, i64 ffn) {
  return 3 * hidden * ffn;
}

// The same config read twice, the second time from the record of the fields the first read
// used, gives the same model.
void check_record_reads_back(const HfModel& hf) {
  INFO(hf.fields);
  const HfModel again = model_from_hf_config(hf.fields, "record");
  REQUIRE(again.model.params.size() == hf.model.params.size());
  for (std::size_t i = 0; i < hf.model.params.size(); ++i) {
    const Parameter& a = hf.model.params[i];
    const Parameter& b = again.model.params[i];
    CHECK(a.name == b.name);
    CHECK(a.shape == b.shape);
    CHECK(a.role == b.role);
    CHECK(a.dtype == b.dtype);
    CHECK(a.layer == b.layer);
  }
  CHECK(again.fields == hf.fields);
}

}  // namespace

TEST_CASE("hf_config: dense architectures match their published parameter counts", "[hf]") {
  // Llama-2-7B (meta-llama/Llama-2-7b-hf, published 6,738,415,616): MHA 32 x 128, SwiGLU 11008,
  // two RMSNorms per block, untied head, final norm. Same count as the llama-7b preset.
  constexpr i64 llama2_7b =
      2 * 32000LL * 4096 + 32 * (gqa(4096, 32, 32, 128) + gated_mlp(4096, 11008) + 2 * 4096) + 4096;
  static_assert(llama2_7b == 6'738'415'616);
  const HfModel llama2 = load("Llama-2-7b-hf");
  CHECK(llama2.model.numel() == llama2_7b);
  CHECK(llama2.model.name == "Llama-2-7b-hf");
  CHECK(llama2.model_type == "llama");
  CHECK(llama2.model.params.front().dtype == DType::fp16);  // torch_dtype float16

  // Llama-3-8B (published 8,030,261,248): GQA 32 heads, 8 KV heads, SwiGLU 14336, vocab 128256.
  constexpr i64 llama3_8b =
      2 * 128256LL * 4096 + 32 * (gqa(4096, 32, 8, 128) + gated_mlp(4096, 14336) + 2 * 4096) + 4096;
  static_assert(llama3_8b == 8'030'261'248);
  CHECK(load("Meta-Llama-3-8B").model.numel() == llama3_8b);

  // Llama-3.2-1B (published 1.23B): head_dim given, embedding tied to the head.
  constexpr i64 llama32_1b =
      128256LL * 2048 + 16 * (gqa(2048, 32, 8, 64) + gated_mlp(2048, 8192) + 2 * 2048) + 2048;
  static_assert(llama32_1b == 1'235'814'400);
  const HfModel l32 = load("Llama-3.2-1B");
  CHECK(l32.model.numel() == llama32_1b);
  CHECK_FALSE(has(l32.model, "lm_head"));

  // Mistral-7B-v0.1 (published 7,241,732,096 on its model page; the announcement says "7.3B"):
  // Llama-3-8B's blocks with Llama-2's vocabulary.
  constexpr i64 mistral_7b =
      2 * 32000LL * 4096 + 32 * (gqa(4096, 32, 8, 128) + gated_mlp(4096, 14336) + 2 * 4096) + 4096;
  static_assert(mistral_7b == 7'241'732'096);
  CHECK(load("Mistral-7B-v0.1").model.numel() == mistral_7b);

  // Qwen2.5-7B (published 7.61B, 6.53B non-embedding; safetensors 7,615,616,512): biases on q, k
  // and v only.
  constexpr i64 qwen25_7b_blocks =
      28 * (gqa(3584, 28, 4, 128) + (3584 + 2 * 512) + gated_mlp(3584, 18944) + 2 * 3584);
  constexpr i64 qwen25_7b = 2 * 152064LL * 3584 + qwen25_7b_blocks + 3584;
  static_assert(qwen25_7b == 7'615'616'512);
  static_assert(qwen25_7b_blocks + 3584 == 6'525'621'760);  // the "6.53B non-embedding"
  const HfModel q25 = load("Qwen2.5-7B");
  CHECK(q25.model.numel() == qwen25_7b);
  CHECK(param(q25.model, "layers.0.attn.k.bias").shape == Shape{512});
  CHECK_FALSE(has(q25.model, "layers.0.attn.o.bias"));

  // Qwen2.5-0.5B (published 0.49B, 0.36B non-embedding): tied.
  constexpr i64 qwen25_05b =
      151936LL * 896 +
      24 * (gqa(896, 14, 2, 64) + (896 + 2 * 128) + gated_mlp(896, 4864) + 2 * 896) + 896;
  static_assert(qwen25_05b == 494'032'768);
  CHECK(load("Qwen2.5-0.5B").model.numel() == qwen25_05b);

  // Qwen3-8B (published 8.2B, 6.95B non-embedding): per-head q_norm and k_norm of head_dim 128.
  constexpr i64 qwen3_8b_blocks =
      36 * (gqa(4096, 32, 8, 128) + 2 * 128 + gated_mlp(4096, 12288) + 2 * 4096);
  constexpr i64 qwen3_8b = 2 * 151936LL * 4096 + qwen3_8b_blocks + 4096;
  static_assert(qwen3_8b == 8'190'735'360);
  static_assert(qwen3_8b_blocks + 4096 == 6'946'075'648);  // "6.95B non-embedding"
  const HfModel q3 = load("Qwen3-8B");
  CHECK(q3.model.numel() == qwen3_8b);
  CHECK(param(q3.model, "layers.5.attn.q_norm").shape == Shape{128});
  CHECK(param(q3.model, "layers.5.attn.k_norm").role == ParamRole::norm);

  // GPT-2 (published 124,439,808): what the gpt2-124m preset builds.
  constexpr i64 gpt2 = 50257LL * 768 + 1024LL * 768 +
                       12 * (2 * 2 * 768 + (768 * 2304 + 2304) + (768 * 768 + 768) +
                             (768 * 3072 + 3072) + (3072 * 768 + 768)) +
                       2 * 768;
  static_assert(gpt2 == 124'439'808);
  const HfModel g2 = load("gpt2");
  CHECK(g2.model.numel() == gpt2);
  CHECK(g2.model.numel() == find_preset("gpt2-124m")->numel());
  CHECK(param(g2.model, "layers.0.attn.q").shape == Shape{768, 768});  // c_attn, split
  CHECK(param(g2.model, "pos_embed").shape == Shape{1024, 768});

  // Gemma-2-9B (published 9,241,705,984; the Gemma 2 report's Table 1 gives 8,324,201,984
  // non-embedding parameters, exactly this model's, and counts its embedding with 256,128 rows
  // where the released config has 256,000): four RMSNorms per block, head_dim 256, tied.
  constexpr i64 gemma2_9b_blocks = 42 * (gqa(3584, 16, 8, 256) + gated_mlp(3584, 14336) + 4 * 3584);
  constexpr i64 gemma2_9b = 256000LL * 3584 + gemma2_9b_blocks + 3584;
  static_assert(gemma2_9b == 9'241'705'984);
  static_assert(gemma2_9b_blocks + 3584 == 8'324'201'984);
  const HfModel gm2 = load("gemma-2-9b");
  CHECK(gm2.model.numel() == gemma2_9b);
  CHECK(param(gm2.model, "layers.3.attn_post_norm").shape == Shape{3584});
  CHECK(param(gm2.model, "layers.3.mlp_post_norm").shape == Shape{3584});
  CHECK(gm2.model.params.front().dtype == DType::fp32);  // released in float32

  // Gemma-3-1B (the Gemma 3 report, Table 1: 302M embedding + 698M non-embedding parameters):
  // Gemma 2's block plus q_norm / k_norm.
  constexpr i64 gemma3_1b_blocks =
      26 * (gqa(1152, 4, 1, 256) + 2 * 256 + gated_mlp(1152, 6912) + 4 * 1152);
  constexpr i64 gemma3_1b = 262144LL * 1152 + gemma3_1b_blocks + 1152;
  static_assert(gemma3_1b == 999'885'952);
  static_assert((262144LL * 1152 + 500'000) / 1'000'000 == 302);  // rounded to millions
  static_assert((gemma3_1b_blocks + 1152 + 500'000) / 1'000'000 == 698);
  const HfModel gm3 = load("gemma-3-1b-pt");
  CHECK(gm3.model.numel() == gemma3_1b);
  CHECK(gm3.model_type == "gemma3_text");

  for (const HfModel* hf : {&llama2, &l32, &q25, &q3, &g2, &gm2, &gm3})
    check_record_reads_back(*hf);
}

TEST_CASE("hf_config: Gemma 3 with a vision tower reads its text_config", "[hf]") {
  // google/gemma-3-4b-pt's config.json leaves the text model's head counts and vocabulary to
  // transformers' Gemma3TextConfig defaults; muonbed asks for them by name.
  REQUIRE_THROWS_MATCHES(load("gemma-3-4b-pt"), HfConfigError,
                         Catch::Predicate<HfConfigError>([](const HfConfigError& e) {
                           return e.field() == "text_config.num_attention_heads" &&
                                  e.problem() == "is missing";
                         }));
  // With the defaults written in (8 heads, 4 KV heads, head_dim 256, vocab 262,208), the text
  // model has the Gemma 3 report's 3,209M non-embedding parameters (Table 1; its 675M embedding
  // figure is 0.6 % above vocab x hidden, and its 417M vision encoder muonbed leaves out: the
  // 4.3B the model page shows is all three).
  nlohmann::json config = nlohmann::json::parse(file_text("gemma-3-4b-pt"));
  auto& text = config["text_config"];
  text["num_attention_heads"] = 8;
  text["num_key_value_heads"] = 4;
  text["head_dim"] = 256;
  text["vocab_size"] = 262208;
  constexpr i64 blocks = 34 * (gqa(2560, 8, 4, 256) + 2 * 256 + gated_mlp(2560, 10240) + 4 * 2560);
  static_assert((blocks + 2560) / 1'000'000 == 3209);
  const HfModel hf = model_from_hf_config(config.dump(), "gemma-3-4b");
  CHECK(hf.model.numel() == 262208LL * 2560 + blocks + 2560);
  CHECK(hf.model_type == "gemma3");
  REQUIRE(hf.model.left_out.size() == 1);
  CHECK_THAT(hf.model.left_out[0], Catch::Contains("vision tower"));
  CHECK(hf.model.params.front().dtype == DType::bf16);  // the top level's torch_dtype
  check_record_reads_back(hf);
}

TEST_CASE("hf_config: MoE architectures match their published parameter counts", "[hf]") {
  // Mixtral-8x7B (published 46.7B): 8 experts of SwiGLU 14336 per block, router [8, 4096].
  constexpr i64 mixtral =
      2 * 32000LL * 4096 +
      32 * (gqa(4096, 32, 8, 128) + 8 * 4096 + 8 * gated_mlp(4096, 14336) + 2 * 4096) + 4096;
  static_assert(mixtral == 46'702'792'704);
  const HfModel mx = load("Mixtral-8x7B-v0.1");
  CHECK(mx.model.numel() == mixtral);
  CHECK(mx.routed_experts == 8);
  CHECK(param(mx.model, "layers.0.moe.experts.gate").shape == Shape{8, 14336, 4096});
  CHECK(param(mx.model, "layers.31.moe.experts.down").shape == Shape{8, 4096, 14336});
  CHECK(param(mx.model, "layers.0.moe.router").role == ParamRole::router);

  // Qwen3-30B-A3B (published 30.5B total, 3.3B activated, 29.9B non-embedding): 128 experts of
  // 768 in every block, qk-norm, no shared expert.
  constexpr i64 attention = gqa(2048, 32, 4, 128) + 2 * 128;
  constexpr i64 qwen3_moe_blocks =
      48 * (attention + 128 * 2048 + 128 * gated_mlp(2048, 768) + 2 * 2048);
  constexpr i64 qwen3_moe = 2 * 151936LL * 2048 + qwen3_moe_blocks + 2048;
  static_assert(qwen3_moe == 30'532'122'624);
  static_assert((qwen3_moe_blocks + 2048) / 100'000'000 == 299);  // "29.9B non-embedding"
  // Activated per token: 8 of the 128 experts.
  static_assert((2 * 151936LL * 2048 + 2048 +
                 48 * (attention + 128 * 2048 + 8 * gated_mlp(2048, 768) + 2 * 2048)) /
                    100'000'000 ==
                33);
  const HfModel q3m = load("Qwen3-30B-A3B");
  CHECK(q3m.model.numel() == qwen3_moe);
  // The copy experiments/hf_qwen3_moe.yaml ships reads the same.
  CHECK(load_hf_config(std::string(MUONBED_SOURCE_DIR) +
                       "/experiments/models/Qwen3-30B-A3B/config.json")
            .fields == q3m.fields);
  CHECK(param(q3m.model, "layers.47.moe.experts.up").shape == Shape{128, 768, 2048});
  CHECK_FALSE(has(q3m.model, "layers.0.mlp.up"));

  // DeepSeek-V3 (published 671B main model + 14B multi-token-prediction module = 685B on its
  // model page). MLA per block: q_a [1536, 7168] + norm, q_b [128 x (128 + 64), 1536], kv_a
  // [512 + 64, 7168] + norm, kv_b [128 x (128 + 128), 512], o [7168, 128 x 128]; the first 3
  // blocks dense (SwiGLU 18432), the other 58 with a router, 256 routed and 1 shared expert of
  // 2048. The checkpoint's main model holds 671,026,419,200 values: that includes each MoE
  // router's e_score_correction_bias (256 per block, 58 x 256 = 14,848), which the load-balancing
  // rule updates and no optimizer does, so muonbed leaves them out; the MTP module too.
  constexpr i64 mla = 1536LL * 7168 + 1536 + 128LL * 192 * 1536 + 576LL * 7168 + 512 +
                      128LL * 256 * 512 + 7168LL * 128 * 128;
  constexpr i64 dense_block = mla + gated_mlp(7168, 18432) + 2 * 7168;
  constexpr i64 moe_block =
      mla + 256LL * 7168 + 256 * gated_mlp(7168, 2048) + gated_mlp(7168, 2048) + 2 * 7168;
  constexpr i64 deepseek = 2 * 129280LL * 7168 + 3 * dense_block + 58 * moe_block + 7168;
  static_assert(deepseek + 58 * 256 == 671'026'419'200);
  const HfModel ds = load("DeepSeek-V3");
  CHECK(ds.model.numel() == deepseek);
  CHECK(ds.heads == 128);
  CHECK(ds.kv_heads == 128);
  CHECK(ds.model.head_dim == 0);  // MLA: no uniform rows per head for attn_q / attn_k
  CHECK(ds.model.left_out.size() == 2);
  CHECK_THAT(ds.model.left_out[0], Catch::Contains("multi-token-prediction module (1 layer)"));
  const Model& m = ds.model;
  CHECK(param(m, "layers.0.attn.q_a").shape == Shape{1536, 7168});
  CHECK(param(m, "layers.0.attn.q_a").role == ParamRole::attn_q_down);
  CHECK(param(m, "layers.0.attn.q_a_norm").shape == Shape{1536});
  CHECK(param(m, "layers.0.attn.q_b").shape == Shape{24576, 1536});
  CHECK(param(m, "layers.0.attn.q_b").role == ParamRole::attn_q_up);
  CHECK(param(m, "layers.0.attn.kv_a").shape == Shape{576, 7168});
  CHECK(param(m, "layers.0.attn.kv_a").role == ParamRole::attn_kv_down);
  CHECK(param(m, "layers.0.attn.kv_a_norm").shape == Shape{512});
  CHECK(param(m, "layers.0.attn.kv_b").shape == Shape{32768, 512});
  CHECK(param(m, "layers.0.attn.kv_b").role == ParamRole::attn_kv_up);
  CHECK(param(m, "layers.0.attn.o").shape == Shape{7168, 16384});
  CHECK_FALSE(has(m, "layers.0.attn.q"));
  CHECK(param(m, "layers.2.mlp.up").shape == Shape{18432, 7168});
  CHECK_FALSE(has(m, "layers.2.moe.router"));
  CHECK(param(m, "layers.3.moe.experts.gate").shape == Shape{256, 2048, 7168});
  CHECK(param(m, "layers.3.moe.shared.up").shape == Shape{2048, 7168});
  CHECK(param(m, "layers.60.moe.router").shape == Shape{256, 7168});
  CHECK_FALSE(has(m, "layers.61.attn.o"));  // the MTP layer

  for (const HfModel* hf : {&mx, &q3m, &ds}) check_record_reads_back(*hf);
}

TEST_CASE("hf_config: MLA without query compression, biases, and layer patterns", "[hf]") {
  // DeepSeek-V2-Lite-like attention: q_lora_rank null projects queries directly.
  nlohmann::json ds = nlohmann::json::parse(file_text("DeepSeek-V3"));
  ds["q_lora_rank"] = nullptr;
  ds["attention_bias"] = true;
  ds["num_hidden_layers"] = 4;
  const Model lite = model_from_hf_config(ds.dump(), "lite").model;
  CHECK(param(lite, "layers.0.attn.q").shape == Shape{24576, 7168});
  CHECK(param(lite, "layers.0.attn.q").role == ParamRole::attn_q_up);
  CHECK_FALSE(has(lite, "layers.0.attn.q_a"));
  CHECK(param(lite, "layers.0.attn.kv_a.bias").shape == Shape{576});
  CHECK(param(lite, "layers.0.attn.o.bias").shape == Shape{7168});
  // Dense blocks 0-2, MoE block 3.
  CHECK(has(lite, "layers.2.mlp.gate"));
  CHECK(has(lite, "layers.3.moe.router"));

  // Qwen3-MoE's decoder_sparse_step and mlp_only_layers: with step 2 blocks 1, 3, 5 are sparse,
  // and mlp_only_layers [3] makes block 3 dense again.
  nlohmann::json q = nlohmann::json::parse(file_text("Qwen3-30B-A3B"));
  q["num_hidden_layers"] = 6;
  q["decoder_sparse_step"] = 2;
  q["mlp_only_layers"] = {3};
  const Model pattern = model_from_hf_config(q.dump(), "pattern").model;
  for (int l = 0; l < 6; ++l) {
    INFO("layer " << l);
    const bool sparse = l == 1 || l == 5;
    CHECK(has(pattern, "layers." + std::to_string(l) + ".moe.router") == sparse);
    CHECK(has(pattern, "layers." + std::to_string(l) + ".mlp.up") == !sparse);
  }
  CHECK(param(pattern, "layers.0.mlp.up").shape == Shape{6144, 2048});  // intermediate_size

  // DeepSeek's moe_layer_freq 2: after the dense first blocks, MoE where l % 2 == 0.
  ds = nlohmann::json::parse(file_text("DeepSeek-V3"));
  ds["num_hidden_layers"] = 8;
  ds["first_k_dense_replace"] = 1;
  ds["moe_layer_freq"] = 2;
  const Model freq = model_from_hf_config(ds.dump(), "freq").model;
  for (int l = 0; l < 8; ++l) {
    INFO("layer " << l);
    CHECK(has(freq, "layers." + std::to_string(l) + ".moe.router") == (l >= 1 && l % 2 == 0));
  }

  // Llama's attention_bias and mlp_bias.
  nlohmann::json l = nlohmann::json::parse(file_text("Llama-3.2-1B"));
  l["attention_bias"] = true;
  l["mlp_bias"] = true;
  const Model biased = model_from_hf_config(l.dump(), "biased").model;
  for (const char* name :
       {"attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down"})
    CHECK(has(biased, std::string("layers.0.") + name + ".bias"));
  CHECK(biased.numel() == 1'235'814'400LL + 16 * ((2048 + 512 + 512 + 2048) + (8192 * 2 + 2048)));
}

TEST_CASE("hf_config: overrides apply on top of the config", "[hf]") {
  // layers: 4 keeps DeepSeek-V3's three dense blocks and one MoE block.
  HfOverrides four;
  four.layers = 4;
  const HfModel ds = load("DeepSeek-V3", four);
  CHECK(ds.model.num_layers == 4);
  CHECK(has(ds.model, "layers.2.mlp.gate"));
  CHECK(has(ds.model, "layers.3.moe.router"));
  CHECK_FALSE(has(ds.model, "layers.4.attn.o"));
  // Fewer layers than dense ones: all dense.
  HfOverrides two;
  two.layers = 2;
  const Model shallow = load("DeepSeek-V3", two).model;
  CHECK(shallow.num_layers == 2);
  CHECK(std::none_of(shallow.params.begin(), shallow.params.end(),
                     [](const Parameter& p) { return p.role == ParamRole::router; }));

  // experts and dtype.
  HfOverrides small;
  small.layers = 2;
  small.experts = 16;
  small.dtype = DType::fp32;
  const HfModel q = load("Qwen3-30B-A3B", small);
  CHECK(q.routed_experts == 16);
  CHECK(param(q.model, "layers.1.moe.experts.down").shape == Shape{16, 2048, 768});
  CHECK(param(q.model, "layers.1.moe.router").shape == Shape{16, 2048});
  CHECK(std::all_of(q.model.params.begin(), q.model.params.end(),
                    [](const Parameter& p) { return p.dtype == DType::fp32; }));
  // The record holds the config's fields, not the overrides: reading it back with the same
  // overrides gives the same model.
  const HfModel again = model_from_hf_config(q.fields, "record", small);
  CHECK(again.model.numel() == q.model.numel());
  CHECK(nlohmann::json::parse(q.fields)["num_experts"] == 128);

  // experts on a dense model is an override error naming the override.
  HfOverrides experts;
  experts.experts = 8;
  REQUIRE_THROWS_MATCHES(load("Llama-2-7b-hf", experts), HfOverrideError,
                         Catch::Predicate<HfOverrideError>([](const HfOverrideError& e) {
                           return e.field() == "experts" && e.fix() == "remove model.experts";
                         }));
}

TEST_CASE("hf_config: errors name the file, the field and the fix", "[hf]") {
  const auto field_error = [](const std::string& text, const std::string& field,
                              const std::string& problem_part) {
    INFO(text);
    try {
      model_from_hf_config(text, "my/config.json");
      FAIL("no error");
    } catch (const HfConfigError& e) {
      INFO(e.what());
      CHECK(e.source() == "my/config.json");
      CHECK(e.field() == field);
      CHECK_THAT(e.problem(), Catch::Contains(problem_part));
      CHECK_FALSE(e.fix().empty());
      CHECK_THAT(std::string(e.what()),
                 Catch::StartsWith("my/config.json: ") && Catch::Contains("; fix: " + e.fix()));
    }
  };
  nlohmann::json llama = nlohmann::json::parse(file_text("Meta-Llama-3-8B"));
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json c = llama;
    c[key] = std::move(value);
    return c.dump();
  };
  auto without = [&](const char* key) {
    nlohmann::json c = llama;
    c.erase(key);
    return c.dump();
  };
  // Unknown model_type, with a suggestion and the supported list.
  field_error(with("model_type", "lama"), "model_type", "did you mean 'llama'");
  field_error(with("model_type", "falcon"), "model_type", "which muonbed does not read");
  field_error(without("model_type"), "model_type", "is missing");
  // Missing, null and mistyped fields.
  field_error(without("num_hidden_layers"), "num_hidden_layers", "is missing");
  field_error(with("hidden_size", nullptr), "hidden_size", "is null");
  field_error(with("hidden_size", "4096"), "hidden_size", "(a string), not an integer");
  field_error(with("hidden_size", 4096.5), "hidden_size", "not an integer");
  field_error(with("hidden_size", 0), "hidden_size", "outside 1..");
  field_error(with("num_hidden_layers", 100000), "num_hidden_layers", "outside 1..1000");
  field_error(with("tie_word_embeddings", "yes"), "tie_word_embeddings", "not true or false");
  field_error(with("num_key_value_heads", 5), "num_key_value_heads", "does not divide");
  field_error(with("torch_dtype", "float8_e4m3fn"), "torch_dtype", "does not model");
  nlohmann::json q = nlohmann::json::parse(file_text("Qwen3-30B-A3B"));
  q["mlp_only_layers"] = {0, 48};
  field_error(q.dump(), "mlp_only_layers[1]", "outside 0..47");
  nlohmann::json ds = nlohmann::json::parse(file_text("DeepSeek-V3"));
  ds.erase("q_lora_rank");
  field_error(ds.dump(), "q_lora_rank", "is missing");
  // The file as a whole.
  field_error("{\"model_type\": \"llama\",\n  \"hidden_size\": 4096,,}", "",
              "not valid JSON at line 2, column 23");
  field_error("[1, 2]", "", "not a JSON object");
  field_error("{\"model_type\": \"llama\", \"model_type\": \"gpt2\"}", "model_type",
              "appears twice");
  // An integral float is a whole number (some tools write 4096.0).
  CHECK(model_from_hf_config(with("hidden_size", 4096.0), "x").model.numel() == 8'030'261'248);
  // The reader tells which model types it reads.
  const std::vector<std::string> types = hf_model_types();
  for (const char* t : {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3",
                        "gpt2", "gemma2", "gemma3_text", "gemma3"})
    CHECK(std::find(types.begin(), types.end(), t) != types.end());
  CHECK(hf_family_descriptions().size() == 10);
}

TEST_CASE("hf_config: files that cannot be read", "[hf]") {
  const testing::TempDir temp("hf-config");
  const std::filesystem::path& dir = temp.path();
  std::filesystem::create_directories(dir / "Qwen3-8B");
  REQUIRE_THROWS_MATCHES(load_hf_config((dir / "missing.json").string()), HfConfigError,
                         Catch::Predicate<HfConfigError>([](const HfConfigError& e) {
                           return e.problem().find("No such file") != std::string::npos;
                         }));
  REQUIRE_THROWS_WITH(load_hf_config(dir.string()),
                      Catch::Contains("is a folder") && Catch::Contains("config.json"));
  REQUIRE_THROWS_WITH(load_hf_config("/dev/null"), Catch::Contains("not a regular file"));
  // A file named config.json takes its folder's name.
  std::filesystem::copy_file(data_path("Qwen3-8B"), dir / "Qwen3-8B" / "config.json");
  CHECK(load_hf_config((dir / "Qwen3-8B" / "config.json").string()).model.name == "Qwen3-8B");
  // Too large to be a config.
  {
    std::ofstream big(dir / "big.json");
    big << std::string((1 << 20) + 10, ' ');
  }
  REQUIRE_THROWS_WITH(load_hf_config((dir / "big.json").string()),
                      Catch::Contains("larger than 1 MiB"));
}
