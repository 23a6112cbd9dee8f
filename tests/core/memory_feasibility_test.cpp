// The training-state memory model (core/plan/plan.hpp training_memory, memory_feasibility,
// training_memory_floor), useful FLOPs, and the cross-check of a point's backends
// (core/results/results.hpp cross_check_point), against hand-computed cases: a two-rank DDP step of
// one [4, 6] matrix and one [6] bias, whose every byte can be counted on paper, and the invariant
// matrix of topologies and strategies for the relations that must hold everywhere.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/model/parallelize.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/strategy.hpp"
#include "core/results/results.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

namespace {

// Two data-parallel ranks (DDP): each holds the whole [4, 6] matrix and the [6] bias.
ShardedModel ddp_model(DType dtype) {
  DeviceMesh mesh({{"dp_replicate", 2, DimRole::replicate}}, 2);
  Model model;
  model.name = "hand";
  model.num_layers = 1;
  model.params = {{"w", {4, 6}, dtype, ParamRole::mlp_up, 0},
                  {"b", {6}, dtype, ParamRole::bias, 0}};
  return parallelize(model, mesh, ParallelRules{});
}

StepPlan ddp_plan(DType dtype, TrainingMemoryOptions memory = {}, std::string strategy = "owner") {
  StrategyOptions options;
  options.name = std::move(strategy);
  PlanSettings settings;
  settings.training_memory = memory;
  return build_plan(ddp_model(dtype), options, settings);
}

}  // namespace

TEST_CASE("NS scratch: two iterates and two Grams of the smaller dim, in bf16", "[memory]") {
  // [3 x] 4 x 8: iterates 2 x 32 elements, Grams 2 x 4 x 4 = 32 elements; 96 x 2 bytes per matrix.
  CHECK(ns_workspace_bytes(4, 8, 3) == 3 * 96 * 2);
  CHECK(ns_workspace_bytes(8, 4, 1) == 96 * 2);  // orientation does not matter
}

TEST_CASE("training memory of a hand-counted DDP step", "[memory]") {
  const StepPlan plan = ddp_plan(DType::bf16);
  const int owner = plan.assignment.owner.at(0);
  for (int r = 0; r < 2; ++r) {
    const TrainingMemory m = training_memory(plan, r);
    // Every rank holds both tensors whole: 30 elements.
    CHECK(m.parameters == 30 * 2);
    CHECK(m.master_weights == 30 * 4);  // auto: bf16 parameters keep an fp32 copy
    // The gradient slot: the whole gradient of both, bf16 (param and comm dtypes are bf16).
    CHECK(m.gradients == 30 * 2);
    // What the optimizer step itself holds is rank_memory, part by part.
    const RankMemory step = rank_memory(plan, r);
    CHECK(m.optimizer_step().static_bytes == step.static_bytes);
    CHECK(m.optimizer_step().peak_transient_bytes == step.peak_transient_bytes);
    CHECK(m.parameters + m.gradients + m.optimizer_state == step.static_bytes);
    // The owner orthogonalizes the [4, 6] matrix: 2 x (24 + 16) bf16 elements of scratch.
    CHECK(m.ns_workspace == (r == owner ? 2 * (2 * 24 + 2 * 16) : 0));
    CHECK(m.activations == 0);
    CHECK(m.reserved == 0);
    CHECK(m.peak_bytes() == m.persistent() + m.transients());
  }
}

TEST_CASE("master weights follow the rule and the dtype", "[memory]") {
  TrainingMemoryOptions none;
  none.master_weights = MasterWeights::none;
  CHECK(training_memory(ddp_plan(DType::bf16, none), 0).master_weights == 0);
  // fp32 parameters need no master copy under auto, and get one when asked for.
  CHECK(training_memory(ddp_plan(DType::fp32), 0).master_weights == 0);
  TrainingMemoryOptions fp32;
  fp32.master_weights = MasterWeights::fp32;
  const TrainingMemory m = training_memory(ddp_plan(DType::fp32, fp32), 0);
  CHECK(m.parameters == 30 * 4);
  CHECK(m.master_weights == 30 * 4);
  // fp16 is lower precision too.
  CHECK(training_memory(ddp_plan(DType::fp16), 1).master_weights == 30 * 4);
}

