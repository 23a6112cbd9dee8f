// The single-device reference step over a whole model (see kernels/reference_optimizer.hpp).
#include "kernels/reference_optimizer.hpp"

#include <cmath>
#include <string>
#include <type_traits>

#include "core/base/errors.hpp"
#include "kernels/bf16.hpp"
#include "kernels/random.hpp"

namespace muonbed {
namespace {

template <typename To, typename From>
std::vector<To> convert(const From* in, std::int64_t n) {
  std::vector<To> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<To>(in[i]);
  return out;
}

// Values stored in `dtype` (fp32 or bf16): through fp32 first, as an fp32 executor holds them
// before the cast.
template <typename T>
void round_to_dtype(DType dtype, std::vector<T>& values) {
  if (dtype == DType::bf16)
    for (T& v : values) v = static_cast<T>(round_to_bf16(static_cast<float>(v)));
  else if (dtype == DType::fp32 && !std::is_same_v<T, float>)
    for (T& v : values) v = static_cast<T>(static_cast<float>(v));
}

}  // namespace

template <typename T>
void orthogonalize(const T* in, T* out, const MatrixShape& shape, const NsConfig& config,
                   NsPrecision precision) {
  const std::int64_t n = shape.numel();
  if (precision == NsPrecision::fp64) {
    if constexpr (std::is_same_v<T, double>) {
      newton_schulz(in, out, shape, config);
    } else {
      std::vector<double> work = convert<double>(in, n);
      newton_schulz(work.data(), work.data(), shape, config);
      for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(work[i]);
    }
  } else {
    if constexpr (std::is_same_v<T, float>) {
      newton_schulz(in, out, shape, config, precision);
    } else {
      std::vector<float> work = convert<float>(in, n);
      newton_schulz(work.data(), work.data(), shape, config, precision);
      for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(work[i]);
    }
  }
}

MatrixShape ns_shape(const Parameter& param) {
  if (!param.is_matrix()) {
    throw Error("parameter '" + param.name + "' is not a matrix; Newton-Schulz needs 2-D or 3-D");
  }
  return MatrixShape{param.batch(), param.rows(), param.cols()};
}

template <typename T>
ReferenceOptimizer<T>::ReferenceOptimizer(Model model, OptimizerConfig config, RoutingRules routing,
                                          ReferenceOptions options)
    : model_(std::move(model)),
      config_(std::move(config)),
      routing_(std::move(routing)),
      options_(options) {
  validate(config_);
  ns_ = make_ns_config(config_.muon);
  if (options_.round_to_comm_dtype && config_.comm_dtype == DType::fp16)
    throw Error(
        "reference optimizer: rounding to fp16 is not emulated; use comm_dtype bf16 or fp32");
  if (options_.round_to_storage_dtypes) {
    if (options_.state_dtype == DType::fp16)
      throw Error(
          "reference optimizer: optimizer state stored in fp16 is not emulated; use bf16 or fp32");
    for (const Parameter& p : model_.params)
      if (p.dtype == DType::fp16)
        throw Error("reference optimizer: parameter '" + p.name +
                    "' is fp16, whose storage is not emulated; use bf16 or fp32");
  }
  const std::size_t count = model_.params.size();
  kinds_.resize(count);
  momentum_.resize(count);
  adam_m_.resize(count);
  adam_v_.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    const Parameter& p = model_.params[i];
    kinds_[i] = route(p, routing_);
    const auto n = static_cast<std::size_t>(p.numel());
    if (kinds_[i] == OptimizerKind::muon) {
      ns_shape(p);  // throws for a non-matrix routed to Muon
      momentum_[i].assign(n, T(0));
    } else {
      adam_m_[i].assign(n, T(0));
      adam_v_[i].assign(n, T(0));
    }
  }
}

template <typename T>
void ReferenceOptimizer<T>::round_to_storage(ModelTensors<T>& params) const {
  if (!options_.round_to_storage_dtypes) return;
  if (params.size() != model_.params.size())
    throw Error("reference: the model has " + std::to_string(model_.params.size()) +
                " parameters but " + std::to_string(params.size()) + " values were given");
  for (std::size_t i = 0; i < params.size(); ++i) round_to_dtype(model_.params[i].dtype, params[i]);
}

