// The CUDA module's export (see gpu_module.hpp): compiled only into libmuonbed_gpu.so, which
// links the real CUDA kernels (kernels/cuda/) and the GPU benchmark (bench_gpu.cpp).
#include "kernels/src/gpu_module.hpp"

#include "kernels/src/bench_detail.hpp"

extern "C" __attribute__((visibility("default"))) const muonbed::GpuModuleEntry*
muonbed_gpu_module() {
  static const muonbed::GpuModuleEntry entry{
      muonbed::kGpuModuleAbi, &muonbed::cuda_device_available, &muonbed::ns_kernel_versions,
      &muonbed::run_ns_benchmark_gpu, &muonbed::time_calibration_kernels_gpu};
  return &entry;
}