TEST_CASE("activations and the step's transients do not overlap; reserved adds", "[memory]") {
  TrainingMemoryOptions options;
  options.activations_bytes = 1 << 20;  // far above the step's transients
  options.reserved_bytes = 1000;
  const StepPlan plan = ddp_plan(DType::bf16, options);
  for (int r = 0; r < 2; ++r) {
    const TrainingMemory m = training_memory(plan, r);
    REQUIRE(m.transients() < m.activations);
    CHECK(m.peak_bytes() == m.persistent() + (1 << 20) + 1000);
  }
  options.activations_bytes = 1;  // below the owner's NS scratch alone
  const StepPlan small = ddp_plan(DType::bf16, options);
  const TrainingMemory owner = training_memory(small, small.assignment.owner.at(0));
  CHECK(owner.peak_bytes() == owner.persistent() + owner.transients() + 1000);
}

TEST_CASE("feasibility counts the ranks over the limit and names the fullest", "[memory]") {
  const StepPlan plan = ddp_plan(DType::bf16);
  const int owner = plan.assignment.owner.at(0);
  const std::int64_t full = training_memory(plan, owner).peak_bytes();
  const std::int64_t other = training_memory(plan, 1 - owner).peak_bytes();
  REQUIRE(full > other);  // the owner also holds the NS scratch
  const MemoryFeasibility fits = memory_feasibility(plan, full);
  CHECK(fits.feasible());
  CHECK(fits.peak_rank == owner);
  CHECK(fits.peak_bytes == full);
  const MemoryFeasibility one = memory_feasibility(plan, full - 1);
  CHECK(one.over_ranks == 1);
  CHECK_FALSE(one.feasible());
  CHECK(memory_feasibility(plan, other - 1).over_ranks == 2);
  // No limit known: nothing is over it.
  CHECK(memory_feasibility(plan, 0).feasible());
  const std::string text = memory_feasibility_text(one, "G", 2);
  CHECK(text.find("exceeds") != std::string::npos);
  CHECK(text.find("on 1 of 2 ranks") != std::string::npos);
  CHECK(memory_feasibility_text(fits, "G", 2).find("fits") != std::string::npos);
}

TEST_CASE("the floor is below every strategy's training memory, part by part", "[memory]") {
  for (const auto& topology : testing::topologies()) {
    const ShardedModel model = testing::make_model(topology);
    for (const StrategyOptions& strategy : testing::strategies()) {
      PlanSettings settings;
      settings.training_memory.activations_bytes = 12345;
      const StepPlan plan = build_plan(model, strategy, settings);
      for (int r = 0; r < model.mesh.world_size(); ++r) {
        INFO(topology.name << " " << strategy.name << " rank " << r);
        const TrainingMemory floor = training_memory_floor(model, settings, r);
        const TrainingMemory m = training_memory(plan, r);
        CHECK(floor.parameters == m.parameters);
        CHECK(floor.master_weights == m.master_weights);
        CHECK(floor.gradients <= m.gradients);
        CHECK(floor.optimizer_state == 0);
        CHECK(floor.transients() == 0);
        CHECK(floor.activations == m.activations);
        CHECK(floor.peak_bytes() <= m.peak_bytes());
      }
    }
  }
}

TEST_CASE("useful FLOPs count each matrix once; replication executes more", "[memory]") {
  const StepPlan owner = ddp_plan(DType::bf16);
  // NS of [4, 6] once, momentum (Nesterov: 4) and update (4) per element of it, AdamW (14) per
  // element of the bias.
  const double expected =
      newton_schulz_flops(4, 6, owner.settings.ns_steps()) + 8.0 * 24 + 14.0 * 6;
  CHECK(useful_step_flops(owner) == Approx(expected).epsilon(1e-12));
  const StepPlan replicated = ddp_plan(DType::bf16, {}, "replicated");
  CHECK(useful_step_flops(replicated) == Approx(expected).epsilon(1e-12));
  double executed_ns = 0;
  for (const Op& op : replicated.ops)
    if (op.kind == OpKind::newton_schulz)
      for (int r = 0; r < 2; ++r) executed_ns += op_flops(replicated, op, r);
  // Both ranks orthogonalize the matrix.
  CHECK(executed_ns == Approx(2 * newton_schulz_flops(4, 6, owner.settings.ns_steps())));
}