template <typename T>
void ReferenceOptimizer<T>::step(ModelTensors<T>& params, const ModelTensors<T>& grads,
                                 const QkLogits* logits) {
  const std::size_t count = model_.params.size();
  if (params.size() != count || grads.size() != count) {
    throw Error("reference step: the model has " + std::to_string(count) + " parameters but " +
                std::to_string(params.size()) + " values and " + std::to_string(grads.size()) +
                " gradients were given");
  }
  for (std::size_t i = 0; i < count; ++i) {
    const auto n = static_cast<std::size_t>(model_.params[i].numel());
    if (params[i].size() != n || grads[i].size() != n) {
      throw Error("reference step: parameter '" + model_.params[i].name + "' has " +
                  std::to_string(n) + " elements but got " + std::to_string(params[i].size()) +
                  " values and " + std::to_string(grads[i].size()) + " gradients");
    }
  }
  if (config_.qk_clip.enabled && logits == nullptr) {
    throw Error("reference step: qk_clip is enabled but no max logits were given");
  }

  ++steps_;
  const MuonConfig& muon = config_.muon;
  const MomentumParams momentum = momentum_params(muon);
  const bool round = options_.round_to_comm_dtype && config_.comm_dtype != DType::fp32;
  const auto round_all = [&](std::vector<T>& values) {
    // Values pass through fp32 first, as an fp32 executor holds them before the cast.
    for (T& v : values) v = static_cast<T>(round_to_bf16(static_cast<float>(v)));
  };
  std::vector<T> update;
  for (std::size_t i = 0; i < count; ++i) {
    const Parameter& p = model_.params[i];
    const std::int64_t n = p.numel();
    if (kinds_[i] == OptimizerKind::muon) {
      update.resize(static_cast<std::size_t>(n));
      momentum_update(momentum, grads[i].data(), momentum_[i].data(), update.data(), n);
      if (round) round_all(update);
      orthogonalize(update.data(), update.data(), ns_shape(p), ns_, options_.ns_precision);
      if (round) round_all(update);
      apply_update(apply_params(muon, p.rows(), p.cols()), params[i].data(), update.data(), n);
      if (options_.round_to_storage_dtypes) round_to_dtype(options_.state_dtype, momentum_[i]);
    } else {
      adamw_update(config_.adamw, steps_, params[i].data(), grads[i].data(), adam_m_[i].data(),
                   adam_v_[i].data(), n);
      if (options_.round_to_storage_dtypes) {
        round_to_dtype(options_.state_dtype, adam_m_[i]);
        round_to_dtype(options_.state_dtype, adam_v_[i]);
      }
    }
  }
  // Parameters are stored once their step is done, QK-clip included.
  if (!config_.qk_clip.enabled) {
    round_to_storage(params);
    return;
  }
  // MuonClip: after the update, rescale the query and key rows of every head whose logit
  // exceeded tau in this step's forward pass.
  const std::int64_t head_dim = config_.qk_clip.head_dim;
  for (std::size_t i = 0; i < count; ++i) {
    const Parameter& p = model_.params[i];
    if (p.role != ParamRole::attn_q && p.role != ParamRole::attn_k) continue;
    if (p.shape.size() != 2 || p.rows() % head_dim != 0 || p.layer < 0) {
      throw Error("qk_clip: parameter '" + p.name + "' is not a [heads * " +
                  std::to_string(head_dim) + ", cols] matrix of a layer");
    }
    if (static_cast<std::size_t>(p.layer) >= logits->per_layer.size()) {
      throw Error("qk_clip: no max logits for layer " + std::to_string(p.layer));
    }
    const std::vector<double>& q_logits = logits->per_layer[static_cast<std::size_t>(p.layer)];
    const std::int64_t heads = p.rows() / head_dim;
    std::vector<double> scales;
    if (p.role == ParamRole::attn_q) {
      if (static_cast<std::int64_t>(q_logits.size()) != heads) {
        throw Error("qk_clip: '" + p.name + "' has " + std::to_string(heads) + " heads but " +
                    std::to_string(q_logits.size()) + " max logits were given");
      }
      scales = qk_clip_head_scales(q_logits, config_.qk_clip.tau);
    } else {
      scales = qk_clip_head_scales(kv_group_max_logits(q_logits, heads), config_.qk_clip.tau);
    }
    qk_clip_rows(params[i].data(), p.rows(), p.cols(), head_dim, scales);
  }
  round_to_storage(params);
}

