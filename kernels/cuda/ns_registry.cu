// The registry of Newton-Schulz kernel versions and the convenience entry point. Adding a
// version: implement NsKernel in its own .cu, declare its factory in ns_versions.cuh, append a
// line below. Callers choose by number and never change.
#include <sstream>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/ns_versions.cuh"
#include "kernels/gpu.hpp"

namespace muonbed {

const std::vector<NsKernelVersion>& ns_kernel_versions() {
  static const std::vector<NsKernelVersion> versions = {
      {1, "cublas-bf16",
       "cuBLAS strided-batched GEMMs, bf16 storage, fp32 accumulation, beta-folded terms",
       &cuda_detail::make_ns_v1_cublas},
      {2, "cublas-bf16-symmetric",
       "v1 with X X^T and A A computed on their lower block triangle only (one pointer-array "
       "batched GEMM over blocks of >= 512 rows, mirrored by a transpose kernel) when the "
       "small dimension is >= 4096",
       [] { return cuda_detail::make_ns_v2_symmetric(); }},
  };
  return versions;
}

std::unique_ptr<NsKernel> make_ns_kernel(int version) {
  std::ostringstream valid;
  for (const NsKernelVersion& v : ns_kernel_versions()) {
    if (v.version == version) return v.make();
    valid << (valid.tellp() > 0 ? ", " : "") << v.version << " (" << v.name << ")";
  }
  throw Error("unknown Newton-Schulz kernel version " + std::to_string(version) +
              "; available: " + valid.str());
}

void newton_schulz_cuda(CudaContext& ctx, const float* in, float* out, const MatrixShape& shape,
                        const NsConfig& config, int version) {
  const std::unique_ptr<NsKernel> kernel = make_ns_kernel(version);
  DeviceBuffer workspace(kernel->workspace_bytes(shape));
  NsDeviceArgs args;
  args.in = in;
  args.out = out;
  args.shape = shape;
  args.config = &config;
  args.workspace = workspace.data();
  args.workspace_bytes = workspace.bytes();
  kernel->run(ctx, args);
  ctx.synchronize();  // the workspace is freed on return
}

}  // namespace muonbed
