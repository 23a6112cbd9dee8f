// Factories of the Newton-Schulz kernel versions, for the registry in ns_registry.cu. A new
// version adds its factory here and one line to the registry. Internal to kernels/cuda.
#pragma once

#include <memory>

#include "kernels/gpu.hpp"

namespace muonbed::cuda_detail {

// v1: cuBLAS strided-batched bf16 GEMMs with fp32 accumulation (ns_v1_cublas.cu).
std::unique_ptr<NsKernel> make_ns_v1_cublas();
// v2: v1 with A = X X^T and A A computed on their lower block triangle only, then mirrored
// (ns_v2_symmetric.cu). Blocks have at least min_block rows; matrices whose small dimension is
// under min_dim run unblocked (v1's products). Tests pass small values to reach the blocked path
// on small shapes. The lower block triangle runs as one pointer-array GEMM over all blocks of
// the batch (block_pointers: one launch, the faster on an H100) or as one strided-batched GEMM
// per block row (row_panels: k launches, each over the whole batch).
enum class TriangleMethod { row_panels, block_pointers };
std::unique_ptr<NsKernel> make_ns_v2_symmetric(
    int min_block = 512, int min_dim = 4096,
    TriangleMethod method = TriangleMethod::block_pointers);

}  // namespace muonbed::cuda_detail
