// Newton-Schulz on the CPU: the fp64 reference against matrices of known SVD (NS maps every
// singular value through the scalar polynomials, so the exact answer is known), fp32 and bf16
// emulation against fp64, the singular-value band of Keller Jordan's coefficients, tall/wide and
// batched equivalences, and the coefficient sets.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/base/errors.hpp"
#include "kernels/bf16.hpp"
#include "kernels/newton_schulz.hpp"
#include "kernels/random.hpp"
#include "tests/kernels/linalg_helpers.hpp"

using namespace muonbed;
using muonbed::test::Matrix;

namespace {

std::vector<double> random_matrix(const MatrixShape& s, std::uint64_t stream) {
  std::vector<double> g(static_cast<std::size_t>(s.numel()));
  fill_uniform(g.data(), s.numel(), 2024, stream, 1.0);
  return g;
}

// The scalar map NS applies to a singular value sigma of G with ||G||_F = frob.
double scalar_ns(double sigma, double frob, const NsConfig& config) {
  double x = sigma / (frob * config.norm_scale + config.eps);
  for (const NsStepCoefficients& s : config.steps) {
    x = s.a * x + s.b * x * x * x + s.c * x * x * x * x * x;
  }
  return x;
}

// G = U diag(s) V_m^T with U (m x m), V (n x n) orthogonal and V_m its first m columns.
Matrix compose(const Matrix& u, const std::vector<double>& s, const Matrix& v, int m, int n) {
  Matrix g(static_cast<std::size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int k = 0; k < m; ++k) sum += u[i * m + k] * s[k] * v[j * n + k];
      g[i * n + j] = sum;
    }
  return g;
}

}  // namespace

TEST_CASE("fp64 NS maps each singular value through the composed polynomials", "[ns]") {
  const int m = 12, n = 20;
  const Matrix u = test::random_orthogonal(m, 1), v = test::random_orthogonal(n, 2);
  std::vector<double> s(m);
  double frob2 = 0;
  for (int k = 0; k < m; ++k) {
    s[k] = 0.3 * (0.02 + 0.08 * k);  // spread over two decades, unnormalized
    frob2 += s[k] * s[k];
  }
  const Matrix g = compose(u, s, v, m, n);

  const std::vector<NsConfig> configs = {
      NsConfig::keller_jordan(5), NsConfig::polar_express(5), NsConfig::polar_express(10),
      NsConfig::custom({{1.5, -0.5, 0.0}, {1.5, -0.5, 0.0}, {1.5, -0.5, 0.0}})};
  for (const NsConfig& config : configs) {
    std::vector<double> mapped(m);
    for (int k = 0; k < m; ++k) mapped[k] = scalar_ns(s[k], std::sqrt(frob2), config);
    const Matrix want = compose(u, mapped, v, m, n);

    Matrix got(g.size());
    newton_schulz(g.data(), got.data(), MatrixShape{1, m, n}, config);
    CHECK(test::relative_error(got, want) < 1e-12);

    // The tall input G^T gives (U diag V^T)^T.
    const Matrix gt = test::transpose(g, m, n);
    Matrix got_t(g.size());
    newton_schulz(gt.data(), got_t.data(), MatrixShape{1, n, m}, config);
    CHECK(test::relative_error(got_t, test::transpose(want, m, n)) < 1e-12);
  }
}

TEST_CASE("tall input equals the iteration written on the tall side (X^T X, right products)",
          "[ns]") {
  const int rows = 40, cols = 24;
  const std::vector<double> g = random_matrix({1, rows, cols}, 3);
  const NsConfig config = NsConfig::keller_jordan(5);

  // X <- a X + X (b A + c A A) with A = X^T X: the same polynomial, never transposing X.
  Matrix x = g;
  double frob2 = 0;
  for (double value : g) frob2 += value * value;
  for (double& value : x) value /= std::sqrt(frob2) + config.eps;
  for (const NsStepCoefficients& st : config.steps) {
    const Matrix a = test::matmul(test::transpose(x, rows, cols), x, cols, rows, cols);
    const Matrix aa = test::matmul(a, a, cols, cols, cols);
    Matrix b(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) b[i] = st.b * a[i] + st.c * aa[i];
    const Matrix xb = test::matmul(x, b, rows, cols, cols);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = st.a * x[i] + xb[i];
  }

  std::vector<double> got(g.size());
  newton_schulz(g.data(), got.data(), MatrixShape{1, rows, cols}, config);
  CHECK(test::relative_error(got, x) < 1e-12);
}

