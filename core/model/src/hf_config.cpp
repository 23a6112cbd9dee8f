// Hugging Face config.json -> DenseSpec / MoeSpec -> Model (hf_config.hpp). One reader per
// model_type family in families(); each names the transformers fields that shape parameters and
// nothing else (rope, dropout, token ids and the like change no parameter). What each family
// builds, per block, in muonbed's names (tests/core/hf_config_test.cpp counts them against the
// published figures):
//   llama, mistral   attn_norm, q/k/v/o (Llama's attention_bias: biases on all four;
//                    mlp_bias: on the MLP), mlp_norm, SwiGLU gate/up/down
//   qwen2            as llama with biases on q, k, v (Qwen2 hard-codes them)
//   qwen3            as llama plus per-head q_norm / k_norm [head_dim]
//   mixtral          llama attention, router [experts, hidden], expert stacks of intermediate_size
//   qwen3_moe        qwen3 attention; MoE blocks (router, experts of moe_intermediate_size) where
//                    (l + 1) % decoder_sparse_step == 0 and l not in mlp_only_layers, else a
//                    dense MLP of intermediate_size
//   deepseek_v3      MLA (model.hpp, MlaSpec); dense MLP of intermediate_size in the first
//                    first_k_dense_replace blocks (and where l % moe_layer_freq != 0), else router,
//                    n_routed_experts stacks and n_shared_experts shared experts of
//                    moe_intermediate_size. Left out: the multi-token-prediction module (DeepSeek
//                    trains it beside the model; transformers drops it too) and the router's
//                    e_score_correction_bias, which a load-balancing rule updates, not the
//                    optimizer (transformers registers it as a buffer)
//   gpt2             learned positions, LayerNorm with bias, biased linears, GELU MLP of n_inner,
//                    tied head; q, k and v as three matrices (GPT-2's fused c_attn [768, 2304]
//                    split, as the gpt2-124m preset and modded-nanogpt keep them)
//   gemma2           llama attention with head_dim, four RMSNorms per block (before and after
//                    attention and MLP), GeGLU MLP, tied head
//   gemma3_text      gemma2 plus q_norm / k_norm;  gemma3: its text_config, vision tower left out
#include "core/model/hf_config.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/base/output_files.hpp"
#include "core/base/suggest.hpp"

