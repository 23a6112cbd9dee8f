// The `cuda_loopback` backend's run function and registration
// (backends/gpu/cuda_loopback_backend.hpp). Plain C++: the CLI starts the worker, which links CUDA.
#include "backends/gpu/cuda_loopback_backend.hpp"

#include <filesystem>
#include <string>

#include "backends/launch/launch.hpp"
#include "core/base/errors.hpp"
#include "core/base/process.hpp"
#include "core/experiment/backends.hpp"
#include "core/results/run_point.hpp"
#include "kernels/gpu.hpp"

namespace muonbed {

namespace {

PointRun run_cuda_loopback(const Experiment& experiment, const StepPlan& plan,
                           const RunSettings& settings) {
  launch::Job job = launch::make_job(experiment, plan, settings);
  job.backend = "cuda_loopback";
  // One process: there is no rank to fail alone and no message pattern of its own to check.
  if (!job.fault.empty())
    throw Error(
        "cuda_loopback runs every rank in one process, so MUONBED_MPI_FAULT has no rank "
        "to fail; fix: unset it (fault injection is for the mpi and nccl backends)");
  if (job.check_data)
    throw Error(
        "cuda_loopback does not check data in a measured run (its data are drawn on the "
        "device); fix: drop --check-data, and check the executor with "
        "`muonbed-gpu-worker loopback EXP --check` (the reference, bf16 NS tolerance)");
  if (const auto graph = env_choice("MUONBED_CUDA_GRAPH", {"0", "1"}))
    job.options["graph"] = *graph == "1";
  if (const auto v = env_number("MUONBED_NS_VERSION", 1, 99, true, "2"))
    job.options["ns_version"] = static_cast<int>(*v);
  const std::string worker = launch::program_beside(
      "muonbed-gpu-worker", "MUONBED_GPU_WORKER",
      "the cuda_loopback backend runs its ranks in muonbed-gpu-worker",
      "build it (a build with CUDA and MPI: cmake --build BUILD --target muonbed-gpu-worker)");
  job.launcher = "muonbed-gpu-worker (one process, every rank on one GPU; no mpirun)";
  PointRun run =
      launch::launch_local_job(job,
                               std::filesystem::path(result_path(experiment, "cuda_loopback"))
                                   .replace_filename("cuda_loopback.failed.log")
                                   .string(),
                               worker, "loopback-job");
  run.record.provenance = make_provenance(&experiment, "");
  return run;
}

std::string cuda_loopback_unavailable() {
  std::string why;
  if (cuda_device_available(&why)) return std::string();
  return "backend 'cuda_loopback' needs a GPU, and this machine has none: " + why +
         "; fix: run it on a machine with a GPU";
}

}  // namespace

void register_cuda_loopback_backend() {
  register_backend(
      {*backend_facts("cuda_loopback"), &run_cuda_loopback, &cuda_loopback_unavailable});
}

}  // namespace muonbed
