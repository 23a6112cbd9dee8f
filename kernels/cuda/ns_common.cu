// The normalization and widening kernels every Newton-Schulz version uses (ns_common.cuh).
#include <algorithm>
#include <climits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/ns_common.cuh"

namespace muonbed::cuda_detail {
namespace {

constexpr int kThreads = 256;
constexpr long long kMaxNormBlocks = 1024;  // per matrix

// partial[b * gridDim.x + blockIdx.x] = sum of squares of this block's share of matrix b.
__global__ void sum_squares_kernel(const float* in, long long per, float* partial) {
  const float* x = in + blockIdx.y * per;
  float acc = 0.0f;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < per;
       i += static_cast<long long>(blockDim.x) * gridDim.x) {
    const float v = x[i];
    acc += v * v;
  }
  __shared__ float warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) sum += warp_sums[w];
    partial[blockIdx.y * gridDim.x + blockIdx.x] = sum;
  }
}

// scale[b] = 1 / (sqrt(sum of partials of b) * norm_scale + eps); one block per matrix.
__global__ void norm_scale_kernel(const float* partial, long long blocks, double norm_scale,
                                  double eps, float* scale) {
  __shared__ double sums[kThreads];
  double acc = 0.0;
  for (long long i = threadIdx.x; i < blocks; i += blockDim.x)
    acc += partial[blockIdx.x * blocks + i];
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    scale[blockIdx.x] = static_cast<float>(1.0 / (sqrt(sums[0]) * norm_scale + eps));
  }
}

// x[i] = bf16(in[i] * scale[matrix of i]).
__global__ void scale_to_bf16_kernel(const float* in, __nv_bfloat16* x, long long per,
                                     long long total, const float* scale) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(blockDim.x) * gridDim.x) {
    x[i] = __float2bfloat16_rn(__fmul_rn(in[i], scale[i / per]));
  }
}

__global__ void bf16_to_float_kernel(const __nv_bfloat16* x, float* out, long long total) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(blockDim.x) * gridDim.x) {
    out[i] = __bfloat162float(x[i]);
  }
}

}  // namespace

NsBuffers NsBuffers::of(const MatrixShape& s) {
  NsBuffers b;
  b.m = s.small_dim();
  b.n = s.large_dim();
  b.batch = s.batch;
  const long long per = b.m * b.n;
  b.norm_blocks = norm_block_count(per);
  b.x_bytes = align256(static_cast<std::size_t>(b.batch * per) * sizeof(__nv_bfloat16));
  b.a_bytes = align256(static_cast<std::size_t>(b.batch * b.m * b.m) * sizeof(__nv_bfloat16));
  b.partial_bytes = align256(static_cast<std::size_t>(b.batch * b.norm_blocks) * sizeof(float));
  b.scale_bytes = align256(static_cast<std::size_t>(b.batch) * sizeof(float));
  return b;
}

bool fits_batched_cublas(const MatrixShape& s, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (s.batch < 1 || s.rows < 1 || s.cols < 1) return no("empty shape " + s.to_string());
  if (s.large_dim() > INT_MAX) return no("a dimension exceeds cuBLAS's int");
  if (s.batch > 65535) return no("more than 65535 matrices in one batch");
  return true;
}

long long norm_block_count(long long per) {
  return std::min(kMaxNormBlocks, std::max(1LL, (per + kThreads * 16 - 1) / (kThreads * 16)));
}

void normalize_to_bf16(cudaStream_t stream, const float* in, __nv_bfloat16* x, long long per,
                       long long batch, long long norm_blocks, const NsConfig& config,
                       float* partial, float* scale) {
  sum_squares_kernel<<<dim3(static_cast<unsigned>(norm_blocks), static_cast<unsigned>(batch)),
                       kThreads, 0, stream>>>(in, per, partial);
  MUONBED_CUDA_CHECK(cudaGetLastError());
  norm_scale_kernel<<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(
      partial, norm_blocks, config.norm_scale, config.eps, scale);
  MUONBED_CUDA_CHECK(cudaGetLastError());
  const long long total = per * batch;
  scale_to_bf16_kernel<<<grid_for(total), kThreads, 0, stream>>>(in, x, per, total, scale);
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

void bf16_to_float(cudaStream_t stream, const __nv_bfloat16* x, float* out, long long total) {
  bf16_to_float_kernel<<<grid_for(total), kThreads, 0, stream>>>(x, out, total);
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace muonbed::cuda_detail
