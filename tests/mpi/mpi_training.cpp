// The training step under mpirun (issue 24): a small dense model's forward, backward, their
// communication, the gradient sync and the Muon step, executed by the Open MPI executor on CPU
// ranks, for FSDP over the ranks and for TP over them. Per rank and step it checks, against
// figures computed independently of the execution:
//   - the FLOPs of the GEMMs the CPU handlers ran (counted as they multiply) equal op_flops
//     summed over the rank's forward and backward ops (the plan's formula);
//   - the bytes it sent equal plan.hpp's count (parameter gathers in the params' dtype,
//     activations of Op::bytes, gradients and updates);
//   - its parameters and optimizer state equal the single-device reference bit for bit: the
//     training ops leave the optimizer's seeded gradients as they are;
// and measures the step (backends/mpi/measure.hpp): the record's training section is present
// with every phase the plan has taking time.
//
//   mpirun -np 2 mpi_training [--compute threads|progress_points]
//
// prints one line per case on rank 0 and PASS: when all pass.
#include <mpi.h>

#include <iostream>
#include <string>
#include <vector>

#include "backends/cpu/check.hpp"
#include "backends/mpi/executor.hpp"
#include "backends/mpi/measure.hpp"
#include "core/base/errors.hpp"
#include "core/model/parallelize.hpp"
#include "core/plan/strategy.hpp"
#include "core/plan/training.hpp"
#include "tests/mpi/test_world.hpp"

using namespace muonbed;

namespace {

constexpr std::uint64_t kSeed = 20261128;

// Two llama-like layers of hidden 64 (MLP 128, vocabulary 256): GEMMs of real size, a fast test.
Model small_model() {
  Model model;
  model.name = "train-small";
  model.num_layers = 2;
  model.params.push_back({"embed", {256, 64}, DType::bf16, ParamRole::embedding, -1});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    model.params.push_back({p + "attn.q", {64, 64}, DType::bf16, ParamRole::attn_q, l});
    model.params.push_back({p + "attn.k", {64, 64}, DType::bf16, ParamRole::attn_k, l});
    model.params.push_back({p + "attn.v", {64, 64}, DType::bf16, ParamRole::attn_v, l});
    model.params.push_back({p + "attn.o", {64, 64}, DType::bf16, ParamRole::attn_o, l});
    model.params.push_back({p + "mlp.up", {128, 64}, DType::bf16, ParamRole::mlp_up, l});
    model.params.push_back({p + "mlp.down", {64, 128}, DType::bf16, ParamRole::mlp_down, l});
  }
  model.params.push_back({"norm", {64}, DType::bf16, ParamRole::norm, -1});
  model.params.push_back({"head", {256, 64}, DType::bf16, ParamRole::lm_head, -1});
  return model;
}

struct Case {
  std::string name;
  std::vector<MeshDim> dims;
  std::int64_t tokens = 0;
  // Phases the plan has, which must take time: FSDP gathers parameters, TP moves activations.
  bool gathers = false, activations = false, syncs = false;
};

StepPlan plan_of(const Case& c, const Model& model) {
  TrainingOptions o;
  o.enabled = true;
  o.tokens_per_step = c.tokens;
  o.seq_len = 32;
  PlanSettings settings;
  settings.training = o;
  StrategyOptions options;
  options.name = "owner";
  int world = 1;
  for (const MeshDim& d : c.dims) world *= d.size;
  return build_plan(parallelize(model, DeviceMesh(c.dims, world), ParallelRules{}), options,
                    settings);
}

mpi::ComputeMode g_compute = mpi::ComputeMode::automatic;

