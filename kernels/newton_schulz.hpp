// Newton-Schulz orthogonalization, the heart of Muon: maps a matrix G = U S V^T to roughly
// U S' V^T with S' near 1, using only matrix products. This header holds the coefficient sets
// (Keller Jordan's quintic, Polar Express, custom per-step lists) and the CPU reference in three
// precisions: fp64 (the reference every other path is judged against), fp32, and bf16 emulation
// (bf16 storage, fp32 accumulation: what the GPU kernels compute).
//
// One iteration with coefficients (a, b, c), on the wide orientation X (rows <= cols):
//   A = X X^T;  B = b A + c A A;  X = a X + B X         i.e. X <- a X + b (XX^T)X + c (XX^T)^2 X
// which applies the odd polynomial p(s) = a s + b s^3 + c s^5 to every singular value. The input
// is first scaled to X0 = G / (||G||_F * norm_scale + eps) so that every singular value is <= 1.
// Tall matrices are transposed, iterated, and transposed back (fewer FLOPs, same result).
//
// Plain C++17 (no <span>, no C++20): the CUDA sources include it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/optimizer.hpp"

namespace muonbed {

// A stack of `batch` row-major rows x cols matrices, stored one after another.
struct MatrixShape {
  std::int64_t batch = 1;
  std::int64_t rows = 0;
  std::int64_t cols = 0;

  std::int64_t numel() const { return batch * rows * cols; }
  std::int64_t small_dim() const { return rows < cols ? rows : cols; }
  std::int64_t large_dim() const { return rows < cols ? cols : rows; }
  bool is_tall() const { return rows > cols; }
  std::string to_string() const;  // "4096x11008" or "64x4096x11008"
};

// FLOPs of one NS run: batch * steps * (4 m^2 n + 2 m^3), m = small dim, n = large dim
// (X X^T: 2m^2n, A A: 2m^3, B X: 2m^2n; the additions are not counted).
double ns_flops(const MatrixShape& shape, int steps);

// The iteration to run: one (a, b, c) per step, plus the normalization.
struct NsConfig {
  std::string name = "keller_jordan";  // for reports: keller_jordan, polar_express, custom
  std::vector<NsStepCoefficients> steps;
  double eps = 1e-7;
  double norm_scale = 1.0;  // X0 = G / (||G||_F * norm_scale + eps)

  int num_steps() const { return static_cast<int>(steps.size()); }

  // (3.4445, -4.7750, 2.0315) repeated: Keller Jordan's Muon and torch.optim.Muon's default.
  static NsConfig keller_jordan(int num_steps = 5);
  // Polar Express (Amsel, Persson, Musco, Gower 2025, arXiv:2505.16932, Algorithm 1): eight
  // per-step minimax-optimal quintics, all but the last divided by the safety factor 1.01
  // (a/1.01, b/1.01^3, c/1.01^5); steps beyond eight repeat the last; norm_scale 1.01.
  static NsConfig polar_express(int num_steps = 5);
  static NsConfig custom(std::vector<NsStepCoefficients> steps, double eps = 1e-7,
                         double norm_scale = 1.0);
};

// What an experiment file names: set = keller (alias keller_jordan) | polar_express | custom. For
// the named sets `num_steps` is the iteration count; for custom it must be 0 or
// custom_steps.size().
// Throws Error listing the valid names.
NsConfig make_ns_config(std::string_view set, int num_steps,
                        const std::vector<NsStepCoefficients>& custom_steps = {});
// The iteration a MuonConfig asks for (its coefficient set, ns_steps and eps).
NsConfig make_ns_config(const MuonConfig& muon);
// Throws Error when the config cannot run (no steps, non-finite coefficients, eps < 0, ...).
void validate(const NsConfig& config);

enum class NsPrecision {
  fp64,  // reference
  fp32,  // fp32 storage and accumulation
  bf16,  // bf16 storage (X, A, B rounded after every product), fp32 accumulation
};
std::string_view to_string(NsPrecision precision);
NsPrecision ns_precision_from_string(std::string_view text);  // throws Error listing names

// The fp64 reference. Never uses BLAS: plain loops, fp64 accumulation. `out` may equal `in`.
void newton_schulz(const double* in, double* out, const MatrixShape& shape, const NsConfig& config);
// fp32 (precision fp32) or bf16 emulation (precision bf16); uses cblas_sgemm when the build
// found BLAS, else blocked loops. The Frobenius norm is accumulated in fp64. `out` may equal `in`.
// precision fp64 is an error here.
void newton_schulz(const float* in, float* out, const MatrixShape& shape, const NsConfig& config,
                   NsPrecision precision = NsPrecision::fp32);

// Split Newton-Schulz (core/plan/split_ns.hpp): one member's part of the iteration in fp32, on its
// slice in the wide orientation X_r [m, n] (m: the Gram size; a slice of rows is transposed
// first). The caller all-reduces what split_ns_gram returns; split_ns_step then runs one step with
// the reduced Gram, exactly the products of the fp32 newton_schulz above (B = c A A + b A,
// X = B X + a X), so the iteration differs from it only by the order of the Gram's sum.
// a = X_r X_r^T [m, m] (zero when n == 0).
void split_ns_gram(const float* x, std::int64_t m, std::int64_t n, float* a);
// X_r <- a X_r + (b A + c A A) X_r in place, with A the reduced Gram [m, m].
void split_ns_step(float* x, std::int64_t m, std::int64_t n, const float* gram,
                   const NsStepCoefficients& step);

// "OpenBLAS cblas_sgemm" or "blocked loops": what the fp32 CPU path multiplies with.
std::string cpu_gemm_backend();
// C = A B^T in fp32 with that GEMM (row-major A [m, k], B [n, k], C [m, n]): the X X^T product
// of Newton-Schulz, which `muonbed calibrate` times at a model's shapes.
void cpu_gemm_abt(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b,
                  float* c);
// C = op(A) op(B) in fp32 with that GEMM (row-major, dense; op(A) [m, k] is A^T when trans_a,
// op(B) [k, n] is B^T when trans_b; C [m, n]): the training step's forward and backward products
// that the CPU executors run (backends/cpu).
void cpu_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
              const float* a, const float* b, float* c);
// The block C[row0, row0 + rows) x [col0, col0 + cols) of cpu_gemm's product (operands and C
// addressed as the whole product's): a long product run as blocks with progress points between.
void cpu_gemm_block(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                    const float* a, const float* b, float* c, std::int64_t row0, std::int64_t rows,
                    std::int64_t col0, std::int64_t cols);

}  // namespace muonbed
