// Element maps of rank programs on the device (kernels/gpu.hpp's DeviceRuns): gather a view of a
// rank's pool (fp32 and bf16 tensors) into a contiguous fp32 or bf16 sequence, scatter (or add)
// one back, rounding to each element's dtype; and the
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
    if (runs[kRunFields * mid] <= s)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Sequence element s of a view: its byte offset in the pool and its width (4: fp32, 2: bf16).
struct PoolElement {
  long long offset;
  long long width;
};

__device__ inline PoolElement pool_element(const long long* runs, long long num_runs, long long s) {
  const long long* r = runs + kRunFields * find_run(runs, num_runs, s);
  return {r[1] + (s - r[0]) * r[3], r[3]};
}

__device__ inline float load(const unsigned char* pool, const PoolElement& e) {
  return e.width == 4
             ? *reinterpret_cast<const float*>(pool + e.offset)
             : bf16_bits_to_float(*reinterpret_cast<const unsigned short*>(pool + e.offset));
}

// Rounded to nearest even where the element is bf16, as the CPU store writes it.
__device__ inline void store(unsigned char* pool, const PoolElement& e, float value) {
  if (e.width == 4)
    *reinterpret_cast<float*>(pool + e.offset) = value;
  else
    *reinterpret_cast<unsigned short*>(pool + e.offset) = float_to_bf16_bits(value);
}

__global__ void gather_f32_kernel(const unsigned char* pool, const long long* runs,
                                  long long num_runs, long long n, float* out) {
  for (long long s = blockIdx.x * 256LL + threadIdx.x; s < n; s += 256LL * gridDim.x)
    out[s] = load(pool, pool_element(runs, num_runs, s));
}

__global__ void gather_bf16_kernel(const unsigned char* pool, const long long* runs,
                                   long long num_runs, long long n, unsigned short* out) {
  for (long long s = blockIdx.x * 256LL + threadIdx.x; s < n; s += 256LL * gridDim.x)
    out[s] = float_to_bf16_bits(load(pool, pool_element(runs, num_runs, s)));
}

__global__ void scatter_f32_kernel(unsigned char* pool, const long long* runs, long long num_runs,
                                   long long n, const float* in, bool accumulate) {
  for (long long s = blockIdx.x * 256LL + threadIdx.x; s < n; s += 256LL * gridDim.x) {
    const PoolElement e = pool_element(runs, num_runs, s);
    store(pool, e, accumulate ? __fadd_rn(load(pool, e), in[s]) : in[s]);
  }
}

__global__ void scatter_bf16_kernel(unsigned char* pool, const long long* runs, long long num_runs,
                                    long long n, const unsigned short* in, bool accumulate) {
  for (long long s = blockIdx.x * 256LL + threadIdx.x; s < n; s += 256LL * gridDim.x) {
    const PoolElement e = pool_element(runs, num_runs, s);
    const float value = bf16_bits_to_float(in[s]);
    store(pool, e, accumulate ? __fadd_rn(load(pool, e), value) : value);
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

void gather_runs_cuda(CUstream_st* stream, const void* pool, const DeviceRuns& runs, void* out,
                      int out_element_bytes) {
  check_width(out_element_bytes, "gather_runs_cuda");
  if (runs.elements <= 0) return;
  const auto* table = reinterpret_cast<const long long*>(runs.runs);
  const unsigned grid = cuda_detail::grid_for(runs.elements);
  if (out_element_bytes == 4)
    gather_f32_kernel<<<grid, 256, 0, stream>>>(static_cast<const unsigned char*>(pool), table,
                                                runs.num_runs, runs.elements,
                                                static_cast<float*>(out));
  else
    gather_bf16_kernel<<<grid, 256, 0, stream>>>(static_cast<const unsigned char*>(pool), table,
                                                 runs.num_runs, runs.elements,
                                                 static_cast<unsigned short*>(out));
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

void scatter_runs_cuda(CUstream_st* stream, void* pool, const DeviceRuns& runs, const void* in,
                       int in_element_bytes, bool accumulate) {
  check_width(in_element_bytes, "scatter_runs_cuda");
  if (runs.elements <= 0) return;
  const auto* table = reinterpret_cast<const long long*>(runs.runs);
  const unsigned grid = cuda_detail::grid_for(runs.elements);
  if (in_element_bytes == 4)
    scatter_f32_kernel<<<grid, 256, 0, stream>>>(static_cast<unsigned char*>(pool), table,
                                                 runs.num_runs, runs.elements,
                                                 static_cast<const float*>(in), accumulate);
  else
    scatter_bf16_kernel<<<grid, 256, 0, stream>>>(
        static_cast<unsigned char*>(pool), table, runs.num_runs, runs.elements,
        static_cast<const unsigned short*>(in), accumulate);
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
