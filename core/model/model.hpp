// Model descriptions: parameters with shapes and roles, generated from architecture specs.
//
// Shapes follow PyTorch's nn.Linear convention, [out_features, in_features]. A 3-D shape
// [batch, rows, cols] is a stack of same-shape matrices (MoE experts), orthogonalized one by one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace muonbed {

enum class DType { fp32, bf16, fp16 };
int bytes_of(DType dtype);
std::string_view to_string(DType dtype);
DType dtype_from_string(std::string_view text);  // throws Error listing valid names

// What a parameter is in the network; drives routing (Muon or AdamW) and TP placement.
enum class ParamRole {
  attn_q,
  attn_k,
  attn_v,
  attn_o,  // attention projections
  attn_q_down,
  attn_q_up,
  attn_kv_down,
  attn_kv_up,  // multi-head latent attention (MLA): q_a, q_b, kv_a, kv_b
  mlp_up,
  mlp_gate,
  mlp_down,  // dense MLP (and shared experts)
  expert_up,
  expert_gate,
  expert_down,  // routed experts (3-D stacks)
  router,       // MoE gate
  embedding,
  lm_head,
  norm,
  bias,
  other_matrix,  // any other 2-D weight (user lists)
};
std::string_view to_string(ParamRole role);
ParamRole param_role_from_string(std::string_view text);  // throws Error listing valid names

struct Parameter {
  std::string name;
  std::vector<std::int64_t> shape;  // 1-D, 2-D, or 3-D (stack of matrices)
  DType dtype = DType::bf16;
  ParamRole role = ParamRole::other_matrix;
  int layer = -1;  // transformer block index; -1 for embedding/head/final norm

  std::int64_t numel() const;
  bool is_matrix() const { return shape.size() >= 2; }
  // Matrices in the stack (1 for 2-D) and the shape of each.
  std::int64_t batch() const { return shape.size() == 3 ? shape[0] : 1; }
  std::int64_t rows() const { return shape[shape.size() - 2]; }
  std::int64_t cols() const { return shape.back(); }
};

struct Model {
  std::string name;
  int num_layers = 0;  // transformer blocks; PP splits these
  std::vector<Parameter> params;
  std::int64_t head_dim = 0;  // rows per attention head of attn_q / attn_k; 0 when unknown
  // Parts of the published checkpoint this model leaves out, one phrase each (hf_config: the
  // multi-token-prediction module, a vision tower); empty for the other models.
  std::vector<std::string> left_out;
  std::int64_t numel() const;
};

// Multi-head latent attention (DeepSeek-V2/V3). Queries and keys/values pass through low-rank
// down-projections, each followed by an RMSNorm, then per-head up-projections (role after ->):
//   attn.q_a  [q_lora_rank, hidden]                -> attn_q_down, then attn.q_a_norm
//   attn.q_b  [heads * (nope + rope), q_lora_rank] -> attn_q_up
//   attn.kv_a [kv_lora_rank + rope, hidden]        -> attn_kv_down, then attn.kv_a_norm
//   attn.kv_b [heads * (nope + v), kv_lora_rank]   -> attn_kv_up
//   attn.o    [hidden, heads * v]                  -> attn_o
// With q_lora_rank 0 (DeepSeek-V2-Lite) the query is one projection attn.q [heads * (nope + rope),
// hidden] (attn_q_up). kv_a's extra `rope` rows are the key's rotary part, shared by all heads.
// DenseSpec::qkv_bias puts biases on the down-projections q_a and kv_a, o_bias on attn.o (as
// DeepSeek's attention_bias does).
struct MlaSpec {
  std::int64_t q_lora_rank = 0;  // 0: no query compression
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t qk_rope_head_dim = 0;
  std::int64_t v_head_dim = 0;
};

struct DenseSpec {
  std::string name;
  std::int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0;
  std::int64_t head_dim = 0;  // 0 = hidden / heads
  bool gated_mlp = true;      // SwiGLU (gate+up+down) vs GELU (up+down)
  bool qkv_bias = false;
  bool tied_embeddings = false;
  bool layernorm_bias = false;
  DType dtype = DType::bf16;
  // Additions (at the end, so existing designated initializers stay valid):
  bool linear_bias = false;        // biases on attn.o and the dense MLP linears (GPT-2)
  std::int64_t max_positions = 0;  // > 0: learned position embedding "pos_embed" [max, hidden]
  // Hugging Face architectures (core/model/hf_config.hpp):
  bool o_bias = false;    // bias on attn.o alone (Llama's attention_bias sets it and qkv_bias)
  bool mlp_bias = false;  // biases on the dense MLP linears alone (Llama's mlp_bias)
  bool qk_norm = false;   // per-head RMSNorm of q and k: attn.q_norm, attn.k_norm [head_dim]
  bool sandwich_norms = false;  // norms after attention and after the MLP too (Gemma 2 and 3)
  std::optional<MlaSpec> mla;   // multi-head latent attention instead of q/k/v/o
};

struct MoeSpec {
  DenseSpec base;            // attention and dense-layer dimensions
  std::int64_t experts = 0;  // routed experts per MoE layer
  std::int64_t expert_ffn = 0;
  std::int64_t shared_experts = 0;  // each of width expert_ffn
  std::int64_t dense_layers = 0;    // the first dense_layers blocks use a dense MLP of base.ffn
  // Blocks after the first dense_layers: block l is MoE when l % moe_every == moe_phase and l is
  // not in dense_layer_list (DeepSeek's moe_layer_freq: phase 0; Qwen's decoder_sparse_step s:
  // phase s - 1, mlp_only_layers: the list); the others use a dense MLP of base.ffn. Entries of
  // the list at or beyond base.layers are ignored (a model cut to fewer layers keeps its list).
  std::int64_t moe_every = 1;
  std::int64_t moe_phase = 0;
  std::vector<std::int64_t> dense_layer_list;
};

Model make_dense(const DenseSpec& spec);
Model make_moe(const MoeSpec& spec);

// Presets: gpt2-124m, llama-7b, llama-70b, deepseek-v3 (and small ones for tests, see .cpp).
std::vector<std::string> preset_names();
std::optional<Model> find_preset(std::string_view name);

// Which optimizer updates a parameter. Matrices go to Muon except those the rules send to
// AdamW; 1-D parameters always go to AdamW.
enum class OptimizerKind { muon, adamw };
struct RoutingRules {
  bool embeddings_to_adamw = true;
  bool lm_head_to_adamw = true;
  bool router_to_adamw = false;
  std::vector<std::string> force_adamw;  // parameter names
  // AdamW for every parameter: the baseline a training step's Muon overhead is measured against
  // (core/results/run_point.hpp); not an experiment key.
  bool everything_to_adamw = false;
};
OptimizerKind route(const Parameter& param, const RoutingRules& rules);

}  // namespace muonbed
