// The resolved configuration of a parsed point (Experiment::resolved_yaml, a result's
// provenance): every key written out, defaults included, so parse_experiment reads it back to the
// same point.
#include <string>

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "core/experiment/src/experiment_parsing.hpp"

namespace muonbed::experiment_parsing {

namespace {

void emit_number(YAML::Emitter& out, const char* key, double value) {
  out << YAML::Key << key << YAML::Value << format_number(value);
}

void emit_dense_fields(YAML::Emitter& out, const DenseSpec& s) {
  out << YAML::Key << "name" << YAML::Value << s.name;
  out << YAML::Key << "hidden" << YAML::Value << s.hidden;
  out << YAML::Key << "layers" << YAML::Value << s.layers;
  out << YAML::Key << "heads" << YAML::Value << s.heads;
  out << YAML::Key << "kv_heads" << YAML::Value << (s.kv_heads > 0 ? s.kv_heads : s.heads);
  out << YAML::Key << "ffn" << YAML::Value << s.ffn;
  out << YAML::Key << "vocab" << YAML::Value << s.vocab;
  if (s.head_dim > 0) out << YAML::Key << "head_dim" << YAML::Value << s.head_dim;
  out << YAML::Key << "gated_mlp" << YAML::Value << s.gated_mlp;
  out << YAML::Key << "qkv_bias" << YAML::Value << s.qkv_bias;
  out << YAML::Key << "tied_embeddings" << YAML::Value << s.tied_embeddings;
  out << YAML::Key << "layernorm_bias" << YAML::Value << s.layernorm_bias;
  out << YAML::Key << "linear_bias" << YAML::Value << s.linear_bias;
  out << YAML::Key << "max_positions" << YAML::Value << s.max_positions;
  out << YAML::Key << "dtype" << YAML::Value << std::string(to_string(s.dtype));
}

}  // namespace

std::string resolved_yaml(const Experiment& e, const MeshSection& ms, const ModelSection& model) {
  YAML::Emitter out;
  out << YAML::Comment("resolved configuration of " + e.file +
                       (e.point_label.empty() ? "" : ", sweep point " + e.point_label));
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << e.name;
  out << YAML::Key << "cluster" << YAML::Value;
  emit_cluster(out, e.cluster);

  out << YAML::Key << "mesh" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "dims" << YAML::Value << YAML::BeginSeq;
  for (const MeshDim& d : e.mesh.dims())
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << d.name << YAML::Key
        << "size" << YAML::Value << d.size << YAML::Key << "role" << YAML::Value
        << std::string(to_string(d.role)) << YAML::EndMap;
  out << YAML::EndSeq;
  out << YAML::Key << "gpus_per_node" << YAML::Value << e.mesh.gpus_per_node();
  out << YAML::Key << "world_size" << YAML::Value << e.mesh.world_size();
  out << YAML::EndMap;

  out << YAML::Key << "model" << YAML::Value;
  out << YAML::Comment(format_number(static_cast<double>(e.model.numel())) + " parameters in " +
                       std::to_string(e.model.params.size()) + " tensors, " +
                       std::to_string(e.model.num_layers) + " layers");
  out << YAML::BeginMap;
  switch (model.kind) {
    case ModelKind::preset:
      out << YAML::Key << "preset" << YAML::Value << model.preset;
      if (!model.name_override.empty())
        out << YAML::Key << "name" << YAML::Value << model.name_override;
      if (model.layers_override > 0)
        out << YAML::Key << "layers" << YAML::Value << model.layers_override;
      if (model.dtype_override)
        out << YAML::Key << "dtype" << YAML::Value << std::string(to_string(*model.dtype_override));
      break;
    case ModelKind::hf:
      // The fields read, defaults explicit: the resolved file needs no config.json, and a changed
      // config.json changes the point's identity.
      out << YAML::Key << "hf_config" << YAML::Value;
      emit_json_as_yaml(out, nlohmann::ordered_json::parse(model.hf_fields));
      out << YAML::Key << "name" << YAML::Value << e.model.name;
      if (model.layers_override > 0)
        out << YAML::Key << "layers" << YAML::Value << model.layers_override;
      if (model.experts_override > 0)
        out << YAML::Key << "experts" << YAML::Value << model.experts_override;
      if (model.dtype_override)
        out << YAML::Key << "dtype" << YAML::Value << std::string(to_string(*model.dtype_override));
      break;
    case ModelKind::dense:
      out << YAML::Key << "dense" << YAML::Value << YAML::BeginMap;
      emit_dense_fields(out, model.dense);
      out << YAML::EndMap;
      break;
    case ModelKind::moe:
      out << YAML::Key << "moe" << YAML::Value << YAML::BeginMap;
      emit_dense_fields(out, model.moe.base);
      out << YAML::Key << "experts" << YAML::Value << model.moe.experts;
      out << YAML::Key << "expert_ffn" << YAML::Value << model.moe.expert_ffn;
      out << YAML::Key << "shared_experts" << YAML::Value << model.moe.shared_experts;
      out << YAML::Key << "dense_layers" << YAML::Value << model.moe.dense_layers;
      out << YAML::EndMap;
      break;
    case ModelKind::params:
      out << YAML::Key << "name" << YAML::Value << e.model.name;
      out << YAML::Key << "params" << YAML::Value << YAML::BeginSeq;
      for (std::size_t i = 0; i < e.model.params.size(); ++i) {
        const Parameter& p = e.model.params[i];
        out << YAML::Flow << YAML::BeginMap;
        out << YAML::Key << "name" << YAML::Value << p.name;
        out << YAML::Key << "shape" << YAML::Value << YAML::Flow << p.shape;
        out << YAML::Key << "role" << YAML::Value << std::string(to_string(p.role));
        out << YAML::Key << "dtype" << YAML::Value << std::string(to_string(p.dtype));
        out << YAML::Key << "layer" << YAML::Value << p.layer;
        if (model.explicit_layouts) {
          out << YAML::Key << "placements" << YAML::Value << YAML::Flow << YAML::BeginMap;
          for (int d = 0; d < e.mesh.ndims(); ++d)
            out << YAML::Key << e.mesh.dim(d).name << YAML::Value
                << model.placements[i][d].to_string();
          out << YAML::EndMap;
        }
        out << YAML::EndMap;
      }
      out << YAML::EndSeq;
      break;
  }
  out << YAML::EndMap;

  out << YAML::Key << "parallel" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "fsdp_tensor_dim" << YAML::Value << e.parallel.fsdp_tensor_dim;
  if (!e.parallel.tp_dim_per_param.empty())
    out << YAML::Key << "tp_dim_per_param" << YAML::Value << YAML::Flow
        << e.parallel.tp_dim_per_param;
  out << YAML::Key << "tp_shard_embeddings" << YAML::Value << e.parallel.tp_shard_embeddings;
  // Only when not the default, so that points resolved before the option existed keep their
  // identity (and their results).
  if (e.parallel.dense_over_ep != DenseOverEp::replicate)
    out << YAML::Key << "dense_over_ep" << YAML::Value
        << std::string(to_string(e.parallel.dense_over_ep));
  out << YAML::EndMap;

  const OptimizerConfig& o = e.optimizer;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  emit_number(out, "lr", o.muon.lr);
  emit_number(out, "weight_decay", o.muon.weight_decay);
  emit_number(out, "momentum", o.muon.momentum);
  out << YAML::Key << "nesterov" << YAML::Value << o.muon.nesterov;
  out << YAML::Key << "momentum_form" << YAML::Value
      << std::string(to_string(o.muon.momentum_form));
  out << YAML::Key << "ns_steps" << YAML::Value << o.muon.ns_steps;
  out << YAML::Key << "ns_coefficients" << YAML::Value;
  if (o.muon.ns_coefficients == "custom") {
    out << YAML::BeginSeq;
    for (const auto& abc : o.muon.custom_coefficients)
      out << YAML::Flow << YAML::BeginSeq << format_number(abc.a) << format_number(abc.b)
          << format_number(abc.c) << YAML::EndSeq;
    out << YAML::EndSeq;
  } else {
    out << o.muon.ns_coefficients;
  }
  emit_number(out, "eps", o.muon.eps);
  out << YAML::Key << "adjust_lr_fn" << YAML::Value << std::string(to_string(o.muon.adjust_lr_fn));
  out << YAML::Key << "adamw" << YAML::Value << YAML::BeginMap;
  emit_number(out, "lr", o.adamw.lr);
  out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
      << format_number(o.adamw.beta1) << format_number(o.adamw.beta2) << YAML::EndSeq;
  emit_number(out, "eps", o.adamw.eps);
  emit_number(out, "weight_decay", o.adamw.weight_decay);
  out << YAML::EndMap;
  out << YAML::Key << "qk_clip" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "enabled" << YAML::Value << o.qk_clip.enabled;
  emit_number(out, "tau", o.qk_clip.tau);
  out << YAML::Key << "head_dim" << YAML::Value << o.qk_clip.head_dim;
  out << YAML::EndMap;
  out << YAML::Key << "comm_dtype" << YAML::Value << std::string(to_string(o.comm_dtype));
  const RoutingRules& r = e.parallel.routing;
  out << YAML::Key << "routing" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "embeddings_to_adamw" << YAML::Value << r.embeddings_to_adamw;
  out << YAML::Key << "lm_head_to_adamw" << YAML::Value << r.lm_head_to_adamw;
  out << YAML::Key << "router_to_adamw" << YAML::Value << r.router_to_adamw;
  if (!r.force_adamw.empty())
    out << YAML::Key << "force_adamw" << YAML::Value << YAML::Flow << r.force_adamw;
  out << YAML::EndMap;
  out << YAML::EndMap;

  const StrategyOptions& s = e.strategy;
  out << YAML::Key << "strategy" << YAML::Value << YAML::BeginMap;
  if (!s.preset.empty()) out << YAML::Key << "preset" << YAML::Value << s.preset;
  out << YAML::Key << "name" << YAML::Value << s.name;
  out << YAML::Key << "assign" << YAML::Value << s.assign;
  if (!s.explicit_owners.empty())
    out << YAML::Key << "explicit_owners" << YAML::Value << s.explicit_owners;
  out << YAML::Key << "async_gpu_parallelism" << YAML::Value << s.async_gpu_parallelism;
  out << YAML::Key << "prefetch_count" << YAML::Value << s.prefetch_count;
  out << YAML::Key << "gather" << YAML::Value << s.gather;
  out << YAML::Key << "chunk_size" << YAML::Value << s.chunk_size;
  out << YAML::Key << "max_chunks_in_flight" << YAML::Value << s.max_chunks_in_flight;
  out << YAML::Key << "small_param_threshold" << YAML::Value << s.small_param_threshold;
  if (s.comm_lanes != 1) out << YAML::Key << "comm_lanes" << YAML::Value << s.comm_lanes;
  if (s.order != "plan") out << YAML::Key << "order" << YAML::Value << s.order;
  if (s.chunk_by_shape) out << YAML::Key << "chunk_by_shape" << YAML::Value << true;
  if (s.chunk_sizing != "count")
    out << YAML::Key << "chunk_sizing" << YAML::Value << s.chunk_sizing;
  // Only when on, so points resolved before it was written keep their identity.
  if (s.split_ns.enabled) {
    out << YAML::Key << "split_ns" << YAML::Value << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "max_members" << YAML::Value << s.split_ns.max_members;
    emit_number(out, "threshold", s.split_ns.threshold);
    out << YAML::EndMap;
  }
  out << YAML::Key << "grad_sync" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "enabled" << YAML::Value << s.grad_sync.enabled;
  out << YAML::Key << "level_periods" << YAML::Value << YAML::Flow << s.grad_sync.level_periods;
  out << YAML::EndMap;
  out << YAML::EndMap;

  if (e.training.enabled) {
    const TrainingOptions& t = e.training;
    out << YAML::Key << "training" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "tokens_per_step" << YAML::Value << t.tokens_per_step;
    out << YAML::Key << "seq_len" << YAML::Value << t.seq_len;
    out << YAML::Key << "micro_batch_size" << YAML::Value << t.micro_batch_size;
    out << YAML::Key << "overlap" << YAML::Value << t.overlap;
    if (t.experts_per_token > 0)
      out << YAML::Key << "experts_per_token" << YAML::Value << t.experts_per_token;
    out << YAML::Key << "max_micro_batch_groups" << YAML::Value << t.max_micro_batch_groups;
    out << YAML::Key << "flash_attention" << YAML::Value << t.flash_attention;
    out << YAML::EndMap;
  }
  // Only when it differs from the default, so the identities of existing results stay.
  if (!(e.memory == TrainingMemoryOptions{})) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    out << YAML::Key << "memory" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "master_weights" << YAML::Value
        << std::string(to_string(e.memory.master_weights));
    emit_number(out, "activations_GiB", static_cast<double>(e.memory.activations_bytes) / gib);
    emit_number(out, "reserved_GiB", static_cast<double>(e.memory.reserved_bytes) / gib);
    out << YAML::EndMap;
  }
  out << YAML::Key << "backend" << YAML::Value << YAML::Flow << e.backends;
  out << YAML::Key << "sim" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "fidelity" << YAML::Value << e.sim_fidelity << YAML::EndMap;
  out << YAML::Key << "steps" << YAML::Value << e.steps;
  out << YAML::Key << "repeats" << YAML::Value << e.repeats;
  out << YAML::Key << "seed" << YAML::Value << e.seed;
  out << YAML::Key << "output" << YAML::Value << e.output_dir;
  out << YAML::EndMap;
  (void)ms;
  return std::string(out.c_str()) + "\n";
}

}  // namespace muonbed::experiment_parsing
