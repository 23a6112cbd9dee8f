// Tests of model generation and routing: preset parameter counts pinned against figures
// computed by hand (and published ones), parameter structure of dense and MoE blocks, names,
// and which parameters go to Muon or AdamW.
#include <catch2/catch.hpp>

#include <algorithm>

#include "core/base/errors.hpp"
#include "core/model/model.hpp"

using namespace muonbed;

namespace {

const Parameter* find_param(const Model& m, const std::string& name) {
  for (const Parameter& p : m.params)
    if (p.name == name) return &p;
  return nullptr;
}

Model preset(const std::string& name) {
  auto m = find_preset(name);
  REQUIRE(m.has_value());
  return *m;
}

}  // namespace

TEST_CASE("dtype and role names", "[model]") {
  CHECK(bytes_of(DType::fp32) == 4);
  CHECK(bytes_of(DType::bf16) == 2);
  CHECK(bytes_of(DType::fp16) == 2);
  for (DType d : {DType::fp32, DType::bf16, DType::fp16})
    CHECK(dtype_from_string(to_string(d)) == d);
  CHECK(to_string(DType::bf16) == "bf16");
  REQUIRE_THROWS_WITH(dtype_from_string("fp8"), Catch::Contains("fp8") && Catch::Contains("bf16"));
  for (int r = 0; r <= static_cast<int>(ParamRole::other_matrix); ++r) {
    const auto role = static_cast<ParamRole>(r);
    CHECK(param_role_from_string(to_string(role)) == role);
  }
  CHECK(to_string(ParamRole::expert_down) == "expert_down");
  CHECK(to_string(ParamRole::other_matrix) == "other_matrix");
  REQUIRE_THROWS_WITH(param_role_from_string("mlp"), Catch::Contains("mlp_up"));
}

