// Small, deliberately naive fp64 linear algebra for the numerics tests, written independently of
// kernels/: products, random orthogonal matrices (Householder), and a cyclic Jacobi eigenvalue
// solver, so Newton-Schulz can be checked against matrices with known singular values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/random.hpp"

namespace muonbed::test {

using Matrix = std::vector<double>;  // row-major, dims passed alongside

// C [m, n] = A [m, k] * B [k, n]
inline Matrix matmul(const Matrix& a, const Matrix& b, int m, int k, int n) {
  Matrix c(static_cast<std::size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) s += a[i * k + p] * b[p * n + j];
      c[i * n + j] = s;
    }
  return c;
}

inline Matrix transpose(const Matrix& a, int rows, int cols) {
  Matrix t(a.size());
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// A random n x n orthogonal matrix: the product of n Householder reflections I - 2 v v^T / v^T v.
inline Matrix random_orthogonal(int n, std::uint64_t seed) {
  Matrix q(static_cast<std::size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) q[i * n + i] = 1.0;
  for (int r = 0; r < n; ++r) {
    std::vector<double> v(n);
    double vv = 0;
    for (int i = 0; i < n; ++i) {
      v[i] = counter_uniform(seed, 1000 + r, i);
      vv += v[i] * v[i];
    }
    // q = q (I - 2 v v^T / vv)
    for (int i = 0; i < n; ++i) {
      double qv = 0;
      for (int j = 0; j < n; ++j) qv += q[i * n + j] * v[j];
      for (int j = 0; j < n; ++j) q[i * n + j] -= 2.0 * qv * v[j] / vv;
    }
  }
  return q;
}

// Eigenvalues of a symmetric n x n matrix by cyclic Jacobi rotations, ascending.
inline std::vector<double> symmetric_eigenvalues(Matrix a, int n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j) off += a[i * n + j] * a[i * n + j];
    if (off < 1e-30) break;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (std::abs(apq) < 1e-300) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
      }
  }
  std::vector<double> eig(n);
  for (int i = 0; i < n; ++i) eig[i] = a[i * n + i];
  std::sort(eig.begin(), eig.end());
  return eig;
}

// Singular values of a rows x cols matrix (the min(rows, cols) largest), ascending.
inline std::vector<double> singular_values(const Matrix& x, int rows, int cols) {
  const bool wide = rows <= cols;
  const int m = wide ? rows : cols;
  const Matrix xt = transpose(x, rows, cols);
  const Matrix gram = wide ? matmul(x, xt, rows, cols, rows) : matmul(xt, x, cols, rows, cols);
  std::vector<double> eig = symmetric_eigenvalues(gram, m);
  for (double& e : eig) e = std::sqrt(std::max(e, 0.0));
  return eig;
}

template <typename A, typename B>
double relative_error(const std::vector<A>& got, const std::vector<B>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    diff += d * d;
    norm += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return std::sqrt(diff / norm);
}

}  // namespace muonbed::test
