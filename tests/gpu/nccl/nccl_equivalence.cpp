// The NCCL executor under mpirun, one process per GPU: plans of N ranks (N = the world size: 1 on
// a lent one-GPU machine, 2 or 4 where there are that many GPUs) run three steps and every rank's
// parameters and optimizer state must agree with the single-device reference within bf16 NS's
// tolerance (cpu::kBf16NsCheck: state bit for bit, parameters within 10 % of their movement);
// the same plans replayed from captured CUDA graphs must give the eager run's bits. Each rank
// checks itself; rank 0 gathers the verdicts and prints "PASS: ..." when all passed.
//
//   mpirun -np N nccl_equivalence
//
// Without a CUDA device, or with fewer GPUs on a host than ranks, every rank prints the reason and
// exits 77 (ctest: skipped, never passed).
#include <cuda_runtime.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "backends/cpu/check.hpp"
#include "backends/gpu/nccl_executor.hpp"
#include "core/base/errors.hpp"
#include "tests/common/equivalence_cases.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

namespace {

constexpr std::uint64_t kSeed = 20260101;
constexpr int kSteps = 3;

std::vector<std::vector<MeshDim>> meshes(int world) {
  if (world == 1) return {{{"dp_shard", 1, DimRole::fsdp}}};
  if (world == 2)
    return {{{"dp_shard", 2, DimRole::fsdp}},
            {{"tp", 2, DimRole::tp}},
            {{"dp_replicate", 2, DimRole::replicate}}};
  if (world == 4) {
    std::vector<std::vector<MeshDim>> out;
    for (const auto& t : testing::topologies())
      if (DeviceMesh(t.dims, 4).world_size() == 4) out.push_back(t.dims);
    return out;
  }
  return {{{"dp_shard", world, DimRole::fsdp}}};
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string why;
  int devices = 0;
  const bool usable = cuda_device_available(&why);
  if (usable) {
    // Ranks per host against GPUs per host: NCCL needs one GPU per rank.
    MPI_Comm local = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    int on_host = 1;
    MPI_Comm_size(local, &on_host);
    MPI_Comm_free(&local);
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    if (devices < on_host)
      why = std::to_string(on_host) + " ranks on a host with " + std::to_string(devices) +
            " GPU(s); NCCL needs one GPU per rank (label multigpu)";
  }
  int ok = usable && why.empty() ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (rank == 0)
      std::cout << "SKIPPED: " << (why.empty() ? "another rank has no GPU" : why) << std::endl;
    MPI_Finalize();
    return 77;
  }
  int failures = 0, cases = 0;
  const Model dense = *find_preset("tiny-dense");
  const Model odd = testing::odd_model();
  try {
    for (const auto& dims : meshes(world))
      for (const Model* model : {&dense, &odd})
        for (const auto& variant : testing::kVariants)
          for (const auto& options : testing::strategies()) {
            if (!testing::gpu_runs(options)) continue;
            const ShardedModel sharded = parallelize(*model, DeviceMesh(dims, 8), ParallelRules{});
            const StepPlan plan =
                build_plan(sharded, options, testing::settings_of(variant, *model));
            const std::string name = DeviceMesh(dims, 8).describe() + ", " + model->name + ", " +
                                     variant.name + ", " + options.to_json_text();
            cpu::ReferenceRun reference(plan, *model, RoutingRules{}, kSeed);
            reference.run_to(kSteps);
            gpu::NcclOptions eager_options;
            eager_options.seed = kSeed;
            eager_options.device.device = -1;
            eager_options.device.poison = true;
            gpu::NcclExecutor eager(plan, MPI_COMM_WORLD, eager_options);
            gpu::NcclOptions graph_options = eager_options;
            graph_options.graph = true;
            gpu::NcclExecutor graph(plan, MPI_COMM_WORLD, graph_options);
            for (int k = 0; k < kSteps; ++k) {
              eager.run_step(k);
              graph.run_step(k);
            }
            std::string verdict;
            if (auto m = cpu::first_mismatch(plan, eager.store(), reference, cpu::kBf16NsCheck))
              verdict = m->message;
            if (verdict.empty())
              for (const ProgramTensor& t : eager.program().tensors) {
                if (t.transient || t.role == PieceRole::gradient) continue;
                if (std::memcmp(eager.store().bytes(t.id), graph.store().bytes(t.id),
                                static_cast<std::size_t>(t.bytes)) != 0) {
                  verdict = "rank " + std::to_string(rank) +
                            ": graph replay differs from eager in " + t.name;
                  break;
                }
              }
            int bad = verdict.empty() ? 0 : 1, any = 0;
            MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            ++cases;
            if (any) {
              ++failures;
              if (!verdict.empty()) std::cerr << "FAIL: " << name << ": " << verdict << std::endl;
            } else if (rank == 0) {
              std::cout << "ok " << cases << ": " << name << std::endl;  // progress, flushed
            }
          }
  } catch (const std::exception& e) {
    std::cerr << "muonbed: error: rank " << rank << ": " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) {
    if (failures == 0)
      std::cout << "PASS: " << cases << " plans on " << world
                << " GPU rank(s) within bf16 NS tolerance of the reference, graph == eager"
                << std::endl;
    else
      std::cout << failures << " of " << cases << " plans failed" << std::endl;
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
