// The compiled-in backends (see backends.hpp). core registers `analytic` by itself; every other
// backend library exports a register function, called here under its feature macro, because a
// static library's self-registering objects would be dropped at link time.
#include "experiments/cli/backends.hpp"

#include "core/base/errors.hpp"
#include "core/results/run_point.hpp"
#include "muonbed/config.hpp"

#if MUONBED_HAVE_SIMGRID
#include "sim/simulate.hpp"
#endif
#if MUONBED_HAVE_MPI
#include "backends/mpi/mpi_backend.hpp"
#endif

namespace muonbed::cli {

void register_compiled_backends() {
#if MUONBED_HAVE_SIMGRID
  register_sim_backend();
#endif
#if MUONBED_HAVE_MPI
  register_mpi_backend();
#endif
#if MUONBED_HAVE_MPI && MUONBED_HAVE_CUDA
  register_nccl_backend();
#endif
}

void require_backend(const std::string& backend, const std::string& file) {
  // Asked before any work (for nccl this loads the CUDA module, as only a GPU command does).
  const std::string why = backend_unavailable(backend, file);
  if (why.empty()) return;
  const std::size_t fix = why.find("; fix: ");
  throw ConfigError(SourceLocation{file, 0, 0}, why.substr(0, fix),
                    fix == std::string::npos ? "" : why.substr(fix + 7));
}

}  // namespace muonbed::cli
