// The `nccl` backend's run function and registration (see backends/gpu/nccl_backend.hpp).
#include "backends/gpu/nccl_backend.hpp"

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

PointRun run_nccl(const Experiment& experiment, const StepPlan& plan, const RunSettings& settings) {
  launch::Job job = launch::make_job(experiment, plan, settings);
  job.backend = "nccl";
  if (const auto graph = env_choice("MUONBED_NCCL_GRAPH", {"0", "1"}))
    job.options["graph"] = *graph == "1";
  if (const auto v = env_number("MUONBED_NS_VERSION", 1, 99, true, "2"))
    job.options["ns_version"] = static_cast<int>(*v);
  if (launch::mpi_environment().inside)
    throw Error("the nccl backend starts mpirun itself; fix: run this command outside mpirun");
  const std::string worker = launch::program_beside(
      "muonbed-gpu-worker", "MUONBED_GPU_WORKER",
      "the nccl backend runs its ranks as muonbed-gpu-worker",
      "build it (a build with CUDA, NCCL and MPI: cmake --build BUILD --target "
      "muonbed-gpu-worker)");
  job.launcher = "mpirun (started by muonbed)";
  PointRun run = launch::launch_job(job, plan.mesh().world_size(),
                                    std::filesystem::path(result_path(experiment, "nccl"))
                                        .replace_filename("nccl.failed.log")
                                        .string(),
                                    worker);
  run.record.provenance = make_provenance(&experiment, "");
  return run;
}

std::string nccl_unavailable() {
  std::string why;
  if (cuda_device_available(&why)) return std::string();
  return "backend 'nccl' needs a GPU per rank, and this machine has none: " + why +
         "; fix: run it where each rank has a GPU; on one GPU, build/muonbed-gpu-worker loopback "
         "EXP runs every rank on it";
}

}  // namespace

void register_nccl_backend() {
  register_backend({*backend_facts("nccl"), &run_nccl, &nccl_unavailable});
}

}  // namespace muonbed
