// The compiled-in backends (see backends.hpp). core registers `analytic` by itself; every other
// backend library exports a register function, called here under its feature macro, because a
// static library's self-registering objects would be dropped at link time.
#include "experiments/cli/backends.hpp"

#include <vector>

#include "core/base/errors.hpp"
#include "core/results/run_point.hpp"
#include "experiments/cli/format.hpp"
#include "kernels/gpu.hpp"
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
#if MUONBED_HAVE_MPI && MUONBED_HAVE_CUDA
  register_nccl_backend();
#endif
}

void require_backend(const std::string& backend, const std::string& file) {
  const SourceLocation where{file, 0, 0};
  if (backend == "nccl" && find_backend(backend) != nullptr) {
    // Checked before any work (this loads the CUDA module, as only a GPU command does).
    std::string why;
    if (!cuda_device_available(&why))
      throw ConfigError(where,
                        "backend 'nccl' needs a GPU per rank, and this machine has none: " + why,
                        "run it where each rank has a GPU; on one GPU, build/muonbed-gpu-worker "
                        "loopback " +
                            file +
                            " runs every rank on it; or run the simulator and the analytic "
                            "model: muonbed run " +
                            file + " --backend sim --backend analytic");
    return;
  }
  if (find_backend(backend) != nullptr) return;
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
    throw ConfigError(where, what + "the NCCL executor needs a build with CUDA, NCCL and MPI",
                      "install the CUDA Toolkit with NCCL and libopenmpi-dev and rebuild, or run "
                      "the simulator and the analytic model: muonbed run " +
                          file + " --backend sim --backend analytic");
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
