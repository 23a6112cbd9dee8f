// The CUDA side of the numerics, behind a header with no CUDA include: a device context (stream
// + cuBLAS handle), raw device buffers, the Newton-Schulz kernel versions, the fused elementwise
// kernels, shard pack/unpack, and timing helpers. Every function exists in every build: without
// CUDA (MUONBED_HAVE_CUDA 0) or without a device, cuda_device_available() says why and the rest
// throw muonbed::Error with that reason, so callers need no #if.
//
// Newton-Schulz versions form a registry, like llm.c's dev/cuda workbench: version 1 runs the
// iteration on cuBLAS (bf16 storage, fp32 accumulation, strided-batched GEMMs); a later version
// (a symmetric X X^T kernel, say) is added to the registry and callers pick it by number.
//
// Plain C++17: the CUDA sources include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/newton_schulz.hpp"
#include "kernels/optimizer_math.hpp"
#include "kernels/shard_table.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace muonbed {

// True if this build has CUDA and a device can be used. Otherwise false, and *why (if given)
// says what is missing: "built without CUDA", "no CUDA device (cudaGetDeviceCount: ...)".
bool cuda_device_available(std::string* why = nullptr);

// The versions a GPU measurement depends on, for provenance: "driver 12080 (CUDA 12.8), CUDA
// runtime 12080, cuBLAS 120803, compute capability 9.0" (the numbers as CUDA reports them).
std::string cuda_versions_text(int device = 0);

// One device, one stream, one cuBLAS handle. Kernels of this library run on stream().
class CudaContext {
 public:
  explicit CudaContext(int device = 0);  // throws Error when no device is usable
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const;
  std::string device_name() const;
  CUstream_st* stream() const;
  void* cublas_handle() const;  // a cublasHandle_t bound to stream()
  std::size_t l2_cache_bytes() const;
  void synchronize() const;

 private:
  friend void flush_l2(CudaContext& ctx);  // owns a scratch buffer in Impl
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Device memory, freed on destruction. upload/download/fill_bytes run on the legacy default
// stream, which waits for work queued on CudaContext streams (created blocking) and is waited
// for by it: they are ordered with kernels without explicit synchronization, and
// upload/download return when the copy is done.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

  void upload(const void* host, std::size_t bytes);
  void download(void* host, std::size_t bytes) const;
  // Every byte set to `value` (0xff makes every fp32 and bf16 element a NaN: poison).
  void fill_bytes(int value);

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T));
  buffer.upload(host.data(), host.size() * sizeof(T));
  return buffer;
}
template <typename T>
std::vector<T> to_host(const DeviceBuffer& buffer, std::size_t count) {
  std::vector<T> host(count);
  buffer.download(host.data(), count * sizeof(T));
  return host;
}

// --- Newton-Schulz ------------------------------------------------------------------------------

// Device pointers: `in` and `out` hold shape.numel() fp32 values (a batch of row-major
// matrices); `out` may equal `in`. `workspace` holds at least workspace_bytes(shape) bytes.
// Every version iterates in bf16 and writes `out` as bf16 values widened to fp32, so rounding
// `out` to bf16 changes nothing (the GPU executors rely on it; gpu_kernels_test checks it).
struct NsDeviceArgs {
  const float* in = nullptr;
  float* out = nullptr;
  MatrixShape shape;
  const NsConfig* config = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// One implementation of NS on the GPU. Stateless; safe to reuse for any shape it can implement.
class NsKernel {
 public:
  virtual ~NsKernel() = default;
  virtual int version() const = 0;
  virtual std::string name() const = 0;
  // Whether this version handles `shape`; if not, *why says why.
  virtual bool can_implement(const MatrixShape& shape, std::string* why) const = 0;
  virtual std::size_t workspace_bytes(const MatrixShape& shape) const = 0;
  // Queues the iteration on ctx's stream (asynchronous).
  virtual void run(CudaContext& ctx, const NsDeviceArgs& args) const = 0;
};

struct NsKernelVersion {
  int version = 0;
  std::string name;
  std::string description;
  std::function<std::unique_ptr<NsKernel>()> make;
};

// All versions this build has (empty without CUDA), in version order.
const std::vector<NsKernelVersion>& ns_kernel_versions();
// Throws Error listing the available versions when `version` is unknown.
std::unique_ptr<NsKernel> make_ns_kernel(int version = 1);

// Convenience: allocates the workspace, runs `version`, and waits for the result.
void newton_schulz_cuda(CudaContext& ctx, const float* in, float* out, const MatrixShape& shape,
                        const NsConfig& config, int version = 1);

// --- Fused elementwise kernels (fp32, device pointers, asynchronous on ctx's stream) ---------

// The same formulas as momentum_update / apply_update / adamw_update in optimizer_math.hpp,
// computed without FMA contraction so that they match the CPU bit for bit.
void momentum_update_cuda(CudaContext& ctx, const MomentumParams& params, const float* grad,
                          float* buf, float* update, std::int64_t n);
void apply_update_cuda(CudaContext& ctx, const ApplyParams& params, float* param,
                       const float* update, std::int64_t n);
void adamw_update_cuda(CudaContext& ctx, const AdamWConfig& params, std::int64_t step, float* param,
                       const float* grad, float* m, float* v, std::int64_t n);
// out[i] = float(scale * counter_uniform(seed, stream, first_index + i)): the CPU's fill_uniform.
void fill_uniform_cuda(CudaContext& ctx, float* out, std::int64_t n, std::uint64_t seed,
                       std::uint64_t stream, double scale, std::int64_t first_index = 0);
// The same values rounded to bf16 (round to nearest even), stored as bf16.
void fill_uniform_bf16_cuda(CudaContext& ctx, void* out, std::int64_t n, std::uint64_t seed,
                            std::uint64_t stream, double scale, std::int64_t first_index = 0);

// --- Shard pack / unpack
// --------------------------------------------------------------------------

// A ShardOffsetTable uploaded to the device.
class DeviceShardTable {
 public:
  DeviceShardTable(const ShardOffsetTable& table);
  std::int64_t numel() const { return num_rows_ * num_cols_; }
  std::int64_t num_rows() const { return num_rows_; }
  std::int64_t num_cols() const { return num_cols_; }
  const std::int64_t* row_offsets() const { return rows_.as<std::int64_t>(); }
  const std::int64_t* cols() const { return cols_.as<std::int64_t>(); }