namespace muonbed {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// Bounds that keep a hostile config from building a model nobody could hold: the experiment's
// own limits (core/experiment) check the built model's tensors again, with their messages.
constexpr std::int64_t kMaxLayers = 1000;
constexpr std::int64_t kMaxWidth = std::int64_t{1} << 24;
constexpr std::int64_t kMaxHeads = 65536;
constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;

std::string shown(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string kind_of(const json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "a list";
  return "an object";
}

// One JSON object of a config, read field by field. Every read records the field with the value
// used (a default when absent) into `used`, in reading order.
class Fields {
 public:
  Fields(const json& object, std::string prefix, std::string source)
      : object_(object), prefix_(std::move(prefix)), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& problem,
                         const std::string& fix) const {
    throw HfConfigError(source_, prefix_ + key, problem, fix);
  }
  const ordered_json& used() const { return used_; }

  // A required integer in [min, max]. `example` shows a typical value in the fix.
  std::int64_t integer(const std::string& key, std::int64_t min, std::int64_t max,
                       const std::string& example) {
    const json* v = find(key);
    if (!v || v->is_null())
      fail(key, v ? "is null" : "is missing",
           "add \"" + key + "\": " + example + " (an integer in " + std::to_string(min) + ".." +
               std::to_string(max) + ")");
    return record(key, to_integer(key, *v, min, max));
  }
  // An optional integer: absent or null gives `fallback`, which is recorded.
  std::int64_t integer_or(const std::string& key, std::int64_t fallback, std::int64_t min,
                          std::int64_t max) {
    const json* v = find(key);
    if (!v || v->is_null()) return record(key, fallback);
    return record(key, to_integer(key, *v, min, max));
  }
  // A required field that may be null (DeepSeek's q_lora_rank: null means no query compression).
  std::optional<std::int64_t> nullable_integer(const std::string& key, std::int64_t min,
                                               std::int64_t max, const std::string& meaning) {
    const json* v = find(key);
    if (!v)
      fail(key, "is missing",
           "add \"" + key + "\": an integer in " + std::to_string(min) + ".." +
               std::to_string(max) + ", or null (" + meaning + ")");
    if (v->is_null()) {
      used_[key] = nullptr;
      return std::nullopt;
    }
    return record(key, to_integer(key, *v, min, max));
  }
  bool flag_or(const std::string& key, bool fallback) {
    const json* v = find(key);
    bool value = fallback;
    if (v && !v->is_null()) {
      if (!v->is_boolean())
        fail(key, "is " + shown(*v) + " (" + kind_of(*v) + "), not true or false",
             "write \"" + key + "\": true or false");
      value = v->get<bool>();
    }
    used_[key] = value;
    return value;
  }
  // A string, or `fallback` when absent or null ("" for none).
  std::string text_or(const std::string& key, const std::string& fallback) {
    const json* v = find(key);
    std::string value = fallback;
    if (v && !v->is_null()) {
      if (!v->is_string())
        fail(key, "is " + shown(*v) + " (" + kind_of(*v) + "), not a string",
             "write it as a JSON string, e.g. \"" + key + "\": \"bfloat16\"");
      value = v->get<std::string>();
    }
    if (!value.empty()) used_[key] = value;
    return value;
  }
  // A list of integers in [min, max] (absent or null: empty).
  std::vector<std::int64_t> integer_list_or_empty(const std::string& key, std::int64_t min,
                                                  std::int64_t max) {
    const json* v = find(key);
    std::vector<std::int64_t> out;
    if (v && !v->is_null()) {
      if (!v->is_array())
        fail(key, "is " + shown(*v) + " (" + kind_of(*v) + "), not a list of integers",
             "write it as a JSON list, e.g. \"" + key + "\": [0, 5]");
      for (std::size_t i = 0; i < v->size(); ++i)
        out.push_back(to_integer(key + "[" + std::to_string(i) + "]", (*v)[i], min, max));
    }
    used_[key] = out;
    return out;
  }
  // A required nested object (gemma3's text_config), read by its own Fields.
  Fields object(const std::string& key, const std::string& what) const {
    const json* v = find(key);
    if (!v || !v->is_object())
      fail(key, v ? "is " + shown(*v) + " (" + kind_of(*v) + "), not an object" : "is missing",
           "give \"" + key + "\": {...} with the " + what);
    return Fields(*v, prefix_ + key + ".", source_);
  }
  void record_object(const std::string& key, const Fields& nested) { used_[key] = nested.used(); }

 private:
  const json* find(const std::string& key) const {
    const auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }
  std::int64_t record(const std::string& key, std::int64_t value) {
    used_[key] = value;
    return value;
  }
  std::int64_t to_integer(const std::string& key, const json& v, std::int64_t min,
                          std::int64_t max) const {
    std::int64_t value = 0;
    if (v.is_number_unsigned()) {
      const std::uint64_t u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(max))
        fail(key,
             "is " + shown(v) + ", outside " + std::to_string(min) + ".." + std::to_string(max),
             "use a value in " + std::to_string(min) + ".." + std::to_string(max));
      value = static_cast<std::int64_t>(u);
    } else if (v.is_number_integer()) {
      value = v.get<std::int64_t>();
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!(std::floor(d) == d) || d < static_cast<double>(min) || d > static_cast<double>(max))
        fail(key,
             "is " + shown(v) + ", not an integer in " + std::to_string(min) + ".." +
                 std::to_string(max),
             "write a whole number in that range");
      value = static_cast<std::int64_t>(d);
    } else {
      fail(key, "is " + shown(v) + " (" + kind_of(v) + "), not an integer",
           "write it as a JSON number without quotes, e.g. \"" + key + "\": 4096");
    }
    if (value < min || value > max)
      fail(key,
           "is " + std::to_string(value) + ", outside " + std::to_string(min) + ".." +
               std::to_string(max),
           "use a value in " + std::to_string(min) + ".." + std::to_string(max));
    return value;
  }

  const json& object_;
  std::string prefix_;
  std::string source_;
  ordered_json used_ = ordered_json::object();
};

// What a family reader makes of a config, before overrides.
struct Arch {
  DenseSpec base;
  bool moe = false;
  MoeSpec moe_spec;  // its base is `base`
  std::int64_t kv_heads = 0;
  std::vector<std::string> left_out;
};