namespace {

ResultRecord record(const std::string& backend, double average_s, double median_s = 0) {
  ResultRecord r;
  r.backend = backend;
  r.fidelity = backend == "sim" ? "flow" : (backend == "analytic" ? "closed_form" : "");
  r.provenance.experiment = "e";
  r.provenance.point = "p";
  r.step.average_s = average_s;
  if (median_s > 0) {
    r.step.measured.timed_steps = 3;
    r.step.measured.median_s = median_s;
  }
  return r;
}

}  // namespace

TEST_CASE("cross-check: every pair of a point's backends, symmetric, measured by its median",
          "[memory][cross_check]") {
  ResultRecord analytic = record("analytic", 1.0);
  ResultRecord sim = record("sim", 1.05);
  ResultRecord mpi = record("mpi", 1.3, 1.2);  // median 1.2 is what is compared
  ResultRecord elsewhere = record("sim", 9.0);
  elsewhere.provenance.point = "q";  // another point: never compared
  std::vector<ResultRecord*> all = {&analytic, &sim, &mpi, &elsewhere};
  CHECK(cross_check_point(all) == std::vector<std::size_t>{0, 1, 2});
  REQUIRE(analytic.cross_check.size() == 2);
  CHECK(analytic.cross_check[0].backend == "mpi");
  CHECK(analytic.cross_check[0].step_s == 1.2);
  CHECK(analytic.cross_check[0].difference_pct == Approx((1.0 / 1.2 - 1) * 100));
  CHECK_FALSE(analytic.cross_check[0].agree);
  CHECK(analytic.cross_check[1].backend == "sim");
  CHECK(analytic.cross_check[1].fidelity == "flow");
  CHECK(analytic.cross_check[1].agree);
  CHECK(sim.cross_check[0].backend == "analytic");
  CHECK(sim.cross_check[0].difference_pct == Approx(5.0));
  CHECK(elsewhere.cross_check.empty());
  // Symmetric at the edge: 1.0 vs 1.1 agrees both ways, 1.0 vs 1.1001 disagrees both ways.
  for (const double other : {1.1, 1.1001}) {
    ResultRecord a = record("analytic", 1.0), b = record("sim", other);
    cross_check_point({&a, &b});
    CHECK(a.cross_check[0].agree == b.cross_check[0].agree);
    CHECK(a.cross_check[0].agree == (other <= 1.1));
  }
  // Nothing changed: nothing to rewrite.
  CHECK(cross_check_point(all).empty());
  sim.step.average_s = 2.0;
  CHECK(cross_check_point(all) == std::vector<std::size_t>{0, 1, 2});
}

TEST_CASE("memory, cross-check and useful FLOPs survive the result file", "[memory][results]") {
  TrainingMemoryOptions options;
  options.activations_bytes = 4096;
  const StepPlan plan = ddp_plan(DType::bf16, options);
  ClusterSpec cluster;
  cluster.name = "hand";
  cluster.gpus_per_node = 2;
  cluster.gpu.name = "G";
  cluster.gpu.peak_tflops = 1;
  cluster.gpu.hbm_GBps = 100;
  cluster.gpu.memory_GiB = 1e-6;  // 1,074 bytes: the step cannot fit
  cluster.intra.bandwidth_GBps = 10;
  cluster.nic.bandwidth_GBps = 10;
  ResultRecord r = analytic_record(plan, cluster);
  REQUIRE(r.memory.present);
  CHECK_FALSE(r.memory.feasible);
  CHECK(r.memory.over_ranks == 2);
  CHECK(r.memory.limit_bytes == static_cast<std::int64_t>(1e-6 * 1024 * 1024 * 1024));
  CHECK(r.memory.peak_bytes == memory_feasibility(plan, r.memory.limit_bytes).peak_bytes);
  bool noted = false;
  for (const std::string& note : r.notes) noted |= note.find("INFEASIBLE") != std::string::npos;
  CHECK(noted);
  CHECK(r.throughput.useful_tflops_per_gpu.average ==
        Approx(useful_step_flops(plan) / (r.step.average_s * 2) / 1e12));
  r.cross_check = {{"sim", "step", 0.5, 12.5, false}};
  const ResultRecord back = result_from_json(result_to_json(r));
  CHECK(back.memory.present);
  CHECK(back.memory.feasible == r.memory.feasible);
  CHECK(back.memory.peak_bytes == r.memory.peak_bytes);
  CHECK(back.memory.breakdown.transients() == r.memory.breakdown.transients());
  CHECK(back.memory.breakdown.activations == 4096);
  REQUIRE(back.cross_check.size() == 1);
  CHECK(back.cross_check[0].difference_pct == 12.5);
  CHECK_FALSE(back.cross_check[0].agree);
  CHECK(back.throughput.useful_tflops_per_gpu.average ==
        r.throughput.useful_tflops_per_gpu.average);
  CHECK(back.setup.rank_kind == "gpu");
  // Written again, the same text: nothing is lost or added by a round trip.
  CHECK(result_to_json(back) == result_to_json(r));
}

