// kernels/gpu.hpp's entry points in a CUDA build, for programs that must not pay for CUDA unless
// they use it: cudart and cuBLAS (~200 MB of libraries, most of a second to load) live in the
// CUDA module libmuonbed_gpu.so, loaded with dlopen on the first GPU call. `muonbed --version`,
// validate, plan, run and the CPU tests never load it. Compiled instead of gpu_stub.cpp when
// MUONBED_HAVE_CUDA; programs that are all GPU (gpu_tests) link the kernels directly instead.
//
// The module is looked for in $MUONBED_GPU_MODULE, beside the executable, then in the build
// folder it was built in. When it cannot be loaded (no CUDA runtime on this machine, a missing
// file), cuda_device_available() says why, and the GPU paths refuse with that reason.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>

#include "core/base/errors.hpp"
#include "kernels/gpu.hpp"
#include "kernels/src/bench_detail.hpp"
#include "kernels/src/gpu_module.hpp"

namespace muonbed {
namespace {

struct Module {
  const GpuModuleEntry* entry = nullptr;
  std::string error;  // why there is none
};

std::string executable_dir() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "";
  path[n] = '\0';
  return std::filesystem::path(path).parent_path().string();
}

const Module& module() {
  static Module loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("MUONBED_GPU_MODULE"); env && *env)
      candidates.emplace_back(env);
    if (const std::string dir = executable_dir(); !dir.empty())
      candidates.push_back(dir + "/" MUONBED_GPU_MODULE_FILE);
    candidates.push_back(MUONBED_GPU_MODULE_DIR "/" MUONBED_GPU_MODULE_FILE);
    std::error_code ec;
    for (const std::string& path : candidates) {
      if (!std::filesystem::exists(path, ec)) continue;
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        loaded.error = std::string("cannot load the CUDA module ") + path + ": " + ::dlerror() +
                       " (is the CUDA runtime with cuBLAS installed on this machine?)";
        return;
      }
      using Entry = const GpuModuleEntry* (*)();
      auto entry = reinterpret_cast<Entry>(::dlsym(handle, MUONBED_GPU_MODULE_SYMBOL));
      if (entry == nullptr || entry() == nullptr || entry()->abi != kGpuModuleAbi) {
        loaded.error = "the CUDA module " + path +
                       " does not match this program; rebuild both (cmake --build BUILD)";
        return;
      }
      loaded.entry = entry();
      return;
    }
    loaded.error = "the CUDA module " MUONBED_GPU_MODULE_FILE
                   " is neither beside the executable nor in " MUONBED_GPU_MODULE_DIR
                   " (set MUONBED_GPU_MODULE to its path)";
  });
  return loaded;
}

}  // namespace

bool cuda_device_available(std::string* why) {
  const Module& m = module();
  if (m.entry == nullptr) {
    if (why) *why = m.error;
    return false;
  }
  return m.entry->device_available(why);
}

const std::vector<NsKernelVersion>& ns_kernel_versions() {
  static const std::vector<NsKernelVersion> none;
  const Module& m = module();
  return m.entry ? m.entry->kernel_versions() : none;
}

int run_ns_benchmark_gpu(const NsBenchOptions& options, const NsConfig& config, std::ostream& out) {
  const Module& m = module();
  if (m.entry == nullptr) throw Error("bench ns: " + m.error);
  return m.entry->run_ns_benchmark(options, config, out);
}

GpuCalibrationTimes time_calibration_kernels_gpu(const GpuCalibrationRequest& request,
                                                 std::ostream& out) {
  const Module& m = module();
  if (m.entry == nullptr) throw Error("calibrate: " + m.error);
  return m.entry->time_calibration_kernels(request, out);
}

}  // namespace muonbed
