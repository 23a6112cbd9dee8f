// Row-major GEMM for the CPU reference: C = alpha * A * op(B) + beta * C, with A [M, K] and
// op(B) [K, N] (B^T when trans_b). Accumulates in T and applies alpha and beta once to the
// finished sum, as cuBLAS does, so the bf16 emulation rounds where the GPU rounds. The fp64
// reference always uses the loops; fp32 uses cblas_sgemm when the build found BLAS.
// Internal to muonbed_kernels.
#pragma once

#include <cstdint>

namespace muonbed::detail {

template <typename T>
void gemm_loops(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc);

// cblas_sgemm when available, else gemm_loops<float>.
void sgemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc);

// C = op(A) op(B), op(A) [M, K] (A^T when trans_a), dense row-major operands: cblas_sgemm when
// available, else A^T copied out and gemm_loops<float>.
void sgemm_ab(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
              const float* a, const float* b, float* c);
// The block C[row0, row0 + rows) x [col0, col0 + cols) of that product, the operands and C
// addressed as the whole product's (a long GEMM run as blocks with work between them).
void sgemm_ab_block(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                    const float* a, const float* b, float* c, std::int64_t row0, std::int64_t rows,
                    std::int64_t col0, std::int64_t cols);

bool have_cblas();

}  // namespace muonbed::detail