TEST_CASE("fp32 NS agrees with fp64 NS within 1e-5 relative", "[ns]") {
  for (const NsConfig& config : {NsConfig::keller_jordan(5), NsConfig::polar_express(5)}) {
    for (const MatrixShape& s : {MatrixShape{1, 64, 64}, MatrixShape{1, 48, 80},
                                 MatrixShape{1, 80, 48}, MatrixShape{2, 32, 56}}) {
      const std::vector<double> g = random_matrix(s, 4);
      std::vector<double> want(g.size());
      newton_schulz(g.data(), want.data(), s, config);
      const std::vector<float> g32(g.begin(), g.end());
      std::vector<float> got(g.size());
      newton_schulz(g32.data(), got.data(), s, config, NsPrecision::fp32);
      INFO(config.name << " " << s.to_string());
      CHECK(test::relative_error(got, want) < 1e-5);
    }
  }
}

TEST_CASE("bf16 emulation stores bf16 values and stays within bf16 accuracy of fp64", "[ns]") {
  const MatrixShape s{1, 48, 80};
  const std::vector<double> g = random_matrix(s, 5);
  const NsConfig config = NsConfig::keller_jordan(5);
  std::vector<double> want(g.size());
  newton_schulz(g.data(), want.data(), s, config);
  const std::vector<float> g32(g.begin(), g.end());
  std::vector<float> got(g.size()), fp32(g.size());
  newton_schulz(g32.data(), got.data(), s, config, NsPrecision::bf16);
  newton_schulz(g32.data(), fp32.data(), s, config, NsPrecision::fp32);
  for (float value : got) REQUIRE(round_to_bf16(value) == value);
  const double err = test::relative_error(got, want);
  CHECK(err < 2e-2);
  // And it really rounds: bf16 (8-bit mantissa) is far coarser than fp32.
  CHECK(err > 10 * test::relative_error(fp32, want));
}

TEST_CASE("Keller Jordan's coefficients leave singular values in [0.5, 1.5], not at 1", "[ns]") {
  // 32 x 96 uniform entries: normalized singular values in about [0.075, 0.28] going in.
  const MatrixShape s{1, 32, 96};
  const std::vector<double> g = random_matrix(s, 6);
  std::vector<double> x(g.size());
  newton_schulz(g.data(), x.data(), s, NsConfig::keller_jordan(5));
  const std::vector<double> sv = test::singular_values(x, 32, 96);
  CHECK(sv.front() >= 0.5);
  CHECK(sv.back() <= 1.5);
  // The quintic trades accuracy for speed: it does not converge to the polar factor.
  CHECK(std::max(1.0 - sv.front(), sv.back() - 1.0) > 0.05);

  // The same band holds for the fp32 path and the bf16 emulation.
  const std::vector<float> g32(g.begin(), g.end());
  for (NsPrecision p : {NsPrecision::fp32, NsPrecision::bf16}) {
    std::vector<float> x32(g.size());
    newton_schulz(g32.data(), x32.data(), s, NsConfig::keller_jordan(5), p);
    const std::vector<double> sv32 =
        test::singular_values(std::vector<double>(x32.begin(), x32.end()), 32, 96);
    CHECK(sv32.front() >= 0.5);
    CHECK(sv32.back() <= 1.5);
  }
}

TEST_CASE("Polar Express converges to the polar factor", "[ns]") {
  const MatrixShape s{1, 32, 96};
  const std::vector<double> g = random_matrix(s, 7);
  std::vector<double> x5(g.size()), x8(g.size());
  newton_schulz(g.data(), x5.data(), s, NsConfig::polar_express(5));
  newton_schulz(g.data(), x8.data(), s, NsConfig::polar_express(8));
  auto worst = [](const std::vector<double>& sv) {
    return std::max(1.0 - sv.front(), sv.back() - 1.0);
  };
  const double err5 = worst(test::singular_values(x5, 32, 96));
  const double err8 = worst(test::singular_values(x8, 32, 96));
  INFO("worst |sigma - 1| after 5 steps " << err5 << ", after 8 " << err8);
  CHECK(err5 < 0.2);
  CHECK(err8 < 1e-6);  // converged: the 8th polynomial is the optimal one on [1-d, 1]
  // Five Polar Express steps already beat five of Keller Jordan's on the same input.
  std::vector<double> kj(g.size());
  newton_schulz(g.data(), kj.data(), s, NsConfig::keller_jordan(5));
  CHECK(err5 < worst(test::singular_values(kj, 32, 96)));
}

TEST_CASE("a batch equals a loop over its matrices", "[ns]") {
  const MatrixShape batch{3, 24, 40};
  const std::vector<double> g = random_matrix(batch, 8);
  const NsConfig config = NsConfig::polar_express(5);
  std::vector<double> all(g.size());
  newton_schulz(g.data(), all.data(), batch, config);
  const std::vector<float> g32(g.begin(), g.end());
  std::vector<float> all32(g.size());
  newton_schulz(g32.data(), all32.data(), batch, config, NsPrecision::fp32);
  const std::int64_t per = 24 * 40;
  for (std::int64_t b = 0; b < 3; ++b) {
    std::vector<double> one(per);
    newton_schulz(g.data() + b * per, one.data(), MatrixShape{1, 24, 40}, config);
    for (std::int64_t i = 0; i < per; ++i) REQUIRE(all[b * per + i] == one[i]);
    std::vector<float> one32(per);
    newton_schulz(g32.data() + b * per, one32.data(), MatrixShape{1, 24, 40}, config,
                  NsPrecision::fp32);
    const std::vector<float> slice(all32.begin() + b * per, all32.begin() + (b + 1) * per);
    CHECK(test::relative_error(slice, one32) < 1e-7);
  }
}

