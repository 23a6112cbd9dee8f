// Newton-Schulz version 2: v1's iteration with the symmetry of A = X X^T and A A exploited.
//
// Both products are symmetric, so only their lower block triangle is computed: the small
// dimension m is cut into k equal blocks and the k(k+1)/2 blocks (i, j), j <= i, of every matrix
// of the batch run as one pointer-array batched GEMM (or, as an alternative, one strided-batched
// GEMM per block row); a transpose kernel then mirrors them into the upper triangle, and copies
// A's lower blocks into B on the way (the C operand of B = c A A + b A). With k blocks the two
// products cost (k+1)/2k of v1's: the step costs about 3 m^2 n + m^3 instead of 4 m^2 n + 2 m^3,
// up to 1.5x less arithmetic on square matrices and 1.35x on 4096 x 11008. X' = B X + a X is
// v1's product. Storage, accumulation and rounding are v1's (every stored value rounded once
// to bf16); only which GEMM computes an element changes.
//
// Blocks must divide m and be multiples of 8 elements (16-byte aligned starts for the tensor
// cores); a matrix with no such blocks of at least `min_block`, or with m < `min_dim`, runs
// unblocked (k = 1), exactly as v1. On an H100 (kernels/BENCHMARKS.md) blocking paid from
// m = 4096 up and cost 5-8% at 2048. A cuBLASLt X' = B X + a X with C != D (no copy of X) was
// tried alongside an earlier, slower mirror kernel and measured 0-3% faster than this copy plus
// cublasGemmStridedBatchedEx, within the spread between device calls, so the simpler call
// stayed; it deserves a re-measurement.
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

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 32;  // per dimension: 528 lower blocks per matrix

// The largest block count k <= kMaxBlocks whose block m / k divides m, is a multiple of 8 and is
// at least min_block; 1 when none is or when m < min_dim (small products gain too little to pay
// for the mirror kernels).
int block_count(long long m, int min_block, int min_dim) {
  if (m < min_dim) return 1;
  for (int k = kMaxBlocks; k >= 2; --k) {
    if (m % k != 0) continue;
    const long long block = m / k;
    if (block % 8 == 0 && block >= min_block) return k;
  }
  return 1;
}

// v1's buffers plus the pointer tables of the block-triangular GEMMs.
struct Layout : NsBuffers {
  int k = 1;               // blocks per dimension
  long long lower = 0;     // k (k + 1) / 2 lower blocks per matrix
  long long pointers = 0;  // batch * lower entries per pointer array
  std::size_t table_bytes = 0;
  static constexpr int kTables = 8;  // gram A/B for each of the two X buffers, gram C, A A's A/B/C
  std::size_t total() const { return NsBuffers::total() + kTables * table_bytes; }
};

Layout layout_of(const MatrixShape& s, int min_block, int min_dim) {
  Layout l;
  static_cast<NsBuffers&>(l) = NsBuffers::of(s);
  l.k = block_count(l.m, min_block, min_dim);
  l.lower = static_cast<long long>(l.k) * (l.k + 1) / 2;
  l.pointers = l.batch * l.lower;
  l.table_bytes = align256(static_cast<std::size_t>(l.pointers) * sizeof(void*));
  return l;
}

// The pointer tables of the two block-triangular GEMMs, built on the device so that a run never
// waits for a host copy. Entry p = matrix * lower + t, where t enumerates (i, j), j <= i, row by
// row. All matrices are column-major with the leading dimensions of NsV2Symmetric::run.
struct Tables {
  const void** gram_a[2];  // per X buffer: first operand of block (i, j)
  const void** gram_b[2];  // per X buffer: second operand
  void** gram_c;           // A's block (i, j)
  const void** square_a;   // A's column panel i (read transposed)
  const void** square_b;   // A's column panel j
  void** square_c;         // B's block (i, j)
};

