// The one symbol the SimGrid module (libmuonbed_simgrid.so) exports, and what it returns: the
// entry points of sim/simulate.hpp. Built from the same sources and compiler as the program that
// loads it, so C++ types cross as they are; kSimgridModuleAbi guards against a stale module.
#pragma once

#include <string>
#include <vector>

#include "sim/simulate.hpp"

namespace muonbed {

inline constexpr int kSimgridModuleAbi = 3;

struct SimgridModuleEntry {
  int abi = kSimgridModuleAbi;
  std::string (*simgrid_version)() = nullptr;
  std::string (*resolve_fidelity)(const SimOptions& options, const StepPlan& plan,
                                  const ClusterSpec& cluster, std::string* why) = nullptr;
  void (*check_simulable)(const StepPlan& plan, const ClusterSpec& cluster) = nullptr;
  SimulationResult (*simulate)(const StepPlan& plan, const ClusterSpec& cluster,
                               const SimOptions& options) = nullptr;
  std::vector<SimulationResult> (*simulate_each)(const std::vector<const StepPlan*>& plans,
                                                 const ClusterSpec& cluster,
                                                 const std::vector<SimOptions>& options) = nullptr;
};

}  // namespace muonbed

// extern "C" const muonbed::SimgridModuleEntry* muonbed_simgrid_module();
#define MUONBED_SIMGRID_MODULE_SYMBOL "muonbed_simgrid_module"
#define MUONBED_SIMGRID_MODULE_FILE "libmuonbed_simgrid.so"
