// The nccl backend's registration: linked whole into the programs that run experiments (the CLI),
// where a static initializer adds the backend (cmake/MuonbedBackends.cmake).
#include "backends/gpu/nccl_backend.hpp"

namespace {

const bool registered = (muonbed::register_nccl_backend(), true);

}  // namespace
