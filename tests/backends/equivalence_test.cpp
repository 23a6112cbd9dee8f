// A distributed step equals the single-device step, proved with real data on in-process ranks:
// every plan of the invariant matrix (9 topologies x 13 strategy variants, tests/common) and the
// hard cases (uneven torch.chunk splits, empty shards, ranks that own no matrix, 1xN and Nx1
// matrices, MoE experts under EP, dense weights sharded over fsdp x ep, pipeline stages,
// level-scheduled sync over its hyper-period)
// runs 3 steps on the loopback executor, and every rank's parameter, momentum and AdamW moments
// must equal ReferenceOptimizer<float> (NS in fp32, updates rounded to the comm dtype) bit for
// bit, in both optimizer variants (bf16 comm, lerp momentum, Nesterov, QK-clip; fp32 comm, classic
// momentum, no Nesterov, no QK-clip). Plans with split Newton-Schulz (two variants of the matrix)
// equal it within kSplitNsTolerance instead: their Gram sums run in another order. Every
// collective moves exactly the bytes plan.hpp counts. Negative controls prove the check fails on
// broken plans and names what differs (a split NS whose Gram all-reduce is skipped included).
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>

#include "backends/cpu/check.hpp"
#include "backends/cpu/data.hpp"
#include "backends/cpu/handlers.hpp"
#include "backends/cpu/store.hpp"
#include "backends/loopback/loopback.hpp"
#include "core/base/errors.hpp"
#include "core/plan/plan_json.hpp"
#include "kernels/bf16.hpp"
#include "kernels/newton_schulz.hpp"
#include "tests/common/equivalence_cases.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;
using testing::drop_op;
using testing::kVariants;
using testing::odd_model;
using testing::settings_of;
using testing::Variant;

namespace {

constexpr int kSteps = 3;
constexpr std::uint64_t kSeed = 20260101;

// Runs `plan` and returns the first mismatch with the reference (empty if none); also checks that
// every collective moved what plan.hpp counts, pair by pair.
std::string run_and_compare(const StepPlan& plan, const cpu::ReferenceRun& reference,
                            LoopbackOptions options = {}) {
  options.seed = kSeed;
  LoopbackExecutor executor(plan, options);
  executor.run(kSteps);
  const auto& mesh = plan.model.mesh;
  for (const Op& op : plan.ops) {
    if (!is_collective(op.kind)) continue;
    int active = 0;
    for (int k = 0; k < kSteps; ++k) active += plan.active_in_step(op, k) ? 1 : 0;
    for (int r : op.ranks.ranks(mesh)) {
      const auto sent = bytes_sent(plan, op, r);
      for (int i = 0; i < static_cast<int>(sent.size()); ++i) {
        const int peer = mesh.group_member(r, op.group, i);
        if (peer == r) continue;
        INFO("op " << op.id << " '" << op.label << "' from rank " << r << " to rank " << peer);
        CHECK(executor.bytes_moved(op.id, r, peer) == active * sent[i]);
      }
    }
  }
  for (int r = 0; r < mesh.world_size(); ++r) {
    // The program's memory is rank_memory's, and every buffer was released. (What the run held
    // at once can exceed rank_memory's plan-order peak where two streams hold stage buffers at
    // once, a redistribution stage beside the next unit's gather stage, or where the pipeline of
    // small matrices runs beside the main one: 7 of the 99 plans of a variant. Units themselves
    // are gated: tests/core/strategy_test.cpp checks depth + 1 in any execution.)
    const RankMemory planned = rank_memory(plan, r);
    INFO("rank " << r);
    CHECK(executor.program(r).memory().static_bytes == planned.static_bytes);
    CHECK(executor.program(r).memory().peak_transient_bytes == planned.peak_transient_bytes);
    CHECK(executor.store(r).live_transient_bytes() == 0);
    const cpu::CheckTolerance tolerance =
        testing::splits_ns(plan) ? testing::kSplitNsCheck : cpu::CheckTolerance{};
    const auto mismatch = cpu::first_mismatch(plan, executor.store(r), reference, tolerance);
    if (mismatch) return mismatch->message;
  }
  return "";
}

// References are shared by plans whose gradients are synced alike (the summed gradients depend
// on the sync groups and periods only).
class References {
 public:
  const cpu::ReferenceRun& get(const StepPlan& plan, const Model& model,
                               const RoutingRules& routing) {
    std::string key;
    for (const auto& dp : plan.model.params) {
      const GradientSync sync = gradient_sync(plan, dp.index);
      key += std::to_string(plan.model.mesh.group_size(sync.reduced_over)) + "/" +
             std::to_string(sync.period) + ",";
    }
    auto it = runs_.find(key);
    if (it != runs_.end()) return *it->second;
    plans_.push_back(plan);
    auto run = std::make_unique<cpu::ReferenceRun>(plans_.back(), model, routing, kSeed);
    run->run_to(kSteps);
    return *runs_.emplace(key, std::move(run)).first->second;
  }

