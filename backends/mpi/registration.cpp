// The mpi backend's registration: linked whole into the programs that run experiments (the CLI),
// where a static initializer adds the backend (backends/CMakeLists.txt
// muonbed_backend_registration).
#include "backends/mpi/mpi_backend.hpp"

namespace {

const bool registered = (muonbed::register_mpi_backend(), true);

}  // namespace