// Parameter dtype: torch_dtype (or "dtype", its name from transformers 4.56), else bf16, the
// dtype the presets train in.
DType read_dtype(Fields& f, bool overridden) {
  std::string key = "torch_dtype";
  std::string text = f.text_or("torch_dtype", "");
  if (text.empty()) {
    key = "dtype";
    text = f.text_or("dtype", "");
  }
  if (text.empty()) {
    f.text_or("torch_dtype", "bfloat16");  // records the default
    return DType::bf16;
  }
  if (text == "bfloat16") return DType::bf16;
  if (text == "float16") return DType::fp16;
  if (text == "float32") return DType::fp32;
  if (overridden) return DType::bf16;  // model.dtype replaces it anyway
  f.fail(key, "is \"" + text + "\", which muonbed does not model",
         "use bfloat16, float16 or float32 there, or set model.dtype: bf16 | fp16 | fp32 in the "
         "experiment");
}

std::int64_t width(Fields& f, const std::string& key, const std::string& example) {
  return f.integer(key, 1, kMaxWidth, example);
}

// hidden, layers, heads, kv heads (default: heads, as transformers), head_dim (default:
// hidden / heads), intermediate and vocab sizes: the fields every decoder family shares.
void read_decoder_dims(Fields& f, DenseSpec& s, std::int64_t& kv_heads, bool head_dim_required) {
  s.hidden = width(f, "hidden_size", "4096");
  s.ffn = width(f, "intermediate_size", "11008");
  s.layers = f.integer("num_hidden_layers", 1, kMaxLayers, "32");
  s.heads = f.integer("num_attention_heads", 1, kMaxHeads, "32");
  if (head_dim_required) {
    kv_heads = f.integer("num_key_value_heads", 1, kMaxHeads, "8");
    s.head_dim = f.integer("head_dim", 1, kMaxWidth, "256");
  } else {
    kv_heads = f.integer_or("num_key_value_heads", s.heads, 1, kMaxHeads);
    if (s.hidden % s.heads != 0) {
      // head_dim must be given; integer() names it when it is not.
      s.head_dim = f.integer("head_dim", 1, kMaxWidth, "128");
    } else {
      s.head_dim = f.integer_or("head_dim", s.hidden / s.heads, 1, kMaxWidth);
    }
  }
  if (s.heads % kv_heads != 0)
    f.fail("num_key_value_heads",
           "is " + std::to_string(kv_heads) + ", which does not divide num_attention_heads (" +
               std::to_string(s.heads) + ")",
           "use a divisor of " + std::to_string(s.heads) + " (grouped-query attention)");
  s.kv_heads = kv_heads;
  s.vocab = width(f, "vocab_size", "32000");
}

Arch read_llama(Fields& f, bool llama_flags) {
  Arch a;
  read_decoder_dims(f, a.base, a.kv_heads, false);
  a.base.tied_embeddings = f.flag_or("tie_word_embeddings", false);
  if (llama_flags) {  // LlamaConfig's; Mistral and Mixtral have no biases at all
    a.base.qkv_bias = a.base.o_bias = f.flag_or("attention_bias", false);
    a.base.mlp_bias = f.flag_or("mlp_bias", false);
  }
  return a;
}

Arch read_mixtral(Fields& f) {
  Arch a = read_llama(f, false);
  a.moe = true;
  a.moe_spec.experts = f.integer("num_local_experts", 1, kMaxHeads, "8");
  a.moe_spec.expert_ffn = a.base.ffn;  // Mixtral's intermediate_size is each expert's width
  return a;
}

Arch read_qwen2(Fields& f) {
  Arch a = read_llama(f, false);
  a.base.qkv_bias = true;  // Qwen2Attention: bias=True on q, k and v, none on o
  return a;
}

Arch read_qwen3(Fields& f) {
  Arch a;
  read_decoder_dims(f, a.base, a.kv_heads, false);
  a.base.tied_embeddings = f.flag_or("tie_word_embeddings", false);
  a.base.qkv_bias = a.base.o_bias = f.flag_or("attention_bias", false);
  a.base.qk_norm = true;
  return a;
}

Arch read_qwen3_moe(Fields& f) {
  Arch a = read_qwen3(f);
  const std::int64_t experts = f.integer("num_experts", 0, kMaxHeads, "128");
  const std::int64_t expert_ffn = width(f, "moe_intermediate_size", "768");
  const std::int64_t step = f.integer_or("decoder_sparse_step", 1, 1, kMaxLayers);
  const std::vector<std::int64_t> dense_list =
      f.integer_list_or_empty("mlp_only_layers", 0, a.base.layers - 1);
  if (experts == 0) return a;  // Qwen3-MoE without experts is Qwen3
  a.moe = true;
  a.moe_spec.experts = experts;
  a.moe_spec.expert_ffn = expert_ffn;
  a.moe_spec.moe_every = step;
  a.moe_spec.moe_phase = step - 1;  // sparse where (l + 1) % step == 0
  a.moe_spec.dense_layer_list = dense_list;
  return a;
}

