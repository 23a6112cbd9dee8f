// What the executors hold against what the plan says a rank holds (rank_memory,
// core/plan/plan.hpp), over the invariant matrix (9 topologies x the strategy variants,
// tests/common) in both optimizer variants, with optimizer state in fp32 and in bf16:
//   * CPU (backends/cpu's RankStore, the loopback and MPI executors' memory): the bytes the store
//     holds, measured from its storage, are rank_memory's: static tensors exactly, and the peak of
//     live plan buffers exactly when allocs and releases run in plan order. A real loopback run
//     (the engine's order, which may run one stream's alloc before another's release) holds the
//     same static bytes, frees every buffer, and peaks within twice the plan's peak of buffers
//     (see kExecutionPeakFactor).
//   * GPU (backends/gpu/layout.hpp's pool, laid out on the host from the same program): the static
//     region is rank_memory's static bytes plus each tensor's padding to kPoolAlignBytes (< 256
//     bytes a tensor), the transient region at least the plan's peak and at most kFirstFitFactor
//     times it; scratch and NS workspaces come on top by design (program.hpp).
//   * llama-7B at world size 1 (issue 25's case): the bytes are the plan's, not 4 per element; the
//     pool is within kLlamaPoolTolerance of rank_memory's peak, and with the fp32 scratch within
//     kLlamaDeviceTolerance. A hidden case ([.llama-host], ~7 GB) holds one rank of llama-7B over 8
//     ranks in a real CPU store and checks the process's resident memory against the plan.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "backends/cpu/store.hpp"
#include "backends/gpu/layout.hpp"
#include "backends/loopback/loopback.hpp"
#include "tests/common/equivalence_cases.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

