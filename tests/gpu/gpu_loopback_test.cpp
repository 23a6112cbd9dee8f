// The CUDA handlers and the CUDA loopback runtime (backends/gpu) on a GPU, against the CPU:
//   * data movement bit for bit: with Newton-Schulz as the identity on both sides, every plan of
//     the invariant matrix and the hard cases leaves every rank's parameters and optimizer state
//     equal, bit for bit, to the CPU loopback executor's (every collective, pack, unpack, keep
//     copy, the fused momentum / apply / AdamW kernels and QK-clip);
//   * the real step against the single-device reference (the GPU's NS is bf16, the reference's
//     fp32: cpu::kBf16NsCheck, state bit for bit, each parameter within 10 % of its movement),
//     over the same matrix, both optimizer variants, three steps;
//   * the negative control (a dropped broadcast) fails the check, naming the rank and tensor;
//   * a step captured as a CUDA graph gives the same bits as the eager step, over level-scheduled
//     sync's hyper-period (one graph per pattern of active ops).
// Label gpu: skipped (exit 77, gpu_probe.cpp) without a CUDA device.
#include <catch2/catch.hpp>

#include <cstring>

#include "backends/cpu/check.hpp"
#include "backends/cpu/data.hpp"
#include "backends/gpu/cuda_loopback.hpp"
#include "backends/loopback/loopback.hpp"
#include "kernels/bf16.hpp"
#include "tests/common/equivalence_cases.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

namespace {

constexpr int kSteps = 3;
constexpr std::uint64_t kSeed = 20260101;

// The CPU handlers with Newton-Schulz as the identity (the update rounded to the comm dtype).
void cpu_compute_ns_identity(const RankOp& op, cpu::RankStore& store,
                             const cpu::StepContext& context) {
  if (op.kind != OpKind::newton_schulz) return cpu::run_compute(op, store, context);
  for (const auto& t : op.newton_schulz) {
    std::vector<float> x = store.read(t.data);
    if (context.plan->settings.optimizer.comm_dtype == DType::bf16)
      round_to_bf16(x.data(), static_cast<std::int64_t>(x.size()));
    store.write(t.data, x.data());
  }
  cpu::run_keep(op, store);
}

// The first element of a parameter or optimizer-state tensor (rank, tensor, element) where two
// runs differ in bits, or "".
std::string first_difference(const StepPlan& plan, gpu::CudaLoopbackExecutor& gpu_run,
                             std::function<const cpu::RankStore&(int)> other) {
  for (int r = 0; r < plan.model.mesh.world_size(); ++r) {
    const cpu::RankStore& a = gpu_run.store(r);
    const cpu::RankStore& b = other(r);
    for (const ProgramTensor& t : a.program().tensors) {
      // The state a step leaves: parameters and optimizer state (the gradient slot is scratch).
      if (t.transient || t.role == PieceRole::gradient) continue;
      // Both hold the tensor in its plan dtype; compared as values widened to fp32.
      const std::vector<float> x = a.read(t.id, 0, t.numel);
      const std::vector<float> y = b.read(t.id, 0, t.numel);
      for (std::int64_t i = 0; i < t.numel; ++i)
        if (std::memcmp(&x[i], &y[i], 4) != 0)
          return "rank " + std::to_string(r) + ", " + t.name + " (" +
                 std::string(to_string(t.dtype)) + ")[" + std::to_string(i) + "]: GPU " +
                 std::to_string(x[i]) + ", other " + std::to_string(y[i]);
    }
  }
  return "";
}

std::string data_movement_difference(const StepPlan& plan) {
  LoopbackOptions cpu_options;
  cpu_options.seed = kSeed;
  cpu_options.compute = cpu_compute_ns_identity;
  LoopbackExecutor cpu_run(plan, cpu_options);
  cpu_run.run(kSteps);
  gpu::CudaLoopbackOptions options;
  options.seed = kSeed;
  options.device.poison = true;
  options.device.ns_identity = true;
  gpu::CudaLoopbackExecutor gpu_run(plan, options);
  gpu_run.run(kSteps);
  return first_difference(plan, gpu_run,
                          [&](int r) -> const cpu::RankStore& { return cpu_run.store(r); });
}

std::string reference_difference(const StepPlan& plan, const Model& model,
                                 const RoutingRules& routing, const LowerOptions& lower = {}) {
  cpu::ReferenceRun reference(plan, model, routing, kSeed);
  reference.run_to(kSteps);
  gpu::CudaLoopbackOptions options;
  options.seed = kSeed;
  options.device.poison = true;
  options.lower = lower;
  gpu::CudaLoopbackExecutor gpu_run(plan, options);
  gpu_run.run(kSteps);
  for (int r = 0; r < plan.model.mesh.world_size(); ++r) {
    const auto mismatch = cpu::first_mismatch(plan, gpu_run.store(r), reference, cpu::kBf16NsCheck);
    if (mismatch) return mismatch->message;
  }
  return "";
}

}  // namespace