template class ReferenceOptimizer<float>;
template class ReferenceOptimizer<double>;
template void orthogonalize<float>(const float*, float*, const MatrixShape&, const NsConfig&,
                                   NsPrecision);
template void orthogonalize<double>(const double*, double*, const MatrixShape&, const NsConfig&,
                                    NsPrecision);

std::uint64_t param_stream(std::size_t param_index) {
  return 2 * param_index;
}

std::uint64_t grad_stream(std::size_t num_params, std::size_t param_index, std::int64_t step) {
  return 2 * num_params * static_cast<std::uint64_t>(step) + 2 * param_index + 1;
}

double init_scale(const Parameter& param) {
  if (param.is_matrix()) return 1.0 / std::sqrt(static_cast<double>(param.cols()));
  return 0.1;
}

double init_offset(const Parameter& param) {
  return param.role == ParamRole::norm ? 1.0 : 0.0;
}

template <typename T>
ModelTensors<T> random_params(const Model& model, std::uint64_t seed) {
  ModelTensors<T> out(model.params.size());
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const Parameter& p = model.params[i];
    const std::uint64_t key = counter_key(seed, param_stream(i));
    const double scale = init_scale(p), offset = init_offset(p);
    out[i].resize(static_cast<std::size_t>(p.numel()));
    for (std::size_t j = 0; j < out[i].size(); ++j) {
      out[i][j] = static_cast<T>(offset + scale * keyed_uniform(key, j));
    }
  }
  return out;
}

template <typename T>
ModelTensors<T> random_grads(const Model& model, std::uint64_t seed, std::int64_t step,
                             double scale) {
  ModelTensors<T> out(model.params.size());
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const std::uint64_t key = counter_key(seed, grad_stream(model.params.size(), i, step));
    out[i].resize(static_cast<std::size_t>(model.params[i].numel()));
    for (std::size_t j = 0; j < out[i].size(); ++j) {
      out[i][j] = static_cast<T>(0.0 + scale * keyed_uniform(key, j));
    }
  }
  return out;
}

template <typename T>
std::vector<T> generate_shard(const ShardIndexSet& set, const std::vector<std::int64_t>& shape,
                              std::uint64_t seed, std::uint64_t stream, double scale,
                              double offset) {
  const std::uint64_t key = counter_key(seed, stream);
  std::vector<T> out(static_cast<std::size_t>(set.numel()));
  for_each_element(set, shape, [&](std::int64_t full, std::int64_t packed) {
    out[static_cast<std::size_t>(packed)] =
        static_cast<T>(offset + scale * keyed_uniform(key, static_cast<std::uint64_t>(full)));
  });
  return out;
}

template ModelTensors<float> random_params<float>(const Model&, std::uint64_t);
template ModelTensors<double> random_params<double>(const Model&, std::uint64_t);
template ModelTensors<float> random_grads<float>(const Model&, std::uint64_t, std::int64_t, double);
template ModelTensors<double> random_grads<double>(const Model&, std::uint64_t, std::int64_t,
                                                   double);
template std::vector<float> generate_shard<float>(const ShardIndexSet&,
                                                  const std::vector<std::int64_t>&, std::uint64_t,
                                                  std::uint64_t, double, double);
template std::vector<double> generate_shard<double>(const ShardIndexSet&,
                                                    const std::vector<std::int64_t>&, std::uint64_t,
                                                    std::uint64_t, double, double);

QkLogits random_max_logits(std::int64_t layers, std::int64_t heads, double tau, std::uint64_t seed,
                           std::int64_t step) {
  // A stream far above any parameter or gradient stream.
  const std::uint64_t key =
      counter_key(seed, 0x51c0000000000000ull + static_cast<std::uint64_t>(step));
  QkLogits out;
  out.per_layer.resize(static_cast<std::size_t>(layers));
  for (std::int64_t l = 0; l < layers; ++l) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const auto index = static_cast<std::uint64_t>(l * heads + h);
      out.per_layer[static_cast<std::size_t>(l)].push_back(tau * (1.0 + keyed_uniform(key, index)));
    }
  }
  return out;
}

}  // namespace muonbed
