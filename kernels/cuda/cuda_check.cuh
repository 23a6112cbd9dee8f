// The one checking macro for CUDA runtime and cuBLAS calls: MUONBED_CUDA_CHECK(call) throws
// muonbed::Error("FILE:LINE: CUDA error: CALL failed: NAME (description)") when the call does
// not succeed. Kernel launches are followed by MUONBED_CUDA_CHECK(cudaGetLastError()).
// Internal to the .cu files of kernels/cuda.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/base/errors.hpp"

namespace muonbed::cuda_detail {

[[noreturn]] inline void fail(const char* call, const char* file, int line,
                              const std::string& status) {
  throw Error(std::string(file) + ":" + std::to_string(line) + ": CUDA error: " + call +
              " failed: " + status);
}

inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a sticky launch error so the next call is judged alone
  fail(call, file, line,
       std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")");
}

inline void check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail(call, file, line,
       std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) + ")");
}

// Grid size for a grid-stride loop over n elements with 256 threads per block.
inline unsigned int grid_for(long long n) {
  const long long blocks = (n + 255) / 256;
  return static_cast<unsigned int>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace muonbed::cuda_detail

#define MUONBED_CUDA_CHECK(call) ::muonbed::cuda_detail::check((call), #call, __FILE__, __LINE__)