TEST_CASE("preset parameter counts", "[model]") {
  // GPT-2 small (HF 'gpt2', published 124,439,808 with the tied head):
  //   wte 50257*768 = 38,597,376; wpe 1024*768 = 786,432
  //   per block: ln_1 1,536 + c_attn 768*2304+2304 = 1,771,776 + attn c_proj 768*768+768 = 590,592
  //              + ln_2 1,536 + c_fc 768*3072+3072 = 2,362,368 + mlp c_proj 3072*768+768
  //              = 2,360,064  -> 7,087,872; x12 = 85,054,464
  //   ln_f 1,536.  Total 38,597,376 + 786,432 + 85,054,464 + 1,536 = 124,439,808.
  CHECK(preset("gpt2-124m").numel() == 124'439'808LL);

  // Llama-2 7B (published 6,738,415,616): embed and head 2*32000*4096 = 262,144,000;
  //   per block q,k,v,o 4*4096^2 = 67,108,864 + MLP 3*4096*11008 = 135,266,304 + norms 8,192
  //   = 202,383,360; x32 = 6,476,267,520; final norm 4,096.  Total 6,738,415,616.
  CHECK(preset("llama-7b").numel() == 6'738'415'616LL);

  // Llama-2 70B (published 68,976,648,192): head_dim 128, kv 8 heads -> k,v [1024, 8192].
  //   per block q,o 2*8192^2 = 134,217,728 + k,v 2*1024*8192 = 16,777,216
  //   + MLP 3*8192*28672 = 704,643,072 + norms 16,384 = 855,654,400; x80 = 68,452,352,000
  //   embed and head 2*32000*8192 = 524,288,000; final norm 8,192.  Total 68,976,648,192.
  CHECK(preset("llama-70b").numel() == 68'976'648'192LL);

  // DeepSeek-V3-class with MLA approximated by 128x128 q/k/v/o (not the published 671B):
  //   attention 4*16384*7168 = 469,762,048; norms 14,336
  //   dense block + MLP 3*7168*18432 = 396,361,728 -> 866,138,112; x3 = 2,598,414,336
  //   MoE block + router 256*7168 = 1,835,008 + experts 3*256*2048*7168 = 11,274,289,152
  //   + shared 3*2048*7168 = 44,040,192 -> 11,789,940,736; x58 = 683,816,562,688
  //   embed and head 2*129280*7168 = 1,853,358,080; final norm 7,168.
  //   Total 688,268,342,272.
  CHECK(preset("deepseek-v3").numel() == 688'268'342'272LL);

  // tiny-dense: embed/head 2*256*64 = 32,768; per block q 64*64 + k,v 2*32*64 + o 64*64
  //   + MLP 3*128*64 + norms 128 = 36,992; x2 = 73,984; final norm 64 -> 106,816.
  CHECK(preset("tiny-dense").numel() == 106'816);
  // tiny-moe: one dense block 36,992; MoE block: attention 12,288 + norms 128 + router 512
  //   + experts 3*8*32*64 = 49,152 + shared 3*32*64 = 6,144 = 68,224; x3 = 204,672;
  //   embed/head 32,768; final norm 64 -> 274,496.
  CHECK(preset("tiny-moe").numel() == 274'496);
}

TEST_CASE("presets: names and lookup", "[model]") {
  const auto names = preset_names();
  for (const char* n :
       {"gpt2-124m", "llama-7b", "llama-70b", "deepseek-v3", "tiny-dense", "tiny-moe"})
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
  for (const std::string& n : names) {
    const auto m = find_preset(n);
    REQUIRE(m.has_value());
    CHECK(m->name == n);
    CHECK(m->num_layers > 0);
  }
  CHECK_FALSE(find_preset("gpt5").has_value());
}

TEST_CASE("dense model structure", "[model]") {
  const Model gpt2 = preset("gpt2-124m");
  CHECK(gpt2.num_layers == 12);
  CHECK(find_param(gpt2, "lm_head") == nullptr);  // tied
  REQUIRE(find_param(gpt2, "pos_embed") != nullptr);
  CHECK(find_param(gpt2, "pos_embed")->shape == std::vector<std::int64_t>{1024, 768});
  CHECK(find_param(gpt2, "pos_embed")->role == ParamRole::embedding);
  CHECK(find_param(gpt2, "layers.3.mlp.gate") == nullptr);  // GELU MLP
  REQUIRE(find_param(gpt2, "layers.3.attn.q.bias") != nullptr);
  CHECK(find_param(gpt2, "layers.3.attn.q.bias")->role == ParamRole::bias);
  CHECK(find_param(gpt2, "layers.3.mlp.down.bias")->shape == std::vector<std::int64_t>{768});
  CHECK(find_param(gpt2, "norm.bias")->layer == -1);

  const Model llama = preset("llama-70b");
  const Parameter* k = find_param(llama, "layers.7.attn.k");
  REQUIRE(k != nullptr);
  CHECK(k->shape == std::vector<std::int64_t>{1024, 8192});
  CHECK(k->role == ParamRole::attn_k);
  CHECK(k->layer == 7);
  CHECK(find_param(llama, "layers.7.attn.o")->shape == std::vector<std::int64_t>{8192, 8192});
  CHECK(find_param(llama, "layers.79.mlp.down")->shape == std::vector<std::int64_t>{8192, 28672});
  CHECK(find_param(llama, "layers.79.mlp.gate")->role == ParamRole::mlp_gate);
  CHECK(find_param(llama, "embed")->shape == std::vector<std::int64_t>{32000, 8192});
  CHECK(find_param(llama, "lm_head")->role == ParamRole::lm_head);
  CHECK(find_param(llama, "norm")->role == ParamRole::norm);
  CHECK(find_param(llama, "layers.0.attn.q.bias") == nullptr);
  CHECK(find_param(llama, "layers.0.attn_norm.bias") == nullptr);
  // Names are unique.
  std::vector<std::string> names;
  for (const auto& p : llama.params) names.push_back(p.name);
  std::sort(names.begin(), names.end());
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());

  DenseSpec bad;
  bad.name = "bad";
  bad.hidden = 100;
  bad.layers = 1;
  bad.heads = 3;
  bad.ffn = 10;
  bad.vocab = 10;
  REQUIRE_THROWS_WITH(make_dense(bad), Catch::Contains("head_dim"));
  bad.head_dim = 32;
  CHECK(make_dense(bad).params.size() > 0);
  bad.kv_heads = 2;
  REQUIRE_THROWS_WITH(make_dense(bad), Catch::Contains("kv_heads"));
}

TEST_CASE("MoE model structure", "[model]") {
  const Model m = preset("tiny-moe");
  CHECK(m.num_layers == 4);
  CHECK(find_param(m, "layers.0.mlp.up") != nullptr);  // dense block
  CHECK(find_param(m, "layers.0.moe.router") == nullptr);
  const Parameter* router = find_param(m, "layers.1.moe.router");
  REQUIRE(router != nullptr);
  CHECK(router->role == ParamRole::router);
  CHECK(router->shape == std::vector<std::int64_t>{8, 64});
  const Parameter* up = find_param(m, "layers.2.moe.experts.up");
  REQUIRE(up != nullptr);
  CHECK(up->shape == std::vector<std::int64_t>{8, 32, 64});
  CHECK(up->batch() == 8);
  CHECK(up->rows() == 32);
  CHECK(up->cols() == 64);
  CHECK(find_param(m, "layers.2.moe.experts.gate")->role == ParamRole::expert_gate);
  const Parameter* down = find_param(m, "layers.3.moe.experts.down");
  CHECK(down->shape == std::vector<std::int64_t>{8, 64, 32});
  CHECK(down->role == ParamRole::expert_down);
  const Parameter* shared = find_param(m, "layers.3.moe.shared.down");
  REQUIRE(shared != nullptr);
  CHECK(shared->role == ParamRole::mlp_down);
  CHECK(shared->shape == std::vector<std::int64_t>{64, 32});

  const Model ds = preset("deepseek-v3");
  CHECK(ds.num_layers == 61);
  CHECK(find_param(ds, "layers.2.mlp.up")->shape == std::vector<std::int64_t>{18432, 7168});
  CHECK(find_param(ds, "layers.3.moe.experts.down")->shape ==
        std::vector<std::int64_t>{256, 7168, 2048});
  CHECK(find_param(ds, "layers.60.attn.q")->shape == std::vector<std::int64_t>{16384, 7168});
}

TEST_CASE("routing to Muon or AdamW", "[model]") {
  const Model m = preset("tiny-moe");
  RoutingRules rules;
  auto route_of = [&](const std::string& name) { return route(*find_param(m, name), rules); };
  CHECK(route_of("layers.0.attn.q") == OptimizerKind::muon);
  CHECK(route_of("layers.1.moe.experts.up") == OptimizerKind::muon);
  CHECK(route_of("layers.1.moe.shared.up") == OptimizerKind::muon);
  CHECK(route_of("layers.0.attn_norm") == OptimizerKind::adamw);
  CHECK(route_of("norm") == OptimizerKind::adamw);
  CHECK(route_of("embed") == OptimizerKind::adamw);
  CHECK(route_of("lm_head") == OptimizerKind::adamw);
  CHECK(route_of("layers.1.moe.router") == OptimizerKind::muon);
  rules.embeddings_to_adamw = false;
  rules.lm_head_to_adamw = false;
  rules.router_to_adamw = true;
  rules.force_adamw = {"layers.0.attn.q"};
  CHECK(route_of("embed") == OptimizerKind::muon);
  CHECK(route_of("lm_head") == OptimizerKind::muon);
  CHECK(route_of("layers.1.moe.router") == OptimizerKind::adamw);
  CHECK(route_of("layers.0.attn.q") == OptimizerKind::adamw);
  CHECK(route_of("layers.0.attn.k") == OptimizerKind::muon);
  CHECK(route_of("layers.0.mlp_norm") == OptimizerKind::adamw);
  const Model gpt2 = preset("gpt2-124m");
  CHECK(route(*find_param(gpt2, "layers.0.attn.q.bias"), rules) == OptimizerKind::adamw);
}
