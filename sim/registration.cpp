// The sim backend's registration: linked whole into the programs that run experiments (the CLI),
// where a static initializer adds the backend (cmake/MuonbedBackends.cmake).
#include "sim/simulate.hpp"

namespace {

const bool registered = (muonbed::register_sim_backend(), true);

}  // namespace
