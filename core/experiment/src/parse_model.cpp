// Experiment YAML, the model: a preset, a Hugging Face config.json, a dense or MoE spec, or
// explicit params with their placements; sizes checked against the limits
// (core/experiment/src/experiment_parsing.hpp), and the JSON a Hugging Face config is emitted as.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "core/experiment/src/experiment_parsing.hpp"
#include "core/model/hf_config.hpp"

namespace muonbed::experiment_parsing {

namespace fs = std::filesystem;

DType read_dtype(const Context& ctx, const Field& field) {
  return dtype_from_string(to_choice(ctx, field, kDTypes));
}

namespace {

std::vector<std::string> role_names() {
  std::vector<std::string> names;
  for (int r = 0; r <= static_cast<int>(ParamRole::other_matrix); ++r)
    names.emplace_back(to_string(static_cast<ParamRole>(r)));
  return names;
}

}  // namespace

// Placement text: R | Replicate, S(d) | Shard(d), SS(d,f) | StridedShard(d,f), I(c) |
// Independent(c).
std::optional<Placement> parse_placement(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), ' '), text.end());
  if (text == "R" || text == "Replicate") return Placement::replicate();
  const std::size_t open = text.find('(');
  if (open == std::string::npos || text.back() != ')') return std::nullopt;
  const std::string head = text.substr(0, open);
  const std::vector<std::string> args = split(text.substr(open + 1, text.size() - open - 2), ',');
  std::vector<int> numbers;
  for (const std::string& a : args) {
    if (a.empty() || a.size() > 9 || !std::all_of(a.begin(), a.end(), ::isdigit))
      return std::nullopt;
    numbers.push_back(std::stoi(a));
  }
  if ((head == "S" || head == "Shard") && numbers.size() == 1) return Placement::shard(numbers[0]);
  if ((head == "SS" || head == "StridedShard") && numbers.size() == 2)
    return Placement::strided_shard(numbers[0], numbers[1]);
  if ((head == "I" || head == "Independent") && numbers.size() == 1)
    return Placement::independent(numbers[0]);
  return std::nullopt;
}

