// Fused elementwise optimizer kernels: momentum + Nesterov, weight decay + scaled update, AdamW.
// Each element goes through the same operations in the same order as optimizer_math.cpp, with
// explicit round-to-nearest intrinsics so nvcc cannot contract a multiply-add into an FMA: the
// GPU then matches the CPU reference bit for bit (the host build does not contract either).
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/gpu.hpp"

namespace muonbed {
namespace {

// torch.lerp as in optimizer_math.hpp's torch_lerp, without contraction.
__device__ inline float lerp_rn(float start, float end, float weight) {
  const float diff = __fsub_rn(end, start);
  return (weight < 0.5f && weight > -0.5f)
             ? __fadd_rn(start, __fmul_rn(weight, diff))
             : __fsub_rn(end, __fmul_rn(diff, __fsub_rn(1.0f, weight)));
}

__global__ void momentum_kernel(const float* grad, float* buf, float* update, long long n,
                                float beta, float one_minus_beta, bool nesterov, bool lerp_form) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    const float g = grad[i];
    float b = buf[i];
    float u;
    if (lerp_form) {
      b = lerp_rn(b, g, one_minus_beta);
      u = nesterov ? lerp_rn(g, b, beta) : b;
    } else {
      b = __fadd_rn(__fmul_rn(beta, b), g);
      u = nesterov ? __fadd_rn(g, __fmul_rn(beta, b)) : b;
    }
    buf[i] = b;
    update[i] = u;
  }
}

__global__ void apply_kernel(float* param, const float* update, long long n, float decay,
                             float step) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    param[i] = __fsub_rn(__fmul_rn(param[i], decay), __fmul_rn(step, update[i]));
  }
}

__device__ inline void adamw_element(float* param, const float* grad, float* m, float* v,
                                     long long i, float decay, float one_minus_beta1, float beta2,
                                     float one_minus_beta2, float step_size, float bias2_sqrt,
                                     float eps) {
  const float g = grad[i];
  const float p = __fmul_rn(param[i], decay);
  const float mi = lerp_rn(m[i], g, one_minus_beta1);
  const float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bias2_sqrt), eps);
  param[i] = __fsub_rn(p, __fdiv_rn(__fmul_rn(step_size, mi), denom));
  m[i] = mi;
  v[i] = vi;
}

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, long long n,
                             float decay, float one_minus_beta1, float beta2, float one_minus_beta2,
                             float step_size, float bias2_sqrt, float eps) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    adamw_element(param, grad, m, v, i, decay, one_minus_beta1, beta2, one_minus_beta2, step_size,
                  bias2_sqrt, eps);
}

// The per-step scalars from device memory (decay, step_size, bias2_sqrt): graph replay.
__global__ void adamw_scalars_kernel(float* param, const float* grad, float* m, float* v,
                                     long long n, const float* scalars, float one_minus_beta1,
                                     float beta2, float one_minus_beta2, float eps) {
  const float decay = scalars[0], step_size = scalars[1], bias2_sqrt = scalars[2];
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    adamw_element(param, grad, m, v, i, decay, one_minus_beta1, beta2, one_minus_beta2, step_size,
                  bias2_sqrt, eps);
}

}  // namespace

void momentum_update_cuda(CudaContext& ctx, const MomentumParams& params, const float* grad,
                          float* buf, float* update, std::int64_t n) {
  if (n <= 0) return;
  momentum_kernel<<<cuda_detail::grid_for(n), 256, 0, ctx.stream()>>>(
      grad, buf, update, n, static_cast<float>(params.beta), static_cast<float>(1.0 - params.beta),
      params.nesterov, params.form == MomentumForm::lerp);
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

void apply_update_cuda(CudaContext& ctx, const ApplyParams& params, float* param,
                       const float* update, std::int64_t n) {
  if (n <= 0) return;
  apply_kernel<<<cuda_detail::grid_for(n), 256, 0, ctx.stream()>>>(
      param, update, n, static_cast<float>(1.0 - params.lr * params.weight_decay),
      static_cast<float>(params.adjusted_lr));
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

void adamw_update_cuda(CudaContext& ctx, const AdamWConfig& params, std::int64_t step, float* param,
                       const float* grad, float* m, float* v, std::int64_t n) {
  const AdamWStepScalars s = adamw_step_scalars(params, step);
  if (n <= 0) return;
  adamw_kernel<<<cuda_detail::grid_for(n), 256, 0, ctx.stream()>>>(
      param, grad, m, v, n, static_cast<float>(s.decay), static_cast<float>(1.0 - params.beta1),
      static_cast<float>(params.beta2), static_cast<float>(1.0 - params.beta2),
      static_cast<float>(s.step_size), static_cast<float>(s.bias2_sqrt),
      static_cast<float>(params.eps));
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

void adamw_update_scalars_cuda(CudaContext& ctx, const AdamWConfig& params, const float* scalars,
                               float* param, const float* grad, float* m, float* v,
                               std::int64_t n) {
  if (n <= 0) return;
  adamw_scalars_kernel<<<cuda_detail::grid_for(n), 256, 0, ctx.stream()>>>(
      param, grad, m, v, n, scalars, static_cast<float>(1.0 - params.beta1),
      static_cast<float>(params.beta2), static_cast<float>(1.0 - params.beta2),
      static_cast<float>(params.eps));
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace muonbed
