// sim/simulate.hpp's entry points in the muonbed program: SimGrid and its Boost libraries (~30 MB
// and ~0.15 s per process start) live in the module libmuonbed_simgrid.so, loaded with dlopen
// the first time a point is simulated. Commands that simulate nothing (--version, validate, plan,
// the analytic backend) never load SimGrid. The tests of the simulator link it directly.
//
// The module is looked for in $MUONBED_SIMGRID_MODULE, beside the executable, then in the build
// folder; when it cannot be loaded, simulating throws Error with the reason.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "sim/src/simgrid_module.hpp"

namespace muonbed {
namespace {

const SimgridModuleEntry& module() {
  static const SimgridModuleEntry* entry = nullptr;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("MUONBED_SIMGRID_MODULE"); env && *env)
      candidates.emplace_back(env);
    char exe[4096];
    if (const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1); n > 0) {
      exe[n] = '\0';
      candidates.push_back(std::filesystem::path(exe).parent_path().string() +
                           "/" MUONBED_SIMGRID_MODULE_FILE);
    }
    candidates.push_back(MUONBED_SIMGRID_MODULE_DIR "/" MUONBED_SIMGRID_MODULE_FILE);
    std::error_code ec;
    for (const std::string& path : candidates) {
      if (!std::filesystem::exists(path, ec)) continue;
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        error = std::string("sim: cannot load the SimGrid module ") + path + ": " + ::dlerror() +
                "; fix: install libsimgrid-dev (bash scripts/install-deps)";
        return;
      }
      using Entry = const SimgridModuleEntry* (*)();
      auto get = reinterpret_cast<Entry>(::dlsym(handle, MUONBED_SIMGRID_MODULE_SYMBOL));
      if (get == nullptr || get() == nullptr || get()->abi != kSimgridModuleAbi) {
        error = "sim: the SimGrid module " + path +
                " does not match this program; fix: rebuild both (cmake --build BUILD)";
        return;
      }
      entry = get();
      return;
    }
    error = "sim: the SimGrid module " MUONBED_SIMGRID_MODULE_FILE
            " is neither beside the executable nor in " MUONBED_SIMGRID_MODULE_DIR
            "; fix: build it (cmake --build BUILD) or set MUONBED_SIMGRID_MODULE to its path";
  });
  if (entry == nullptr) throw Error(error);
  return *entry;
}

}  // namespace

std::string simgrid_version() {
  return module().simgrid_version();
}

std::string resolve_fidelity(const SimOptions& options, const StepPlan& plan,
                             const ClusterSpec& cluster, std::string* why) {
  return module().resolve_fidelity(options, plan, cluster, why);
}

void check_simulable(const StepPlan& plan, const ClusterSpec& cluster) {
  module().check_simulable(plan, cluster);
}

SimulationResult simulate(const StepPlan& plan, const ClusterSpec& cluster,
                          const SimOptions& options) {
  return module().simulate(plan, cluster, options);
}

std::vector<SimulationResult> simulate_each(const std::vector<const StepPlan*>& plans,
                                            const ClusterSpec& cluster,
                                            const std::vector<SimOptions>& options) {
  return module().simulate_each(plans, cluster, options);
}

}  // namespace muonbed