namespace {

// A real run may hold, at its peak, buffers that plan order never holds at once: a redistribution
// stage on one stream beside the next unit's gather stage on another, or the pipeline of small
// matrices beside the main one (the engine starts each op as soon as the semantics allow;
// tests/backends/equivalence_test.cpp). Not a theorem: over this matrix the worst rank run held
// 2.0x the plan-order peak (184 of 3,072 rank runs held more than it); the bound pins that, so an
// engine or plan change that holds more is seen. The GPU pool is laid out in plan order and its
// allocs wait for the releases whose space they reuse, so it never holds more than its layout.
constexpr std::int64_t kExecutionPeakFactor = 2;

// The GPU pool's transient region against the plan's peak of buffers: first fit along plan order
// leaves gaps (a buffer larger than any hole goes above them), and every buffer starts aligned.
// Not a theorem either: over this matrix the worst rank's region is 1.375x the peak; the bound
// pins that with some room, so a layout change that fragments more is seen.
constexpr double kFirstFitFactor = 1.5;

// llama-7B at world size 1: the pool (the plan's tensors) is at most 1 % above rank_memory's peak
// (measured: 0.12 %, the first-fit gaps of its ~0.2 GB of buffers), and with the per-stream fp32
// scratch the kernels compute in at most 5 % (measured: 4.4 %; scratch is sized by the largest
// single tensor an op touches, the embedding's momentum).
constexpr double kLlamaPoolTolerance = 0.01;
constexpr double kLlamaDeviceTolerance = 0.05;

std::int64_t aligned(std::int64_t bytes) {
  return (bytes + gpu::kPoolAlignBytes - 1) / gpu::kPoolAlignBytes * gpu::kPoolAlignBytes;
}

struct Tally {
  int plans = 0, ranks = 0, execution_above_plan = 0, bf16_tensors = 0;
  double worst_ratio = 1;
};

void check_cpu(const StepPlan& plan, Tally& tally) {
  ++tally.plans;
  for (int r = 0; r < plan.model.mesh.world_size(); ++r) {
    INFO("rank " << r);
    const RankMemory planned = rank_memory(plan, r);
    const RankProgram program = lower_rank_program(plan, r);
    // Allocs and releases in plan order.
    cpu::RankStore store(program);
    CHECK(store.static_bytes() == planned.static_bytes);
    for (const RankOp& op : program.ops) {
      if (op.kind == OpKind::alloc) store.allocate(op.tensor);
      if (op.kind == OpKind::release) store.release(op.tensor);
    }
    CHECK(store.peak_transient_bytes() == planned.peak_transient_bytes);
    CHECK(store.peak_bytes() == planned.peak_bytes());
    CHECK(store.live_transient_bytes() == 0);
    for (const ProgramTensor& t : program.tensors)
      if (t.dtype == DType::bf16 && t.numel > 0) ++tally.bf16_tensors;
    ++tally.ranks;
  }
  // A real run, in the engine's order.
  LoopbackExecutor executor(plan);
  executor.run(2);
  for (int r = 0; r < plan.model.mesh.world_size(); ++r) {
    INFO("rank " << r << " after a loopback run");
    const RankMemory planned = rank_memory(plan, r);
    const cpu::RankStore& store = executor.store(r);
    CHECK(store.static_bytes() == planned.static_bytes);
    CHECK(store.live_transient_bytes() == 0);
    CHECK(store.peak_transient_bytes() <= kExecutionPeakFactor * planned.peak_transient_bytes);
    if (store.peak_transient_bytes() > planned.peak_transient_bytes) {
      ++tally.execution_above_plan;
      tally.worst_ratio =
          std::max(tally.worst_ratio, static_cast<double>(store.peak_transient_bytes()) /
                                          static_cast<double>(planned.peak_transient_bytes));
    }
  }
}

void check_gpu(const StepPlan& plan, double& worst_fragmentation) {
  for (int r = 0; r < plan.model.mesh.world_size(); ++r) {
    INFO("rank " << r);
    const RankMemory planned = rank_memory(plan, r);
    const RankProgram program = lower_rank_program(plan, r);
    const gpu::PoolLayout pool = gpu::plan_pool(plan, program);
    std::int64_t padded_static = 0, padded_buffers = 0, static_tensors = 0;
    for (const ProgramTensor& t : program.tensors) {
      if (t.transient) {
        padded_buffers += aligned(std::max<std::int64_t>(t.bytes, 1));
      } else {
        padded_static += aligned(t.bytes);
        ++static_tensors;
      }
    }
    CHECK(pool.static_bytes == padded_static);
    CHECK(pool.static_bytes - planned.static_bytes < gpu::kPoolAlignBytes * (static_tensors + 1));
    CHECK(pool.peak_live_bytes == planned.peak_transient_bytes);
    CHECK(pool.transient_bytes >= planned.peak_transient_bytes);
    CHECK(pool.transient_bytes <= padded_buffers);
    CHECK(static_cast<double>(pool.transient_bytes) <=
          kFirstFitFactor * static_cast<double>(planned.peak_transient_bytes));
    // So the pool's peak (it is allocated once, at its full size) against rank_memory's.
    CHECK(static_cast<double>(pool.bytes() - planned.peak_bytes()) <=
          static_cast<double>(gpu::kPoolAlignBytes * (static_tensors + 1)) +
              (kFirstFitFactor - 1) * static_cast<double>(planned.peak_transient_bytes));
    if (planned.peak_transient_bytes > 0)
      worst_fragmentation =
          std::max(worst_fragmentation, static_cast<double>(pool.transient_bytes) /
                                            static_cast<double>(planned.peak_transient_bytes));
  }
}

}  // namespace