TEST_CASE("every rank's training memory at once equals rank by rank", "[memory]") {
  // training_memories computes one rank per class of ranks holding the same (core/plan/plan.cpp
  // memory_classes); the direct per-rank computation is the reference, on meshes where ranks
  // differ: uneven shards (sizes that do not divide the tiny models' dims), EP, TP, PP and a 4-D
  // hybrid, under every strategy variant of the invariant matrix (owners, split NS, all_to_all).
  using testing::Topology;
  const std::vector<Topology> meshes = {
      {"FSDP 6", {{"dp_shard", 6, DimRole::fsdp}}, "tiny-dense"},
      {"FSDP 5 x TP 2", {{"dp_shard", 5, DimRole::fsdp}, {"tp", 2, DimRole::tp}}, "tiny-dense"},
      {"TP 3", {{"tp", 3, DimRole::tp}}, "tiny-dense"},
      {"FSDP 3 x EP 2", {{"dp_shard", 3, DimRole::fsdp}, {"ep", 2, DimRole::ep}}, "tiny-moe"},
      {"PP 2 x FSDP 7", {{"pp", 2, DimRole::pp}, {"dp_shard", 7, DimRole::fsdp}}, "tiny-dense"},
      {"4-D",
       {{"pp", 2, DimRole::pp},
        {"dp_replicate", 2, DimRole::replicate},
        {"dp_shard", 3, DimRole::fsdp},
        {"tp", 2, DimRole::tp}},
       "tiny-dense"},
  };
  int plans = 0;
  for (const Topology& t : meshes) {
    // One GPU per node: these world sizes do not fill the matrix's 4-GPU nodes.
    const ShardedModel model = parallelize(*find_preset(t.model), DeviceMesh(t.dims, 1), {});
    for (const StrategyOptions& o : testing::strategies()) {
      INFO(t.name << ", strategy " << o.name);
      StepPlan plan;
      try {
        plan = build_plan(model, o, PlanSettings{});
      } catch (const Error&) {
        continue;  // a strategy this topology does not support
      }
      ++plans;
      const std::vector<TrainingMemory> all = training_memories(plan);
      REQUIRE(static_cast<int>(all.size()) == model.mesh.world_size());
      for (int r = 0; r < model.mesh.world_size(); ++r) {
        INFO("rank " << r);
        const TrainingMemory one = training_memory(plan, r);
        CHECK(all[r].parameters == one.parameters);
        CHECK(all[r].master_weights == one.master_weights);
        CHECK(all[r].gradients == one.gradients);
        CHECK(all[r].optimizer_state == one.optimizer_state);
        CHECK(all[r].step_buffers == one.step_buffers);
        CHECK(all[r].ns_workspace == one.ns_workspace);
        CHECK(all[r].peak_bytes() == one.peak_bytes());
        const RankMemory step = rank_memory(plan, r);
        CHECK(all[r].optimizer_step().static_bytes == step.static_bytes);
        CHECK(all[r].optimizer_step().peak_transient_bytes == step.peak_transient_bytes);
      }
    }
  }
  CHECK(plans > 50);
}
