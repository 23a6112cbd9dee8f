// What every Newton-Schulz kernel version shares: the normalization X0 = bf16(G / (||G||_F *
// norm_scale + eps)) per matrix of a batch, the final widening to fp32, and workspace alignment.
// One implementation, so that all versions start from the same X0 (same reduction order).
// Internal to kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "kernels/newton_schulz.hpp"

namespace muonbed::cuda_detail {

inline std::size_t align256(std::size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// The buffers every version's workspace starts with, in this order, each 256-byte aligned: two
// bf16 X buffers (batch * m * n, m the small dimension), bf16 A and B (batch * m * m), and the
// normalization scratch (partial sums, per-matrix scales).
struct NsBuffers {
  long long m = 0, n = 0, batch = 0, norm_blocks = 0;
  std::size_t x_bytes = 0, a_bytes = 0, partial_bytes = 0, scale_bytes = 0;

  static NsBuffers of(const MatrixShape& shape);
  std::size_t total() const { return 2 * x_bytes + 2 * a_bytes + partial_bytes + scale_bytes; }
};

// Whether a batch of this shape fits the int sizes of cuBLAS's batched GEMMs and the kernels'
// grids; if not, *why (if given) says why.
bool fits_batched_cublas(const MatrixShape& shape, std::string* why);

// Blocks of the sum-of-squares pass per matrix of `per` elements (at most 1024).
long long norm_block_count(long long per);

// x[b] = bf16(in[b] / (||in[b]||_F * norm_scale + eps)) for each of `batch` matrices of `per`
// elements. `partial` holds batch * norm_blocks floats (norm_blocks from norm_block_count),
// `scale` batch floats: device scratch. Asynchronous on `stream`.
void normalize_to_bf16(cudaStream_t stream, const float* in, __nv_bfloat16* x, long long per,
                       long long batch, long long norm_blocks, const NsConfig& config,
                       float* partial, float* scale);

// out[i] = float(x[i]) for i < total. Asynchronous on `stream`.
void bf16_to_float(cudaStream_t stream, const __nv_bfloat16* x, float* out, long long total);

}  // namespace muonbed::cuda_detail