TEST_CASE("memory: the CPU store holds rank_memory's bytes over the invariant matrix", "[memory]") {
  Tally tally;
  for (const auto& topology : testing::topologies()) {
    const Model model = *find_preset(topology.model);
    const ShardedModel sharded = testing::make_model(topology);
    for (const auto& variant : testing::kVariants)
      for (const DType state : {DType::fp32, DType::bf16})
        for (const auto& options : testing::strategies()) {
          PlanSettings settings = testing::settings_of(variant, model);
          settings.state_dtype = state;
          const StepPlan plan = build_plan(sharded, options, settings);
          INFO("topology " << topology.name << ", " << variant.name << ", state "
                           << to_string(state) << ", strategy " << options.to_json_text());
          check_cpu(plan, tally);
        }
  }
  CHECK(tally.plans == 9 * 2 * 2 * static_cast<int>(testing::strategies().size()));
  CHECK(tally.bf16_tensors > 1000);  // the matrix stores bf16 (parameters, bf16 comm, state)
  WARN("CPU store: " << tally.plans << " plans, " << tally.ranks << " ranks; a loopback run peaks "
                     << "above the plan-order peak on " << tally.execution_above_plan
                     << " rank runs, at most " << tally.worst_ratio << "x");
}

TEST_CASE("memory: the GPU pool holds rank_memory's bytes plus alignment over the invariant matrix",
          "[memory]") {
  double worst_fragmentation = 1;
  for (const auto& topology : testing::topologies()) {
    const Model model = *find_preset(topology.model);
    const ShardedModel sharded = testing::make_model(topology);
    for (const auto& variant : testing::kVariants)
      for (const DType state : {DType::fp32, DType::bf16})
        for (const auto& options : testing::strategies()) {
          if (!testing::gpu_runs(options)) continue;
          PlanSettings settings = testing::settings_of(variant, model);
          settings.state_dtype = state;
          const StepPlan plan = build_plan(sharded, options, settings);
          INFO("topology " << topology.name << ", " << variant.name << ", state "
                           << to_string(state) << ", strategy " << options.to_json_text());
          check_gpu(plan, worst_fragmentation);
        }
  }
  WARN("GPU pool: transient region at most "
       << worst_fragmentation << "x the plan's peak of buffers (first fit, aligned)");
}

TEST_CASE("memory: llama-7B at world size 1 is held in the plan's dtypes", "[memory][llama]") {
  // Issue 25's case: every element in fp32 took ~84 GB. At world size 1 a rank holds every
  // parameter whole (its dtype, bf16), its gradient slot (bf16: the wider of bf16 parameters and
  // bf16 comm), Muon's momentum (fp32 state) and AdamW's two moments (fp32): bytes from the model
  // alone, against the lowered program, the store's accounting and the GPU pool.
  const Model model = *find_preset("llama-7b");
  const ShardedModel sharded =
      parallelize(model, DeviceMesh({{"dp_shard", 1, DimRole::fsdp}}, 8), ParallelRules{});
  const StepPlan plan = build_plan(sharded, StrategyOptions{}, PlanSettings{});
  std::int64_t by_hand = 0, numel = 0;
  for (const auto& dp : sharded.params) {
    REQUIRE(dp.dtype == DType::bf16);
    numel += dp.numel();
    by_hand += dp.numel() * (2 + 2 + (dp.optimizer == OptimizerKind::muon ? 4 : 8));
  }
  const RankMemory planned = rank_memory(plan, 0);
  const RankProgram program = lower_rank_program(plan, 0);
  CHECK(planned.static_bytes == by_hand);
  CHECK(program.memory().static_bytes == by_hand);
  const gpu::PoolLayout pool = gpu::plan_pool(plan, program);
  CHECK(pool.static_bytes >= by_hand);
  CHECK(pool.static_bytes - by_hand <
        gpu::kPoolAlignBytes * static_cast<std::int64_t>(program.tensors.size()));
  CHECK(pool.transient_bytes >= planned.peak_transient_bytes);
  CHECK(pool.bytes() >= planned.peak_bytes());
  CHECK(static_cast<double>(pool.bytes()) <=
        (1 + kLlamaPoolTolerance) * static_cast<double>(planned.peak_bytes()));
  // What storing every element as fp32 held: the static tensors alone, 4 bytes an element.
  std::int64_t static_numel = 0;
  for (const ProgramTensor& t : program.tensors)
    if (!t.transient) static_numel += t.numel;
  CHECK(4 * static_numel > pool.bytes());
  // The device also holds each stream's fp32 scratch (the largest op's working copies and
  // staging, as device_rank.cpp sizes it) and NS workspaces (not sized without CUDA).
  std::map<int, std::int64_t> scratch;  // plan stream -> fp32 elements
  for (const RankOp& op : program.ops) {
    std::int64_t& s = scratch[plan.ops.at(static_cast<std::size_t>(op.op)).stream];
    s = std::max(s, gpu::op_scratch(op).elements);
  }
  std::int64_t scratch_bytes = 0;
  for (const auto& [stream, elements] : scratch) scratch_bytes += 4 * elements;
  CHECK(static_cast<double>(pool.bytes() + scratch_bytes) <=
        (1 + kLlamaDeviceTolerance) * static_cast<double>(planned.peak_bytes()));
  const double gb = 1e9;
  WARN("llama-7B, world size 1, owner: "
       << numel << " parameters; rank_memory static " << planned.static_bytes / gb
       << " GB + peak buffers " << planned.peak_transient_bytes / gb
       << " GB = " << planned.peak_bytes() / gb << " GB; GPU pool static " << pool.static_bytes / gb
       << " GB + transient " << pool.transient_bytes / gb << " GB = " << pool.bytes() / gb
       << " GB (+ fp32 scratch " << scratch_bytes / gb
       << " GB); every element in fp32: " << 4 * static_numel / gb << " GB static");
}