 private:
  std::deque<StepPlan> plans_;
  std::map<std::string, std::unique_ptr<cpu::ReferenceRun>> runs_;
};

void check_topology(const std::string& name) {
  const auto topologies = testing::topologies();
  const auto it = std::find_if(topologies.begin(), topologies.end(),
                               [&](const auto& t) { return t.name == name; });
  REQUIRE(it != topologies.end());
  const Model model = *find_preset(it->model);
  const ShardedModel sharded = testing::make_model(*it);
  for (const Variant& variant : kVariants) {
    References references;
    for (const auto& options : testing::strategies()) {
      const StepPlan plan = build_plan(sharded, options, settings_of(variant, model));
      INFO("topology " << name << ", " << variant.name << ", strategy " << options.to_json_text());
      const auto& reference = references.get(plan, model, ParallelRules{}.routing);
      CHECK(run_and_compare(plan, reference) == "");
    }
  }
}

}  // namespace

TEST_CASE("DDP: every strategy equals the single-device step bit for bit", "[equivalence]") {
  check_topology("DDP");
}
TEST_CASE("FSDP: every strategy equals the single-device step bit for bit", "[equivalence]") {
  check_topology("FSDP");
}
TEST_CASE("HSDP: every strategy equals the single-device step bit for bit", "[equivalence]") {
  check_topology("HSDP");
}
TEST_CASE("TP: every strategy equals the single-device step bit for bit", "[equivalence]") {
  check_topology("TP");
}
TEST_CASE("FSDP+TP: every strategy equals the single-device step bit for bit", "[equivalence]") {
  check_topology("FSDP+TP");
}
TEST_CASE("EP: every strategy equals the single-device step bit for bit", "[equivalence]") {
  check_topology("EP");
}
TEST_CASE("CP: every strategy equals the single-device step bit for bit", "[equivalence]") {
  check_topology("CP");
}
TEST_CASE("PP: every strategy equals the single-device step bit for bit", "[equivalence]") {
  check_topology("PP");
}
TEST_CASE("4-D: every strategy equals the single-device step bit for bit", "[equivalence]") {
  check_topology("4-D");
}

// ------------------------------------------------------------------------------------------------
// Hard cases

namespace {

std::vector<testing::Topology> odd_topologies() {
  return {
      {"FSDP 4 (uneven, empty shards)", {{"dp_shard", 4, DimRole::fsdp}}, ""},
      {"FSDP 2 x TP 3 (strided, uneven)",
       {{"dp_shard", 2, DimRole::fsdp}, {"tp", 3, DimRole::tp}},
       ""},
      {"HSDP 2 x 3", {{"dp_replicate", 2, DimRole::replicate}, {"dp_shard", 3, DimRole::fsdp}}, ""},
      {"FSDP 3 x EP 2", {{"dp_shard", 3, DimRole::fsdp}, {"ep", 2, DimRole::ep}}, ""},
      {"PP 2 x FSDP 3", {{"pp", 2, DimRole::pp}, {"dp_shard", 3, DimRole::fsdp}}, ""},
      {"FSDP 7 (ranks without a matrix)", {{"dp_shard", 7, DimRole::fsdp}}, ""},
  };
}

}  // namespace