 private:
  DeviceBuffer rows_, cols_;
  std::int64_t num_rows_ = 0, num_cols_ = 0;
};

// packed[p] = full[row_offsets[p / ncols] + cols[p % ncols]] and back, for elements of
// element_bytes = 2 (bf16), 4 (fp32) or 8 bytes. Asynchronous on ctx's stream.
void pack_shard_cuda(CudaContext& ctx, const DeviceShardTable& table, const void* full,
                     void* packed, int element_bytes);
void unpack_shard_cuda(CudaContext& ctx, const DeviceShardTable& table, const void* packed,
                       void* full, int element_bytes);

// --- Rank-program element maps and small step kernels (the GPU executors, backends/gpu) -------

// A run table on the device: `num_runs` runs of kRunFields int64 (sequence, pool byte offset,
// length, element bytes), sorted by sequence and covering sequence elements [0, elements) without
// gaps: sequence element s of a run is the element at byte pool + (s - sequence) * element_bytes
// of a rank's pool, an fp32 value (element bytes 4) or a bf16 one (2). Built on the host by
// backends/gpu.
inline constexpr int kRunFields = 4;
struct DeviceRuns {
  const std::int64_t* runs = nullptr;
  std::int64_t num_runs = 0;
  std::int64_t elements = 0;
};

// out[s] = pool element map(s), widened to fp32, for s < runs.elements, written as fp32
// (out_element_bytes 4) or as bf16 (2: round to nearest even, kernels/bf16.hpp's
// float_to_bf16_bits, so the bits equal the CPU's encode). Asynchronous on `stream`.
void gather_runs_cuda(CUstream_st* stream, const void* pool, const DeviceRuns& runs, void* out,
                      int out_element_bytes);
// pool element map(s) = in[s] (or, when `accumulate`, the element plus in[s] in fp32), `in` fp32
// or bf16 (widened exactly), stored rounded to nearest even to the element's dtype: the CPU
// store's write and accumulate (backends/cpu/store.hpp). Asynchronous on `stream`.
void scatter_runs_cuda(CUstream_st* stream, void* pool, const DeviceRuns& runs, const void* in,
                       int in_element_bytes, bool accumulate);
// data[i] = round_to_bf16(data[i]) (the value a bf16 buffer holds), i < n.
void round_to_bf16_cuda(CUstream_st* stream, float* data, std::int64_t n);
// Row r of a [rows, cols] fp32 matrix multiplied by row_scales[r] (device): QK-clip with the
// scales computed on the host (float(head scale) per row, as qk_clip_rows multiplies).
void scale_rows_cuda(CUstream_st* stream, float* data, std::int64_t rows, std::int64_t cols,
                     const float* row_scales);
// adamw_update_cuda with its per-step scalars read from device memory (`scalars`: decay,
// step_size, bias2_sqrt as floats, adamw_step_scalars rounded to float), so that a captured CUDA
// graph replays any step: the same element formula, bit for bit.
void adamw_update_scalars_cuda(CudaContext& ctx, const AdamWConfig& params, const float* scalars,
                               float* param, const float* grad, float* m, float* v, std::int64_t n);

// --- Timing --------------------------------------------------------------------------------------

// Milliseconds between CUDA events recorded on ctx's stream around fn() (which queues work).
double time_on_stream_ms(CudaContext& ctx, const std::function<void()>& fn);
// Overwrites a buffer twice the L2 size so the next kernel starts with a cold cache.
void flush_l2(CudaContext& ctx);
// TFLOP/s of an m x n x k bf16 GEMM with fp32 accumulation (cublasGemmEx): the median of
// `repeats` timed runs after `warmup` runs. The yardstick the NS benchmark reports against.
double bf16_gemm_tflops(CudaContext& ctx, std::int64_t m, std::int64_t n, std::int64_t k,
                        int warmup, int repeats);

}  // namespace muonbed
