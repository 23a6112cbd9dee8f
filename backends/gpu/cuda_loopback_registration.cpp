// The cuda_loopback backend's registration: linked whole into the CLI, where a static initializer
// adds the backend (cmake/MuonbedBackends.cmake).
#include "backends/gpu/cuda_loopback_backend.hpp"

namespace {

const bool registered = (muonbed::register_cuda_loopback_backend(), true);

}  // namespace