TEST_CASE("uneven splits, empty shards, 1xN and Nx1 matrices, experts and idle owners",
          "[equivalence][hard]") {
  const Model model = odd_model();
  bool some_rank_owns_nothing = false, some_shard_empty = false;
  for (const auto& topology : odd_topologies()) {
    const ShardedModel sharded = parallelize(model, DeviceMesh(topology.dims, 8), ParallelRules{});
    for (const auto& dp : sharded.params)
      for (int r = 0; r < sharded.mesh.world_size(); ++r)
        some_shard_empty = some_shard_empty || (dp.layout.holds(sharded.mesh, r) &&
                                                dp.layout.shard_numel(sharded.mesh, r) == 0);
    for (const Variant& variant : kVariants) {
      References references;
      for (const auto& options : testing::strategies()) {
        const StepPlan plan = build_plan(sharded, options, settings_of(variant, model));
        INFO(topology.name << ", " << variant.name << ", strategy " << options.to_json_text());
        if (options.name != "replicated")
          for (int r = 0; r < sharded.mesh.world_size(); ++r)
            some_rank_owns_nothing = some_rank_owns_nothing || plan.assignment.owned_by(r).empty();
        CHECK(run_and_compare(plan, references.get(plan, model, RoutingRules{})) == "");
      }
    }
  }
  CHECK(some_rank_owns_nothing);
  CHECK(some_shard_empty);
}

TEST_CASE("EP with dense weights sharded over fsdp x ep: every strategy equals the reference",
          "[equivalence][hard]") {
  // parallel.dense_over_ep: shard (torchtitan's and Megatron's layout): the dense parameters'
  // shards span the ep dim too, so their gathers, scatters and gradient reductions do.
  for (const auto& c : testing::dense_over_ep_cases()) {
    const Model model = c.model == "odd" ? odd_model() : *find_preset(c.model);
    const ShardedModel sharded =
        parallelize(model, DeviceMesh(c.dims, 8), testing::dense_over_ep_rules());
    bool dense_over_ep = false;
    for (const auto& dp : sharded.params)
      for (int d = 0; d < sharded.mesh.ndims(); ++d)
        dense_over_ep = dense_over_ep || (sharded.mesh.dim(d).role == DimRole::ep &&
                                          dp.layout.placements()[d].is_shard());
    REQUIRE(dense_over_ep);
    for (const Variant& variant : kVariants) {
      References references;
      for (const auto& options : testing::strategies()) {
        const StepPlan plan = build_plan(sharded, options, settings_of(variant, model));
        INFO(c.name << ", " << variant.name << ", strategy " << options.to_json_text());
        CHECK(run_and_compare(plan, references.get(plan, model, RoutingRules{})) == "");
      }
    }
  }
}

TEST_CASE("level-scheduled sync equals the reference over its whole hyper-period",
          "[equivalence][hard]") {
  const Model model = odd_model();
  const ShardedModel sharded = parallelize(
      model,
      DeviceMesh({{"dp_replicate", 2, DimRole::replicate}, {"dp_shard", 2, DimRole::fsdp}}, 8),
      ParallelRules{});
  for (const char* name : {"owner", "all_to_all", "owner_allgather"}) {
    StrategyOptions options;
    options.name = name;
    options.grad_sync.enabled = true;
    options.grad_sync.level_periods = {2, 3};  // hyper-period 6: every pattern of frozen levels
    const StepPlan plan = build_plan(sharded, options, settings_of(kVariants[0], model));
    REQUIRE(plan.hyper_period() == 6);
    INFO("strategy " << name);
    LoopbackExecutor executor(plan, {.seed = kSeed});
    executor.run(plan.hyper_period() + 1);
    cpu::ReferenceRun reference(plan, model, RoutingRules{}, kSeed);
    reference.run_to(plan.hyper_period() + 1);
    for (int r = 0; r < sharded.mesh.world_size(); ++r) {
      const auto mismatch = cpu::first_mismatch(plan, executor.store(r), reference);
      CHECK(!mismatch.has_value());
      if (mismatch) FAIL(mismatch->message);
    }
    // A sync op ran once per instance in the steps its period selects, never in frozen ones.
    const PlanIndex index(plan);
    for (const Op& op : plan.ops) {
      if (op.kind != OpKind::reduce_scatter && op.kind != OpKind::all_reduce) continue;
      int instances = 0, active = 0;
      index.for_each_instance(op.id, [&](int) { ++instances; });
      for (int k = 0; k <= plan.hyper_period(); ++k) active += k % op.period == 0 ? 1 : 0;
      INFO("op " << op.id << " " << op.label);
      CHECK(executor.ran(op.id) == static_cast<std::int64_t>(instances) * active);
    }
  }
}

