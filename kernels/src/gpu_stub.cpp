// kernels/gpu.hpp in a build without CUDA: cuda_device_available() says so, everything else
// throws the same reason. Compiled only when MUONBED_HAVE_CUDA is 0.
#include <utility>

#include "core/base/errors.hpp"
#include "kernels/gpu.hpp"
#include "kernels/src/bench_detail.hpp"

namespace muonbed {
namespace {

constexpr const char* kNoCuda =
    "built without CUDA (configure with MUONBED_WITH_CUDA=ON and a CUDA Toolkit with cuBLAS and "
    "NCCL)";

[[noreturn]] void no_cuda(const char* what) {
  throw Error(std::string(what) + ": " + kNoCuda);
}

}  // namespace

bool cuda_device_available(std::string* why) {
  if (why) *why = kNoCuda;
  return false;
}

std::string cuda_versions_text(int) {
  no_cuda("cuda_versions_text");
}

struct CudaContext::Impl {};
CudaContext::CudaContext(int) {
  no_cuda("CudaContext");
}
CudaContext::~CudaContext() = default;
int CudaContext::device() const {
  return -1;
}
std::string CudaContext::device_name() const {
  return "none";
}
CUstream_st* CudaContext::stream() const {
  return nullptr;
}
void* CudaContext::cublas_handle() const {
  return nullptr;
}
std::size_t CudaContext::l2_cache_bytes() const {
  return 0;
}
void CudaContext::synchronize() const {}

DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  if (bytes > 0) no_cuda("DeviceBuffer");
}
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  data_ = std::exchange(other.data_, nullptr);
  bytes_ = std::exchange(other.bytes_, 0);
  return *this;
}
void DeviceBuffer::upload(const void*, std::size_t) {
  no_cuda("DeviceBuffer::upload");
}
void DeviceBuffer::download(void*, std::size_t) const {
  no_cuda("DeviceBuffer::download");
}
void DeviceBuffer::fill_bytes(int) {
  no_cuda("DeviceBuffer::fill_bytes");
}

const std::vector<NsKernelVersion>& ns_kernel_versions() {
  static const std::vector<NsKernelVersion> none;
  return none;
}
std::unique_ptr<NsKernel> make_ns_kernel(int) {
  no_cuda("make_ns_kernel");
}
void newton_schulz_cuda(CudaContext&, const float*, float*, const MatrixShape&, const NsConfig&,
                        int) {
  no_cuda("newton_schulz_cuda");
}

void momentum_update_cuda(CudaContext&, const MomentumParams&, const float*, float*, float*,
                          std::int64_t) {
  no_cuda("momentum_update_cuda");
}
void apply_update_cuda(CudaContext&, const ApplyParams&, float*, const float*, std::int64_t) {
  no_cuda("apply_update_cuda");
}
void adamw_update_cuda(CudaContext&, const AdamWConfig&, std::int64_t, float*, const float*, float*,
                       float*, std::int64_t) {
  no_cuda("adamw_update_cuda");
}
void fill_uniform_cuda(CudaContext&, float*, std::int64_t, std::uint64_t, std::uint64_t, double,
                       std::int64_t) {
  no_cuda("fill_uniform_cuda");
}
void fill_uniform_bf16_cuda(CudaContext&, void*, std::int64_t, std::uint64_t, std::uint64_t, double,
                            std::int64_t) {
  no_cuda("fill_uniform_bf16_cuda");
}

DeviceShardTable::DeviceShardTable(const ShardOffsetTable&) {
  no_cuda("DeviceShardTable");
}
void pack_shard_cuda(CudaContext&, const DeviceShardTable&, const void*, void*, int) {
  no_cuda("pack_shard_cuda");
}
void unpack_shard_cuda(CudaContext&, const DeviceShardTable&, const void*, void*, int) {
  no_cuda("unpack_shard_cuda");
}

void gather_runs_cuda(CUstream_st*, const void*, const DeviceRuns&, void*, int) {
  no_cuda("gather_runs_cuda");
}
void scatter_runs_cuda(CUstream_st*, void*, const DeviceRuns&, const void*, int, bool) {
  no_cuda("scatter_runs_cuda");
}
void round_to_bf16_cuda(CUstream_st*, float*, std::int64_t) {
  no_cuda("round_to_bf16_cuda");
}
void scale_rows_cuda(CUstream_st*, float*, std::int64_t, std::int64_t, const float*) {
  no_cuda("scale_rows_cuda");
}
void adamw_update_scalars_cuda(CudaContext&, const AdamWConfig&, const float*, float*, const float*,
                               float*, float*, std::int64_t) {
  no_cuda("adamw_update_scalars_cuda");
}

double time_on_stream_ms(CudaContext&, const std::function<void()>&) {
  no_cuda("time_on_stream_ms");
}
void flush_l2(CudaContext&) {
  no_cuda("flush_l2");
}
double bf16_gemm_tflops(CudaContext&, std::int64_t, std::int64_t, std::int64_t, int, int) {
  no_cuda("bf16_gemm_tflops");
}

int run_ns_benchmark_gpu(const NsBenchOptions&, const NsConfig&, std::ostream&) {
  no_cuda("bench ns");
}

GpuCalibrationTimes time_calibration_kernels_gpu(const GpuCalibrationRequest&, std::ostream&) {
  no_cuda("calibrate --backend nccl");
}

}  // namespace muonbed