// This rank's problems with case `c` ("" when none).
std::string check_rank(const Case& c, const Model& model, const StepPlan& plan, int rank) {
  mpi::ExecutorOptions options;
  options.seed = kSeed;
  options.timeout_s = 60;
  options.compute_mode = g_compute;
  constexpr int kSteps = 2;
  std::string problem;
  {
    mpi::Executor executor(plan, MPI_COMM_WORLD, options);
    double planned_flops = 0;
    for (const Op& op : plan.ops)
      if ((op.kind == OpKind::forward || op.kind == OpKind::backward) &&
          op.ranks.contains(plan.mesh(), rank))
        planned_flops += op_flops(plan, op, rank);
    if (!(planned_flops > 0)) problem = "rank " + std::to_string(rank) + " plans no GEMM FLOPs";
    for (int k = 0; k < kSteps; ++k) {
      executor.run_step(k);
      const mpi::StepTimings& t = executor.timings();
      // Integer-valued sums below 2^53: exact whatever the order.
      if (problem.empty() && t.gemm_flops != planned_flops)
        problem = "rank " + std::to_string(rank) + " ran " + std::to_string(t.gemm_flops) +
                  " GEMM FLOPs in step " + std::to_string(k) + ", op_flops plans " +
                  std::to_string(planned_flops);
      double expected = 0;
      for (const Op& op : plan.ops) {
        if (!is_collective(op.kind) || !plan.active_in_step(op, k) ||
            !op.ranks.contains(plan.mesh(), rank))
          continue;
        const auto sent = bytes_sent(plan, op, rank);
        const int me = plan.mesh().group_index(rank, op.group);
        for (int i = 0; i < static_cast<int>(sent.size()); ++i)
          if (i != me) expected += static_cast<double>(sent[static_cast<std::size_t>(i)]);
      }
      if (problem.empty() && t.bytes_sent != expected)
        problem = "rank " + std::to_string(rank) + " sent " +
                  std::to_string(static_cast<long long>(t.bytes_sent)) + " bytes in step " +
                  std::to_string(k) + ", the plan counts " +
                  std::to_string(static_cast<long long>(expected));
    }
    cpu::ReferenceRun reference(plan, model, RoutingRules{}, kSeed);
    reference.run_to(kSteps);
    if (const auto m = cpu::first_mismatch(plan, executor.store(), reference); problem.empty() && m)
      problem = m->message;
  }
  // The measured step and its training section (rank 0's record).
  mpi::MeasureSettings settings;
  settings.warmup_steps = 1;
  settings.timed_steps = 2;
  settings.trace_ranks = 0;
  settings.cluster_name = "test";
  settings.peak_tflops = 0.1;
  const std::optional<mpi::Measured> m = mpi::measure(plan, MPI_COMM_WORLD, options, settings);
  if (rank == 0 && problem.empty()) {
    const TrainingResult& t = m->record.training;
    const auto need = [&](bool wanted, double value, const char* what) {
      if (problem.empty() && wanted && !(value > 0))
        problem = std::string("the measured training section's ") + what + " is " +
                  std::to_string(value) + ", not positive";
    };
    if (!t.present) problem = "the measured record has no training section";
    need(true, t.step_s, "step_s");
    need(true, t.forward_s, "forward_s");
    need(true, t.backward_s, "backward_s");
    need(true, t.optimizer_s, "optimizer_s");
    need(c.gathers, t.parameter_gather_s, "parameter_gather_s");
    need(c.activations, t.activation_comm_s, "activation_comm_s");
    need(c.syncs, t.gradient_sync_s, "gradient_sync_s");
    need(true, t.model_tflops, "model_tflops");
    if (problem.empty() && !(t.forward_s < t.step_s && t.backward_s < t.step_s))
      problem = "forward or backward is not shorter than the whole step";
  }
  return problem;
}

}  // namespace

int main(int argc, char** argv) {
  const testing::TestWorld world = testing::start_test_world();
  const int rank = world.rank, size = world.size;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--compute") g_compute = mpi::parse_compute_mode(argv[i + 1]);
  if (size != 2) {
    if (rank == 0) std::cerr << "mpi_training runs on 2 ranks (mpirun -np 2)\n";
    MPI_Finalize();
    return 2;
  }
  const Model model = small_model();
  // FSDP: 2 data-parallel ranks x 2 micro-batches of 32; TP: one data-parallel rank.
  const std::vector<Case> cases = {
      {"fsdp dp_shard 2", {{"dp_shard", 2, DimRole::fsdp}}, 128, true, false, true},
      {"tp 2", {{"tp", 2, DimRole::tp}}, 64, false, true, false},
  };
  int failed = 0;
  for (const Case& c : cases) {
    std::string problem;
    try {
      problem = check_rank(c, model, plan_of(c, model), rank);
    } catch (const std::exception& e) {
      mpi::abort_world("rank " + std::to_string(rank) + ", case " + c.name + ": " + e.what());
    }
    // Every rank's verdict: the first problem of any rank fails the case.
    int bad = problem.empty() ? 0 : 1, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!problem.empty()) std::cerr << "rank " << rank << ", " << c.name << ": " << problem << "\n";
    if (rank == 0) std::cout << (any ? "FAIL " : "ok   ") << c.name << std::endl;
    failed += any;
  }
  if (rank == 0)
    std::cout << (failed ? "FAIL: " : "PASS: ") << failed << " of " << cases.size()
              << " training cases failed" << std::endl;
  MPI_Finalize();
  return failed ? 1 : 0;
}
