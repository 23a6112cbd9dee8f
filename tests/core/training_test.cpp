// The training step in the plan (core/plan/training.hpp) against independent references: the
// step's FLOPs summed over every rank equal the textbook count (6 x tokens x matrix parameters,
// plus attention's 12 x tokens x seq_len x query rows per layer; top-k of E experts per token) on
// every topology of the invariant matrix, which the per-rank sharding must not change; a
// hand-counted one-layer model for the per-op figures; the activation memory of Korthikanti et al.
// by hand; the shape errors; the order of the gradient sync; and what overlap with the backward
// pass changes (dependencies and the peak-memory rule).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "core/base/errors.hpp"
#include "core/model/parallelize.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/strategy.hpp"
#include "core/plan/training.hpp"
#include "tests/common/strategy_matrix.hpp"
#include "tests/common/training_models.hpp"

using namespace muonbed;

namespace {

TrainingOptions training(std::int64_t tokens, std::int64_t seq_len, std::int64_t micro = 1) {
  TrainingOptions o;
  o.enabled = true;
  o.tokens_per_step = tokens;
  o.seq_len = seq_len;
  o.micro_batch_size = micro;
  o.experts_per_token = 2;
  return o;
}

StepPlan training_plan(const ShardedModel& model, const TrainingOptions& o,
                       const std::string& strategy = "owner") {
  StrategyOptions options;
  options.name = strategy;
  PlanSettings settings;
  settings.training = o;
  return build_plan(model, options, settings);
}

// The textbook forward FLOPs of a whole step, from the unsharded model: 2 per matrix element and
// token (routed experts: top-k of E), attention's scores and values 4 x seq_len per query row and
// token. The embedding is a lookup.
double textbook_forward_flops(const Model& model, const TrainingOptions& o) {
  const double tokens = static_cast<double>(o.tokens_per_step);
  double flops = 0;
  for (const Parameter& p : model.params) {
    if (p.shape.size() < 2 || p.role == ParamRole::embedding) continue;
    const double numel = static_cast<double>(p.numel());
    const bool expert = p.role == ParamRole::expert_up || p.role == ParamRole::expert_gate ||
                        p.role == ParamRole::expert_down;
    if (expert)
      flops += 2 * tokens * static_cast<double>(o.experts_per_token) * numel /
               static_cast<double>(p.shape[0]);
    else
      flops += 2 * tokens * numel;
    if (p.role == ParamRole::attn_q)
      flops += 4 * tokens * static_cast<double>(o.seq_len) * static_cast<double>(p.shape[0]);
  }
  return flops;
}

struct Totals {
  double forward = 0;
  double backward = 0;
};

Totals planned_flops(const StepPlan& plan) {
  Totals t;
  const DeviceMesh& mesh = plan.mesh();
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
    for (int r : op.ranks.ranks(mesh))
      (op.kind == OpKind::forward ? t.forward : t.backward) += op_flops(plan, op, r);
  }
  return t;
}

ShardedModel hand_model(const std::vector<MeshDim>& dims) {
  return testing::hand_training_model(dims);
}

// Whether op `to` depends on op `from`, following deps.
bool depends_on(const StepPlan& plan, int to, int from) {
  std::vector<int> stack = {to};
  std::set<int> seen;
  while (!stack.empty()) {
    const int id = stack.back();
    stack.pop_back();
    if (id == from) return true;
    if (!seen.insert(id).second) continue;
    for (int d : plan.ops[static_cast<std::size_t>(id)].deps) stack.push_back(d);
  }
  return false;
}

}  // namespace

TEST_CASE("a hand-counted layer: FLOPs per op and rank", "[training]") {
  const ShardedModel model = hand_model({{"dp_shard", 2, DimRole::fsdp}});
  // 2 ranks x 1 sequence of 4 tokens x 2 micro-batches: each op processes 4 tokens (2 groups).
  const StepPlan plan = training_plan(model, training(16, 4));
  int forward_attention = 0;
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
    CHECK(op.tokens == 4);
    const bool attention = std::any_of(op.params.begin(), op.params.end(), [&](int p) {
      return plan.model.params[p].role == ParamRole::attn_q;
    });
    if (!attention) continue;
    // Gathered q, k, v, o: 256 elements x 2 x 4 tokens, plus 4 x 4 tokens x seq 4 x 8 query rows.
    const double forward = 2.0 * 4 * 256 + 4.0 * 4 * 4 * 8;
    for (int r = 0; r < 2; ++r)
      CHECK(op_flops(plan, op, r) == (op.kind == OpKind::forward ? forward : 2 * forward));
    if (op.kind == OpKind::forward) ++forward_attention;
  }
  CHECK(forward_attention == 2);  // one per micro-batch group
  // The whole step: 3 x (2 x 16 tokens x (256 + 512 + 128) + 4 x 16 x 4 x 8).
  const Totals t = planned_flops(plan);
  CHECK(t.forward == 2.0 * 16 * 896 + 4.0 * 16 * 4 * 8);
  CHECK(t.backward == 2 * t.forward);
}

