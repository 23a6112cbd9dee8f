// Device discovery, the CUDA context (stream + cuBLAS handle), device buffers, random fills and
// the timing helpers of kernels/gpu.hpp.
#include <cuda_bf16.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/gpu.hpp"
#include "kernels/random.hpp"

namespace muonbed {

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) {
      *why = std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorName(status) + ": " +
             cudaGetErrorString(status) + ")";
    }
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device (cudaGetDeviceCount found 0 devices)";
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = "no CUDA device (cudaGetDeviceProperties failed)";
    return false;
  }
  // bf16 tensor-core GEMMs and the sm_80/sm_90 binaries of this build need Ampere or newer.
  if (prop.major < 8) {
    if (why) {
      *why = "no usable CUDA device (" + std::string(prop.name) + " has compute capability " +
             std::to_string(prop.major) + "." + std::to_string(prop.minor) +
             "; muonbed's kernels need 8.0 or newer)";
    }
    return false;
  }
  if (why) why->clear();
  return true;
}

std::string cuda_versions_text(int device) {
  int driver = 0, runtime = 0, cublas = 0;
  MUONBED_CUDA_CHECK(cudaDriverGetVersion(&driver));
  MUONBED_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  cublasHandle_t handle = nullptr;
  MUONBED_CUDA_CHECK(cublasCreate(&handle));
  const cublasStatus_t got = cublasGetVersion(handle, &cublas);
  cublasDestroy(handle);
  MUONBED_CUDA_CHECK(got);
  cudaDeviceProp prop{};
  MUONBED_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return "driver " + std::to_string(driver) + " (CUDA " + std::to_string(driver / 1000) + "." +
         std::to_string(driver % 1000 / 10) + "), CUDA runtime " + std::to_string(runtime) +
         ", cuBLAS " + std::to_string(cublas) + ", compute capability " +
         std::to_string(prop.major) + "." + std::to_string(prop.minor);
}

struct CudaContext::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::string name;
  std::size_t l2_bytes = 0;
  DeviceBuffer flush;             // scratch overwritten by flush_l2
  DeviceBuffer cublas_workspace;  // given to cuBLAS once: no allocation inside a graph capture
};

CudaContext::CudaContext(int device) : impl_(std::make_unique<Impl>()) {
  std::string why;
  if (!cuda_device_available(&why)) throw Error("CudaContext: " + why);
  impl_->device = device;
  MUONBED_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  MUONBED_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  impl_->name = prop.name;
  impl_->l2_bytes = static_cast<std::size_t>(prop.l2CacheSize);
  // A blocking stream: it orders with the legacy default stream DeviceBuffer's copies use.
  MUONBED_CUDA_CHECK(cudaStreamCreate(&impl_->stream));
  MUONBED_CUDA_CHECK(cublasCreate(&impl_->cublas));
  MUONBED_CUDA_CHECK(cublasSetStream(impl_->cublas, impl_->stream));
  // A workspace of our own (32 MiB, NVIDIA's recommendation for Hopper): cuBLAS then never
  // allocates during a stream capture (the GPU executors capture whole steps as CUDA graphs).
  impl_->cublas_workspace = DeviceBuffer(std::size_t{32} << 20);
  MUONBED_CUDA_CHECK(cublasSetWorkspace(impl_->cublas, impl_->cublas_workspace.data(),
                                        impl_->cublas_workspace.bytes()));
}

CudaContext::~CudaContext() {
  if (!impl_) return;
  // Destructors must not throw: errors here are ignored.
  if (impl_->cublas) (void)cublasDestroy(impl_->cublas);
  if (impl_->stream) (void)cudaStreamDestroy(impl_->stream);
}

int CudaContext::device() const {
  return impl_->device;
}
std::string CudaContext::device_name() const {
  return impl_->name;
}
CUstream_st* CudaContext::stream() const {
  return impl_->stream;
}
void* CudaContext::cublas_handle() const {
  return impl_->cublas;
}
std::size_t CudaContext::l2_cache_bytes() const {
  return impl_->l2_bytes;
}
void CudaContext::synchronize() const {
  MUONBED_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) MUONBED_CUDA_CHECK(cudaMalloc(&data_, bytes));
}
DeviceBuffer::~DeviceBuffer() {
  if (data_) (void)cudaFree(data_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) (void)cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  if (bytes > bytes_) {
    throw Error("DeviceBuffer::upload: " + std::to_string(bytes) + " bytes into a buffer of " +
                std::to_string(bytes_));
  }
  if (bytes) MUONBED_CUDA_CHECK(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, std::size_t bytes) const {
  if (bytes > bytes_) {
    throw Error("DeviceBuffer::download: " + std::to_string(bytes) + " bytes from a buffer of " +
                std::to_string(bytes_));
  }
  if (bytes) MUONBED_CUDA_CHECK(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_bytes(int value) {
  if (bytes_) MUONBED_CUDA_CHECK(cudaMemset(data_, value, bytes_));
}

namespace {

__global__ void fill_uniform_kernel(float* out, long long n, unsigned long long key,
                                    long long first, double scale) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    out[i] =
        static_cast<float>(scale * keyed_uniform(key, static_cast<unsigned long long>(first + i)));
  }
}

__global__ void fill_uniform_scaled_bf16_kernel(unsigned short* out, long long n,
                                                unsigned long long key, long long first,
                                                double scale) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    out[i] = float_to_bf16_bits(
        static_cast<float>(scale * keyed_uniform(key, static_cast<unsigned long long>(first + i))));
  }
}