namespace {

// The process's resident set (VmRSS) or its high-water mark (VmHWM) from /proc/self/status, bytes.
std::int64_t proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return 1024 * std::stoll(line.substr(key.size() + 1));
  return -1;
}

}  // namespace

TEST_CASE("memory: one rank of llama-7B over 8 ranks held by a real CPU store", "[.llama-host]") {
  // Hidden (~7 GB of host memory, ~1 min): `backends_tests "[.llama-host]"`. The quickstart's plan
  // (experiments/quickstart.yaml: llama-7b, dp_shard 8, owner). Rank 0's store allocates its
  // tensors in their dtypes and its buffers in plan order; what the OS reports resident grows by
  // the plan's static bytes (zero-filled, so every page is touched), within 1 % plus 16 MiB of
  // allocator slack.
  const Model model = *find_preset("llama-7b");
  const ShardedModel sharded =
      parallelize(model, DeviceMesh({{"dp_shard", 8, DimRole::fsdp}}, 8), ParallelRules{});
  const StepPlan plan = build_plan(sharded, StrategyOptions{}, PlanSettings{});
  const RankMemory planned = rank_memory(plan, 0);
  const RankProgram program = lower_rank_program(plan, 0);
  const std::int64_t resident_before = proc_status_bytes("VmRSS");
  REQUIRE(resident_before > 0);
  cpu::RankStore store(program);
  const std::int64_t resident_static = proc_status_bytes("VmRSS") - resident_before;
  for (const RankOp& op : program.ops) {
    if (op.kind == OpKind::alloc) store.allocate(op.tensor);
    if (op.kind == OpKind::release) store.release(op.tensor);
  }
  CHECK(store.static_bytes() == planned.static_bytes);
  CHECK(store.peak_bytes() == planned.peak_bytes());
  CHECK(static_cast<double>(std::abs(resident_static - planned.static_bytes)) <=
        0.01 * static_cast<double>(planned.static_bytes) + 16.0 * (1 << 20));
  const double gb = 1e9;
  WARN("llama-7B, rank 0 of 8 (owner): rank_memory static "
       << planned.static_bytes / gb << " GB + peak buffers " << planned.peak_transient_bytes / gb
       << " GB = " << planned.peak_bytes() / gb << " GB; CPU store static "
       << store.static_bytes() / gb << " GB (resident growth " << resident_static / gb
       << " GB, /proc/self/status) + peak buffers " << store.peak_transient_bytes() / gb
       << " GB = " << store.peak_bytes() / gb << " GB; process high-water mark "
       << proc_status_bytes("VmHWM") / gb << " GB");
}