Arch read_deepseek_v3(Fields& f) {
  Arch a;
  DenseSpec& s = a.base;
  s.hidden = width(f, "hidden_size", "7168");
  s.ffn = width(f, "intermediate_size", "18432");
  s.layers = f.integer("num_hidden_layers", 1, kMaxLayers, "61");
  s.heads = f.integer("num_attention_heads", 1, kMaxHeads, "128");
  s.kv_heads = a.kv_heads = s.heads;  // MLA: every head has its own keys and values
  s.vocab = width(f, "vocab_size", "129280");
  MlaSpec m;
  const std::optional<std::int64_t> q_lora = f.nullable_integer(
      "q_lora_rank", 1, kMaxWidth, "null: queries projected directly, as DeepSeek-V2-Lite");
  m.q_lora_rank = q_lora.value_or(0);
  m.kv_lora_rank = width(f, "kv_lora_rank", "512");
  m.qk_nope_head_dim = f.integer("qk_nope_head_dim", 0, kMaxWidth, "128");
  m.qk_rope_head_dim = f.integer("qk_rope_head_dim", 0, kMaxWidth, "64");
  if (m.qk_nope_head_dim + m.qk_rope_head_dim == 0)
    f.fail("qk_rope_head_dim", "and qk_nope_head_dim are both 0: queries and keys have no size",
           "use DeepSeek-V3's 64 and 128");
  m.v_head_dim = width(f, "v_head_dim", "128");
  s.mla = m;
  s.qkv_bias = s.o_bias = f.flag_or("attention_bias", false);
  s.tied_embeddings = f.flag_or("tie_word_embeddings", false);
  const std::optional<std::int64_t> routed =
      f.nullable_integer("n_routed_experts", 1, kMaxHeads, "null: a dense model");
  const std::int64_t expert_ffn = width(f, "moe_intermediate_size", "2048");
  const std::optional<std::int64_t> shared =
      f.nullable_integer("n_shared_experts", 1, 1024, "null: no shared expert");
  const std::int64_t first_dense =
      f.integer("first_k_dense_replace", 0, s.layers, "3 (DeepSeek-V3's value)");
  const std::int64_t every = f.integer_or("moe_layer_freq", 1, 1, kMaxLayers);
  const std::int64_t mtp = f.integer_or("num_nextn_predict_layers", 0, 0, kMaxLayers);
  if (mtp > 0)
    a.left_out.push_back("the multi-token-prediction module (" + std::to_string(mtp) + " layer" +
                         (mtp == 1 ? "" : "s") +
                         "), trained beside the model; transformers drops it too");
  if (!routed) return a;
  a.moe = true;
  a.moe_spec.experts = *routed;
  a.moe_spec.expert_ffn = expert_ffn;
  a.moe_spec.shared_experts = shared.value_or(0);
  a.moe_spec.dense_layers = first_dense;
  a.moe_spec.moe_every = every;
  a.moe_spec.moe_phase = 0;  // MoE where l % moe_layer_freq == 0
  a.left_out.push_back(
      "each MoE router's e_score_correction_bias (one value per expert), which DeepSeek's "
      "load-balancing rule updates, not the optimizer (a buffer in transformers)");
  return a;
}

Arch read_gpt2(Fields& f) {
  Arch a;
  DenseSpec& s = a.base;
  s.hidden = width(f, "n_embd", "768");
  s.layers = f.integer("n_layer", 1, kMaxLayers, "12");
  s.heads = f.integer("n_head", 1, kMaxHeads, "12");
  s.kv_heads = a.kv_heads = s.heads;
  if (s.hidden % s.heads != 0)
    f.fail("n_head",
           "is " + std::to_string(s.heads) + ", which does not divide n_embd (" +
               std::to_string(s.hidden) + ")",
           "use a divisor of n_embd");
  s.max_positions = width(f, "n_positions", "1024");
  s.vocab = width(f, "vocab_size", "50257");
  s.ffn = f.integer_or("n_inner", 4 * s.hidden, 1, kMaxWidth);  // GPT-2: null means 4 x n_embd
  s.tied_embeddings = f.flag_or("tie_word_embeddings", true);
  s.gated_mlp = false;
  s.qkv_bias = s.layernorm_bias = s.linear_bias = true;
  return a;
}

