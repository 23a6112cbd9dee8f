// CPU implementations of the elementwise optimizer formulas (see kernels/optimizer_math.hpp).
// Scalars are formed in fp64 and cast once to T, then every operation is done in T in the
// order PyTorch does it; the CUDA kernels cast and order identically.
#include "kernels/optimizer_math.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/base/errors.hpp"

namespace muonbed {

MomentumParams momentum_params(const MuonConfig& muon) {
  return MomentumParams{muon.momentum, muon.nesterov, muon.momentum_form};
}

ApplyParams apply_params(const MuonConfig& muon, std::int64_t rows, std::int64_t cols) {
  return ApplyParams{muon.lr, muon.lr * lr_scale(muon.adjust_lr_fn, rows, cols), muon.weight_decay};
}

template <typename T>
void momentum_update(const MomentumParams& params, const T* grad, T* buf, T* update,
                     std::int64_t n) {
  const T beta = static_cast<T>(params.beta);
  const T one_minus_beta = static_cast<T>(1.0 - params.beta);
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    T b = buf[i];
    T u;
    if (params.form == MomentumForm::classic) {
      b = beta * b + g;                        // buf.mul_(beta).add_(g)
      u = params.nesterov ? g + beta * b : b;  // g.add(buf, alpha=beta)
    } else {
      b = torch_lerp(b, g, one_minus_beta);              // buf.lerp_(g, 1 - beta)
      u = params.nesterov ? torch_lerp(g, b, beta) : b;  // g.lerp(buf, beta)
    }
    buf[i] = b;
    update[i] = u;
  }
}

double lr_scale(LrScaleRule rule, std::int64_t rows, std::int64_t cols) {
  const double r = static_cast<double>(rows);
  const double c = static_cast<double>(cols);
  switch (rule) {
    case LrScaleRule::none:
      return 1.0;
    case LrScaleRule::original:
      return std::sqrt(std::max(1.0, r / c));
    case LrScaleRule::match_rms_adamw:
      return 0.2 * std::sqrt(std::max(r, c));
  }
  return 1.0;
}

template <typename T>
void apply_update(const ApplyParams& params, T* param, const T* update, std::int64_t n) {
  const T decay = static_cast<T>(1.0 - params.lr * params.weight_decay);
  const T step = static_cast<T>(params.adjusted_lr);
  for (std::int64_t i = 0; i < n; ++i) {
    const T decayed = param[i] * decay;     // param.mul_(1 - lr * wd)
    param[i] = decayed - step * update[i];  // param.add_(update, alpha=-adjusted_lr)
  }
}

AdamWStepScalars adamw_step_scalars(const AdamWConfig& params, std::int64_t step) {
  if (step < 1) throw Error("adamw: steps count from 1, got " + std::to_string(step));
  const double t = static_cast<double>(step);
  AdamWStepScalars s;
  s.decay = 1.0 - params.lr * params.weight_decay;
  s.step_size = params.lr / (1.0 - std::pow(params.beta1, t));
  s.bias2_sqrt = std::sqrt(1.0 - std::pow(params.beta2, t));
  return s;
}

template <typename T>
void adamw_update(const AdamWConfig& params, std::int64_t step, T* param, const T* grad, T* m, T* v,
                  std::int64_t n) {
  const AdamWStepScalars s = adamw_step_scalars(params, step);
  const T decay = static_cast<T>(s.decay);
  const T one_minus_beta1 = static_cast<T>(1.0 - params.beta1);
  const T beta2 = static_cast<T>(params.beta2);
  const T one_minus_beta2 = static_cast<T>(1.0 - params.beta2);
  const T step_size = static_cast<T>(s.step_size);
  const T bias2_sqrt = static_cast<T>(s.bias2_sqrt);
  const T eps = static_cast<T>(params.eps);
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    const T p = param[i] * decay;
    const T mi = torch_lerp(m[i], g, one_minus_beta1);
    // mul_(beta2).addcmul_(g, g, value=1-beta2); ATen's addcmul is self + (value * t1) * t2.
    const T vi = v[i] * beta2 + (one_minus_beta2 * g) * g;
    const T denom = std::sqrt(vi) / bias2_sqrt + eps;
    // addcdiv_(m, denom, value=-step_size); ATen's addcdiv is self + (value * t1) / t2.
    param[i] = p - (step_size * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

std::vector<double> qk_clip_head_scales(const std::vector<double>& max_logits, double tau) {
  if (!(tau > 0.0)) throw Error("qk_clip: tau must be > 0");
  std::vector<double> scales(max_logits.size(), 1.0);
  for (std::size_t h = 0; h < max_logits.size(); ++h) {
    if (max_logits[h] > tau) scales[h] = std::sqrt(tau / max_logits[h]);
  }
  return scales;
}

std::vector<double> kv_group_max_logits(const std::vector<double>& q_head_max_logits,
                                        std::int64_t kv_heads) {
  const auto q_heads = static_cast<std::int64_t>(q_head_max_logits.size());
  if (kv_heads <= 0 || q_heads % kv_heads != 0) {
    throw Error("qk_clip: " + std::to_string(q_heads) + " query heads cannot be grouped into " +
                std::to_string(kv_heads) + " key heads");
  }
  const std::int64_t group = q_heads / kv_heads;
  std::vector<double> out(static_cast<std::size_t>(kv_heads));
  for (std::int64_t k = 0; k < kv_heads; ++k) {
    const auto first = q_head_max_logits.begin() + k * group;
    out[static_cast<std::size_t>(k)] = *std::max_element(first, first + group);
  }
  return out;
}

template <typename T>
void qk_clip_rows(T* weight, std::int64_t rows, std::int64_t cols, std::int64_t head_dim,
                  const std::vector<double>& head_scales, const std::int64_t* global_rows) {
  if (head_dim <= 0) throw Error("qk_clip: head_dim must be > 0");
  const auto heads = static_cast<std::int64_t>(head_scales.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t global = global_rows ? global_rows[r] : r;
    const std::int64_t head = global / head_dim;
    if (head < 0 || head >= heads) {
      throw Error("qk_clip: row " + std::to_string(global) + " is in head " + std::to_string(head) +
                  " but only " + std::to_string(heads) + " head scales were given");
    }
    const double scale = head_scales[static_cast<std::size_t>(head)];
    if (scale == 1.0) continue;
    const T s = static_cast<T>(scale);
    T* row = weight + r * cols;
    for (std::int64_t j = 0; j < cols; ++j) row[j] *= s;
  }
}

#define MUONBED_INSTANTIATE(T)                                                             \
  template void momentum_update<T>(const MomentumParams&, const T*, T*, T*, std::int64_t); \
  template void apply_update<T>(const ApplyParams&, T*, const T*, std::int64_t);           \
  template void adamw_update<T>(const AdamWConfig&, std::int64_t, T*, const T*, T*, T*,    \
                                std::int64_t);                                             \
  template void qk_clip_rows<T>(T*, std::int64_t, std::int64_t, std::int64_t,              \
                                const std::vector<double>&, const std::int64_t*);
MUONBED_INSTANTIATE(float)
MUONBED_INSTANTIATE(double)
#undef MUONBED_INSTANTIATE

}  // namespace muonbed