namespace {

// A map {mesh dim name: placement}; unlisted dims replicate.
std::vector<Placement> read_placements(const Context& ctx, const Field& field,
                                       const DeviceMesh& mesh,
                                       const std::vector<std::int64_t>& shape) {
  std::vector<std::string> dim_names;
  for (const MeshDim& d : mesh.dims()) dim_names.push_back(d.name);
  const MapReader map(ctx, field, dim_names);
  std::vector<Placement> placements(mesh.ndims(), Placement::replicate());
  for (const Field& f : map.fields()) {
    const int dim = mesh.find(f.key.Scalar());
    const std::string text = to_string_value(ctx, f);
    const std::optional<Placement> p = parse_placement(text);
    if (!p)
      fail(ctx, f, "bad placement '" + text + "' for mesh dim '" + f.key.Scalar() + "'",
           "use R (replicate), S(d) (shard tensor dim d), SS(d,f) (strided shard) or I(c) "
           "(only at coordinate c)");
    if (p->is_shard() && p->tensor_dim >= static_cast<int>(shape.size()))
      fail(ctx, f,
           "placement '" + text + "' shards tensor dim " + std::to_string(p->tensor_dim) +
               " but the shape " + shape_text(shape) + " has " + std::to_string(shape.size()) +
               " dims",
           "use a tensor dim in 0.." + std::to_string(shape.size() - 1));
    if (p->kind == PlacementKind::strided_shard && p->split_factor < 1)
      fail(ctx, f, "placement '" + text + "' has split factor 0", "use a split factor >= 1");
    if (p->kind == PlacementKind::independent && p->coord >= mesh.size(dim))
      fail(ctx, f,
           "placement '" + text + "' names coordinate " + std::to_string(p->coord) +
               " but mesh dim '" + f.key.Scalar() + "' has size " + std::to_string(mesh.size(dim)),
           "use a coordinate in 0.." + std::to_string(mesh.size(dim) - 1));
    placements[dim] = *p;
  }
  return placements;
}

void read_dense_fields(const Context& ctx, const MapReader& m, DenseSpec& s) {
  m.read("name", s.name);
  m.read("hidden", s.hidden, 1, kMaxExtent);
  m.read("layers", s.layers, 1, kMaxLayers);
  m.read("heads", s.heads, 1, kMaxHeads);
  m.read("kv_heads", s.kv_heads, 1, kMaxHeads);
  m.read("ffn", s.ffn, 1, kMaxExtent);
  m.read("vocab", s.vocab, 1, kMaxExtent);
  m.read("head_dim", s.head_dim, 1, kMaxHeads);
  m.read("gated_mlp", s.gated_mlp);
  m.read("qkv_bias", s.qkv_bias);
  m.read("tied_embeddings", s.tied_embeddings);
  m.read("layernorm_bias", s.layernorm_bias);
  m.read("linear_bias", s.linear_bias);
  m.read("max_positions", s.max_positions, 0, kMaxExtent);
  if (const Field* f = m.find("dtype")) s.dtype = read_dtype(ctx, *f);
  const std::int64_t kv = s.kv_heads > 0 ? s.kv_heads : s.heads;
  if (s.heads % kv != 0)
    fail(ctx, *m.find("kv_heads"),
         "heads (" + std::to_string(s.heads) + ") is not a multiple of kv_heads (" +
             std::to_string(kv) + ")",
         "use kv_heads dividing heads: " + divisors_text(s.heads, s.heads));
  if (s.head_dim == 0 && s.hidden % s.heads != 0)
    fail(ctx, *m.find("heads"),
         "hidden (" + std::to_string(s.hidden) + ") is not a multiple of heads (" +
             std::to_string(s.heads) + ")",
         "use heads dividing hidden, or give head_dim explicitly");
}

// Every tensor of a model within the physical ranges (each dim <= kMaxExtent, each tensor <=
// kMaxTensorElements elements, the model <= kMaxModelElements and kMaxTensors tensors), with
// overflow-checked products: a derived shape (heads x head_dim, experts x ffn) can exceed what
// each input allows. Errors point at the tensor's shape (model.params) or at the model section.
void check_model_size(const Context& ctx, const Field& model_field,
                      const std::vector<Field>& shape_fields, const Model& model) {
  if (static_cast<std::int64_t>(model.params.size()) > kMaxTensors)
    fail(ctx, model_field,
         "model '" + model.name + "' has " + std::to_string(model.params.size()) +
             " tensors, more than " + std::to_string(kMaxTensors),
         "use fewer layers (at most " + std::to_string(kMaxLayers) + ") or fewer parameters");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const Parameter& p = model.params[i];
    const Field& at = i < shape_fields.size() ? shape_fields[i] : model_field;
    std::int64_t numel = 1;
    bool overflow = false;
    for (std::int64_t extent : p.shape) {
      if (extent < 1 || extent > kMaxExtent)
        fail(ctx, at,
             "tensor '" + p.name + "' of model '" + model.name + "' has shape " +
                 shape_text(p.shape) + ": a dim of " + std::to_string(extent) + " is outside 1.." +
                 std::to_string(kMaxExtent),
             "use dims in 1.." + std::to_string(kMaxExtent) +
                 " (the model's widths, heads x head_dim and experts x expert_ffn all count)");
      overflow = overflow || __builtin_mul_overflow(numel, extent, &numel);
    }
    if (overflow || numel > kMaxTensorElements)
      fail(ctx, at,
           "tensor '" + p.name + "' of model '" + model.name + "' has shape " +
               shape_text(p.shape) + ", more than " + std::to_string(kMaxTensorElements) +
               " (2^40) elements",
           "use smaller dims: no GPU holds a tensor of 2^40 elements (2.2 TB in bf16)");
    total += numel;  // at most kMaxTensors x 2^40 = 2^56: no overflow
    if (total > kMaxModelElements)
      fail(ctx, at,
           "model '" + model.name + "' has more than " + std::to_string(kMaxModelElements) +
               " (2^44, 17.6 trillion) parameters (reached at tensor '" + p.name + "')",
           "use a smaller model: fewer layers, experts or narrower dims");
  }
}