TEST_CASE("a plan read back from JSON executes to the same bits, with the model rebuilt from it",
          "[equivalence]") {
  const Model model = odd_model();
  const ShardedModel sharded =
      parallelize(model, DeviceMesh({{"dp_shard", 3, DimRole::fsdp}, {"ep", 2, DimRole::ep}}, 8),
                  ParallelRules{});
  StrategyOptions options;
  options.name = "all_to_all";
  options.grad_sync.enabled = true;
  const StepPlan plan = build_plan(sharded, options, settings_of(kVariants[0], model));
  const StepPlan back = plan_from_json(nlohmann::json::parse(plan_to_json(plan).dump()));
  // The model and routing an out-of-process executor rebuilds from the plan are the originals.
  const Model rebuilt = cpu::source_model(back.model);
  REQUIRE(rebuilt.params.size() == model.params.size());
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    CHECK(rebuilt.params[i].name == model.params[i].name);
    CHECK(rebuilt.params[i].shape == model.params[i].shape);
    CHECK(rebuilt.params[i].role == model.params[i].role);
    CHECK(rebuilt.params[i].layer == model.params[i].layer);
  }
  cpu::ReferenceRun reference(back, kSeed);  // model and routing from the plan alone
  reference.run_to(kSteps);
  CHECK(run_and_compare(back, reference) == "");
}

// ------------------------------------------------------------------------------------------------
// Negative controls: the check fails on broken plans, naming the tensor, rank and first element.

namespace {

std::string broken_run(const StepPlan& plan, const Model& model) {
  LoopbackOptions options;
  options.lower.allow_stale_reads = true;
  cpu::ReferenceRun reference(plan, model, RoutingRules{}, kSeed);
  reference.run_to(kSteps);
  return run_and_compare(plan, reference, options);
}

}  // namespace

TEST_CASE("negative control: two owners' scatters swapped", "[equivalence][negative]") {
  const Model model = *find_preset("tiny-dense");
  // Two scatters of same-shape matrices from different owners: each now scatters from the other
  // owner, which holds no result of that matrix.
  const testing::SwappedScatters swapped = testing::swapped_scatter_owners(model);
  REQUIRE(swapped.first >= 0);
  const StepPlan& plan = swapped.plan;
  const int x = swapped.first;
  const int p = plan.ops[x].params[0];
  const std::string name = plan.model.params[p].name;
  const int wrong_root = plan.model.mesh.group_member(0, plan.ops[x].group, plan.ops[x].root);
  // Lowering names it when stale reads are not allowed...
  CHECK_THROWS_WITH(lower_rank_program(plan, wrong_root),
                    Catch::Contains("reads the result of '" + name + "'") &&
                        Catch::Contains("rank " + std::to_string(wrong_root)));
  // ...and when they are, the executed step differs from the reference, and the check says where.
  const std::string message = broken_run(plan, model);
  INFO(message);
  CHECK_THAT(message, Catch::StartsWith("rank 0: parameter of '" + name +
                                        "' differs from the single-device reference after 3 "
                                        "steps at element [0, 0]") &&
                          Catch::Contains("got ") && Catch::Contains(", want "));
}

TEST_CASE("negative control: one op dropped", "[equivalence][negative]") {
  const Model model = *find_preset("tiny-dense");
  const ShardedModel sharded = parallelize(
      model,
      DeviceMesh({{"dp_replicate", 2, DimRole::replicate}, {"dp_shard", 2, DimRole::fsdp}}, 4),
      ParallelRules{});
  const StepPlan full = build_plan(sharded, StrategyOptions{}, settings_of(kVariants[1], model));
  // The broadcast that brings the other replica its results of one matrix.
  int dropped = -1;
  for (const Op& op : full.ops)
    if (op.kind == OpKind::broadcast && dropped < 0) dropped = op.id;
  REQUIRE(dropped >= 0);
  const int p = full.ops[dropped].params[0];
  const std::string name = full.model.params[p].name;
  const int owner = full.assignment.owner[p];
  const StepPlan plan = drop_op(full, dropped);
  // The first rank of the other replica (dp_replicate is the outer dim: ranks 0-1 and 2-3).
  const int victim = owner < 2 ? 2 : 0;
  CHECK_THROWS_WITH(
      lower_rank_program(plan, victim),
      Catch::Contains("apply_update") && Catch::Contains("reads the result of '" + name + "'"));
  const std::string message = broken_run(plan, model);
  INFO(message);
  CHECK_THAT(message, Catch::StartsWith("rank " + std::to_string(victim) + ": parameter of '" +
                                        name + "' differs from the single-device reference") &&
                          Catch::Contains("at element [0, 0]"));
}

