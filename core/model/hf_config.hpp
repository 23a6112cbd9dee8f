// Models from a Hugging Face `config.json`, the file every open model ships: the architectures
// people train (Llama 1-3.x, Mistral, Mixtral, Qwen2/2.5, Qwen3, Qwen3-MoE, DeepSeek-V3 with
// MLA, GPT-2, Gemma 2 and 3) read into muonbed's DenseSpec / MoeSpec and built by make_dense /
// make_moe, so their parameters are those of the published checkpoints (tests/core pins the
// counts). One reader per model_type family (src/hf_config.cpp, families()). Dimension fields
// are required; a flag transformers defaults when absent (tie_word_embeddings, attention_bias)
// takes transformers' default for that model_type. Every field read, defaults included, is
// recorded (HfModel::fields), so reading that record back builds the same model: experiments
// write it into their resolved configuration instead of a path whose file may change.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/model/model.hpp"

namespace muonbed {

// A config.json that cannot be read into a model: names the file (or "inline"), the field by
// its JSON path ("text_config.num_attention_heads", "" for the whole file) and the fix.
// what() is "SOURCE: field 'FIELD' PROBLEM; fix: FIX".
class HfConfigError : public Error {
 public:
  HfConfigError(std::string source, std::string field, std::string problem, std::string fix);
  const std::string& source() const { return source_; }
  const std::string& field() const { return field_; }
  const std::string& problem() const { return problem_; }  // without source and fix
  const std::string& fix() const { return fix_; }
  std::string message() const;  // what() without the fix: "SOURCE: field 'FIELD' PROBLEM"

 private:
  std::string source_, field_, problem_, fix_;
};

// An override (HfOverrides) that does not apply to the config: field() names the override
// ("experts").
class HfOverrideError : public HfConfigError {
 public:
  using HfConfigError::HfConfigError;
};

// What an experiment changes on top of the config (model.layers, model.experts, model.dtype).
struct HfOverrides {
  std::int64_t layers = 0;   // > 0: num_hidden_layers (MoE patterns follow the new count)
  std::int64_t experts = 0;  // > 0: routed experts per MoE layer (an error for a dense model)
  std::optional<DType> dtype;
};

struct HfModel {
  Model model;  // named after the file (its folder for config.json) or model_type; its left_out
                // names what the checkpoint has beyond it (DeepSeek's MTP module, a vision tower)
  std::string model_type;  // as the config says ("qwen3_moe"; "gemma3" for a multimodal one)
  std::int64_t heads = 0, kv_heads = 0;  // attention heads (kv_heads == heads for MLA)
  std::int64_t routed_experts = 0;       // 0 for a dense model, after overrides
  // Every field the reader used, with the value it used (defaults made explicit), as JSON text
  // of one object: read back with model_from_hf_config it gives the same model.
  std::string fields;
};

// The model_type values muonbed reads, and one line per family saying what it covers.
std::vector<std::string> hf_model_types();
std::vector<std::string> hf_family_descriptions();

// Reads a config from JSON text; `source` names it in errors (a path, or "hf_config (inline)").
HfModel model_from_hf_config(const std::string& json_text, const std::string& source,
                             const HfOverrides& overrides = {});
// Reads a config.json file (at most 1 MiB; recorded as an input of this command, so no output
// of it may replace the file). The model is named after the file: its folder's name when the
// file is called config.json (models/Qwen3-8B/config.json -> "Qwen3-8B"), else its stem.
HfModel load_hf_config(const std::string& path, const HfOverrides& overrides = {});

}  // namespace muonbed
