// The SimGrid module's export (see simgrid_module.hpp): compiled only into
// libmuonbed_simgrid.so, which links the simulator (every other file of sim/src but
// run_point.cpp) and SimGrid.
#include "sim/src/simgrid_module.hpp"

extern "C" __attribute__((visibility("default"))) const muonbed::SimgridModuleEntry*
muonbed_simgrid_module() {
  static const muonbed::SimgridModuleEntry entry{
      muonbed::kSimgridModuleAbi, &muonbed::simgrid_version, &muonbed::resolve_fidelity,
      &muonbed::check_simulable,  &muonbed::simulate,        &muonbed::simulate_each};
  return &entry;
}
