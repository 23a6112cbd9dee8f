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
// with every phase the plan has taking time. Then the paired measurement of issue 24's Muon
// overhead: the loop runs two executors' timed steps alternately (a fake executor records the
// order of its run_step calls), and the FSDP point measured with its AdamW twin in one job gives
// both records, the twin's with as many timed steps as the point's, and one overhead per pair.
//
//   mpirun -np 2 mpi_training [--compute threads|progress_points]
//
// prints one line per case on rank 0 and PASS: when all pass.
#include <mpi.h>

#include <cmath>
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

// One warm-up and `timed` steps, no trace, a made-up cluster (the tests check structure, not
// speed).
mpi::MeasureSettings test_measure_settings(int timed) {
  mpi::MeasureSettings settings;
  settings.warmup_steps = 1;
  settings.timed_steps = timed;
  settings.trace_ranks = 0;
  settings.cluster_name = "test";
  settings.peak_tflops = 0.1;
  return settings;
}

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

StepPlan plan_of(const Case& c, const Model& model, bool everything_to_adamw = false) {
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
  ParallelRules rules;
  rules.routing.everything_to_adamw = everything_to_adamw;
  return build_plan(parallelize(model, DeviceMesh(c.dims, world), rules), options, settings);
}

mpi::ComputeMode g_compute = mpi::ComputeMode::automatic;

// An executor that runs nothing: it appends "<name><step>" to a shared log for each run_step,
// and reports `messages` messages per step.
class LoggingRank final : public mpi::MeasuredRank {
 public:
  LoggingRank(std::string name, double messages, std::vector<std::string>& log)
      : name_(std::move(name)), log_(log) {
    timings_.messages = messages;
  }
  void run_step(int step) override {
    log_.push_back(name_ + std::to_string(step));
    timings_.step = step;
  }
  const mpi::StepTimings& timings() const override { return timings_; }
  int rank() const override { return 0; }
  const std::vector<int>& host_of() const override { return host_of_; }
  const std::vector<std::string>& hosts() const override { return hosts_; }
  int compute_threads() const override { return 0; }
  void run_check_step(int) override {}

 private:
  std::string name_;
  std::vector<std::string>& log_;
  mpi::StepTimings timings_;
  std::vector<int> host_of_ = {0};
  std::vector<std::string> hosts_ = {"here"};
};

// The loop's order, by hand: 2 warm-up steps each, one executor after the other, then 3 timed
// rounds alternating a, b; each keeps its own timed steps 2, 3, 4; messages summed per executor
// over its 5 steps (1 and 10 per step).
std::string check_interleaving() {
  std::vector<std::string> log;
  LoggingRank a("a", 1, log), b("b", 10, log);
  std::vector<double> messages;
  const auto kept = mpi::run_interleaved_steps({&a, &b}, 2, 3, messages);
  const std::vector<std::string> expected = {"a0", "a1", "b0", "b1", "a2",
                                             "b2", "a3", "b3", "a4", "b4"};
  if (log != expected) {
    std::string got;
    for (const std::string& s : log) got += s + " ";
    return "run_step order " + got + "(expected a0 a1 b0 b1 a2 b2 a3 b3 a4 b4)";
  }
  if (kept.size() != 2) return "kept timings of " + std::to_string(kept.size()) + " executors";
  for (const auto& steps : kept)
    if (steps.size() != 3 || steps[0].step != 2 || steps[2].step != 4)
      return "an executor kept the wrong timed steps";
  if (messages != std::vector<double>{5, 50})
    return "messages " + std::to_string(messages[0]) + ", " + std::to_string(messages[1]) +
           " (expected 5 and 50)";
  return "";
}

