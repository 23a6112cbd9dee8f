// The compute half of `muonbed calibrate` on MPI ranks (backends/mpi/measure.hpp): every rank
// runs the CPU handlers of backends/cpu (what the executor's compute threads run) on the
// synthetic plan of core/calibration.hpp's compute_bench_plan, one rank at a time (the others
// wait in a barrier, as a rank's idle threads wait in a step) or all ranks at once.
// Per kernel and round the slowest rank's mean call counts; each row is the median over rounds.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "backends/cpu/data.hpp"
#include "backends/cpu/handlers.hpp"
#include "backends/cpu/store.hpp"
#include "backends/mpi/executor.hpp"
#include "backends/mpi/measure.hpp"
#include "core/errors.hpp"
#include "core/program.hpp"
#include "kernels/newton_schulz.hpp"

namespace muonbed::mpi {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::vector<ComputeBenchRow> compute_bench(const std::vector<StepPlan>& plans, MPI_Comm world,
                                           int warmup, int repeats, double timeout_s,
                                           bool concurrent) {
  int rank = 0, size = 1;
  MUONBED_MPI_CHECK(MPI_Comm_rank(world, &rank));
  MUONBED_MPI_CHECK(MPI_Comm_size(world, &size));
  retain_freed_memory();  // as the executor runs its steps
  const std::string where = "rank " + std::to_string(rank) + ", compute benchmark";
  const auto barrier = [&] {
    MPI_Request request = MPI_REQUEST_NULL;
    MUONBED_MPI_CHECK(MPI_Ibarrier(world, &request));
    wait_for(request, timeout_s, where, "a barrier");
  };
  // The number of back-to-back calls each rank times, agreed on (the largest any rank wants).
  const auto agree = [&](int calls) {
    int out = calls;
    MPI_Request request = MPI_REQUEST_NULL;
    MUONBED_MPI_CHECK(MPI_Iallreduce(&calls, &out, 1, MPI_INT, MPI_MAX, world, &request));
    wait_for(request, timeout_s, where, "agreeing on a call count");
    return out;
  };
  constexpr int kKernels = 5;  // momentum, newton_schulz, apply_update, gemm, pack
  const char* names[kKernels] = {"momentum", "newton_schulz", "apply_update", "gemm", "pack"};
  constexpr int kElementwise = 3;  // momentum, apply_update, adamw
  const char* elementwise_names[kElementwise] = {"momentum", "apply_update", "adamw"};
  // Each timed round calls a kernel back to back for at least kRoundSeconds and reports the mean
  // call: on a shared machine a lone short call is either undisturbed or pays a whole scheduler
  // slice of another task, while a step's many calls pay their share of the machine, which is
  // what a mean over back-to-back calls measures (nccl-tests times its -n iterations so too).
  constexpr double kRoundSeconds = 0.03;
  // mine[plan][kernel][repeat]
  std::vector<double> mine;
  // A plan of compute_bench_plan (3 ops) times the kernels above; one of elementwise_bench_plan
  // (4 ops) times momentum, apply_update and adamw at a step's size.
  const auto elementwise_plan = [](const StepPlan& plan) { return plan.ops.size() == 4; };
  for (const StepPlan& plan : plans) {
    if (plan.ops.size() != 3 && !elementwise_plan(plan))
      throw ExecutionError(
          "internal: a compute benchmark plan has 3 ops (compute_bench_plan) or 4 "
          "(elementwise_bench_plan)");
    const bool elementwise = elementwise_plan(plan);
    const RankProgram program = lower_rank_program(plan, rank);
    cpu::RankStore store(program);
    cpu::fill_parameters(plan, program, store, 1);
    cpu::fill_gradients(plan, program, store, 1, 0);
    const cpu::StepContext context = cpu::make_step_context(plan, 1, 0);
    const DistributedParam& p = plan.model.params.front();
    const std::int64_t rows = std::min(p.rows(), p.cols()), cols = std::max(p.rows(), p.cols());
    std::vector<float> x(static_cast<std::size_t>(rows * cols), 0.5f);
    std::vector<float> c(static_cast<std::size_t>(rows * rows));
    std::vector<float> values(static_cast<std::size_t>(p.numel()), 0.25f);
    std::vector<std::byte> wire(static_cast<std::size_t>(p.numel() * 2));
    const auto call = [&](int kernel) {
      if (elementwise)  // momentum, apply_update, adamw: ops 0, 2, 3
        cpu::run_compute(*program.find(kernel == 0 ? 0 : kernel + 1), store, context);
      else if (kernel < 3)
        cpu::run_compute(*program.find(kernel), store, context);
      else if (kernel == 3)
        cpu_gemm_abt(rows, rows, cols, x.data(), x.data(), c.data());
      else
        cpu::encode_into(values.data(), p.numel(), DType::bf16, wire.data());
    };
    std::vector<double> times(static_cast<std::size_t>(kKernels * repeats));
    for (int j = 0; j < (elementwise ? kElementwise : kKernels); ++j) {
      // Warm-up calls, the first of them timed to size the rounds.
      barrier();
      auto t0 = Clock::now();
      call(j);
      const double first = std::max(1e-7, since(t0));
      for (int k = 1; k < warmup; ++k) call(j);
      const int calls =
          agree(static_cast<int>(std::clamp(std::ceil(kRoundSeconds / first), 1.0, 10000.0)));
      for (int k = 0; k < repeats; ++k) {
        // Concurrent: every rank at once. Alone: the ranks take turns, the others waiting in
        // the barrier (sleeping), so each rank has a core to itself.
        for (int turn = 0; turn < (concurrent ? 1 : size); ++turn) {
          barrier();
          if (!concurrent && turn != rank) continue;
          t0 = Clock::now();
          for (int i = 0; i < calls; ++i) call(j);
          times[static_cast<std::size_t>(j * repeats + k)] = since(t0) / calls;
        }
      }
    }
    mine.insert(mine.end(), times.begin(), times.end());
  }
  std::vector<double> slowest(mine.size());
  MPI_Request request = MPI_REQUEST_NULL;
  MUONBED_MPI_CHECK(MPI_Ireduce(mine.data(), slowest.data(), static_cast<int>(mine.size()),
                                MPI_DOUBLE, MPI_MAX, 0, world, &request));
  wait_for(request, timeout_s, where, "reducing the timings");
  if (rank != 0) return {};
  std::vector<ComputeBenchRow> rows;
  std::size_t at = 0;
  for (const StepPlan& plan : plans) {
    const DistributedParam& p = plan.model.params.front();
    const NsCallShape shape{p.batch(), p.rows(), p.cols()};
    if (elementwise_plan(plan)) {
      for (int j = 0; j < kElementwise; ++j) {
        const std::size_t first = at + static_cast<std::size_t>(j * repeats);
        std::vector<double> v(slowest.begin() + static_cast<std::ptrdiff_t>(first),
                              slowest.begin() + static_cast<std::ptrdiff_t>(first + repeats));
        ComputeBenchRow r;
        r.kernel = elementwise_names[j];
        r.numel = p.numel();
        r.seconds = median(v);
        r.model_bytes = op_memory_bytes(plan, plan.ops[j == 0 ? 0 : j + 1], 0);
        r.step_sized = true;
        rows.push_back(r);
      }
      at += static_cast<std::size_t>(kKernels * repeats);  // the plan's slots (see `times`)
      continue;
    }
    for (int j = 0; j < kKernels; ++j) {
      std::vector<double> v(slowest.begin() + static_cast<std::ptrdiff_t>(at),
                            slowest.begin() + static_cast<std::ptrdiff_t>(at + repeats));
      at += static_cast<std::size_t>(repeats);
      ComputeBenchRow r;
      r.kernel = names[j];
      r.shape = shape;
      r.numel = p.numel();
      r.seconds = median(v);
      const std::int64_t m = std::min(p.rows(), p.cols()), n = std::max(p.rows(), p.cols());
      if (j == 0 || j == 2) r.model_bytes = op_memory_bytes(plan, plan.ops[j], 0);
      if (j == 1) r.flops = op_flops(plan, plan.ops[1], 0);
      if (j == 3) {
        r.flops = 2.0 * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(n);
        r.shape = {1, m, n};
        r.numel = m * n;
      }
      if (j == 4) r.model_bytes = static_cast<double>(p.numel()) * (4 + 2);
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace muonbed::mpi