Arch read_gemma(Fields& f, bool qk_norm) {
  Arch a;
  read_decoder_dims(f, a.base, a.kv_heads, true);
  a.base.tied_embeddings = f.flag_or("tie_word_embeddings", true);
  a.base.qkv_bias = a.base.o_bias = f.flag_or("attention_bias", false);
  a.base.sandwich_norms = true;
  a.base.qk_norm = qk_norm;
  return a;
}

struct Family {
  std::vector<std::string> model_types;
  std::string description;
  std::function<Arch(Fields&)> read;
};

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {{"llama"},
       "Llama 1, 2, 3, 3.1, 3.2, 3.3 (LlamaForCausalLM)",
       [](Fields& f) { return read_llama(f, true); }},
      {{"mistral"}, "Mistral (MistralForCausalLM)", [](Fields& f) { return read_llama(f, false); }},
      {{"mixtral"}, "Mixtral MoE (MixtralForCausalLM)", read_mixtral},
      {{"qwen2"}, "Qwen2, Qwen2.5 (Qwen2ForCausalLM)", read_qwen2},
      {{"qwen3"}, "Qwen3 (Qwen3ForCausalLM)", read_qwen3},
      {{"qwen3_moe"}, "Qwen3 MoE (Qwen3MoeForCausalLM)", read_qwen3_moe},
      {{"deepseek_v3"}, "DeepSeek-V3 (MLA, shared experts, dense first layers)", read_deepseek_v3},
      {{"gpt2"}, "GPT-2 (GPT2LMHeadModel)", read_gpt2},
      {{"gemma2"}, "Gemma 2 (Gemma2ForCausalLM)", [](Fields& f) { return read_gemma(f, false); }},
      {{"gemma3_text", "gemma3"},
       "Gemma 3 (Gemma3ForCausalLM; Gemma3ForConditionalGeneration's text_config)",
       [](Fields& f) { return read_gemma(f, true); }},
  };
  return table;
}

// Parses JSON text strictly: a syntax error names its line and column, a key repeated inside one
// object is an error (nlohmann would keep the last one silently).
json parse_strictly(const std::string& text, const std::string& source) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string repeated;
  const json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() && repeated.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second)
      repeated = parsed.get<std::string>();
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(text, callback);
  } catch (const json::parse_error& e) {
    std::size_t line = 1, column = 1;
    for (std::size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string message = e.what();
    if (const std::size_t at = message.find("syntax error"); at != std::string::npos)
      message = message.substr(at);
    throw HfConfigError(source, "",
                        "is not valid JSON at line " + std::to_string(line) + ", column " +
                            std::to_string(column) + " (" + message + ")",
                        "fix the JSON there (a Hugging Face config.json is one JSON object)");
  }
  if (!repeated.empty())
    throw HfConfigError(source, repeated, "appears twice in one object",
                        "keep one \"" + repeated + "\" (JSON readers disagree on which wins)");
  if (!parsed.is_object())
    throw HfConfigError(source, "", "is " + kind_of(parsed) + ", not a JSON object",
                        "give the model's config.json, an object such as {\"model_type\": "
                        "\"llama\", \"hidden_size\": 4096, ...}");
  return parsed;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// The model name a config file suggests.
std::string name_from_path(const std::string& path) {
  const std::filesystem::path p(path);
  if (p.filename() == "config.json" && p.has_parent_path()) {
    const std::string folder = std::filesystem::absolute(p).parent_path().filename().string();
    if (!folder.empty()) return folder;
  }
  return p.stem().string();
}

}  // namespace

HfConfigError::HfConfigError(std::string source, std::string field, std::string problem,
                             std::string fix)
    : Error(source + ": " + (field.empty() ? std::string("the config") : "field '" + field + "'") +
            " " + problem + "; fix: " + fix),
      source_(std::move(source)),
      field_(std::move(field)),
      problem_(std::move(problem)),
      fix_(std::move(fix)) {}

std::string HfConfigError::message() const {
  return source_ + ": " + (field_.empty() ? std::string("the config") : "field '" + field_ + "'") +
         " " + problem_;
}

std::vector<std::string> hf_model_types() {
  std::vector<std::string> out;
  for (const Family& f : families())
    for (const std::string& t : f.model_types) out.push_back(t);
  return out;
}

