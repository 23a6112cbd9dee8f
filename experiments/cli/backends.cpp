// The compiled-in backends (see backends.hpp). core registers `analytic` by itself; every other
// backend library exports a register function, called here under its feature macro, because a
// static library's self-registering objects would be dropped at link time.
#include "experiments/cli/backends.hpp"

#include <vector>

#include "core/errors.hpp"
#include "core/run_point.hpp"
#include "experiments/cli/format.hpp"
#include "muonbed/config.hpp"

#if MUONBED_HAVE_SIMGRID
#include "sim/simulate.hpp"
#endif
#if MUONBED_HAVE_MPI
#include "backends/mpi/mpi_backend.hpp"
#endif

namespace muonbed::cli {

namespace {

// Every backend an experiment may name (core/experiment.cpp accepts these), in the order the
// docs list them.
const std::vector<std::string> kKnownBackends = {"sim", "analytic", "mpi", "nccl"};

}  // namespace

void register_compiled_backends() {
#if MUONBED_HAVE_SIMGRID
  register_sim_backend();
#endif
#if MUONBED_HAVE_MPI
  register_mpi_backend();
#endif
}

void require_backend(const std::string& backend, const std::string& file) {
  if (find_backend(backend) != nullptr) return;
  const SourceLocation where{file, 0, 0};
  const std::string what = "backend '" + backend + "' is not built into this muonbed: ";
  if (backend == "sim")
    throw ConfigError(
        where, what + "it was built without SimGrid, so the 'sim' backend is off",
        "install libsimgrid-dev (bash scripts/install-deps) and rebuild, or run the analytic "
        "model: muonbed run " +
            file + " --backend analytic");
  if (backend == "mpi")
    throw ConfigError(where, what + "it was built without MPI, so the 'mpi' backend is off",
                      "install libopenmpi-dev and openmpi-bin (bash scripts/install-deps) and "
                      "rebuild, or run the simulator and the analytic model: muonbed run " +
                          file + " --backend sim --backend analytic");
  if (backend == "nccl")
    throw ConfigError(where,
                      what + "it has no NCCL executor yet (the GPU executor is the next milestone)",
                      "run the simulator and the analytic model for now: muonbed run " + file +
                          " --backend sim --backend analytic");
  throw ConfigError(
      where,
      what + "no backend has that name (this build runs " + join(registered_backends()) + ")",
      "use one of: " + join(registered_backends()));
}

std::string backends_summary() {
  std::string out;
  for (const std::string& name : kKnownBackends)
    out += (out.empty() ? "" : ", ") + name + (find_backend(name) ? "" : " (not built)");
  return out;
}

}  // namespace muonbed::cli
