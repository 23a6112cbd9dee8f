// The experiment key table (core/experiment/keys.hpp) and the key reference printed from it and
// from the cluster table and the registries. A new key is one row here plus its read in
// experiment.cpp; tests/experiments/keys_test.cpp fails until both agree.
#include "core/experiment/keys.hpp"

#include <algorithm>
#include <sstream>

#include "core/base/errors.hpp"
#include "core/config/cluster.hpp"
#include "core/config/cluster_fields.hpp"
#include "core/config/src/yaml_util.hpp"
#include "core/experiment/backends.hpp"
#include "core/model/model.hpp"
#include "core/plan/assignment.hpp"
#include "core/plan/strategy.hpp"

namespace muonbed {

namespace {

using yaml_util::join;

constexpr const char* kBool = "true | false";
constexpr const char* kDType = "fp32 | bf16 | fp16";

std::vector<ExperimentKey> make_table() {
  std::vector<ExperimentKey> t;
  const auto row = [&t](std::string section, std::string key, std::string type, std::string range,
                        std::string default_value, std::string meaning, std::string example,
                        bool sets_value = true) {
    t.push_back({std::move(section), std::move(key), std::move(type), std::move(range),
                 std::move(default_value), std::move(meaning), std::move(example), sets_value});
  };

  // --- top level ------------------------------------------------------------------------------
  row("", "name", "text", "", "(the file's name)",
      "The experiment's name: results go to results/NAME. At most 200 bytes, a plain folder name "
      "(no '/', '\\', '.' or '..').",
      "keys_example");
  row("", "cluster", "name, path or map", "", "dgx-h100",
      "The cluster profile: a name from experiments/clusters, a path to a profile YAML, or a map "
      "(a whole profile, or {preset: NAME, ...} overriding some fields; cluster keys below).",
      "{preset: dgx-h100, nodes: 64}");
  row("", "mesh", "map", "", "required", "The device mesh (mesh keys below).", "");
  row("", "model", "map", "", "required",
      "The model: exactly one of preset, hf_config, dense, moe or params (model keys below).", "");
  row("", "parallel", "map", "", "(rules' defaults)",
      "How tensors are laid out over the mesh dims (parallel keys below).", "");
  row("", "optimizer", "map", "", "(torch.optim.Muon's defaults)",
      "Muon's and AdamW's settings, torch.optim's names (optimizer keys below).", "");
  row("", "strategy", "map", "", "{name: owner}",
      "The strategy that plans the distributed step, and its options (strategy keys below).", "");
  row("", "backend", "backend name or list", "", "[sim]",
      "Where each point runs: predicted (sim, analytic) or measured (mpi, nccl); see Backends "
      "below.",
      "[analytic]");
  row("", "sim", "map", "", "{fidelity: auto}", "Simulator settings (sim keys below).", "");
  row("", "steps", "integer", "0 .. 1000000", "2",
      "Measured backends: untimed warm-up steps before the timed ones.", "3");
  row("", "repeats", "integer", "1 .. 1000000", "10",
      "Measured backends: timed steps after the warm-up.", "3");
  row("", "seed", "integer", ">= 0", "1", "Measured backends: seed of the step's generated data.",
      "7");
  row("", "output", "text", "", "(results/NAME)",
      "The results folder. At most 4,000 bytes, folder names at most 255 bytes.",
      "results/keys_elsewhere");
  row("", "sweep", "map KEY: [values]", "", "-",
      "A Cartesian product of overrides: each key a dotted key of this reference (or mesh.DIM for "
      "a mesh dim's size), each value a list. At most 10,000 points.",
      "", false);
  row("", "memory", "map", "", "-",
      "The training state beside the optimizer step, for the memory check (memory keys below).",
      "");
  row("", "training", "map", "", "-",
      "Plan the whole training step (forward, backward, gradient sync) around the optimizer step "
      "(training keys below).",
      "");

  // --- mesh -----------------------------------------------------------------------------------
  row("mesh", "dims", "map or list", "", "required",
      "The mesh dims, outermost first (the last varies fastest): a map {NAME: SIZE} or {NAME: "
      "{size, role}}, or a list of {name, size, role} (mesh.dims[] keys). The names dp_shard "
      "(fsdp), dp_replicate, dp, cp (replicate), tp, ep and pp imply their role.",
      "", false);
  row("mesh", "gpus_per_node", "integer", "1 .. 1024", "(the cluster's)",
      "A check: must equal the cluster's GPUs per node (override the cluster to change it).", "8",
      false);
  row("mesh", "world_size", "integer", "1 .. 16384", "(the dims' product)",
      "A check: must equal the product of the dim sizes.", "4", false);
  row("mesh.dims[]", "name", "text", "", "required (list form)",
      "The dim's name: letters, digits, '_' or '-'; distinct; sweep its size as mesh.NAME.", "dp");
  row("mesh.dims[]", "size", "integer", "1 .. 16384", "required",
      "Ranks along the dim; the product of all sizes is at most 16,384.", "4");
  row("mesh.dims[]", "role", "replicate | fsdp | tp | ep | pp", "", "(implied by the name)",
      "What the dim does to tensors (parallel rules); required for a name that implies none.",
      "replicate");

  // --- model ----------------------------------------------------------------------------------
  row("model", "preset", "model preset name", "", "-", "A built-in model (Model presets below).",
      "llama-7b");
  row("model", "hf_config", "path or map", "", "-",
      "A Hugging Face config.json, as a path relative to the file or its fields inline.",
      "{model_type: llama, hidden_size: 256, intermediate_size: 688, num_hidden_layers: 2, "
      "num_attention_heads: 4, vocab_size: 1024}");
  row("model", "name", "text", "", "(the model's)", "The model's name in results and tables.",
      "renamed");
  row("model", "layers", "integer", "1 .. the preset's layers (hf_config: 1 .. 1000)",
      "(the model's)", "preset or hf_config: keep the first LAYERS blocks (a shallower variant).",
      "2");
  row("model", "dtype", kDType, "", "(the model's)",
      "preset or hf_config: the dtype of every parameter.", "fp32");
  row("model", "experts", "integer", "1 .. 65536", "(the config's)",
      "hf_config only: routed experts per MoE layer instead of the config's.", "4");
  row("model", "dense", "map", "", "-", "A dense transformer by its sizes (model.dense keys).", "");
  row("model", "moe", "map", "", "-",
      "A mixture-of-experts transformer: model.dense's keys plus model.moe's.", "");
  row("model", "params", "list of maps", "", "-", "The tensors one by one (model.params[] keys).",
      "");
  row("model", "placements", "map DIM: PLACEMENT", "", "-",
      "model.params only: the placements of every tensor without its own (R, S(d), SS(d,f), I(c); "
      "unlisted dims replicate).",
      "{dp_shard: S(1)}");

  row("model.dense", "name", "text", "", "custom-dense (moe: custom-moe)", "The model's name.",
      "small");
  row("model.dense", "hidden", "integer", "1 .. 16777216", "required", "Model width.", "512");
  row("model.dense", "layers", "integer", "1 .. 1000", "required", "Transformer blocks.", "3");
  row("model.dense", "heads", "integer", "1 .. 65536", "required",
      "Attention heads (divide hidden unless head_dim is given).", "16");
  row("model.dense", "kv_heads", "integer", "1 .. 65536", "(heads)",
      "Key/value heads (grouped-query attention); divides heads.", "2");
  row("model.dense", "ffn", "integer", "1 .. 16777216", "required (moe: -)",
      "Dense MLP width (moe: the width of its dense_layers).", "1536");
  row("model.dense", "vocab", "integer", "1 .. 16777216", "required", "Vocabulary size.", "2048");
  row("model.dense", "head_dim", "integer", "1 .. 65536", "(hidden / heads)",
      "Rows per attention head.", "64");
  row("model.dense", "gated_mlp", kBool, "", "true", "SwiGLU (gate, up, down) or GELU (up, down).",
      "false");
  row("model.dense", "qkv_bias", kBool, "", "false", "Biases on q, k and v.", "true");
  row("model.dense", "tied_embeddings", kBool, "", "false",
      "The output head shares the embedding matrix.", "true");
  row("model.dense", "layernorm_bias", kBool, "", "false", "LayerNorm with bias (not RMSNorm).",
      "true");
  row("model.dense", "linear_bias", kBool, "", "false",
      "Biases on attn.o and the dense MLP linears (GPT-2).", "true");
  row("model.dense", "max_positions", "integer", "0 .. 16777216", "0",
      "> 0: a learned position embedding [max_positions, hidden].", "1024");
  row("model.dense", "dtype", kDType, "", "bf16", "The parameters' dtype.", "fp32");
  row("model.moe", "experts", "integer", "1 .. 65536", "required", "Routed experts per MoE layer.",
      "8");
  row("model.moe", "expert_ffn", "integer", "1 .. 16777216", "required", "Each expert's width.",
      "512");
  row("model.moe", "shared_experts", "integer", "0 .. 1024", "0",
      "Shared experts per MoE layer (each of width expert_ffn).", "1");
  row("model.moe", "dense_layers", "integer", "0 .. layers", "0",
      "The first blocks with a dense MLP of width ffn instead of experts.", "1");

  row("model.params[]", "name", "text", "", "required", "The tensor's name (distinct).",
      "renamed_w");
  row("model.params[]", "shape", "list of integers", "1 to 3 dims, each 1 .. 16777216", "required",
      "[n] (vector), [rows, cols] (matrix), [batch, rows, cols] (a stack).", "[128, 64]");
  row("model.params[]", "role", "parameter role", "", "(norm for 1 dim, else other_matrix)",
      "What the tensor is (attn_q, mlp_up, expert_up, embedding, lm_head, ...): the parallel and "
      "routing rules read it.",
      "attn_q");
  row("model.params[]", "dtype", kDType, "", "bf16", "The tensor's dtype.", "fp32");
  row("model.params[]", "layer", "integer", "-1 .. 999", "-1",
      "The block it belongs to (-1: none; pipeline stages and grad_sync levels read it).", "0");
  row("model.params[]", "placements", "map DIM: PLACEMENT", "", "(model.placements)",
      "This tensor's placements (R, S(d), SS(d,f), I(c)).", "{dp_shard: S(1)}");

  // --- parallel -------------------------------------------------------------------------------
  row("parallel", "fsdp_tensor_dim", "integer", "0 .. 1", "0",
      "The tensor dim fsdp dims shard: 0 (rows, as FSDP2) or 1 (columns).", "1");
  row("parallel", "tp_dim_per_param", "map NAME: DIM", "", "-",
      "Per tensor: the dim tp shards instead of the role's rule.", "{w: 1}");
  row("parallel", "tp_shard_embeddings", kBool, "", "true",
      "Vocabulary-parallel embeddings and head under tp.", "false");
  row("parallel", "dense_over_ep", "replicate | shard", "", "replicate",
      "Dense (non-expert) tensors under an ep dim: replicated over it, or sharded over the fsdp "
      "dims and ep together (torchtitan, Megatron).",
      "shard");

  // --- optimizer ------------------------------------------------------------------------------
  row("optimizer", "lr", "number", "> 0", "0.001", "Muon's learning rate.", "0.02");
  row("optimizer", "weight_decay", "number", ">= 0", "0.1", "Decoupled weight decay of Muon.",
      "0.01");
  row("optimizer", "momentum", "number", "0 .. below 1", "0.95", "Muon's momentum.", "0.9");
  row("optimizer", "nesterov", kBool, "", "true", "Nesterov momentum.", "false");
  row("optimizer", "momentum_form", "lerp | classic", "", "lerp",
      "lerp (torch's and Keller Jordan's code) or classic (buf = beta buf + g).", "classic");
  row("optimizer", "ns_coefficients", "keller | polar_express | [a, b, c] | [[a, b, c], ...]", "",
      "keller",
      "The Newton-Schulz quintic: a named set, one triple for every step (torch's form) or one "
      "per step (keller_jordan is keller).",
      "polar_express");
  row("optimizer", "ns_steps", "integer", "1 .. 100", "5", "Newton-Schulz iterations.", "6");
  row("optimizer", "eps", "number", "0 .. 1", "1e-07", "X0 = G / (||G||_F + eps).", "1e-06");
  row("optimizer", "adjust_lr_fn", "original | match_rms_adamw | none", "", "original",
      "How the learning rate scales with the matrix shape (none isolates Newton-Schulz).",
      "match_rms_adamw");
  row("optimizer", "adamw", "map", "", "(torch.optim.AdamW's defaults)",
      "The AdamW that updates what Muon does not (optimizer.adamw keys).", "");
  row("optimizer", "qk_clip", "map", "", "{enabled: false}",
      "MuonClip's query/key clipping, Kimi K2 (optimizer.qk_clip keys).", "");
  row("optimizer", "comm_dtype", kDType, "", "bf16", "The dtype updates move in between ranks.",
      "fp32");
  row("optimizer", "routing", "map", "", "(defaults below)",
      "Which tensors go to AdamW instead of Muon (optimizer.routing keys).", "");
  row("optimizer.adamw", "lr", "number", "> 0", "0.001", "AdamW's learning rate.", "0.0003");
  row("optimizer.adamw", "betas", "[beta1, beta2]", "each 0 .. below 1", "[0.9, 0.999]",
      "AdamW's moment decays.", "[0.9, 0.95]");
  row("optimizer.adamw", "eps", "number", "0 .. 1", "1e-08", "AdamW's epsilon.", "1e-06");
  row("optimizer.adamw", "weight_decay", "number", ">= 0", "0.01", "AdamW's weight decay.", "0.1");
  row("optimizer.qk_clip", "enabled", kBool, "", "false", "Clip query/key rows (MuonClip).",
      "true");
  row("optimizer.qk_clip", "tau", "number", "> 0", "100", "The logit threshold.", "50");
  row("optimizer.qk_clip", "head_dim", "integer", "0 .. 1048576", "0",
      "Rows per attention head of attn_q / attn_k (0: the model's).", "32");
  row("optimizer.routing", "embeddings_to_adamw", kBool, "", "true", "Embeddings go to AdamW.",
      "false");
  row("optimizer.routing", "lm_head_to_adamw", kBool, "", "true", "The output head goes to AdamW.",
      "false");
  row("optimizer.routing", "router_to_adamw", kBool, "", "false", "MoE routers go to AdamW.",
      "true");
  row("optimizer.routing", "force_adamw", "list of parameter names", "", "-",
      "These tensors go to AdamW whatever their role.", "[w]");

  // --- strategy (the keys of core/plan/strategy.hpp strategy_option_keys) ----------------------
  row("strategy", "name", "strategy name", "", "owner", "The strategy (Strategies below).",
      "all_to_all");
  row("strategy", "preset", "strategy preset name", "", "-",
      "Start from a published system's options (Presets below); the other keys override "
      "them.",
      "dion");
  row("strategy", "grad_sync", "map", "", "{enabled: false}",
      "Level-scheduled gradient sync, seed 002 (strategy.grad_sync keys).", "");
  row("strategy", "assign", "assign policy name | explicit", "", "flop_balanced",
      "How Muon matrices get their owners (Assign policies below); explicit reads "
      "explicit_owners.",
      "round_robin");
  row("strategy", "explicit_owners", "map NAME: RANK", "", "-",
      "assign: explicit: the owner rank of every Muon matrix (each must hold a piece of it).",
      "{w: 1, v: 2}");
  row("strategy", "small_param_threshold", "integer", ">= 0", "0",
      "Matrices below this many elements run the replicated schedule (0: off).", "100000");
  row("strategy", "async_gpu_parallelism", kBool, "", "true",
      "Owners run Newton-Schulz on their own stream as their gathers arrive.", "false");
  row("strategy", "prefetch_count", "integer", "0 .. 1024", "1",
      "Gathers run ahead of Newton-Schulz by this many units per owner.", "2");
  row("strategy", "gather", "hierarchical | rails | flat", "", "hierarchical",
      "How updates are gathered to owners: TP then FSDP, the cross-node stage on every NIC rail, "
      "or one flat collective.",
      "flat");
  row("strategy", "split_ns", "true | false, or a map", "", "false",
      "Split Newton-Schulz of the largest matrices over a group of ranks (strategy.split_ns "
      "keys; a map enables it unless enabled: false).",
      "true");
  row("strategy", "comm_lanes", "integer", "1 .. 4096", "1",
      "Communication streams the units are spread over.", "2");
  row("strategy", "order", "plan | lpt", "", "plan",
      "Unit order: parameter order, or largest Newton-Schulz first.", "lpt");
  row("strategy", "chunk_size", "integer", "1 .. 1048576", "8",
      "Matrices per chunk (chunk_sizing: count).", "4");
  row("strategy", "chunk_by_shape", kBool, "", "false", "Each chunk holds one matrix shape only.",
      "true");
  row("strategy", "chunk_sizing", "count | ns_cost", "", "count",
      "Chunks of chunk_size matrices, or cut by Newton-Schulz cost (chunk k holds every owner's "
      "k-th largest matrix).",
      "ns_cost");
  row("strategy", "max_chunks_in_flight", "integer", "1 .. 1048576", "2",
      "Chunks exchanged ahead of the one computing.", "3");
  row("strategy.split_ns", "enabled", kBool, "", "true (when the map is given)",
      "Split Newton-Schulz on or off.", "false");
  row("strategy.split_ns", "max_members", "integer", "2 .. 16384", "8",
      "The largest split group (8: a DGX node's tp group).", "4");
  row("strategy.split_ns", "threshold", "number", "0 .. 1000000000", "1",
      "Split a matrix whose Newton-Schulz exceeds this times the balanced per-rank share (0: "
      "every matrix that can split).",
      "0");
  row("strategy.grad_sync", "enabled", kBool, "", "false", "Level-scheduled gradient sync on.",
      "true");
  row("strategy.grad_sync", "level_periods", "list of integers", "each 1 .. 1048576, lcm too",
      "[1]",
      "Level i (contiguous blocks of layers) syncs every level_periods[i] steps; at most one "
      "level per layer.",
      "[1, 2]");

  // --- memory, training, sim --------------------------------------------------------------------
  row("memory", "master_weights", "auto | fp32 | none", "", "auto",
      "fp32 copies of the parameters: of each shard stored in a lower dtype (auto), of every "
      "shard (fp32), or none.",
      "none");
  row("memory", "activations_GiB", "number", "0 .. 65536", "0",
      "Activations per rank, live during forward and backward.", "20");
  row("memory", "reserved_GiB", "number", "0 .. 65536", "0",
      "Memory per rank held throughout (CUDA context, NCCL buffers, allocator slack).", "4");
  row("training", "tokens_per_step", "integer", "1 .. 1099511627776", "required",
      "The global batch, in tokens.", "4096");
  row("training", "seq_len", "integer", "1 .. 16777216", "required", "Tokens per sequence.", "512");
  row("training", "micro_batch_size", "integer", "1 .. 1048576", "1",
      "Sequences per micro-batch per data-parallel rank.", "2");
  row("training", "overlap", "none | backward", "", "none",
      "none: the optimizer starts once every gradient is synced; backward: a matrix's optimizer "
      "work starts once its own gradient is synced.",
      "backward");
  row("training", "experts_per_token", "integer", "1 .. 65536", "(0: a dense model)",
      "MoE routing top-k.", "2");
  row("training", "max_micro_batch_groups", "integer", "1 .. 1024", "8",
      "Micro-batches run in at most this many groups (bounds the plan's size).", "2");
  row("training", "flash_attention", kBool, "", "true",
      "FlashAttention-style kernels keep no score matrix (less activation memory).", "false");
  row("sim", "fidelity", "step | flow | auto", "", "auto",
      "step models every transfer (at most 2,048 ranks), flow one flow per ring edge; auto: flow "
      "where the test suite shows it within 1 % of step for plans of the kind, else step where "
      "affordable, else flow with a warning (the pick and why are printed).",
      "flow");
  return t;
}

// Markdown cells: '|' would end the cell.
std::string cell(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::string code(const std::string& text) {
  return text.empty() ? "" : "`" + text + "`";
}

struct Group {
  std::string name;
  std::string title;
  std::string intro;
};

const std::vector<Group>& groups() {
  static const std::vector<Group> g = {
      {"experiment", "Top level", "The keys of an experiment file's top level."},
      {"cluster", "cluster",
       "A cluster profile's keys (experiments/clusters/*.yaml), and the keys of an inline "
       "`cluster:` map; with `preset: NAME` any of them overrides that profile. \"required\" "
       "means required in a whole profile; a default is what a whole profile without the key "
       "gets."},
      {"mesh", "mesh", "The device mesh."},
      {"model", "model", "The model: exactly one of preset, hf_config, dense, moe or params."},
      {"parallel", "parallel", "Layout rules of tensors over the mesh dims."},
      {"optimizer", "optimizer", "torch.optim.Muon's and torch.optim.AdamW's names and defaults."},
      {"strategy", "strategy",
       "An option a strategy does not read is refused unless left at its default; the last "
       "column names the strategies that read it (with small_param_threshold > 0 the small "
       "matrices run the replicated schedule, which reads prefetch_count, comm_lanes and order "
       "whatever the strategy; chunk_size is unread under chunk_sizing: ns_cost)."},
      {"memory", "memory", "The training state around the optimizer step, for the memory check."},
      {"training", "training", "The training step around the optimizer step."},
      {"sim", "sim", "The simulator."},
      {"strategies", "Strategies", ""},
      {"presets", "Presets and policies", ""},
      {"backends", "Backends", ""},
  };
  return g;
}

// The table group of an experiment key: its section's first word, "experiment" for the top.
std::string group_of(const ExperimentKey& k) {
  if (k.section.empty()) return "experiment";
  return k.section.substr(0, k.section.find_first_of(".["));
}

bool is_table_group(std::string_view name) {
  return name != "strategies" && name != "presets" && name != "backends";
}

// The registries' lists: name and one line each.
std::vector<std::pair<std::string, std::string>> list_entries(std::string_view group,
                                                              std::string& heading) {
  std::vector<std::pair<std::string, std::string>> out;
  if (group == "strategies") {
    heading = "`strategy.name`: the registered strategies (core/strategies, core/policies).";
    for (const std::string& name : strategy_names())
      out.emplace_back(name, find_strategy(name).summary());
  } else if (group == "backends") {
    heading = "`backend`: where a point runs.";
    for (const BackendFacts& b : known_backends()) out.emplace_back(b.name, b.description);
  }
  return out;
}

std::string presets_text(bool markdown) {
  std::ostringstream out;
  const auto line = [&](const std::string& key, const std::string& names) {
    out << (markdown ? "- " + code(key) + ": " : "  " + key + ": ") << names << "\n";
  };
  line("model.preset", join(preset_names()));
  std::vector<std::string> policies = assign_policy_names();
  if (std::find(policies.begin(), policies.end(), "explicit") == policies.end())
    policies.push_back("explicit");  // made by make_explicit_assign_policy, not the registry
  line("strategy.assign", join(policies));
  line("strategy.preset", "the options of a published system (core/plan/src/presets.cpp):");
  for (const StrategyPreset& p : strategy_presets())
    out << (markdown ? "  - " + code(p.name) + ": " : "    " + p.name + ": ") << p.source << "\n";
  return out.str();
}

}  // namespace

const std::vector<ExperimentKey>& experiment_keys() {
  static const std::vector<ExperimentKey> table = make_table();
  return table;
}

std::vector<std::string> experiment_keys_in(std::string_view section) {
  std::vector<std::string> keys;
  for (const ExperimentKey& k : experiment_keys())
    if (k.section == section) keys.push_back(k.key);
  return keys;
}

std::vector<std::string> key_reference_sections() {
  std::vector<std::string> names;
  for (const Group& g : groups()) names.push_back(g.name);
  return names;
}

std::vector<KeyReferenceRow> key_reference_rows(std::string_view section) {
  std::vector<KeyReferenceRow> rows;
  if (section == "cluster") {
    rows.push_back({"cluster.preset", "name or path", "", "-",
                    "An inline cluster map only: the profile its other keys override.", ""});
    for (const ClusterKeyDoc& d : cluster_key_reference()) {
      std::string meaning = d.doc;
      if (!d.calibrated.empty()) meaning += " Calibrated: " + d.calibrated + ".";
      const std::string default_value = d.required                ? "required"
                                        : d.default_value.empty() ? "-"
                                                                  : d.default_value;
      rows.push_back({"cluster." + d.path, d.type, d.range, default_value, meaning, ""});
    }
    return rows;
  }
  for (const ExperimentKey& k : experiment_keys()) {
    if (group_of(k) != section) continue;
    std::string applies;
    if (k.section == "strategy") applies = strategies_reading_option(k.key);
    if (k.section.starts_with("strategy."))
      applies = strategies_reading_option(k.section.substr(9));
    rows.push_back({k.path(), k.type, k.range, k.default_value, k.meaning, applies});
  }
  return rows;
}

std::string key_reference(std::string_view format, std::string_view section) {
  if (format != "markdown" && format != "text")
    throw Error("unknown key reference format '" + std::string(format) + "'; use markdown or text");
  const std::vector<std::string> names = key_reference_sections();
  if (!section.empty() && std::find(names.begin(), names.end(), section) == names.end())
    throw Error("unknown key reference section '" + std::string(section) +
                "'; sections: " + join(names));
  const bool markdown = format == "markdown";
  std::ostringstream out;
  if (markdown && section.empty())
    out << "# muonbed: every key\n\n"
        << "Generated by `muonbed keys --format markdown > docs/KEYS.md` from the tables the "
           "parsers use (core/experiment/src/keys.cpp, core/config/src/cluster.cpp) and the "
           "registries; `ctest -R cli.keys_reference` fails when this file differs. Do not edit "
           "it by hand.\n\n"
        << "A sweep (`sweep:`) overrides any dotted key below (except `sweep`), or `mesh.DIM` for "
           "a mesh dim's size. Defaults in parentheses are descriptions; `-` means absent (off). "
           "Ranges include both ends.\n";
  for (const Group& g : groups()) {
    if (!section.empty() && g.name != section) continue;
    if (markdown)
      out << "\n## " << g.title << "\n\n";
    else
      out << (out.tellp() > 0 ? "\n" : "") << g.title << "\n";
    if (!g.intro.empty())
      out << (markdown ? "" : "  ") << g.intro << "\n" << (markdown ? "\n" : "");
    if (g.name == "presets") {
      out << presets_text(markdown);
      continue;
    }
    if (!is_table_group(g.name)) {
      std::string heading;
      const auto entries = list_entries(g.name, heading);
      out << (markdown ? "" : "  ") << heading << "\n" << (markdown ? "\n" : "");
      for (const auto& [name, line] : entries)
        out << (markdown ? "- " + code(name) + ": " : "  " + name + ": ") << line << "\n";
      continue;
    }
    const std::vector<KeyReferenceRow> rows = key_reference_rows(g.name);
    const bool strategies = g.name == "strategy";
    if (markdown) {
      out << "| key | type | range | default | meaning |" << (strategies ? " read by |" : "")
          << "\n| --- | --- | --- | --- | --- |" << (strategies ? " --- |" : "") << "\n";
      for (const KeyReferenceRow& r : rows) {
        out << "| " << code(r.path) << " | " << cell(r.type) << " | " << cell(r.range) << " | "
            << cell(r.default_value) << " | " << cell(r.meaning) << " |";
        if (strategies) out << " " << cell(r.applies_to) << " |";
        out << "\n";
      }
    } else {
      for (const KeyReferenceRow& r : rows) {
        out << "  " << r.path << "  (" << r.type;
        if (!r.range.empty()) out << ", " << r.range;
        out << "; default " << r.default_value << ")\n      " << r.meaning << "\n";
        if (!r.applies_to.empty()) out << "      read by: " << r.applies_to << "\n";
      }
    }
  }
  return out.str();
}

}  // namespace muonbed