__global__ void fill_uniform_bf16_kernel(__nv_bfloat16* out, long long n, unsigned long long key) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    out[i] = __float2bfloat16_rn(static_cast<float>(keyed_uniform(key, i)));
  }
}

// Destroys its events even when a check throws.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    MUONBED_CUDA_CHECK(cudaEventCreate(&start));
    MUONBED_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    if (start) (void)cudaEventDestroy(start);
    if (stop) (void)cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

}  // namespace

void fill_uniform_cuda(CudaContext& ctx, float* out, std::int64_t n, std::uint64_t seed,
                       std::uint64_t stream, double scale, std::int64_t first_index) {
  if (n <= 0) return;
  fill_uniform_kernel<<<cuda_detail::grid_for(n), 256, 0, ctx.stream()>>>(
      out, n, counter_key(seed, stream), first_index, scale);
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

void fill_uniform_bf16_cuda(CudaContext& ctx, void* out, std::int64_t n, std::uint64_t seed,
                            std::uint64_t stream, double scale, std::int64_t first_index) {
  if (n <= 0) return;
  fill_uniform_scaled_bf16_kernel<<<cuda_detail::grid_for(n), 256, 0, ctx.stream()>>>(
      static_cast<unsigned short*>(out), n, counter_key(seed, stream), first_index, scale);
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

double time_on_stream_ms(CudaContext& ctx, const std::function<void()>& fn) {
  EventPair events;
  MUONBED_CUDA_CHECK(cudaEventRecord(events.start, ctx.stream()));
  fn();
  MUONBED_CUDA_CHECK(cudaEventRecord(events.stop, ctx.stream()));
  MUONBED_CUDA_CHECK(cudaEventSynchronize(events.stop));
  float ms = 0.0f;
  MUONBED_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
  return ms;
}

void flush_l2(CudaContext& ctx) {
  const std::size_t bytes = std::max<std::size_t>(2 * ctx.l2_cache_bytes(), 1 << 20);
  DeviceBuffer& scratch = ctx.impl_->flush;
  if (scratch.bytes() < bytes) scratch = DeviceBuffer(bytes);
  MUONBED_CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0, scratch.bytes(), ctx.stream()));
}

double bf16_gemm_tflops(CudaContext& ctx, std::int64_t m, std::int64_t n, std::int64_t k,
                        int warmup, int repeats) {
  if (m <= 0 || n <= 0 || k <= 0 || repeats <= 0) {
    throw Error("bf16_gemm_tflops: dimensions and repeats must be positive");
  }
  DeviceBuffer a(m * k * sizeof(__nv_bfloat16)), b(k * n * sizeof(__nv_bfloat16)),
      c(m * n * sizeof(__nv_bfloat16));
  fill_uniform_bf16_kernel<<<cuda_detail::grid_for(m * k), 256, 0, ctx.stream()>>>(
      a.as<__nv_bfloat16>(), m * k, counter_key(1, 1));
  MUONBED_CUDA_CHECK(cudaGetLastError());
  fill_uniform_bf16_kernel<<<cuda_detail::grid_for(k * n), 256, 0, ctx.stream()>>>(
      b.as<__nv_bfloat16>(), k * n, counter_key(1, 2));
  MUONBED_CUDA_CHECK(cudaGetLastError());
  auto handle = static_cast<cublasHandle_t>(ctx.cublas_handle());
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    MUONBED_CUDA_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(m),
                                    static_cast<int>(n), static_cast<int>(k), &alpha, a.data(),
                                    CUDA_R_16BF, static_cast<int>(m), b.data(), CUDA_R_16BF,
                                    static_cast<int>(k), &beta, c.data(), CUDA_R_16BF,
                                    static_cast<int>(m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  for (int i = 0; i < warmup; ++i) gemm();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    flush_l2(ctx);
    ms.push_back(time_on_stream_ms(ctx, gemm));
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  return 2.0 * static_cast<double>(m) * n * k / (median * 1e-3) / 1e12;
}

}  // namespace muonbed