// model.hf_config given inline: the YAML map as the JSON object a config.json would hold. A
// quoted scalar is a string; a plain one is read as YAML's core schema reads it (true/false,
// null/~, an integer, a number, else a string).
nlohmann::json yaml_to_json(const Context& ctx, const YAML::Node& node, const std::string& path) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "!") return text;
      if (text == "true" || text == "True" || text == "TRUE") return true;
      if (text == "false" || text == "False" || text == "FALSE") return false;
      if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL")
        return nullptr;
      std::int64_t integer = 0;
      const char* end = text.data() + text.size();
      if (const auto r = std::from_chars(text.data(), end, integer);
          r.ec == std::errc() && r.ptr == end)
        return integer;
      char* stop = nullptr;
      const double number = std::strtod(text.c_str(), &stop);
      if (stop == text.c_str() + text.size() && std::isfinite(number)) return number;
      return text;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json list = nlohmann::json::array();
      for (std::size_t i = 0; i < node.size(); ++i)
        list.push_back(yaml_to_json(ctx, node[i], path + "[" + std::to_string(i) + "]"));
      return list;
    }
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar())
          fail(ctx, entry.first, "a key of '" + path + "' is " + kind_of(entry.first),
               "use plain names as keys, as config.json does");
        const std::string key = entry.first.Scalar();
        if (object.contains(key))
          fail(ctx, entry.first, "key '" + key + "' appears twice in '" + path + "'",
               "keep one of them");
        object[key] = yaml_to_json(ctx, entry.second, path + "." + key);
      }
      return object;
    }
  }
  return nullptr;
}

}  // namespace

// The read fields of a config (JSON) as YAML, for the resolved configuration: strings quoted, so
// that yaml_to_json reads every value back with its JSON type.
void emit_json_as_yaml(YAML::Emitter& out, const nlohmann::ordered_json& value) {
  if (value.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [key, item] : value.items()) {
      out << YAML::Key << key << YAML::Value;
      emit_json_as_yaml(out, item);
    }
    out << YAML::EndMap;
  } else if (value.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& item : value) emit_json_as_yaml(out, item);
    out << YAML::EndSeq;
  } else if (value.is_string()) {
    out << YAML::DoubleQuoted << value.get<std::string>();
  } else if (value.is_boolean()) {
    out << value.get<bool>();
  } else if (value.is_number_integer()) {
    out << value.get<std::int64_t>();
  } else if (value.is_number_float()) {
    out << format_number(value.get<double>());
  } else {
    out << YAML::Null;
  }
}