std::vector<std::string> hf_family_descriptions() {
  std::vector<std::string> out;
  for (const Family& f : families()) out.push_back(joined(f.model_types) + ": " + f.description);
  return out;
}

HfModel model_from_hf_config(const std::string& json_text, const std::string& source,
                             const HfOverrides& overrides) {
  const json config = parse_strictly(json_text, source);
  Fields top(config, "", source);
  const std::string model_type = top.text_or("model_type", "");
  const std::vector<std::string> types = hf_model_types();
  if (model_type.empty())
    top.fail("model_type", "is missing",
             "add \"model_type\": one of " + joined(types) + " (it names the architecture)");
  const Family* family = nullptr;
  for (const Family& f : families())
    for (const std::string& t : f.model_types)
      if (t == model_type) family = &f;
  if (!family)
    top.fail(
        "model_type",
        "is \"" + model_type + "\", which muonbed does not read" + did_you_mean(model_type, types),
        "use one of " + joined(types) +
            ", or describe the model in the experiment with model.dense, model.moe or "
            "model.params");

  HfModel out;
  out.model_type = model_type;
  Arch arch;
  if (model_type == "gemma3") {
    // Gemma3ForConditionalGeneration: the language model is text_config; the SigLIP vision
    // tower and the projector (vision_config) are not muonbed's to model.
    Fields text = top.object("text_config", "language model's fields (hidden_size, ...)");
    arch = family->read(text);
    top.record_object("text_config", text);
    arch.left_out.push_back("the vision tower and multimodal projector (vision_config)");
  } else {
    arch = family->read(top);
  }
  arch.base.dtype = read_dtype(top, overrides.dtype.has_value());
  if (overrides.dtype) arch.base.dtype = *overrides.dtype;
  if (overrides.experts > 0) {
    if (!arch.moe)
      throw HfOverrideError(source, "experts",
                            "cannot apply: the config describes a dense model (model_type \"" +
                                model_type + "\" without routed experts)",
                            "remove model.experts");
    arch.moe_spec.experts = overrides.experts;
  }
  if (overrides.layers > 0) {
    arch.base.layers = overrides.layers;
    arch.moe_spec.dense_layers = std::min(arch.moe_spec.dense_layers, overrides.layers);
  }
  arch.base.name = model_type;
  try {
    if (arch.moe) {
      arch.moe_spec.base = arch.base;
      out.model = make_moe(arch.moe_spec);
    } else {
      out.model = make_dense(arch.base);
    }
  } catch (const HfConfigError&) {
    throw;
  } catch (const Error& e) {
    throw HfConfigError(source, "", "does not build a model: " + std::string(e.what()),
                        "fix the config's dimensions");
  }
  out.heads = arch.base.heads;
  out.kv_heads = arch.kv_heads;
  out.routed_experts = arch.moe ? arch.moe_spec.experts : 0;
  out.fields = top.used().dump();
  out.model.left_out = std::move(arch.left_out);
  return out;
}

HfModel load_hf_config(const std::string& path, const HfOverrides& overrides) {
  if (path.empty())
    throw HfConfigError("hf_config", "", "path is empty", "give the path of a config.json");
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    throw HfConfigError(path, "", std::string("cannot be opened: ") + std::strerror(error),
                        path_error_fix(error) +
                            " (a relative hf_config path starts at the experiment file's folder)");
  }
  if (S_ISDIR(info.st_mode))
    throw HfConfigError(path, "", "is a folder, not a config.json",
                        "give the file: " + (std::filesystem::path(path) / "config.json").string());
  // A device or FIFO could block or never end (a fuzzer's /dev/stdin, /dev/zero): a config is
  // a file.
  if (!S_ISREG(info.st_mode))
    throw HfConfigError(path, "", "is not a regular file (a device, FIFO or socket)",
                        "give the model's config.json file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    throw HfConfigError(path, "", std::string("cannot be opened: ") + std::strerror(error),
                        path_error_fix(error));
  }
  note_input_file(fd, path);
  std::string text;
  char buffer[1 << 16];
  while (text.size() <= kMaxConfigBytes) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      throw HfConfigError(path, "", std::string("cannot be read: ") + std::strerror(error),
                          "check the file");
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (text.size() > kMaxConfigBytes)
    throw HfConfigError(path, "", "is larger than 1 MiB; a config.json has a few KiB",
                        "give the model's config.json, not its weights or tokenizer");
  HfModel model = model_from_hf_config(text, path, overrides);
  model.model.name = name_from_path(path);
  return model;
}

}  // namespace muonbed