TEST_CASE("the step's FLOPs over all ranks are the textbook count on every topology",
          "[training]") {
  for (const auto& topology : testing::topologies()) {
    for (const std::int64_t micro : {1, 2}) {
      INFO(topology.name << ", micro_batch_size " << micro);
      const ShardedModel model = testing::make_model(topology);
      // 4 micro-batches per data-parallel rank whatever the mesh's data-parallel degree.
      const TrainingOptions o = training(4 * 64 * micro * 4, 64, micro);
      const StepPlan plan = training_plan(model, o);
      const Model unsharded = *find_preset(topology.model);
      const double expected = textbook_forward_flops(unsharded, o);
      const TrainingShape shape = training_shape(model, o);
      // Scale by the data-parallel degree the shape found: tokens_per_step is global.
      const Totals t = planned_flops(plan);
      CHECK(t.forward == Approx(expected).epsilon(1e-12));
      CHECK(t.backward == Approx(2 * expected).epsilon(1e-12));
      CHECK(shape.micro_batches * shape.data_parallel * micro * o.seq_len == o.tokens_per_step);
    }
  }
}

TEST_CASE("the step's shape: micro-batches, groups and data-parallel degree", "[training]") {
  const ShardedModel model = testing::make_model(testing::topologies()[7]);  // PP x FSDP
  REQUIRE(model.mesh.ndims() == 2);
  TrainingOptions o = training(2 * 64 * 12, 64);  // 12 micro-batches per FSDP rank
  TrainingShape s = training_shape(model, o);
  CHECK(s.data_parallel == 2);  // pp is not data-parallel
  CHECK(s.stages == 2);
  CHECK(s.micro_batches == 12);
  CHECK(s.groups == 6);  // at most 8 groups of equal micro-batches
  CHECK(s.tokens_per_micro_batch_rank == 64);
  CHECK(s.hidden == 64);
  CHECK(s.layers == 2);
  o.max_micro_batch_groups = 12;
  CHECK(training_shape(model, o).groups == 12);

  // CP divides the sequence and is not data-parallel.
  const ShardedModel cp = testing::make_model(testing::topologies()[6]);
  const TrainingShape c = training_shape(cp, training(2 * 64, 64));
  CHECK(c.context_parallel == 2);
  CHECK(c.data_parallel == 2);
  CHECK(c.tokens_per_micro_batch_rank == 32);
}

TEST_CASE("a step that does not divide is an error naming the fix", "[training]") {
  const ShardedModel model = testing::make_model(testing::topologies()[1]);  // FSDP 4
  const auto message = [&](const TrainingOptions& o) -> std::string {
    try {
      training_shape(model, o);
    } catch (const PlanError& e) {
      return e.what();
    }
    return {};
  };
  const std::string uneven = message(training(4 * 64 + 1, 64));
  CHECK(uneven.find("tokens_per_step 257") != std::string::npos);
  CHECK(uneven.find("4 x 1 x 64 = 256") != std::string::npos);
  CHECK(uneven.find("fix:") != std::string::npos);
  CHECK(message(training(256, 0)).find("seq_len must be > 0") != std::string::npos);
  CHECK(message(training(0, 64)).find("tokens_per_step 0") != std::string::npos);
  const ShardedModel cp = testing::make_model(testing::topologies()[6]);
  try {
    training_shape(cp, training(2 * 63, 63));
    FAIL("an odd sequence over cp 2 was accepted");
  } catch (const PlanError& e) {
    CHECK(std::string(e.what()).find("does not split over context parallelism 2") !=
          std::string::npos);
  }
  const ShardedModel moe = testing::make_model(testing::topologies()[5]);
  TrainingOptions dense_routing = training(4 * 64, 64);
  dense_routing.experts_per_token = 0;
  try {
    training_shape(moe, dense_routing);
    FAIL("a MoE model without top-k was accepted");
  } catch (const PlanError& e) {
    CHECK(std::string(e.what()).find("experts_per_token") != std::string::npos);
  }
}