namespace {

// The YAML node an inline config's field path ("text_config.num_attention_heads", "a[2]") names,
// or `fallback` when the field is absent (a missing field's error points at the map).
YAML::Node inline_field(const YAML::Node& map, const std::string& path,
                        const YAML::Node& fallback) {
  YAML::Node node = map;
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const std::size_t bracket = part.find('[');
    const std::string key = part.substr(0, bracket);
    if (!node.IsMap()) return fallback;
    YAML::Node next;
    for (const auto& entry : node)
      if (entry.first.IsScalar() && entry.first.Scalar() == key) next = entry.second;
    if (!next.IsDefined()) return fallback;
    node = next;
    if (bracket != std::string::npos) {
      const std::size_t index = std::strtoull(part.c_str() + bracket + 1, nullptr, 10);
      if (!node.IsSequence() || index >= node.size()) return fallback;
      node = node[index];
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return node;
}

// model.hf_config: a path to a config.json (relative to the experiment file) or its fields
// inline; model.layers, model.experts and model.dtype override it (core/model/hf_config.hpp).
void read_hf_model(const Context& ctx, const MapReader& m, const Field& chosen, ModelSection& out) {
  out.kind = ModelKind::hf;
  HfOverrides overrides;
  if (const Field* f = m.find("layers")) {
    overrides.layers = to_int(ctx, *f, 1, kMaxLayers);
    out.layers_override = static_cast<int>(overrides.layers);
  }
  if (const Field* f = m.find("experts")) {
    overrides.experts = to_int(ctx, *f, 1, kMaxExperts);
    out.experts_override = overrides.experts;
  }
  if (const Field* f = m.find("dtype")) out.dtype_override = overrides.dtype = read_dtype(ctx, *f);
  if (!chosen.value.IsScalar() && !chosen.value.IsMap())
    fail(ctx, chosen, "'model.hf_config' must be a path or a map, got " + kind_of(chosen.value),
         "write hf_config: path/to/config.json (relative to this file), or its fields as a map");
  HfModel hf;
  try {
    if (chosen.value.IsScalar()) {
      const std::string given = to_string_value(ctx, chosen);
      fs::path path(given);
      if (path.is_relative() && !given.empty()) path = fs::path(ctx.file).parent_path() / path;
      hf = load_hf_config(path.lexically_normal().string(), overrides);
    } else {
      const std::string text = yaml_to_json(ctx, chosen.value, "model.hf_config").dump();
      hf = model_from_hf_config(text, "model.hf_config (inline)", overrides);
    }
  } catch (const HfOverrideError& e) {
    fail(ctx, *m.find(e.field()), "model." + e.field() + " " + e.problem(), e.fix());
  } catch (const HfConfigError& e) {
    const YAML::Node at = chosen.value.IsMap() && !e.field().empty()
                              ? inline_field(chosen.value, e.field(), chosen.value)
                              : chosen.value;
    fail(ctx, at, "model.hf_config: " + e.message(), e.fix());
  }
  out.model = std::move(hf.model);
  out.hf_fields = hf.fields;
  out.hf_heads = hf.heads;
  out.hf_kv_heads = hf.kv_heads;
}

}  // namespace

ModelSection read_model(const Context& ctx, const Field& field, const DeviceMesh& mesh) {
  ModelSection out;
  out.field = field;
  std::vector<Field> shape_fields;  // model.params: each tensor's shape, for size errors
  const MapReader m(ctx, field, kModelKeys);
  const Field* kinds[] = {m.find("preset"), m.find("hf_config"), m.find("dense"), m.find("moe"),
                          m.find("params")};
  const Field* chosen = nullptr;
  for (const Field* k : kinds) {
    if (!k) continue;
    if (chosen)
      fail(ctx, k->key,
           "model has both '" + chosen->key.Scalar() + "' and '" + k->key.Scalar() + "'",
           "give exactly one of preset, hf_config, dense, moe or params");
    chosen = k;
  }
  if (!chosen)
    fail(ctx, field, "model has none of preset, hf_config, dense, moe or params",
         "add e.g. 'preset: llama-7b' under model (valid presets: " + join(preset_names()) +
             "), or 'hf_config: path/to/config.json'");
  const std::string kind = chosen->key.Scalar();
  for (const char* key : {"layers", "dtype"})
    if (kind != "preset" && kind != "hf_config" && m.has(key))
      fail(ctx, m.find(key)->key,
           "'model." + std::string(key) + "' applies only with model.preset or model.hf_config",
           "put " + std::string(key) + " inside model." + kind);
  if (kind != "hf_config" && m.has("experts"))
    fail(ctx, m.find("experts")->key, "'model.experts' applies only with model.hf_config",
         kind == "moe" ? "put experts inside model.moe" : "remove it");
  if (kind != "params" && m.has("placements"))
    fail(ctx, m.find("placements")->key, "'model.placements' applies only with model.params",
         "remove it; layouts of generated models come from the parallel rules");
  m.read("name", out.name_override);

  if (kind == "preset") {
    out.kind = ModelKind::preset;
    out.preset = to_string_value(ctx, *chosen);
    std::optional<Model> model = find_preset(out.preset);
    if (!model)
      fail(ctx, *chosen,
           "unknown model preset '" + out.preset + "'" + did_you_mean(out.preset, preset_names()),
           "use one of: " + join(preset_names()) + ", or describe the model with dense/moe/params");
    out.model = std::move(*model);
    if (const Field* f = m.find("layers")) {
      out.layers_override = static_cast<int>(to_int(ctx, *f, 1, out.model.num_layers));
      // Keep the first blocks (and the non-block parameters): a quick, shallower variant.
      std::erase_if(out.model.params,
                    [&](const Parameter& p) { return p.layer >= out.layers_override; });
      out.model.num_layers = out.layers_override;
    }
    if (const Field* f = m.find("dtype")) {
      out.dtype_override = read_dtype(ctx, *f);
      for (Parameter& p : out.model.params) p.dtype = *out.dtype_override;
    }
  } else if (kind == "hf_config") {
    read_hf_model(ctx, m, *chosen, out);
  } else if (kind == "dense" || kind == "moe") {
    const bool moe = kind == "moe";
    out.kind = moe ? ModelKind::moe : ModelKind::dense;
    const MapReader d(ctx, *chosen, moe ? concat(kDenseKeys, kMoeExtraKeys) : kDenseKeys);
    d.require("hidden", "hidden: 4096");
    d.require("layers", "layers: 32");
    d.require("heads", "heads: 32");
    d.require("vocab", "vocab: 32000");
    if (moe) {
      d.require("experts", "experts: 64");
      d.require("expert_ffn", "expert_ffn: 1408");
    } else {
      d.require("ffn", "ffn: 11008");
    }
    DenseSpec& s = moe ? out.moe.base : out.dense;
    s.name = moe ? "custom-moe" : "custom-dense";
    read_dense_fields(ctx, d, s);
    if (moe) {
      d.read("experts", out.moe.experts, 1, kMaxExperts);
      d.read("expert_ffn", out.moe.expert_ffn, 1, kMaxExtent);
      d.read("shared_experts", out.moe.shared_experts, 0, 1024);
      d.read("dense_layers", out.moe.dense_layers, 0, s.layers);
      if (out.moe.dense_layers > 0 && s.ffn <= 0)
        fail(ctx, *d.find("dense_layers"), "dense_layers > 0 needs the dense MLP width 'ffn'",
             "add ffn: N under model.moe, or set dense_layers: 0");
    }
    try {
      out.model = moe ? make_moe(out.moe) : make_dense(out.dense);
    } catch (const Error& e) {
      fail(ctx, *chosen, e.what(), "fix the model." + kind + " numbers");
    }
  } else {
    out.kind = ModelKind::params;
    out.model.name = "custom";
    const std::vector<Field> items = list_items(ctx, *chosen);
    if (items.empty())
      fail(ctx, *chosen, "'model.params' is an empty list",
           "list parameters, e.g. - {name: w, shape: [1024, 1024]}");
    if (static_cast<std::int64_t>(items.size()) > kMaxTensors)
      fail(ctx, *chosen,
           "'model.params' lists " + std::to_string(items.size()) + " tensors, more than " +
               std::to_string(kMaxTensors),
           "list at most " + std::to_string(kMaxTensors) +
               " tensors, or describe the model with model.dense or model.moe");
    const std::vector<std::string> roles = role_names();
    std::vector<Field> placement_fields;
    std::vector<Field> name_fields;
    std::unordered_map<std::string, std::size_t> name_index;
    int max_layer = -1;
    for (const Field& item : items) {
      const MapReader p(ctx, item, kParamKeys);
      Parameter param;
      const Field& name = p.require("name", "name: layers.0.attn.q");
      param.name = to_string_value(ctx, name);
      if (param.name.empty()) fail(ctx, name, "a parameter has an empty name", "name it");
      if (const auto it = name_index.find(param.name); it != name_index.end())
        fail(ctx, name,
             "parameter name " + quote(param.name) + " appears twice (first at line " +
                 std::to_string(location_of(name_fields[it->second], ctx.file).line) + ")",
             "give every parameter a distinct name");
      name_index.emplace(param.name, name_fields.size());
      name_fields.push_back(name);
      const Field& shape = p.require("shape", "shape: [4096, 4096]");
      shape_fields.push_back(shape);
      const std::vector<Field> extents = list_items(ctx, shape);
      if (extents.empty() || extents.size() > 3)
        fail(ctx, shape,
             "shape of '" + param.name + "' has " + std::to_string(extents.size()) + " dims",
             "use 1 to 3 dims: [n] (vector), [rows, cols] (matrix), [batch, rows, cols] (stack)");
      for (const Field& e : extents) param.shape.push_back(to_int(ctx, e, 1, kMaxExtent));
      param.role = param.shape.size() == 1 ? ParamRole::norm : ParamRole::other_matrix;
      if (const Field* r = p.find("role"))
        param.role = param_role_from_string(to_choice(ctx, *r, roles));
      if (const Field* dt = p.find("dtype")) param.dtype = read_dtype(ctx, *dt);
      p.read("layer", param.layer, -1, kMaxLayers - 1);
      max_layer = std::max(max_layer, param.layer);
      const Field* pl = p.find("placements");
      placement_fields.push_back(pl ? *pl : missing_field(item.value, item.path + ".placements"));
      out.model.params.push_back(std::move(param));
    }
    out.model.num_layers = max_layer + 1;
    const Field* defaults = m.find("placements");
    out.explicit_layouts = defaults != nullptr;
    for (const Field& f : placement_fields) out.explicit_layouts |= f.key.IsDefined();
    if (out.explicit_layouts) {
      for (std::size_t i = 0; i < out.model.params.size(); ++i) {
        const Field& f = placement_fields[i].key.IsDefined() ? placement_fields[i]
                         : defaults                          ? *defaults
                                                             : placement_fields[i];
        if (!f.key.IsDefined()) {
          out.placements.emplace_back(mesh.ndims(), Placement::replicate());
          continue;
        }
        out.placements.push_back(read_placements(ctx, f, mesh, out.model.params[i].shape));
        try {
          TensorLayout(mesh, out.model.params[i].shape, out.placements.back());
        } catch (const Error& e) {
          fail(ctx, f, "placements of '" + out.model.params[i].name + "': " + e.what(),
               "fix the placements");
        }
      }
    }
  }
  if (!out.name_override.empty()) out.model.name = out.name_override;
  check_model_size(ctx, *chosen, shape_fields, out.model);
  return out;
}

}  // namespace muonbed::experiment_parsing
