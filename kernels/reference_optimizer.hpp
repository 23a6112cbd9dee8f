// The single-device reference optimizer step over a whole core::Model: the Muon group (matrices
// route() sends to Muon: momentum, Newton-Schulz, scaled update with decoupled weight decay,
// optional QK-clip) and the AdamW group (everything else). Every distributed execution of the
// same step, whatever its plan, must reproduce what this class computes.
//
// Tensors are plain row-major buffers, one per Model::params entry, in the model's order.
// Deterministic data: random_params / random_grads fill them from the counter-based generator
// of kernels/random.hpp, so a distributed rank can generate exactly its own shard of the same
// values (generate_shard).
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/layout.hpp"
#include "core/model/model.hpp"
#include "core/model/optimizer.hpp"
#include "kernels/newton_schulz.hpp"
#include "kernels/optimizer_math.hpp"

namespace muonbed {

template <typename T>
using ModelTensors = std::vector<std::vector<T>>;

// How the reference computes, beyond the optimizer configuration itself.
struct ReferenceOptions {
  NsPrecision ns_precision = NsPrecision::fp64;  // precision of the Newton-Schulz iteration
  // Round the Muon update to the config's comm_dtype before Newton-Schulz and its result after,
  // as a distributed step does when it moves updates in that dtype: then a distributed step that
  // only moves data agrees with the reference bit for bit.
  bool round_to_comm_dtype = false;
  // Store parameters in their dtype (Parameter::dtype) and the optimizer state (momentum, AdamW's
  // moments) in `state_dtype`, as a plan's executors store them (the plan's rank_memory counts
  // them so; there are no fp32 master copies): each value is computed in T from the stored values
  // and rounded to nearest even to its storage dtype when stored: a parameter at the end of its
  // step (after its update and QK-clip), the state after its update. A parameter's initial values
  // are rounded by round_to_storage. Off: everything stays in T. fp32 and bf16 are emulated.
  bool round_to_storage_dtypes = false;
  DType state_dtype = DType::fp32;
};

// The largest attention logit each query head produced in the step's forward pass:
// per_layer[layer][q_head]. QK-clip needs it; the testbed makes it up (random_max_logits).
struct QkLogits {
  std::vector<std::vector<double>> per_layer;
};

template <typename T>
class ReferenceOptimizer {
 public:
  // Throws Error for an invalid config (bad NS config, QK-clip without head_dim, ...).
  ReferenceOptimizer(Model model, OptimizerConfig config, RoutingRules routing = {},
                     ReferenceOptions options = {});

  // One step: params[i] -= update(grads[i]) for every parameter, state advanced. Sizes must
  // match the model (throws Error). `logits` is required when QK-clip is enabled.
  void step(ModelTensors<T>& params, const ModelTensors<T>& grads,
            const QkLogits* logits = nullptr);

  const Model& model() const { return model_; }
  // Rounds parameters to their storage dtypes (round_to_storage_dtypes; nothing otherwise): what
  // initial values become when stored, before the first step.
  void round_to_storage(ModelTensors<T>& params) const;

  const OptimizerConfig& config() const { return config_; }
  const ReferenceOptions& options() const { return options_; }
  std::int64_t steps_taken() const { return steps_; }
  OptimizerKind kind(std::size_t param) const { return kinds_.at(param); }
  // State; empty vectors for parameters of the other group.
  const std::vector<T>& momentum_buffer(std::size_t param) const { return momentum_.at(param); }
  const std::vector<T>& adam_m(std::size_t param) const { return adam_m_.at(param); }
  const std::vector<T>& adam_v(std::size_t param) const { return adam_v_.at(param); }

 private:
  Model model_;
  OptimizerConfig config_;
  RoutingRules routing_;
  ReferenceOptions options_;
  NsConfig ns_;
  std::vector<OptimizerKind> kinds_;
  ModelTensors<T> momentum_, adam_m_, adam_v_;
  std::int64_t steps_ = 0;
};

extern template class ReferenceOptimizer<float>;
extern template class ReferenceOptimizer<double>;

// Orthogonalizes `n = shape.numel()` values of type T with the given NS precision (converting
// to fp64 or fp32 as needed). `out` may equal `in`.
template <typename T>
void orthogonalize(const T* in, T* out, const MatrixShape& shape, const NsConfig& config,
                   NsPrecision precision);

// The matrix shape NS sees for a parameter: [batch, rows, cols] (batch 1 for 2-D).
MatrixShape ns_shape(const Parameter& param);

// Random streams: parameter i's initial values use stream 2i, its gradient at step t (from 1)
// uses stream 2 * num_params * t + 2i + 1; distinct for every (tensor, step).
std::uint64_t param_stream(std::size_t param_index);
std::uint64_t grad_stream(std::size_t num_params, std::size_t param_index, std::int64_t step);

// Initial values: matrices uniform on [-1, 1) / sqrt(cols); norm weights 1 + 0.1 u; biases 0.1 u.
double init_scale(const Parameter& param);
double init_offset(const Parameter& param);
template <typename T>
ModelTensors<T> random_params(const Model& model, std::uint64_t seed);
// Gradients: uniform on [-scale, scale), never all zero.
template <typename T>
ModelTensors<T> random_grads(const Model& model, std::uint64_t seed, std::int64_t step,
                             double scale = 1e-2);
// The elements of `set` (row-major order of the full tensor, as pack_shard) of the tensor
// offset + scale * counter_uniform(seed, stream, full_index): a rank's shard of random_params /
// random_grads without generating the rest.
template <typename T>
std::vector<T> generate_shard(const ShardIndexSet& set, const std::vector<std::int64_t>& shape,
                              std::uint64_t seed, std::uint64_t stream, double scale,
                              double offset = 0.0);

// Made-up max logits for QK-clip tests: per layer, `heads` values uniform on [0, 2 * tau).
QkLogits random_max_logits(std::int64_t layers, std::int64_t heads, double tau, std::uint64_t seed,
                           std::int64_t step);

}  // namespace muonbed
