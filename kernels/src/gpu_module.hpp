// The one symbol the CUDA module (libmuonbed_gpu.so) exports, and what it returns: the GPU entry
// points the CPU library needs. The module is built from the same sources and compiler as the
// program that loads it, so C++ types cross the boundary as they are; kGpuModuleAbi guards
// against a stale module beside a newer program.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "kernels/bench.hpp"
#include "kernels/gpu.hpp"

namespace muonbed {

inline constexpr int kGpuModuleAbi = 2;

struct GpuModuleEntry {
  int abi = kGpuModuleAbi;
  bool (*device_available)(std::string* why) = nullptr;
  const std::vector<NsKernelVersion>& (*kernel_versions)() = nullptr;
  int (*run_ns_benchmark)(const NsBenchOptions& options, const NsConfig& config,
                          std::ostream& out) = nullptr;
  GpuCalibrationTimes (*time_calibration_kernels)(const GpuCalibrationRequest& request,
                                                  std::ostream& out) = nullptr;
};

}  // namespace muonbed

// Name of the exported function: extern "C" const muonbed::GpuModuleEntry* muonbed_gpu_module();
#define MUONBED_GPU_MODULE_SYMBOL "muonbed_gpu_module"
#define MUONBED_GPU_MODULE_FILE "libmuonbed_gpu.so"