TEST_CASE("activation memory by Korthikanti et al., counted by hand", "[training][memory]") {
  // s = 4 tokens, b = 1, h = 8, t = 1, one layer, one stage: s b h (10 + 24 / t) bytes.
  const ShardedModel model = hand_model({{"dp_shard", 2, DimRole::fsdp}});
  TrainingOptions o = training(16, 4);
  CHECK(training_activation_bytes(model, o) == 4 * 8 * 34);
  // Without flash attention the score term 5 a s / (h t), a = 1 head (8 query rows < 128).
  o.flash_attention = false;
  CHECK(training_activation_bytes(model, o) == 4 * 8 * 34 + 5 * 1 * 4 * 4);
  // Two-way TP: 24 / t halves; micro_batch_size 2 doubles every term.
  const ShardedModel tp = hand_model({{"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}});
  o = training(2 * 2 * 4 * 2, 4, 2);
  CHECK(training_activation_bytes(tp, o) == 4 * 2 * 8 * 22);
  // It is the activations of training_memory when the step is planned.
  const StepPlan plan = training_plan(tp, o);
  for (int r = 0; r < 4; ++r) CHECK(training_memory(plan, r).activations == 4 * 2 * 8 * 22);
}

TEST_CASE("pipeline stages keep min(m, p) micro-batches of their own layers",
          "[training][memory]") {
  const ShardedModel pp = testing::make_model(testing::topologies()[7]);  // 2 stages x FSDP 2
  // tiny-dense: h = 64, 2 layers (1 per stage), seq 64, 3 micro-batches: 2 in flight.
  const TrainingOptions o = training(2 * 64 * 3, 64);
  CHECK(training_activation_bytes(pp, o) == 64 * 64 * 34 * 1 * 2);
}

TEST_CASE("gradient sync runs per layer in backward order", "[training]") {
  const ShardedModel model = testing::make_model(testing::topologies()[1]);  // FSDP 4, 2 layers
  StrategyOptions options;
  options.name = "owner";
  options.grad_sync.enabled = true;
  PlanSettings settings;
  settings.training = training(4 * 64 * 2, 64);
  const StepPlan plan = build_plan(model, options, settings);
  // The first reduce-scatter of each layer's gradients, in op order.
  std::vector<int> layer_order;
  int last_backward = -1;
  for (const Op& op : plan.ops) {
    if (op.kind == OpKind::backward) last_backward = op.id;
    if (step_phase(op) != StepPhase::gradient_sync) continue;
    for (int p : op.params) {
      const int layer = plan.model.params[p].layer;
      if (layer >= 0 &&
          std::find(layer_order.begin(), layer_order.end(), layer) == layer_order.end())
        layer_order.push_back(layer);
    }
  }
  CHECK(layer_order == std::vector<int>{1, 0});
  // A layer's sync does not wait for the backward of the layers before it.
  for (const Op& op : plan.ops) {
    if (step_phase(op) != StepPhase::gradient_sync) continue;
    bool top_layer = std::all_of(op.params.begin(), op.params.end(),
                                 [&](int p) { return plan.model.params[p].layer == 1; });
    if (top_layer) CHECK_FALSE(depends_on(plan, op.id, last_backward));
  }
}

TEST_CASE("overlap with backward: the optimizer starts before the backward ends",
          "[training][overlap]") {
  for (const auto& topology : testing::topologies()) {
    INFO(topology.name);
    const ShardedModel model = testing::make_model(topology);
    TrainingOptions o = training(4 * 64 * 4, 64);
    std::vector<int> last_backward;
    for (const std::string overlap : {"none", "backward"}) {
      o.overlap = overlap;
      const StepPlan plan = training_plan(model, o);
      int last = -1;
      for (const Op& op : plan.ops)
        if (op.kind == OpKind::backward) last = op.id;
      REQUIRE(last >= 0);
      // Optimizer compute (momentum, Newton-Schulz) that does not wait for the last backward.
      int early = 0;
      int optimizer_compute = 0;
      for (const Op& op : plan.ops) {
        if (op.kind != OpKind::momentum && op.kind != OpKind::newton_schulz) continue;
        ++optimizer_compute;
        if (!depends_on(plan, op.id, last)) ++early;
      }
      REQUIRE(optimizer_compute > 0);
      if (overlap == "none") {
        // Every rank's optimizer waits for the whole backward, every stage's.
        CHECK(early == 0);
      } else {
        CHECK(early > 0);
      }
      // The peak memory rule: overlapping holds the activations and the optimizer's
      // transients at once.
      for (int r = 0; r < model.mesh.world_size(); ++r) {
        const TrainingMemory m = training_memory(plan, r);
        CHECK(m.overlapping == (overlap == "backward"));
        CHECK(m.activations > 0);
        const std::int64_t held = overlap == "backward" ? m.activations + m.transients()
                                                        : std::max(m.activations, m.transients());
        CHECK(m.peak_bytes() == m.persistent() + held + m.reserved);
      }
    }
  }
}

TEST_CASE("a plan without training holds no training op", "[training]") {
  const ShardedModel model = testing::make_model(testing::topologies()[1]);
  StrategyOptions options;
  options.name = "owner";
  const StepPlan plan = build_plan(model, options, PlanSettings{});
  CHECK_FALSE(has_training_ops(plan));
  for (const Op& op : plan.ops) {
    CHECK(op.tensor != TensorRole::parameter);
    CHECK(op.tensor != TensorRole::activation);
  }
  CHECK(training_memory(plan, 0).activations == 0);
}

TEST_CASE("the training step's gradient sync spans the data-parallel dims, not TP", "[training]") {
  // FSDP 2 x TP 2: each TP rank's backward computes its own slice, reduce-scattered over FSDP.
  const ShardedModel model = testing::make_model(testing::topologies()[4]);
  const int tp = model.mesh.find("tp");
  REQUIRE(tp >= 0);
  StrategyOptions options;
  options.name = "owner";
  options.grad_sync.enabled = true;
  PlanSettings settings;
  settings.training = training(2 * 64 * 2, 64);
  const StepPlan plan = build_plan(model, options, settings);
  int syncs = 0;
  for (const Op& op : plan.ops) {
    if (step_phase(op) != StepPhase::gradient_sync) continue;
    ++syncs;
    CHECK_FALSE(op.group.contains(tp));
  }
  CHECK(syncs > 0);
  // The gradient slot keeps the synced shard, plus one layer's unsynced TP-local gradient.
  for (int r = 0; r < 4; ++r) {
    std::int64_t shards = 0;
    std::map<int, std::int64_t> layer_unsynced;
    for (const auto& dp : plan.model.params) {
      if (!dp.layout.holds(plan.mesh(), r)) continue;
      const std::int64_t shard = dp.layout.shard_numel(plan.mesh(), r);
      shards += shard * 2;  // bf16 gradients
      const DimSet fsdp = dp.layout.shard_dims().without(tp);
      if (dp.layer >= 0 && !fsdp.empty())
        layer_unsynced[dp.layer] += (dp.layout.shard_numel(plan.mesh(), r, fsdp) - shard) * 2;
    }
    std::int64_t largest = 0;
    for (const auto& [layer, bytes] : layer_unsynced) largest = std::max(largest, bytes);
    INFO("rank " << r);
    CHECK(training_memory(plan, r).gradients == shards + largest);
  }
}

TEST_CASE("the EP token exchange moves top-k copies of every token, in every pricing path",
          "[training][ep]") {
  // Each MoE layer exchanges every token's top-k hidden states four times (forward dispatch
  // and combine, their two backward twins), bf16, each member keeping its own 1/ep share:
  // 4 x moe_layers x tokens_per_step x k x hidden x 2 B x (ep - 1) / ep leaves the ranks in all.
  // bytes_sent (the plan's summaries) and all_to_all_transfers (the analytic model's and the
  // simulator's pair matrices) must both say so: the second once priced these ops at zero bytes.
  for (const auto& topology : testing::topologies()) {
    const ShardedModel model = testing::make_model(topology);
    const StepPlan plan = training_plan(model, training(4 * 64 * 8, 64));
    const DeviceMesh& mesh = plan.mesh();
    double via_bytes_sent = 0, via_transfers = 0;
    int exchanges = 0;
    for (const Op& op : plan.ops) {
      if (op.kind != OpKind::all_to_all || op.tensor != TensorRole::activation) continue;
      ++exchanges;
      for (int r : op.ranks.ranks(mesh)) {
        for (const std::int64_t b : bytes_sent(plan, op, r))
          via_bytes_sent += static_cast<double>(b);
        if (mesh.group_leader(r, op.group) != r) continue;
        for (const PairBytes& t : all_to_all_transfers(plan, op, mesh.group_members(r, op.group)))
          via_transfers += static_cast<double>(t.bytes);
      }
    }
    INFO(topology.name << ": " << exchanges << " token exchanges");
    CHECK(via_transfers == via_bytes_sent);
    const Model unsharded = *find_preset(topology.model);
    const bool moe = std::any_of(unsharded.params.begin(), unsharded.params.end(),
                                 [](const Parameter& p) { return p.role == ParamRole::expert_up; });
    const int ep = mesh.find("ep") >= 0 ? mesh.size(mesh.find("ep")) : 1;
    if (!moe || ep < 2) {
      CHECK(exchanges == 0);
      continue;
    }
    std::set<int> moe_layers;
    for (const Parameter& p : unsharded.params)
      if (p.role == ParamRole::expert_up) moe_layers.insert(p.layer);
    const auto embedding =
        std::find_if(unsharded.params.begin(), unsharded.params.end(),
                     [](const Parameter& p) { return p.role == ParamRole::embedding; });
    REQUIRE(embedding != unsharded.params.end());
    const double hidden = static_cast<double>(embedding->shape.back());  // [vocab, hidden]
    const double expected =
        4.0 * static_cast<double>(moe_layers.size()) * 4 * 64 * 8 * 2 * hidden * 2 * (ep - 1) / ep;
    CHECK(via_bytes_sent == Approx(expected).epsilon(1e-9));
  }
}