// The point and its AdamW twin measured in one job: rank 0 gets both records, each with the
// timed steps asked for, and one overhead per pair of steps with its spread.
std::string check_paired(const Case& c, const Model& model, int rank) {
  const StepPlan plan = plan_of(c, model);
  const StepPlan twin = plan_of(c, model, true);
  const auto runs_newton_schulz = [](const StepPlan& p) {
    for (const Op& op : p.ops)
      if (op.kind == OpKind::newton_schulz || op.kind == OpKind::split_newton_schulz) return true;
    return false;
  };
  if (!runs_newton_schulz(plan) || runs_newton_schulz(twin))
    return "the test's plans: the point must run Newton-Schulz and its AdamW twin none";
  mpi::ExecutorOptions options;
  options.seed = kSeed;
  options.timeout_s = 60;
  options.compute_mode = g_compute;
  const mpi::MeasureSettings settings = test_measure_settings(3);
  const std::optional<mpi::Measured> m =
      mpi::measure(plan, MPI_COMM_WORLD, options, settings, &twin);
  if (rank != 0) return m ? "a rank other than 0 got a record" : "";
  if (!m) return "rank 0 got no record";
  if (!m->twin) return "no twin record came back with the point's";
  const TrainingResult& t = m->record.training;
  if (m->record.step.measured.timed_steps != 3 || m->twin->step.measured.timed_steps != 3)
    return "timed steps: point " + std::to_string(m->record.step.measured.timed_steps) + ", twin " +
           std::to_string(m->twin->step.measured.timed_steps) + " (expected 3 each)";
  if (!m->twin->training.present) return "the twin's record has no training section";
  if (!(m->twin->step.measured.median_s > 0)) return "the twin's median step is not positive";
  if (t.overhead_pairs != 3) return "overhead_pairs " + std::to_string(t.overhead_pairs);
  // The spread from the two records' own per-step times (step.patterns, in the order run): the
  // population standard deviation of step i / twin step i - 1.
  const std::vector<StepPatternResult>& a = m->record.step.patterns;
  const std::vector<StepPatternResult>& b = m->twin->step.patterns;
  if (a.size() != 3 || b.size() != 3) return "the records do not list their 3 timed steps";
  std::vector<double> overheads;
  double mean = 0, variance = 0;
  for (std::size_t i = 0; i < 3; ++i) overheads.push_back(a[i].time_s / b[i].time_s - 1);
  for (double o : overheads) mean += o / 3;
  for (double o : overheads) variance += (o - mean) * (o - mean) / 3;
  if (!std::isfinite(t.overhead_spread) ||
      std::abs(t.overhead_spread - std::sqrt(variance)) > 1e-9 * (1 + std::sqrt(variance)))
    return "overhead_spread " + std::to_string(t.overhead_spread) + ", the steps' pairs give " +
           std::to_string(std::sqrt(variance));
  bool noted = false;
  for (const std::string& note : m->record.notes)
    noted = noted || note.find("measured interleaved") != std::string::npos;
  if (!noted) return "no note says the twin was measured interleaved";
  // The per-pair overheads from the two records' step times, by their definition.
  const std::vector<double> pairs = mpi::paired_overheads({0.3, 0.2}, {0.2, 0.25});
  if (pairs.size() != 2 || std::abs(pairs[0] - 0.5) > 1e-12 || std::abs(pairs[1] + 0.2) > 1e-12)
    return "paired_overheads({0.3, 0.2}, {0.2, 0.25}) is not {+0.5, -0.2}";
  return "";
}

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
  const mpi::MeasureSettings settings = test_measure_settings(2);
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
  const auto verdict = [&](const std::string& name, const std::string& problem) {
    // Every rank's verdict: the first problem of any rank fails the case.
    int bad = problem.empty() ? 0 : 1, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!problem.empty()) std::cerr << "rank " << rank << ", " << name << ": " << problem << "\n";
    if (rank == 0) std::cout << (any ? "FAIL " : "ok   ") << name << std::endl;
    failed += any;
  };
  for (const Case& c : cases) {
    std::string problem;
    try {
      problem = check_rank(c, model, plan_of(c, model), rank);
    } catch (const std::exception& e) {
      mpi::abort_world("rank " + std::to_string(rank) + ", case " + c.name + ": " + e.what());
    }
    verdict(c.name, problem);
  }
  verdict("interleaved loop order", check_interleaving());
  std::string paired;
  try {
    paired = check_paired(cases.front(), model, rank);
  } catch (const std::exception& e) {
    mpi::abort_world("rank " + std::to_string(rank) + ", paired: " + e.what());
  }
  verdict("paired " + cases.front().name + " with its AdamW twin", paired);
  if (rank == 0)
    std::cout << (failed ? "FAIL: " : "PASS: ") << failed << " of " << cases.size() + 2
              << " training cases failed" << std::endl;
  MPI_Finalize();
  return failed ? 1 : 0;
}