__global__ void block_tables_kernel(Tables t, const __nv_bfloat16* x0, const __nv_bfloat16* x1,
                                    __nv_bfloat16* a, __nv_bfloat16* b, long long m, long long n,
                                    long long block, long long lower, long long pointers,
                                    bool tall) {
  for (long long p = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; p < pointers;
       p += static_cast<long long>(blockDim.x) * gridDim.x) {
    const long long matrix = p / lower;
    long long tri = p % lower, i = 0;
    while (tri > i) {  // row i holds i + 1 blocks
      tri -= i + 1;
      ++i;
    }
    const long long j = tri;
    const long long x_off = matrix * m * n, a_off = matrix * m * m;
    // Wide: X^T is [n, m] with ld n and block i is its column panel i (offset i*block*n).
    // Tall: X^T is [m, n] with ld m and block i is its row panel i (offset i*block).
    const long long xi = tall ? i * block : i * block * n, xj = tall ? j * block : j * block * n;
    t.gram_a[0][p] = x0 + x_off + xi;
    t.gram_b[0][p] = x0 + x_off + xj;
    t.gram_a[1][p] = x1 + x_off + xi;
    t.gram_b[1][p] = x1 + x_off + xj;
    t.gram_c[p] = a + a_off + j * block * m + i * block;
    t.square_a[p] = a + a_off + i * block * m;
    t.square_b[p] = a + a_off + j * block * m;
    t.square_c[p] = b + a_off + j * block * m + i * block;
  }
}

// Mirrors the lower block triangle of each column-major m x m matrix into its upper one:
// mat[r, c] = mat[c, r] wherever block(r) < block(c). With `copy` non-null, also copies every
// element of the lower block triangle (diagonal blocks included) into `copy`: the C operand the
// next GEMM reads. One thread block per 64 x 64 tile of the upper tile triangle (tr <= tc):
// it reads the mirror tile (tc, tr) column by column, two rows per thread (bf16x2, so a warp
// moves 128 contiguous bytes), and writes the transpose through shared memory, equally
// coalesced. Blocks are multiples of 8 rows and m is even, so a thread's two rows always share
// a block. Thread blocks below the tile diagonal exit at once.
constexpr int kMirrorTile = 64;

__global__ void mirror_lower_kernel(__nv_bfloat16* mat, __nv_bfloat16* copy, int m, int block) {
  const int tc = blockIdx.x, tr = blockIdx.y;
  if (tr > tc) return;
  const std::size_t matrix = static_cast<std::size_t>(blockIdx.z) * m * m;
  __nv_bfloat16* base = mat + matrix;
  __nv_bfloat16* copy_base = copy ? copy + matrix : nullptr;
  // lower[c][r] = mat[tc*64 + r, tr*64 + c]; the odd pitch keeps the transposed reads below
  // free of bank conflicts.
  __shared__ __nv_bfloat16 lower[kMirrorTile][kMirrorTile + 1];
  const int r = 2 * threadIdx.x;
  for (int c = threadIdx.y; c < kMirrorTile; c += blockDim.y) {
    const int row = tc * kMirrorTile + r, col = tr * kMirrorTile + c;
    if (row >= m || col >= m) continue;
    const std::size_t at = static_cast<std::size_t>(col) * m + row;
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(base + at);
    lower[c][r] = v.x;
    lower[c][r + 1] = v.y;
    if (copy_base && row / block >= col / block) {
      *reinterpret_cast<__nv_bfloat162*>(copy_base + at) = v;
    }
  }
  __syncthreads();
  // Tile (tr, tc): element (tr*64 + i, tc*64 + j) mirrors mat[tc*64 + j, tr*64 + i] = lower[i][j].
  for (int c = threadIdx.y; c < kMirrorTile; c += blockDim.y) {
    const int row = tr * kMirrorTile + r, col = tc * kMirrorTile + c;
    if (row >= m || col >= m) continue;
    const std::size_t at = static_cast<std::size_t>(col) * m + row;
    if (row / block < col / block) {
      __nv_bfloat162 v;
      v.x = lower[r][c];
      v.y = lower[r + 1][c];
      *reinterpret_cast<__nv_bfloat162*>(base + at) = v;
    } else if (copy_base && tr != tc) {
      // Part of a diagonal block above the tile diagonal: copied as it is. (On the tile diagonal
      // the mirror tile is this tile, copied in the first loop.)
      *reinterpret_cast<__nv_bfloat162*>(copy_base + at) =
          *reinterpret_cast<const __nv_bfloat162*>(base + at);
    }
  }
}