TEST_CASE("NS runs in place and maps zero to zero", "[ns]") {
  const MatrixShape s{1, 16, 24};
  std::vector<double> g = random_matrix(s, 9), out(g.size());
  newton_schulz(g.data(), out.data(), s, NsConfig::keller_jordan(5));
  newton_schulz(g.data(), g.data(), s, NsConfig::keller_jordan(5));
  CHECK(g == out);

  std::vector<float> zeros(static_cast<std::size_t>(s.numel()), 0.0f), z(zeros.size(), 1.0f);
  newton_schulz(zeros.data(), z.data(), s, NsConfig::keller_jordan(5), NsPrecision::fp32);
  for (float value : z) REQUIRE(value == 0.0f);
}

TEST_CASE("coefficient sets", "[ns]") {
  const NsConfig kj = NsConfig::keller_jordan(5);
  REQUIRE(kj.num_steps() == 5);
  CHECK(kj.steps[4].a == 3.4445);
  CHECK(kj.steps[4].b == -4.7750);
  CHECK(kj.steps[4].c == 2.0315);
  CHECK(kj.norm_scale == 1.0);

  // Polar Express: safety factor 1.01 on all but the last listed polynomial, repeated after.
  const NsConfig pe = NsConfig::polar_express(10);
  REQUIRE(pe.num_steps() == 10);
  CHECK(pe.norm_scale == 1.01);
  CHECK(pe.steps[0].a == Approx(8.28721201814563 / 1.01).epsilon(1e-15));
  CHECK(pe.steps[0].b == Approx(-23.595886519098837 / std::pow(1.01, 3)).epsilon(1e-15));
  CHECK(pe.steps[0].c == Approx(17.300387312530933 / std::pow(1.01, 5)).epsilon(1e-15));
  CHECK(pe.steps[4].a == Approx(2.300652019954817 / 1.01).epsilon(1e-15));
  for (int i = 7; i < 10; ++i) {
    CHECK(pe.steps[i].a == 1.875);
    CHECK(pe.steps[i].b == -1.25);
    CHECK(pe.steps[i].c == 0.375);
  }

  const NsConfig custom = make_ns_config("custom", 0, {{2, -1.5, 0.5}, {1.5, -0.5, 0}});
  CHECK(custom.num_steps() == 2);
  CHECK(custom.steps[1].a == 1.5);
  CHECK(make_ns_config("polar_express", 3).num_steps() == 3);
  // The experiment files' name and the kernels' name are the same coefficients.
  const NsConfig from_experiment = make_ns_config("keller", 5);
  const NsConfig reference = NsConfig::keller_jordan(5);
  REQUIRE(from_experiment.num_steps() == 5);
  for (int k = 0; k < 5; ++k) {
    CHECK(from_experiment.steps[k].a == reference.steps[k].a);
    CHECK(from_experiment.steps[k].b == reference.steps[k].b);
    CHECK(from_experiment.steps[k].c == reference.steps[k].c);
  }

  CHECK_THROWS_AS(make_ns_config("newton", 5), Error);
  CHECK_THROWS_WITH(make_ns_config("newton", 5), Catch::Contains("keller_jordan"));
  CHECK_THROWS_AS(make_ns_config("custom", 3, {{1.5, -0.5, 0}}), Error);
  CHECK_THROWS_AS(make_ns_config("keller_jordan", 0), Error);
  CHECK_THROWS_AS(validate(NsConfig::custom({{NAN, 0, 0}})), Error);
  std::vector<float> x(6, 1.0f);
  CHECK_THROWS_AS(newton_schulz(x.data(), x.data(), MatrixShape{1, 2, 3},
                                NsConfig::keller_jordan(5), NsPrecision::fp64),
                  Error);
}

TEST_CASE("NS FLOP count", "[ns]") {
  // 5 steps of 4 m^2 n + 2 m^3 with m = 2, n = 3 (either orientation): 5 * (48 + 16) = 320.
  CHECK(ns_flops(MatrixShape{1, 2, 3}, 5) == 320.0);
  CHECK(ns_flops(MatrixShape{1, 3, 2}, 5) == 320.0);
  CHECK(ns_flops(MatrixShape{4, 3, 2}, 5) == 1280.0);
  CHECK(MatrixShape{4, 3, 2}.to_string() == "4x3x2");
}