TEST_CASE("CUDA loopback: data movement equals the CPU loopback bit for bit", "[gpu][loopback]") {
  for (const auto& topology : testing::topologies()) {
    const Model model = *find_preset(topology.model);
    const ShardedModel sharded = testing::make_model(topology);
    for (const auto& variant : testing::kVariants)
      for (const auto& options : testing::strategies()) {
        if (!testing::gpu_runs(options)) continue;
        const StepPlan plan = build_plan(sharded, options, testing::settings_of(variant, model));
        INFO("topology " << topology.name << ", " << variant.name << ", strategy "
                         << options.to_json_text());
        CHECK(data_movement_difference(plan) == "");
      }
  }
}

TEST_CASE("CUDA loopback: uneven splits and empty shards move data bit for bit",
          "[gpu][loopback][hard]") {
  const Model model = testing::odd_model();
  for (const auto& dims : std::vector<std::vector<MeshDim>>{
           {{"dp_shard", 4, DimRole::fsdp}},
           {{"dp_shard", 2, DimRole::fsdp}, {"tp", 3, DimRole::tp}},
           {{"dp_replicate", 2, DimRole::replicate}, {"dp_shard", 3, DimRole::fsdp}},
           {{"dp_shard", 3, DimRole::fsdp}, {"ep", 2, DimRole::ep}},
           {{"pp", 2, DimRole::pp}, {"dp_shard", 3, DimRole::fsdp}},
           {{"dp_shard", 7, DimRole::fsdp}}}) {
    const ShardedModel sharded = parallelize(model, DeviceMesh(dims, 8), ParallelRules{});
    for (const auto& variant : testing::kVariants)
      for (const auto& options : testing::strategies()) {
        if (!testing::gpu_runs(options)) continue;
        const StepPlan plan = build_plan(sharded, options, testing::settings_of(variant, model));
        INFO(DeviceMesh(dims, 8).describe()
             << ", " << variant.name << ", strategy " << options.to_json_text());
        CHECK(data_movement_difference(plan) == "");
        CHECK(reference_difference(plan, model, RoutingRules{}) == "");
      }
  }
}

TEST_CASE("CUDA loopback: every strategy within bf16 NS tolerance of the single-device reference",
          "[gpu][loopback]") {
  for (const auto& topology : testing::topologies()) {
    const Model model = *find_preset(topology.model);
    const ShardedModel sharded = testing::make_model(topology);
    for (const auto& variant : testing::kVariants)
      for (const auto& options : testing::strategies()) {
        if (!testing::gpu_runs(options)) continue;
        const StepPlan plan = build_plan(sharded, options, testing::settings_of(variant, model));
        INFO("topology " << topology.name << ", " << variant.name << ", strategy "
                         << options.to_json_text());
        CHECK(reference_difference(plan, model, ParallelRules{}.routing) == "");
      }
  }
}

TEST_CASE("CUDA loopback: negative control, one broadcast dropped", "[gpu][loopback][negative]") {
  const Model model = *find_preset("tiny-dense");
  const ShardedModel sharded = parallelize(
      model,
      DeviceMesh({{"dp_replicate", 2, DimRole::replicate}, {"dp_shard", 2, DimRole::fsdp}}, 4),
      ParallelRules{});
  const StepPlan full =
      build_plan(sharded, StrategyOptions{}, testing::settings_of(testing::kVariants[1], model));
  int dropped = -1;
  for (const Op& op : full.ops)
    if (op.kind == OpKind::broadcast && dropped < 0) dropped = op.id;
  REQUIRE(dropped >= 0);
  const std::string name = full.model.params[full.ops[dropped].params[0]].name;
  const StepPlan plan = testing::drop_op(full, dropped);
  LowerOptions lower;
  lower.allow_stale_reads = true;
  const std::string message = reference_difference(plan, model, RoutingRules{}, lower);
  INFO(message);
  CHECK_THAT(message, Catch::Contains("parameter of '" + name + "'") &&
                          Catch::Contains("differs from the single-device reference"));
}

TEST_CASE("CUDA loopback: a captured CUDA graph gives the eager step's bits", "[gpu][graph]") {
  const Model model = testing::odd_model();
  const ShardedModel sharded = parallelize(
      model,
      DeviceMesh({{"dp_replicate", 2, DimRole::replicate}, {"dp_shard", 2, DimRole::fsdp}}, 8),
      ParallelRules{});
  for (const char* name : {"owner", "all_to_all", "owner_allgather"}) {
    StrategyOptions options;
    options.name = name;
    options.grad_sync.enabled = true;
    options.grad_sync.level_periods = {1, 2};
    const StepPlan plan =
        build_plan(sharded, options, testing::settings_of(testing::kVariants[0], model));
    INFO("strategy " << name);
    gpu::CudaLoopbackOptions eager_options;
    eager_options.seed = kSeed;
    gpu::CudaLoopbackExecutor eager(plan, eager_options);
    gpu::CudaLoopbackOptions graph_options = eager_options;
    graph_options.graph = true;
    gpu::CudaLoopbackExecutor graph(plan, graph_options);
    for (int k = 0; k < 4; ++k) {
      eager.run_step();
      graph.run_step();
      CHECK(graph.last_step().captured == (k < 2));  // two patterns of active ops
    }
    CHECK(first_difference(plan, graph,
                           [&](int r) -> const cpu::RankStore& { return eager.store(r); }) == "");
  }
}