void mirror_lower(cudaStream_t stream, __nv_bfloat16* mat, __nv_bfloat16* copy, long long m,
                  long long block, long long batch) {
  const unsigned tiles = static_cast<unsigned>((m + kMirrorTile - 1) / kMirrorTile);
  mirror_lower_kernel<<<dim3(tiles, tiles, static_cast<unsigned>(batch)), dim3(32, 8), 0, stream>>>(
      mat, copy, static_cast<int>(m), static_cast<int>(block));
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

class NsV2Symmetric final : public NsKernel {
 public:
  NsV2Symmetric(int min_block, int min_dim, TriangleMethod method)
      : min_block_(min_block), min_dim_(min_dim), method_(method) {}

  int version() const override { return 2; }
  std::string name() const override { return "cublas-bf16-symmetric"; }

  bool can_implement(const MatrixShape& s, std::string* why) const override {
    if (!fits_batched_cublas(s, why)) return false;
    const Layout l = layout_of(s, min_block_, min_dim_);
    if (l.pointers > INT_MAX) {
      if (why) *why = "too many blocks for one batched GEMM";
      return false;
    }
    return true;
  }

  std::size_t workspace_bytes(const MatrixShape& s) const override {
    return layout_of(s, min_block_, min_dim_).total();
  }

  void run(CudaContext& ctx, const NsDeviceArgs& args) const override {
    std::string why;
    if (!can_implement(args.shape, &why)) throw Error("NS v2: " + why);
    if (!args.config) throw Error("NS v2: no NsConfig given");
    const NsConfig& config = *args.config;
    if (config.steps.empty()) throw Error("NS v2: the NsConfig has no steps");
    const Layout l = layout_of(args.shape, min_block_, min_dim_);
    if (args.workspace_bytes < l.total()) {
      throw Error("NS v2: workspace of " + std::to_string(args.workspace_bytes) + " bytes, needs " +
                  std::to_string(l.total()));
    }
    auto* cursor = static_cast<unsigned char*>(args.workspace);
    auto take = [&](std::size_t bytes) {
      unsigned char* p = cursor;
      cursor += bytes;
      return p;
    };
    __nv_bfloat16* xs[2] = {reinterpret_cast<__nv_bfloat16*>(take(l.x_bytes)),
                            reinterpret_cast<__nv_bfloat16*>(take(l.x_bytes))};
    auto* a = reinterpret_cast<__nv_bfloat16*>(take(l.a_bytes));
    auto* b = reinterpret_cast<__nv_bfloat16*>(take(l.a_bytes));
    auto* partial = reinterpret_cast<float*>(take(l.partial_bytes));
    auto* scale = reinterpret_cast<float*>(take(l.scale_bytes));
    Tables t{};
    for (int parity = 0; parity < 2; ++parity) {
      t.gram_a[parity] = reinterpret_cast<const void**>(take(l.table_bytes));
      t.gram_b[parity] = reinterpret_cast<const void**>(take(l.table_bytes));
    }
    t.gram_c = reinterpret_cast<void**>(take(l.table_bytes));
    t.square_a = reinterpret_cast<const void**>(take(l.table_bytes));
    t.square_b = reinterpret_cast<const void**>(take(l.table_bytes));
    t.square_c = reinterpret_cast<void**>(take(l.table_bytes));

    cudaStream_t stream = ctx.stream();
    auto handle = static_cast<cublasHandle_t>(ctx.cublas_handle());
    const long long per = l.m * l.n, total = per * l.batch;
    const long long block = l.m / l.k;
    const bool tall = args.shape.is_tall();

    // X0 = bf16(G / (||G||_F * norm_scale + eps)), per matrix (as v1).
    normalize_to_bf16(stream, args.in, xs[0], per, l.batch, l.norm_blocks, config, partial, scale);
    if (method_ == TriangleMethod::block_pointers) {
      block_tables_kernel<<<grid_for(l.pointers), kThreads, 0, stream>>>(
          t, xs[0], xs[1], a, b, l.m, l.n, block, l.lower, l.pointers, tall);
      MUONBED_CUDA_CHECK(cudaGetLastError());
    }

    const int m = static_cast<int>(l.m), n = static_cast<int>(l.n), bs = static_cast<int>(block);
    const int batch = static_cast<int>(l.batch), blocks = static_cast<int>(l.pointers);
    const float one = 1.0f, zero = 0.0f;
    int current = 0;
    for (const NsStepCoefficients& st : config.steps) {
      const float coef_a = static_cast<float>(st.a), coef_b = static_cast<float>(st.b),
                  coef_c = static_cast<float>(st.c);
      if (method_ == TriangleMethod::block_pointers) {
        // A's lower blocks: wide V_i^T V_j (panels of V = X^T, ld n); tall W_i W_j^T (ld m).
        MUONBED_CUDA_CHECK(cublasGemmBatchedEx(
            handle, tall ? CUBLAS_OP_N : CUBLAS_OP_T, tall ? CUBLAS_OP_T : CUBLAS_OP_N, bs, bs, n,
            &one, t.gram_a[current], CUDA_R_16BF, tall ? m : n, t.gram_b[current], CUDA_R_16BF,
            tall ? m : n, &zero, t.gram_c, CUDA_R_16BF, m, blocks, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
      } else {
        // Block row i of A up to its diagonal block, one strided-batched GEMM per block row:
        // wide V_i^T V_{0..i}; tall W_i W_{0..i}^T.
        const __nv_bfloat16* x = xs[current];
        for (int i = 0; i < l.k; ++i) {
          MUONBED_CUDA_CHECK(cublasGemmStridedBatchedEx(
              handle, tall ? CUBLAS_OP_N : CUBLAS_OP_T, tall ? CUBLAS_OP_T : CUBLAS_OP_N, bs,
              (i + 1) * bs, n, &one, x + (tall ? i * block : i * block * l.n), CUDA_R_16BF,
              tall ? m : n, per, x, CUDA_R_16BF, tall ? m : n, per, &zero, a + i * block,
              CUDA_R_16BF, m, l.m * l.m, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
      }
      // Upper blocks mirrored; the lower ones copied into B for the beta term below.
      if (l.k > 1) {
        mirror_lower(stream, a, b, l.m, block, l.batch);
      } else {
        MUONBED_CUDA_CHECK(cudaMemcpyAsync(
            b, a, static_cast<std::size_t>(l.m * l.m * l.batch) * sizeof(__nv_bfloat16),
            cudaMemcpyDeviceToDevice, stream));
      }
      if (method_ == TriangleMethod::block_pointers) {
        // B's lower blocks: c A_i^T A_j + b A_ij (A symmetric: row panel i = column panel i^T).
        MUONBED_CUDA_CHECK(cublasGemmBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, bs, bs, m, &coef_c,
                                               t.square_a, CUDA_R_16BF, m, t.square_b, CUDA_R_16BF,
                                               m, &coef_b, t.square_c, CUDA_R_16BF, m, blocks,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      } else {
        // Block row i of B: c (A's column panel i)^T A_{0..i} + b B (B holds A's lower blocks).
        for (int i = 0; i < l.k; ++i) {
          MUONBED_CUDA_CHECK(cublasGemmStridedBatchedEx(
              handle, CUBLAS_OP_T, CUBLAS_OP_N, bs, (i + 1) * bs, m, &coef_c, a + i * block * l.m,
              CUDA_R_16BF, m, l.m * l.m, a, CUDA_R_16BF, m, l.m * l.m, &coef_b, b + i * block,
              CUDA_R_16BF, m, l.m * l.m, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
      }
      if (l.k > 1) mirror_lower(stream, b, nullptr, l.m, block, l.batch);
      // X' = B X + a X (X copied into X' for the beta term). Wide: V' = V B + a V on
      // V = X^T [n, m] (B is symmetric); tall: W' = B W + a W on W = X^T [m, n].
      MUONBED_CUDA_CHECK(cudaMemcpyAsync(xs[1 - current], xs[current],
                                         static_cast<std::size_t>(total) * sizeof(__nv_bfloat16),
                                         cudaMemcpyDeviceToDevice, stream));
      if (tall) {
        MUONBED_CUDA_CHECK(cublasGemmStridedBatchedEx(
            handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, m, &one, b, CUDA_R_16BF, m, l.m * l.m,
            xs[current], CUDA_R_16BF, m, per, &coef_a, xs[1 - current], CUDA_R_16BF, m, per, batch,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      } else {
        MUONBED_CUDA_CHECK(cublasGemmStridedBatchedEx(
            handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, m, &one, xs[current], CUDA_R_16BF, n, per, b,
            CUDA_R_16BF, m, l.m * l.m, &coef_a, xs[1 - current], CUDA_R_16BF, n, per, batch,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      current = 1 - current;
    }

    bf16_to_float(stream, xs[current], args.out, total);
  }

 private:
  int min_block_;
  int min_dim_;
  TriangleMethod method_;
};

}  // namespace

std::unique_ptr<NsKernel> make_ns_v2_symmetric(int min_block, int min_dim, TriangleMethod method) {
  if (min_block < 8) throw Error("NS v2: min_block must be at least 8");
  return std::make_unique<NsV2Symmetric>(min_block, min_dim, method);
}

}  // namespace muonbed::cuda_detail
