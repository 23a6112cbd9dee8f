// Element maps of rank programs on the device (kernels/gpu.hpp's DeviceRuns): gather a view of a
// rank's fp32 pool into a contiguous fp32 or bf16 sequence, scatter (or add) one back; and the
// small step kernels of the GPU executors: rounding to bf16 in place and QK-clip's row scaling.
// Each element is found by a binary search of its run (runs sorted by sequence offset), so one
// launch serves a view of any number of runs; a view of one run costs one comparison.
#include <cuda_bf16.h>

#include "kernels/bf16.hpp"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/gpu.hpp"

namespace muonbed {
namespace {

// The run holding sequence element s: the last run whose sequence offset is <= s.
__device__ inline long long find_run(const long long* runs, long long num_runs, long long s) {
  long long lo = 0, hi = num_runs - 1;
  while (lo < hi) {
    const long long mid = (lo + hi + 1) / 2;
    if (runs[3 * mid] <= s)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__device__ inline long long pool_index(const long long* runs, long long num_runs, long long s) {
  const long long r = find_run(runs, num_runs, s);
  return runs[3 * r + 1] + (s - runs[3 * r]);
}

__global__ void gather_f32_kernel(const float* pool, const long long* runs, long long num_runs,
                                  long long n, float* out) {
  for (long long s = blockIdx.x * 256LL + threadIdx.x; s < n; s += 256LL * gridDim.x)
    out[s] = pool[pool_index(runs, num_runs, s)];
}

__global__ void gather_bf16_kernel(const float* pool, const long long* runs, long long num_runs,
                                   long long n, unsigned short* out) {
  for (long long s = blockIdx.x * 256LL + threadIdx.x; s < n; s += 256LL * gridDim.x)
    out[s] = float_to_bf16_bits(pool[pool_index(runs, num_runs, s)]);
}

__global__ void scatter_f32_kernel(float* pool, const long long* runs, long long num_runs,
                                   long long n, const float* in, bool accumulate) {
  for (long long s = blockIdx.x * 256LL + threadIdx.x; s < n; s += 256LL * gridDim.x) {
    const long long i = pool_index(runs, num_runs, s);
    pool[i] = accumulate ? __fadd_rn(pool[i], in[s]) : in[s];
  }
}

__global__ void scatter_bf16_kernel(float* pool, const long long* runs, long long num_runs,
                                    long long n, const unsigned short* in, bool accumulate) {
  for (long long s = blockIdx.x * 256LL + threadIdx.x; s < n; s += 256LL * gridDim.x) {
    const long long i = pool_index(runs, num_runs, s);
    const float value = bf16_bits_to_float(in[s]);
    pool[i] = accumulate ? __fadd_rn(pool[i], value) : value;
  }
}

__global__ void round_bf16_kernel(float* data, long long n) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    data[i] = round_to_bf16(data[i]);
}

__global__ void scale_rows_kernel(float* data, long long rows, long long cols,
                                  const float* row_scales) {
  const long long n = rows * cols;
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    data[i] = __fmul_rn(data[i], row_scales[i / cols]);
}

void check_width(int bytes, const char* what) {
  if (bytes != 2 && bytes != 4)
    throw Error(std::string(what) + ": elements of " + std::to_string(bytes) +
                " bytes; fp32 (4) and bf16 (2) are supported");
}

}  // namespace

void gather_runs_cuda(CUstream_st* stream, const float* pool, const DeviceRuns& runs, void* out,
                      int out_element_bytes) {
  check_width(out_element_bytes, "gather_runs_cuda");
  if (runs.elements <= 0) return;
  const auto* table = reinterpret_cast<const long long*>(runs.runs);
  const unsigned grid = cuda_detail::grid_for(runs.elements);
  if (out_element_bytes == 4)
    gather_f32_kernel<<<grid, 256, 0, stream>>>(pool, table, runs.num_runs, runs.elements,
                                                static_cast<float*>(out));
  else
    gather_bf16_kernel<<<grid, 256, 0, stream>>>(pool, table, runs.num_runs, runs.elements,
                                                 static_cast<unsigned short*>(out));
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

void scatter_runs_cuda(CUstream_st* stream, float* pool, const DeviceRuns& runs, const void* in,
                       int in_element_bytes, bool accumulate) {
  check_width(in_element_bytes, "scatter_runs_cuda");
  if (runs.elements <= 0) return;
  const auto* table = reinterpret_cast<const long long*>(runs.runs);
  const unsigned grid = cuda_detail::grid_for(runs.elements);
  if (in_element_bytes == 4)
    scatter_f32_kernel<<<grid, 256, 0, stream>>>(pool, table, runs.num_runs, runs.elements,
                                                 static_cast<const float*>(in), accumulate);
  else
    scatter_bf16_kernel<<<grid, 256, 0, stream>>>(pool, table, runs.num_runs, runs.elements,
                                                  static_cast<const unsigned short*>(in),
                                                  accumulate);
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

void round_to_bf16_cuda(CUstream_st* stream, float* data, std::int64_t n) {
  if (n <= 0) return;
  round_bf16_kernel<<<cuda_detail::grid_for(n), 256, 0, stream>>>(data, n);
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

void scale_rows_cuda(CUstream_st* stream, float* data, std::int64_t rows, std::int64_t cols,
                     const float* row_scales) {
  if (rows <= 0 || cols <= 0) return;
  scale_rows_kernel<<<cuda_detail::grid_for(rows * cols), 256, 0, stream>>>(data, rows, cols,
                                                                            row_scales);
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace muonbed
