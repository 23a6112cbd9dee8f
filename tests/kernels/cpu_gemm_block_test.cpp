// cpu_gemm_block (kernels/newton_schulz.hpp): a block of C = op(A) op(B) run alone, addressed in
// the whole operands, as the CPU training handler runs a long product between progress points.
// Every block of a partition, for every transpose combination and for row and column splits, is
// checked against an fp64 product computed here element by element; the blocks together cover
// C exactly (an element outside the block is never written); a block outside C is refused.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/base/errors.hpp"
#include "kernels/newton_schulz.hpp"

using namespace muonbed;

namespace {

// Element (r, c) of a row-major [rows, cols] matrix of small integers' halves: exact in fp32, so
// the fp32 products differ from fp64 only by the rounding of their sums.
std::vector<float> filled(std::int64_t rows, std::int64_t cols, int salt) {
  std::vector<float> m(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows * cols; ++i)
    m[static_cast<std::size_t>(i)] = static_cast<float>(((i * 7 + salt * 13) % 17) - 8) * 0.5f;
  return m;
}

double reference(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                 const std::vector<float>& a, const std::vector<float>& b, std::int64_t i,
                 std::int64_t j) {
  double sum = 0;
  for (std::int64_t p = 0; p < k; ++p) {
    const double x =
        ta ? a[static_cast<std::size_t>(p * m + i)] : a[static_cast<std::size_t>(i * k + p)];
    const double y =
        tb ? b[static_cast<std::size_t>(j * k + p)] : b[static_cast<std::size_t>(p * n + j)];
    sum += x * y;
  }
  return sum;
}

}  // namespace

TEST_CASE("a GEMM run as blocks of rows or columns equals the fp64 product, block by block",
          "[cpu_gemm]") {
  const std::int64_t m = 37, n = 29, k = 23;  // odd sizes: uneven blocks
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const bool by_rows : {false, true})
        for (const std::int64_t parts : {1, 3, 5}) {
          CAPTURE(ta, tb, by_rows, parts);
          const std::vector<float> a = filled(ta ? k : m, ta ? m : k, 1);
          const std::vector<float> b = filled(tb ? n : k, tb ? k : n, 2);
          std::vector<float> c(static_cast<std::size_t>(m * n),
                               std::numeric_limits<float>::quiet_NaN());
          const std::int64_t side = by_rows ? m : n;
          for (std::int64_t p = 0; p < parts; ++p) {
            const std::int64_t from = side * p / parts, to = side * (p + 1) / parts;
            if (by_rows)
              cpu_gemm_block(ta, tb, m, n, k, a.data(), b.data(), c.data(), from, to - from, 0, n);
            else
              cpu_gemm_block(ta, tb, m, n, k, a.data(), b.data(), c.data(), 0, m, from, to - from);
          }
          int wrong = 0;
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              const double want = reference(ta, tb, m, n, k, a, b, i, j);
              const double got = c[static_cast<std::size_t>(i * n + j)];
              // |sum| <= k * 4 * 4 = 368: fp32 sums of 23 terms are exact to well under 1e-3.
              if (!(std::abs(got - want) <= 1e-3)) ++wrong;  // a NaN (unwritten) counts
            }
          CHECK(wrong == 0);
        }
}

TEST_CASE("a GEMM block writes only its own elements", "[cpu_gemm]") {
  const std::int64_t m = 16, n = 12, k = 8;
  const std::vector<float> a = filled(m, k, 3), b = filled(k, n, 4);
  std::vector<float> c(static_cast<std::size_t>(m * n), -1234.0f);
  cpu_gemm_block(false, false, m, n, k, a.data(), b.data(), c.data(), 4, 5, 3, 6);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const bool inside = i >= 4 && i < 9 && j >= 3 && j < 9;
      CAPTURE(i, j);
      if (inside)
        CHECK(c[static_cast<std::size_t>(i * n + j)] ==
              Approx(reference(false, false, m, n, k, a, b, i, j)).margin(1e-3));
      else
        CHECK(c[static_cast<std::size_t>(i * n + j)] == -1234.0f);
    }
}

TEST_CASE("a GEMM block outside C is refused", "[cpu_gemm]") {
  const std::vector<float> a = filled(4, 4, 1), b = filled(4, 4, 2);
  std::vector<float> c(16);
  CHECK_THROWS_AS(cpu_gemm_block(false, false, 4, 4, 4, a.data(), b.data(), c.data(), 2, 3, 0, 4),
                  Error);
  CHECK_THROWS_AS(cpu_gemm_block(false, false, 4, 4, 4, a.data(), b.data(), c.data(), 0, 4, -1, 2),
                  Error);
}
