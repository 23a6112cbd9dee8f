// Factories of the Newton-Schulz kernel versions, for the registry in ns_registry.cu. A new
// version adds its factory here and one line to the registry. Internal to kernels/cuda.
#pragma once

#include <memory>

#include "kernels/gpu.hpp"

namespace muonbed::cuda_detail {

// v1: cuBLAS strided-batched bf16 GEMMs with fp32 accumulation (ns_v1_cublas.cu).
std::unique_ptr<NsKernel> make_ns_v1_cublas();

}  // namespace muonbed::cuda_detail
