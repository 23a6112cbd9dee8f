// Newton-Schulz on the CPU: coefficient sets, config parsing, and the reference iteration in
// fp64, fp32 and bf16 emulation (see kernels/newton_schulz.hpp for the math).
#include "kernels/newton_schulz.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/base/errors.hpp"
#include "kernels/bf16.hpp"
#include "kernels/progress.hpp"
#include "kernels/src/cpu_gemm.hpp"

namespace muonbed {
namespace {

// Polar Express, degree 5, as printed in Algorithm 1 of Amsel, Persson, Musco, Gower, "The
// Polar Express: Optimal Matrix Sign Methods and Their Application to the Muon Algorithm"
// (arXiv:2505.16932; reference code github.com/NoahAmsel/PolarExpress). Each step's polynomial is
// minimax-optimal on the interval the previous steps leave; from the 8th on they are equal.
constexpr NsStepCoefficients kPolarExpressRaw[] = {
    {8.28721201814563, -23.595886519098837, 17.300387312530933},
    {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
    {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
    {3.3184196573706015, -2.488488024314874, 0.51004894012372},
    {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
    {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
    {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
    {1.875, -1.25, 0.375},
};
// The paper's bf16 safety factor: p(x / 1.01) for all but the last polynomial, and the input
// normalized by 1.01 ||G||_F, so rounding cannot push a singular value past the interval.
constexpr double kPolarExpressSafety = 1.01;

template <typename T>
void transpose(const T* in, T* out, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) out[j * rows + i] = in[i * cols + j];
  }
}

// Multiplies with the fp64 loops or the fp32 path (cblas when available).
void gemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
          double* c, std::int64_t ldc) {
  detail::gemm_loops<double>(trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  detail::sgemm(trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void maybe_round(std::vector<T>& values, bool bf16) {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16) round_to_bf16(values.data(), static_cast<std::int64_t>(values.size()));
  } else {
    (void)values;
    (void)bf16;
  }
}

// One matrix. X is the wide orientation [m, n], m <= n; A and B are [m, m].
template <typename T>
void ns_matrix(const T* g, T* out, std::int64_t rows, std::int64_t cols, const NsConfig& config,
               bool bf16) {
  const bool tall = rows > cols;
  const std::int64_t m = tall ? cols : rows;
  const std::int64_t n = tall ? rows : cols;
  const auto mn = static_cast<std::size_t>(m * n);
  std::vector<T> x(mn), x_next(mn), a(static_cast<std::size_t>(m * m)),
      b(static_cast<std::size_t>(m * m));
  if (tall) {
    transpose(g, x.data(), rows, cols);
  } else {
    std::copy(g, g + mn, x.begin());
  }

  // The norm is accumulated in fp64 in every precision: it is one number, and an fp32 sum of
  // millions of squares would lose digits the kernels do not lose.
  double sum_squares = 0.0;
  for (T v : x) sum_squares += static_cast<double>(v) * static_cast<double>(v);
  const T scale = static_cast<T>(1.0 / (std::sqrt(sum_squares) * config.norm_scale + config.eps));
  for (T& v : x) v *= scale;
  maybe_round(x, bf16);

  for (const NsStepCoefficients& s : config.steps) {
    // A = X X^T
    gemm(true, m, m, n, T(1), x.data(), n, x.data(), n, T(0), a.data(), m);
    maybe_round(a, bf16);
    progress_point();
    // B = c A A + b A  (the b A term rides in GEMM's beta, as on the GPU)
    b = a;
    gemm(false, m, m, m, static_cast<T>(s.c), a.data(), m, a.data(), m, static_cast<T>(s.b),
         b.data(), m);
    maybe_round(b, bf16);
    progress_point();
    // X = B X + a X
    x_next = x;
    gemm(false, m, n, m, T(1), b.data(), m, x.data(), n, static_cast<T>(s.a), x_next.data(), n);
    maybe_round(x_next, bf16);
    std::swap(x, x_next);
    progress_point();
  }

  if (tall) {
    transpose(x.data(), out, m, n);
  } else {
    std::copy(x.begin(), x.end(), out);
  }
}

template <typename T>
void ns_batch(const T* in, T* out, const MatrixShape& shape, const NsConfig& config, bool bf16) {
  validate(config);
  if (shape.batch < 0 || shape.rows <= 0 || shape.cols <= 0) {
    throw Error("newton_schulz: invalid shape " + shape.to_string());
  }
  const std::int64_t per = shape.rows * shape.cols;
  for (std::int64_t i = 0; i < shape.batch; ++i) {
    ns_matrix(in + i * per, out + i * per, shape.rows, shape.cols, config, bf16);
  }
}

}  // namespace

std::string MatrixShape::to_string() const {
  std::ostringstream os;
  if (batch != 1) os << batch << "x";
  os << rows << "x" << cols;
  return os.str();
}

double ns_flops(const MatrixShape& shape, int steps) {
  const double m = static_cast<double>(shape.small_dim());
  const double n = static_cast<double>(shape.large_dim());
  return static_cast<double>(shape.batch) * steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

NsConfig NsConfig::keller_jordan(int num_steps) {
  NsConfig config;
  config.name = "keller_jordan";
  config.steps.assign(static_cast<std::size_t>(std::max(num_steps, 0)),
                      NsStepCoefficients{3.4445, -4.7750, 2.0315});
  return config;
}

NsConfig NsConfig::polar_express(int num_steps) {
  NsConfig config;
  config.name = "polar_express";
  config.norm_scale = kPolarExpressSafety;
  constexpr int kListed = static_cast<int>(std::size(kPolarExpressRaw));
  for (int i = 0; i < num_steps; ++i) {
    const int k = std::min(i, kListed - 1);
    NsStepCoefficients s = kPolarExpressRaw[k];
    if (k < kListed - 1) {
      const double f = kPolarExpressSafety;
      s = {s.a / f, s.b / (f * f * f), s.c / (f * f * f * f * f)};
    }
    config.steps.push_back(s);
  }
  return config;
}

NsConfig NsConfig::custom(std::vector<NsStepCoefficients> steps, double eps, double norm_scale) {
  NsConfig config;
  config.name = "custom";
  config.steps = std::move(steps);
  config.eps = eps;
  config.norm_scale = norm_scale;
  return config;
}

NsConfig make_ns_config(std::string_view set, int num_steps,
                        const std::vector<NsStepCoefficients>& custom_steps) {
  NsConfig config;
  if (set == "keller_jordan" || set == "keller") {  // "keller": the experiment files' name
    config = NsConfig::keller_jordan(num_steps);
  } else if (set == "polar_express") {
    config = NsConfig::polar_express(num_steps);
  } else if (set == "custom") {
    if (num_steps != 0 && num_steps != static_cast<int>(custom_steps.size())) {
      throw Error("newton_schulz: custom coefficients list " + std::to_string(custom_steps.size()) +
                  " steps but steps = " + std::to_string(num_steps) +
                  "; give one (a, b, c) per step or leave steps 0");
    }
    config = NsConfig::custom(custom_steps);
  } else {
    throw Error("newton_schulz: unknown coefficient set '" + std::string(set) +
                "'; valid: keller (or keller_jordan), polar_express, custom");
  }
  validate(config);
  return config;
}

NsConfig make_ns_config(const MuonConfig& muon) {
  NsConfig config = make_ns_config(muon.ns_coefficients, muon.ns_steps, muon.custom_coefficients);
  config.eps = muon.eps;
  validate(config);
  return config;
}

void validate(const NsConfig& config) {
  if (config.steps.empty()) {
    throw Error("newton_schulz: '" + config.name + "' has no steps; give at least one");
  }
  if (config.steps.size() > 100) {
    throw Error("newton_schulz: " + std::to_string(config.steps.size()) +
                " steps; at most 100 are allowed");
  }
  for (std::size_t i = 0; i < config.steps.size(); ++i) {
    const NsStepCoefficients& s = config.steps[i];
    if (!std::isfinite(s.a) || !std::isfinite(s.b) || !std::isfinite(s.c)) {
      throw Error("newton_schulz: step " + std::to_string(i) + " of '" + config.name +
                  "' has a non-finite coefficient");
    }
  }
  if (!(config.eps >= 0.0) || !std::isfinite(config.eps)) {
    throw Error("newton_schulz: eps must be finite and >= 0");
  }
  if (!(config.norm_scale > 0.0) || !std::isfinite(config.norm_scale)) {
    throw Error("newton_schulz: norm_scale must be finite and > 0");
  }
}

std::string_view to_string(NsPrecision precision) {
  switch (precision) {
    case NsPrecision::fp64:
      return "fp64";
    case NsPrecision::fp32:
      return "fp32";
    case NsPrecision::bf16:
      return "bf16";
  }
  return "?";
}

NsPrecision ns_precision_from_string(std::string_view text) {
  for (NsPrecision p : {NsPrecision::fp64, NsPrecision::fp32, NsPrecision::bf16}) {
    if (text == to_string(p)) return p;
  }
  throw Error("unknown Newton-Schulz precision '" + std::string(text) +
              "'; valid: fp64, fp32, bf16");
}

void newton_schulz(const double* in, double* out, const MatrixShape& shape,
                   const NsConfig& config) {
  ns_batch(in, out, shape, config, false);
}

void newton_schulz(const float* in, float* out, const MatrixShape& shape, const NsConfig& config,
                   NsPrecision precision) {
  if (precision == NsPrecision::fp64) {
    throw Error(
        "newton_schulz: the float overload runs fp32 or bf16; use the double overload "
        "for fp64");
  }
  ns_batch(in, out, shape, config, precision == NsPrecision::bf16);
}

void split_ns_gram(const float* x, std::int64_t m, std::int64_t n, float* a) {
  if (n == 0) {
    std::fill(a, a + m * m, 0.0f);
    return;
  }
  gemm(true, m, m, n, 1.0f, x, n, x, n, 0.0f, a, m);
}

void split_ns_step(float* x, std::int64_t m, std::int64_t n, const float* gram,
                   const NsStepCoefficients& step) {
  if (n == 0) return;
  std::vector<float> b(gram, gram + m * m);
  gemm(false, m, m, m, static_cast<float>(step.c), gram, m, gram, m, static_cast<float>(step.b),
       b.data(), m);
  std::vector<float> x_next(x, x + m * n);
  gemm(false, m, n, m, 1.0f, b.data(), m, x, n, static_cast<float>(step.a), x_next.data(), n);
  std::copy(x_next.begin(), x_next.end(), x);
}

void cpu_gemm_abt(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b,
                  float* c) {
  detail::sgemm(true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
}

void cpu_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
              const float* a, const float* b, float* c) {
  detail::sgemm_ab(trans_a, trans_b, m, n, k, a, b, c);
}

void cpu_gemm_block(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                    const float* a, const float* b, float* c, std::int64_t row0, std::int64_t rows,
                    std::int64_t col0, std::int64_t cols) {
  detail::sgemm_ab_block(trans_a, trans_b, m, n, k, a, b, c, row0, rows, col0, cols);
}

std::string cpu_gemm_backend() {
  return detail::have_cblas() ? "OpenBLAS cblas_sgemm" : "blocked loops";
}

}  // namespace muonbed
