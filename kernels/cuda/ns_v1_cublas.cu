// Newton-Schulz version 1: the iteration on cuBLAS, as torch.optim.Muon does it on the GPU.
//
// Storage is bf16 (X, A = X X^T, B = b A + c A A), products accumulate in fp32, and the b A and
// a X terms ride in the GEMMs' beta (cuBLAS's C is read in fp32 before the single rounding), so
// every stored value is rounded exactly once, as the CPU bf16 emulation does. The Frobenius norm
// is reduced on the device (fp32 per thread, fp64 across blocks). A stack of same-shape matrices
// runs as strided-batched GEMMs.
//
// Orientation without transposes: cuBLAS is column-major, so a row-major buffer read
// column-major is the transpose. For a wide matrix (rows <= cols) the buffer is V = X^T [n, m]
// and the step is A = V^T V, B = c A A + b A, V' = V B^T + a V. For a tall one the buffer is
// already the wide W = X^T [m, n] column-major, and the step is A = W W^T, W' = B W + a W. In
// both cases the output buffer is row-major NS(G) in G's own orientation.
//
// cublasGemmStridedBatchedEx writes C in place, so the beta terms need A and X copied into the
// outputs first (two device copies per step, ~5-10% of the time at 4096^2): a cuBLASLt version
// with C != D, or a symmetric X X^T kernel, can remove them as version 2.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/ns_common.cuh"
#include "kernels/cuda/ns_versions.cuh"

namespace muonbed::cuda_detail {
namespace {

using Layout = NsBuffers;

Layout layout_of(const MatrixShape& s) {
  return NsBuffers::of(s);
}

class NsV1Cublas final : public NsKernel {
 public:
  int version() const override { return 1; }
  std::string name() const override { return "cublas-bf16"; }

  bool can_implement(const MatrixShape& s, std::string* why) const override {
    return fits_batched_cublas(s, why);
  }

  std::size_t workspace_bytes(const MatrixShape& s) const override { return layout_of(s).total(); }

  void run(CudaContext& ctx, const NsDeviceArgs& args) const override {
    std::string why;
    if (!can_implement(args.shape, &why)) throw Error("NS v1: " + why);
    if (!args.config) throw Error("NS v1: no NsConfig given");
    const NsConfig& config = *args.config;
    if (config.steps.empty()) throw Error("NS v1: the NsConfig has no steps");
    const Layout l = layout_of(args.shape);
    if (args.workspace_bytes < l.total()) {
      throw Error("NS v1: workspace of " + std::to_string(args.workspace_bytes) + " bytes, needs " +
                  std::to_string(l.total()));
    }
    auto* base = static_cast<unsigned char*>(args.workspace);
    auto* x = reinterpret_cast<__nv_bfloat16*>(base);
    auto* x_next = reinterpret_cast<__nv_bfloat16*>(base + l.x_bytes);
    auto* a = reinterpret_cast<__nv_bfloat16*>(base + 2 * l.x_bytes);
    auto* b = reinterpret_cast<__nv_bfloat16*>(base + 2 * l.x_bytes + l.a_bytes);
    auto* partial = reinterpret_cast<float*>(base + 2 * l.x_bytes + 2 * l.a_bytes);
    auto* scale = reinterpret_cast<float*>(base + 2 * l.x_bytes + 2 * l.a_bytes + l.partial_bytes);

    cudaStream_t stream = ctx.stream();
    auto handle = static_cast<cublasHandle_t>(ctx.cublas_handle());
    const long long per = l.m * l.n, total = per * l.batch;

    // X0 = bf16(G / (||G||_F * norm_scale + eps)), per matrix.
    normalize_to_bf16(stream, args.in, x, per, l.batch, l.norm_blocks, config, partial, scale);

    const int m = static_cast<int>(l.m), n = static_cast<int>(l.n);
    const int batch = static_cast<int>(l.batch);
    const long long stride_x = per, stride_a = l.m * l.m;
    const bool tall = args.shape.is_tall();
    const float one = 1.0f, zero = 0.0f;
    for (const NsStepCoefficients& st : config.steps) {
      const float coef_a = static_cast<float>(st.a), coef_b = static_cast<float>(st.b),
                  coef_c = static_cast<float>(st.c);
      // A = X X^T: wide V^T V (V = X^T, ld n); tall W W^T (W = X^T of the tall X, ld m).
      MUONBED_CUDA_CHECK(cublasGemmStridedBatchedEx(
          handle, tall ? CUBLAS_OP_N : CUBLAS_OP_T, tall ? CUBLAS_OP_T : CUBLAS_OP_N, m, m, n, &one,
          x, CUDA_R_16BF, tall ? m : n, stride_x, x, CUDA_R_16BF, tall ? m : n, stride_x, &zero, a,
          CUDA_R_16BF, m, stride_a, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      // B = c A A + b A (A copied into B for the beta term).
      MUONBED_CUDA_CHECK(cudaMemcpyAsync(b, a, static_cast<std::size_t>(stride_a * batch) * 2,
                                         cudaMemcpyDeviceToDevice, stream));
      MUONBED_CUDA_CHECK(cublasGemmStridedBatchedEx(
          handle, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &coef_c, a, CUDA_R_16BF, m, stride_a, a,
          CUDA_R_16BF, m, stride_a, &coef_b, b, CUDA_R_16BF, m, stride_a, batch, CUBLAS_COMPUTE_32F,
          CUBLAS_GEMM_DEFAULT));
      // X' = B X + a X (X copied into X' for the beta term).
      MUONBED_CUDA_CHECK(cudaMemcpyAsync(x_next, x, static_cast<std::size_t>(total) * 2,
                                         cudaMemcpyDeviceToDevice, stream));
      if (tall) {
        // W' = B W + a W: [m, m] x [m, n].
        MUONBED_CUDA_CHECK(cublasGemmStridedBatchedEx(
            handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, m, &one, b, CUDA_R_16BF, m, stride_a, x,
            CUDA_R_16BF, m, stride_x, &coef_a, x_next, CUDA_R_16BF, m, stride_x, batch,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      } else {
        // V' = V B^T + a V: [n, m] x [m, m].
        MUONBED_CUDA_CHECK(cublasGemmStridedBatchedEx(
            handle, CUBLAS_OP_N, CUBLAS_OP_T, n, m, m, &one, x, CUDA_R_16BF, n, stride_x, b,
            CUDA_R_16BF, m, stride_a, &coef_a, x_next, CUDA_R_16BF, n, stride_x, batch,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      std::swap(x, x_next);
    }

    bf16_to_float(stream, x, args.out, total);
  }
};

}  // namespace

std::unique_ptr<NsKernel> make_ns_v1_cublas() {
  return std::make_unique<NsV1Cublas>();
}

}  // namespace muonbed::cuda_detail