TEST_CASE("the check is sensitive to the seed and to the number of steps", "[equivalence]") {
  const Model model = *find_preset("tiny-dense");
  const ShardedModel sharded =
      parallelize(model, DeviceMesh({{"dp_shard", 2, DimRole::fsdp}}, 4), ParallelRules{});
  const StepPlan plan = build_plan(sharded, StrategyOptions{}, settings_of(kVariants[0], model));
  cpu::ReferenceRun reference(plan, model, RoutingRules{}, kSeed);
  reference.run_to(kSteps);
  LoopbackExecutor other_seed(plan, {.seed = kSeed + 1});
  other_seed.run(kSteps);
  const auto a = cpu::first_mismatch(plan, other_seed.store(0), reference);
  REQUIRE(a.has_value());
  CHECK_THAT(a->message, Catch::StartsWith("rank 0: parameter of 'embed'"));
  LoopbackExecutor fewer(plan, {.seed = kSeed});
  fewer.run(kSteps - 1);
  const auto b = cpu::first_mismatch(plan, fewer.store(1), reference);
  REQUIRE(b.has_value());
  CHECK(b->rank == 1);
  // And the same run, complete, matches: every piece of every role was compared.
  LoopbackExecutor same(plan, {.seed = kSeed});
  same.run(kSteps);
  for (int r = 0; r < 2; ++r) CHECK_FALSE(cpu::first_mismatch(plan, same.store(r), reference));
}

