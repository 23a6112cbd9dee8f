// Row-major CPU GEMMs for the Newton-Schulz reference: portable loops (the fp64 reference) and
// cblas_sgemm when the build found BLAS (the fp32 path's speed).
#include "kernels/src/cpu_gemm.hpp"

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "core/base/errors.hpp"

#if MUONBED_KERNELS_HAVE_CBLAS
#include <cblas.h>
#endif

namespace muonbed::detail {

template <typename T>
void gemm_loops(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  std::vector<T> acc(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < m; ++i) {
    const T* a_row = a + i * lda;
    T* c_row = c + i * ldc;
    if (trans_b) {
      // C[i][j] = sum_p A[i][p] * B[j][p]: dot products of contiguous rows.
      for (std::int64_t j = 0; j < n; ++j) {
        const T* b_row = b + j * ldb;
        T sum = 0;
        for (std::int64_t p = 0; p < k; ++p) sum += a_row[p] * b_row[p];
        acc[j] = sum;
      }
    } else {
      // Row i of A times B, streaming B's rows (i-k-j order keeps every access contiguous).
      std::fill(acc.begin(), acc.end(), T(0));
      for (std::int64_t p = 0; p < k; ++p) {
        const T aip = a_row[p];
        const T* b_row = b + p * ldb;
        for (std::int64_t j = 0; j < n; ++j) acc[j] += aip * b_row[j];
      }
    }
    // beta == 0 must not read C (it may hold NaN poison), as in BLAS.
    for (std::int64_t j = 0; j < n; ++j) {
      c_row[j] = beta == T(0) ? alpha * acc[j] : alpha * acc[j] + beta * c_row[j];
    }
  }
}

template void gemm_loops<float>(bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                                std::int64_t, const float*, std::int64_t, float, float*,
                                std::int64_t);
template void gemm_loops<double>(bool, std::int64_t, std::int64_t, std::int64_t, double,
                                 const double*, std::int64_t, const double*, std::int64_t, double,
                                 double*, std::int64_t);

bool have_cblas() {
  return MUONBED_KERNELS_HAVE_CBLAS != 0;
}

void sgemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc) {
#if MUONBED_KERNELS_HAVE_CBLAS
  for (std::int64_t v : {m, n, k, lda, ldb, ldc}) {
    if (v > INT_MAX) throw Error("sgemm: dimension " + std::to_string(v) + " exceeds BLAS's int");
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
#else
  gemm_loops<float>(trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

void sgemm_ab(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
              const float* a, const float* b, float* c) {
  sgemm_ab_block(trans_a, trans_b, m, n, k, a, b, c, 0, m, 0, n);
}

void sgemm_ab_block(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                    const float* a, const float* b, float* c, std::int64_t row0, std::int64_t rows,
                    std::int64_t col0, std::int64_t cols) {
  if (row0 < 0 || rows < 0 || col0 < 0 || cols < 0 || row0 + rows > m || col0 + cols > n)
    throw Error("sgemm: block [" + std::to_string(row0) + ", +" + std::to_string(rows) + ") x [" +
                std::to_string(col0) + ", +" + std::to_string(cols) + ") is outside C [" +
                std::to_string(m) + ", " + std::to_string(n) + "]");
  if (rows == 0 || cols == 0) return;
  // The block's rows of op(A) and columns of op(B), addressed in the full operands.
  const std::int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  const float* a_block = trans_a ? a + row0 : a + row0 * lda;
  const float* b_block = trans_b ? b + col0 * ldb : b + col0;
  float* c_block = c + row0 * n + col0;
#if MUONBED_KERNELS_HAVE_CBLAS
  for (std::int64_t v : {m, n, k}) {
    if (v > INT_MAX) throw Error("sgemm: dimension " + std::to_string(v) + " exceeds BLAS's int");
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(rows), static_cast<int>(cols),
              static_cast<int>(k), 1.0f, a_block, static_cast<int>(lda), b_block,
              static_cast<int>(ldb), 0.0f, c_block, static_cast<int>(n));
#else
  if (!trans_a)
    return gemm_loops<float>(trans_b, rows, cols, k, 1.0f, a_block, lda, b_block, ldb, 0.0f,
                             c_block, n);
  std::vector<float> at(static_cast<std::size_t>(rows * k));
  for (std::int64_t p = 0; p < k; ++p)
    for (std::int64_t i = 0; i < rows; ++i)
      at[static_cast<std::size_t>(i * k + p)] = a_block[p * lda + i];
  gemm_loops<float>(trans_b, rows, cols, k, 1.0f, at.data(), k, b_block, ldb, 0.0f, c_block, n);
#endif
}

}  // namespace muonbed::detail
