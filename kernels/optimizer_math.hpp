// The elementwise parts of a Muon/AdamW step on the CPU: momentum (classic and lerp forms, with
// Nesterov), Muon's learning-rate scale rules, decoupled weight decay with the update applied,
// AdamW, and QK-clip. Each formula follows the PyTorch code it names, operation by operation, so
// results can match a PyTorch run and the CUDA kernels (kernels/gpu.hpp) bit for bit when the
// same order is used. Instantiated for float and double.
//
// Plain C++17: the CUDA sources include it.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/model/optimizer.hpp"
#include "kernels/host_device.hpp"

namespace muonbed {

// torch.lerp: start + weight * (end - start), computed as ATen does (aten/src/ATen/native/Lerp.h)
// so that it is exact at weight 0 and 1: for |weight| >= 0.5 it is end - (end - start) * (1 - w).
template <typename T>
MUONBED_HD inline T torch_lerp(T start, T end, T weight) {
  const T diff = end - start;
  return (weight < T(0.5) && weight > T(-0.5)) ? start + weight * diff
                                               : end - diff * (T(1) - weight);
}

// The momentum part of MuonConfig, as the kernels take it (momentum_params builds it).
struct MomentumParams {
  double beta = 0.95;
  bool nesterov = true;
  MomentumForm form = MomentumForm::lerp;
};

// Updates `buf` in place from `grad` and writes the direction to orthogonalize to `update`
// (buf itself without Nesterov). `update` may alias `grad`; it must not alias `buf`.
template <typename T>
void momentum_update(const MomentumParams& params, const T* grad, T* buf, T* update,
                     std::int64_t n);

MomentumParams momentum_params(const MuonConfig& muon);

double lr_scale(LrScaleRule rule, std::int64_t rows, std::int64_t cols);

// param = param * (1 - lr * weight_decay) - adjusted_lr * update   (decoupled weight decay, as
// torch.optim.Muon: param.mul_(1 - lr * wd); param.add_(update, alpha=-adjusted_lr)).
struct ApplyParams {
  double lr = 0.0;
  double adjusted_lr = 0.0;  // lr * lr_scale(...)
  double weight_decay = 0.0;
};
// The scalars of one [rows, cols] matrix (rows and cols of each matrix of a stack).
ApplyParams apply_params(const MuonConfig& muon, std::int64_t rows, std::int64_t cols);
template <typename T>
void apply_update(const ApplyParams& params, T* param, const T* update, std::int64_t n);

// torch.optim.AdamW (single-tensor, non-amsgrad), step counted from 1, with
// core/model/optimizer.hpp's AdamWConfig:
//   p *= 1 - lr * wd;  m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// The scalars of step t, computed once in fp64 so CPU and GPU use identical values.
struct AdamWStepScalars {
  double decay = 1.0;       // 1 - lr * wd
  double step_size = 0.0;   // lr / (1 - beta1^t)
  double bias2_sqrt = 1.0;  // sqrt(1 - beta2^t)
};
AdamWStepScalars adamw_step_scalars(const AdamWConfig& params, std::int64_t step);
template <typename T>
void adamw_update(const AdamWConfig& params, std::int64_t step, T* param, const T* grad, T* m, T* v,
                  std::int64_t n);

// QK-clip (MuonClip, Kimi K2): when head h's largest attention logit S_h exceeds tau, its query
// and key rows are scaled by sqrt(tau / S_h), so the logit q.k shrinks by tau / S_h.
// Returns one scale per head: sqrt(tau / S_h) if S_h > tau, else 1.
std::vector<double> qk_clip_head_scales(const std::vector<double>& max_logits, double tau);
// With grouped-query attention a key head serves q_heads / kv_heads query heads; its logit bound
// is the largest of its group's (so its scale is the smallest of theirs).
std::vector<double> kv_group_max_logits(const std::vector<double>& q_head_max_logits,
                                        std::int64_t kv_heads);
// Scales the rows of a [rows, cols] weight (or a shard of it) by their head's scale. Row r is
// global row global_rows[r] (or r when global_rows is null) and belongs to head
// global_row / head_dim. Works for strided shards whose rows interleave heads.
template <typename T>
void qk_clip_rows(T* weight, std::int64_t rows, std::int64_t cols, std::int64_t head_dim,
                  const std::vector<double>& head_scales,
                  const std::int64_t* global_rows = nullptr);

}  // namespace muonbed