TEST_CASE("QK-clip takes effect on the shards it clips", "[equivalence]") {
  const Model model = *find_preset("tiny-dense");
  const ShardedModel sharded =
      parallelize(model, DeviceMesh({{"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}}, 4),
                  ParallelRules{});
  const StepPlan clipped = build_plan(sharded, StrategyOptions{}, settings_of(kVariants[0], model));
  PlanSettings off = settings_of(kVariants[0], model);
  off.optimizer.qk_clip.enabled = false;
  const StepPlan unclipped = build_plan(sharded, StrategyOptions{}, off);
  LoopbackExecutor executor(clipped, {.seed = kSeed});
  executor.run(kSteps);
  cpu::ReferenceRun without(unclipped, model, RoutingRules{}, kSeed);
  without.run_to(kSteps);
  const auto mismatch = cpu::first_mismatch(clipped, executor.store(0), without);
  REQUIRE(mismatch.has_value());
  CHECK_THAT(mismatch->tensor, Catch::Contains(".attn.q'") || Catch::Contains(".attn.k'"));
}

// ------------------------------------------------------------------------------------------------
// Split Newton-Schulz (core/plan/split_ns.hpp)

namespace {

// How far a run is from the reference: whether it equals it bit for bit, and the largest
// |parameter - reference| over every rank's pieces after the steps beyond kSplitNsCheck's rounding
// units (the smallest absolute tolerance that passes, with them, to within 1 %; 0 when the
// rounding units alone cover every difference).
struct SplitNsError {
  bool bit_exact = false;
  double beyond_rounding = 0;
};

SplitNsError split_ns_error(const StepPlan& plan, const Model& model,
                            LoopbackOptions options = {}) {
  options.seed = kSeed;
  LoopbackExecutor executor(plan, options);
  executor.run(kSteps);
  cpu::ReferenceRun reference(plan, model, RoutingRules{}, kSeed);
  reference.run_to(kSteps);
  auto passes = [&](const cpu::CheckTolerance& t) {
    for (int r = 0; r < plan.model.mesh.world_size(); ++r)
      if (cpu::first_mismatch(plan, executor.store(r), reference, t)) return false;
    return true;
  };
  auto with = [](double absolute) {
    cpu::CheckTolerance t = testing::kSplitNsCheck;
    t.absolute = absolute;
    return t;
  };
  SplitNsError out;
  out.bit_exact = passes(cpu::CheckTolerance{});
  double lo = 0, hi = 1;
  if (!passes(with(hi))) {
    out.beyond_rounding = hi;
    return out;
  }
  if (passes(with(1e-9))) return out;  // the rounding units cover it all
  while (hi - lo > 0.01 * hi) {
    const double mid = 0.5 * (lo + hi);
    (passes(with(mid)) ? hi : lo) = mid;
  }
  out.beyond_rounding = hi;
  return out;
}

StepPlan split_plan(const ShardedModel& sharded, const Model& model, int variant) {
  StrategyOptions o;
  o.split_ns.enabled = true;
  o.split_ns.threshold = 0;
  o.split_ns.max_members = 64;
  return build_plan(sharded, o, settings_of(kVariants[variant], model));
}

}  // namespace

TEST_CASE("split Newton-Schulz: every split matrix's NS runs on its group, within tolerance",
          "[equivalence][split_ns]") {
  const Model model = *find_preset("tiny-dense");
  const ShardedModel sharded =
      parallelize(model, DeviceMesh({{"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}}, 4),
                  ParallelRules{});
  for (int v = 0; v < 2; ++v) {
    const StepPlan plan = split_plan(sharded, model, v);
    int split = 0;
    for (const Op& op : plan.ops)
      if (op.kind == OpKind::split_newton_schulz) {
        ++split;
        CHECK(plan.mesh().group_size(op.group) >= 2);
      }
    INFO(kVariants[v].name << ": " << split << " split NS ops");
    CHECK(split >= 4);  // q, o, mlp up/gate of both layers can split over tp or dp_shard x tp
    const SplitNsError error = split_ns_error(plan, model);
    INFO("largest deviation beyond rounding " << error.beyond_rounding);
    CHECK_FALSE(error.bit_exact);  // the Gram sums run in another order
    CHECK(error.beyond_rounding <= testing::kSplitNsTolerance);
  }
}

TEST_CASE("negative control: split Newton-Schulz with its Gram all-reduce skipped",
          "[equivalence][negative][split_ns]") {
  const Model model = *find_preset("tiny-dense");
  const ShardedModel sharded =
      parallelize(model, DeviceMesh({{"tp", 4, DimRole::tp}}, 4), ParallelRules{});
  const StepPlan plan = split_plan(sharded, model, 0);
  REQUIRE(testing::splits_ns(plan));
  LoopbackOptions broken;
  broken.edit_program = testing::drop_gram_all_reduce;
  const SplitNsError error = split_ns_error(plan, model, broken);
  INFO("largest deviation with each member's own Gram: " << error.beyond_rounding);
  CHECK(error.beyond_rounding > 4 * testing::kSplitNsTolerance);
  // The check names the first parameter that differs.
  broken.seed = kSeed;
  LoopbackExecutor executor(plan, broken);
  executor.run(kSteps);
  cpu::ReferenceRun reference(plan, model, RoutingRules{}, kSeed);
  reference.run_to(kSteps);
  const auto mismatch =
      cpu::first_mismatch(plan, executor.store(0), reference, testing::kSplitNsCheck);
  REQUIRE(mismatch.has_value());
  CHECK_THAT(mismatch->message, Catch::StartsWith("rank 0: parameter of 'layers."));
}

// ------------------------------------------------------------------------------------------------
// The bf16 Newton-Schulz check (cpu::kBf16NsCheck) that the GPU executors are held to, on the
// host: a loopback run whose NS is the CPU's bf16 emulation (what the GPU kernels compute, up to
// rounding order) passes it and not the bitwise check; a run whose NS drops its update, or
// halves it, fails it, naming a parameter.

namespace {

// The CPU handlers with NS run by `ns` on each task's matrices (then rounded to the comm dtype).
LoopbackOptions with_ns(
    std::function<void(std::vector<float>&, const MatrixShape&, const NsConfig&)> ns) {
  LoopbackOptions options;
  options.compute = [ns](const RankOp& op, cpu::RankStore& store, const cpu::StepContext& context) {
    if (op.kind != OpKind::newton_schulz) return cpu::run_compute(op, store, context);
    for (const auto& t : op.newton_schulz) {
      std::vector<float> x = store.read(t.data);
      ns(x, MatrixShape{t.batch, t.rows, t.cols}, context.ns);
      if (context.plan->settings.comm_dtype() == DType::bf16)
        round_to_bf16(x.data(), static_cast<std::int64_t>(x.size()));
      store.write(t.data, x.data());
    }
    cpu::run_keep(op, store);
  };
  return options;
}

std::string check_with(const StepPlan& plan, const Model& model, const LoopbackOptions& base,
                       const cpu::CheckTolerance& tolerance) {
  LoopbackOptions options = base;
  options.seed = kSeed;
  LoopbackExecutor executor(plan, options);
  executor.run(kSteps);
  cpu::ReferenceRun reference(plan, model, RoutingRules{}, kSeed);
  reference.run_to(kSteps);
  for (int r = 0; r < plan.model.mesh.world_size(); ++r)
    if (auto m = cpu::first_mismatch(plan, executor.store(r), reference, tolerance))
      return m->message;
  return "";
}

}  // namespace

TEST_CASE("bf16 NS check: bf16 emulation passes, a dropped or halved update fails",
          "[equivalence][bf16_check]") {
  const auto bf16 = with_ns([](std::vector<float>& x, const MatrixShape& s, const NsConfig& c) {
    newton_schulz(x.data(), x.data(), s, c, NsPrecision::bf16);
  });
  const auto dropped = with_ns([](std::vector<float>& x, const MatrixShape&, const NsConfig&) {
    std::fill(x.begin(), x.end(), 0.0f);
  });
  const auto halved = with_ns([](std::vector<float>& x, const MatrixShape& s, const NsConfig& c) {
    newton_schulz(x.data(), x.data(), s, c, NsPrecision::fp32);
    for (float& v : x) v *= 0.5f;
  });
  for (const Model& model : {*find_preset("tiny-dense"), odd_model()})
    for (const auto& dims : std::vector<std::vector<MeshDim>>{
             {{"dp_shard", 1, DimRole::fsdp}},
             {{"dp_shard", 4, DimRole::fsdp}},
             {{"dp_shard", 2, DimRole::fsdp}, {"tp", 3, DimRole::tp}}})
      for (const Variant& variant : kVariants) {
        const ShardedModel sharded = parallelize(model, DeviceMesh(dims, 8), ParallelRules{});
        const StepPlan plan = build_plan(sharded, StrategyOptions{}, settings_of(variant, model));
        INFO(model.name << ", " << DeviceMesh(dims, 8).describe() << ", " << variant.name);
        CHECK(check_with(plan, model, bf16, cpu::kBf16NsCheck) == "");
        // The check is not vacuous: bf16 NS is not the reference's bits...
        CHECK_THAT(check_with(plan, model, bf16, cpu::CheckTolerance{}),
                   Catch::Contains("parameter of"));
        // ...and an update that is missing or half as large is caught.
        CHECK_THAT(check_with(plan, model, dropped, cpu::kBf16NsCheck),
                   Catch::Contains("parameter of") && Catch::Contains("allowed difference"));
        CHECK_THAT(check_with(plan, model, halved, cpu::kBf16NsCheck),
                   Catch::Contains("parameter of"));
      }
}

TEST_CASE("a rank that cannot allocate says which allocation, how large, and the fix",
          "[backends][memory]") {
  // More than any address space holds (2^58 bytes): new fails at once, whatever the machine's
  // overcommit setting, and nothing is touched.
  RankProgram program;
  program.rank = 3;
  ProgramTensor huge;
  huge.name = "parameter of 'x'";
  huge.numel = std::int64_t{1} << 56;
  huge.bytes = huge.numel * 4;
  program.tensors.push_back(huge);
  program.static_bytes = huge.bytes;
  CHECK_THROWS_WITH(cpu::RankStore(program),
                    Catch::Contains("rank 3: out of memory allocating its static tensors") &&
                        Catch::Contains("MiB") && Catch::Contains("fix:"));
}
