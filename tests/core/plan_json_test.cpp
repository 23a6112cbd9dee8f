// Tests of the JSON form of step plans: exact round trip of every field (compared field by field
// and by re-serialization, in memory and through text) on a hand-made plan that uses every op
// kind and every op field, and on the plans of every built-in strategy; compactness of ops; and
// error messages that name the JSON path of malformed input.
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/plan/plan_json.hpp"
#include "core/plan/strategy.hpp"
#include "core/plan/training.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;
using nlohmann::json;

namespace {

DistributedParam make_param(const DeviceMesh& mesh, int index, std::string name,
                            std::vector<std::int64_t> shape, std::vector<Placement> placements,
                            ParamRole role, int layer, OptimizerKind optimizer,
                            DType dtype = DType::bf16) {
  DistributedParam p;
  p.index = index;
  p.source = index + 10;
  p.name = std::move(name);
  p.shape = shape;
  p.dtype = dtype;
  p.role = role;
  p.layer = layer;
  p.optimizer = optimizer;
  p.layout = TensorLayout(mesh, std::move(shape), std::move(placements));
  return p;
}

Op make_op(OpKind kind, int stream, RankBox ranks) {
  Op op;
  op.kind = kind;
  op.stream = stream;
  op.ranks = std::move(ranks);
  return op;
}

// A plan that sets every field of every struct to something other than its default somewhere.
StepPlan hand_made_plan() {
  const DeviceMesh mesh(
      {{"pp", 2, DimRole::pp}, {"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}}, 4);
  StepPlan plan;
  plan.strategy = "hand";
  plan.strategy_options = R"({"name":"hand","note":"quotes \" and \\ survive"})";
  plan.model.mesh = mesh;
  plan.model.model_name = "hand-model";
  plan.model.params = {
      make_param(mesh, 0, "layers.0.attn.q", {16, 8},
                 {Placement::independent(0), Placement::strided_shard(0, 2), Placement::shard(0)},
                 ParamRole::attn_q, 0, OptimizerKind::muon),
      make_param(mesh, 1, "layers.1.mlp.down", {8, 24},
                 {Placement::independent(1), Placement::replicate(), Placement::shard(1)},
                 ParamRole::mlp_down, 1, OptimizerKind::muon, DType::fp32),
      make_param(mesh, 2, "layers.1.experts.up", {4, 8, 8},
                 {Placement::independent(1), Placement::shard(0), Placement::replicate()},
                 ParamRole::expert_up, 1, OptimizerKind::muon, DType::fp16),
      make_param(mesh, 3, "norm", {8},
                 {Placement::replicate(), Placement::replicate(), Placement::replicate()},
                 ParamRole::norm, -1, OptimizerKind::adamw),
  };
  plan.assignment.owner = {1, 7, 5, Assignment::kNoOwner};
  plan.assignment.ns_flops_per_rank = {0.0, 1.0 / 3.0, 0.0, 0.0, 0.0, 2.5e13, 0.0, 1e-300};
  plan.assignment.imbalance = std::numeric_limits<double>::infinity();
  plan.settings.optimizer.muon.ns_steps = 3;
  plan.settings.optimizer.comm_dtype = DType::fp32;
  plan.settings.state_dtype = DType::bf16;
  plan.settings.optimizer.muon.nesterov = false;
  plan.settings.optimizer.muon.lr = 0.1 + 0.2;  // no short decimal form
  plan.settings.optimizer.muon.momentum_form = MomentumForm::classic;
  plan.settings.optimizer.muon.ns_coefficients = "custom";
  plan.settings.optimizer.muon.custom_coefficients = {
      {3.4445, -4.775, 2.0315}, {1.0 / 3.0, -1e-300, 2.0}, {1, 2, 3}};
  plan.settings.optimizer.muon.adjust_lr_fn = LrScaleRule::match_rms_adamw;
  plan.settings.optimizer.adamw = {2e-4, 0.85, 0.975, 1e-12, 0.03};
  plan.settings.optimizer.qk_clip = {true, 42.5, 16};
  plan.streams = {"compute", "comm", "comm.prefetch"};
  plan.buffers = {{0, "gathered.q", {0}, DimSet::of({1, 2}), true},
                  {1, "everything", {0, 1, 2, 3}, DimSet{}, false}};

  const RankBox all = RankBox::everyone(mesh);
  RankBox stage1 = all;
  stage1.coord[0] = 1;
  const RankBox single5 = RankBox::single(mesh, 5);
  std::vector<Op> ops;
  ops.push_back(make_op(OpKind::alloc, 0, all));
  ops.back().buffer = 0;
  ops.push_back(make_op(OpKind::momentum, 0, all));
  ops.back().params = {0, 1};
  ops.back().label = "momentum";
  ops.push_back(make_op(OpKind::pack, 1, all));
  ops.back().params = {0};
  ops.back().gathered = DimSet::of({2});
  ops.push_back(make_op(OpKind::gather, 1, stage1));
  ops.back().group = DimSet::of({1, 2});
  ops.back().root = 3;
  ops.back().params = {1};
  ops.back().deps = {1, 2};
  ops.push_back(make_op(OpKind::unpack, 1, single5));
  ops.back().params = {1};
  ops.push_back(make_op(OpKind::newton_schulz, 0, single5));
  ops.back().params = {1, 2};
  ops.back().owned_only = true;
  ops.back().ns_steps = 5;
  ops.back().deps = {3};
  ops.push_back(make_op(OpKind::scatter, 1, stage1));
  ops.back().group = DimSet::of({1});
  ops.back().root = 1;
  ops.back().params = {1};
  ops.back().gathered = DimSet::of({2});
  ops.push_back(make_op(OpKind::broadcast, 2, all));
  ops.back().group = DimSet::of({0});
  ops.back().root = 1;
  ops.back().params = {3};
  ops.push_back(make_op(OpKind::all_to_all, 1, stage1));
  ops.back().group = DimSet::of({1, 2});
  ops.back().params = {1, 2};
  ops.back().direction = AllToAllDirection::from_owners;
  ops.push_back(make_op(OpKind::all_gather, 1, all));
  ops.back().group = DimSet::of({0, 1, 2});
  ops.back().params = {0, 1};
  ops.back().owned_only = true;
  ops.push_back(make_op(OpKind::reduce_scatter, 2, all));
  ops.back().group = DimSet::of({1});
  ops.back().params = {0};
  ops.back().period = 4;
  ops.push_back(make_op(OpKind::all_reduce, 2, all));
  ops.back().group = DimSet::of({1});
  ops.back().params = {3};
  ops.back().period = 2;
  ops.push_back(make_op(OpKind::send, 1, stage1));
  ops.back().group = DimSet::of({2});
  ops.back().root = 0;
  ops.back().peer = 1;
  ops.back().params = {2};
  ops.back().tensor = TensorRole::result;
  ops.push_back(make_op(OpKind::recv, 1, stage1));
  ops.back().group = DimSet::of({2});
  ops.back().root = 0;
  ops.back().peer = 1;
  ops.back().params = {2};
  ops.push_back(make_op(OpKind::apply_update, 0, all));
  ops.back().params = {0, 1, 2};
  ops.back().deps = {6, 9};
  ops.push_back(make_op(OpKind::adamw, 0, all));
  ops.back().params = {3};
  ops.push_back(make_op(OpKind::barrier, 2, all));
  ops.back().group = DimSet::all(3);
  ops.push_back(make_op(OpKind::release, 0, all));
  ops.back().buffer = 0;
  ops.back().label = "free \"gathered\"";
  for (std::size_t i = 0; i < ops.size(); ++i) {
    ops[i].id = static_cast<int>(i);
    if (ops[i].tensor == TensorRole::none) ops[i].tensor = default_tensor(ops[i]);
  }
  // Fields a valid plan would not have still round-trip: an id that is not the position, an
  // empty (default) rank box.
  ops.push_back(make_op(OpKind::barrier, 0, RankBox{}));
  ops.back().id = 99;
  plan.ops = std::move(ops);
  return plan;
}

void require_same_layout(const TensorLayout& a, const TensorLayout& b) {
  CHECK(a.shape() == b.shape());
  CHECK(a.placements() == b.placements());
}

// Field-by-field equality of two plans.
void require_same(const StepPlan& a, const StepPlan& b) {
  CHECK(a.strategy == b.strategy);
  CHECK(a.strategy_options == b.strategy_options);
  CHECK(a.model.model_name == b.model.model_name);
  const DeviceMesh& ma = a.model.mesh;
  const DeviceMesh& mb = b.model.mesh;
  CHECK(ma.gpus_per_node() == mb.gpus_per_node());
  REQUIRE(ma.ndims() == mb.ndims());
  for (int d = 0; d < ma.ndims(); ++d) {
    CHECK(ma.dim(d).name == mb.dim(d).name);
    CHECK(ma.dim(d).size == mb.dim(d).size);
    CHECK(ma.dim(d).role == mb.dim(d).role);
  }
  REQUIRE(a.model.params.size() == b.model.params.size());
  for (std::size_t i = 0; i < a.model.params.size(); ++i) {
    const DistributedParam& pa = a.model.params[i];
    const DistributedParam& pb = b.model.params[i];
    INFO("param " << i);
    CHECK(pa.index == pb.index);
    CHECK(pa.source == pb.source);
    CHECK(pa.name == pb.name);
    CHECK(pa.shape == pb.shape);
    CHECK(pa.dtype == pb.dtype);
    CHECK(pa.role == pb.role);
    CHECK(pa.layer == pb.layer);
    CHECK(pa.optimizer == pb.optimizer);
    require_same_layout(pa.layout, pb.layout);
  }
  CHECK(a.assignment.owner == b.assignment.owner);
  CHECK(a.assignment.ns_flops_per_rank == b.assignment.ns_flops_per_rank);
  CHECK(a.assignment.imbalance == b.assignment.imbalance);
  const OptimizerConfig& oa = a.settings.optimizer;
  const OptimizerConfig& ob = b.settings.optimizer;
  CHECK(oa.muon.lr == ob.muon.lr);
  CHECK(oa.muon.weight_decay == ob.muon.weight_decay);
  CHECK(oa.muon.momentum == ob.muon.momentum);
  CHECK(oa.muon.nesterov == ob.muon.nesterov);
  CHECK(oa.muon.momentum_form == ob.muon.momentum_form);
  CHECK(oa.muon.ns_coefficients == ob.muon.ns_coefficients);
  CHECK(oa.muon.custom_coefficients == ob.muon.custom_coefficients);
  CHECK(oa.muon.eps == ob.muon.eps);
  CHECK(oa.muon.ns_steps == ob.muon.ns_steps);
  CHECK(oa.muon.adjust_lr_fn == ob.muon.adjust_lr_fn);
  CHECK(oa.adamw.lr == ob.adamw.lr);
  CHECK(oa.adamw.beta1 == ob.adamw.beta1);
  CHECK(oa.adamw.beta2 == ob.adamw.beta2);
  CHECK(oa.adamw.eps == ob.adamw.eps);
  CHECK(oa.adamw.weight_decay == ob.adamw.weight_decay);
  CHECK(oa.qk_clip.enabled == ob.qk_clip.enabled);
  CHECK(oa.qk_clip.tau == ob.qk_clip.tau);
  CHECK(oa.qk_clip.head_dim == ob.qk_clip.head_dim);
  CHECK(oa.comm_dtype == ob.comm_dtype);
  CHECK(a.settings.state_dtype == b.settings.state_dtype);
  CHECK(a.settings.training_memory == b.settings.training_memory);
  CHECK(a.settings.training == b.settings.training);
  CHECK(a.streams == b.streams);
  REQUIRE(a.buffers.size() == b.buffers.size());
  for (std::size_t i = 0; i < a.buffers.size(); ++i) {
    INFO("buffer " << i);
    CHECK(a.buffers[i].id == b.buffers[i].id);
    CHECK(a.buffers[i].name == b.buffers[i].name);
    CHECK(a.buffers[i].params == b.buffers[i].params);
    CHECK(a.buffers[i].gathered == b.buffers[i].gathered);
    CHECK(a.buffers[i].owned_only == b.buffers[i].owned_only);
  }
  REQUIRE(a.ops.size() == b.ops.size());
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const Op& x = a.ops[i];
    const Op& y = b.ops[i];
    INFO("op " << i);
    CHECK(x.id == y.id);
    CHECK(x.kind == y.kind);
    CHECK(x.stream == y.stream);
    CHECK(x.ranks == y.ranks);
    CHECK(x.group == y.group);
    CHECK(x.root == y.root);
    CHECK(x.peer == y.peer);
    CHECK(x.params == y.params);
    CHECK(x.gathered == y.gathered);
    CHECK(x.owned_only == y.owned_only);
    CHECK(x.direction == y.direction);
    CHECK(x.buffer == y.buffer);
    CHECK(x.ns_steps == y.ns_steps);
    CHECK(x.period == y.period);
    CHECK(x.tokens == y.tokens);
    CHECK(x.bytes == y.bytes);
    CHECK(x.deps == y.deps);
    CHECK(x.label == y.label);
  }
}

void check_round_trip(const StepPlan& plan) {
  const json j = plan_to_json(plan);
  const StepPlan back = plan_from_json(j);
  require_same(plan, back);
  CHECK(plan_to_json(back) == j);
  // Through text too: doubles print as the shortest text that reads back exactly.
  const StepPlan from_text = plan_from_json(json::parse(j.dump()));
  require_same(plan, from_text);
  CHECK(plan_to_json(from_text) == j);
}

// The message of the PlanError that plan_from_json throws for `j` (empty if none).
std::string error_of(const json& j) {
  try {
    plan_from_json(j);
  } catch (const PlanError& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("plan JSON round trip is exact on a plan using every op kind and field", "[plan_json]") {
  const StepPlan plan = hand_made_plan();
  // Every op kind appears.
  for (int k = static_cast<int>(OpKind::alloc); k <= static_cast<int>(OpKind::barrier); ++k) {
    bool found = false;
    for (const Op& op : plan.ops) found = found || op.kind == static_cast<OpKind>(k);
    INFO("op kind " << to_string(static_cast<OpKind>(k)));
    CHECK(found);
  }
  check_round_trip(plan);
}

TEST_CASE("plan JSON uses names and compact ops", "[plan_json]") {
  const StepPlan plan = hand_made_plan();
  const json j = plan_to_json(plan);
  CHECK(j.at("format") == "muonbed-plan");
  CHECK(j.at("version") == 3);
  CHECK(j.at("model").at("mesh").at("dims").at(1) ==
        json({{"name", "dp_shard"}, {"size", 2}, {"role", "fsdp"}}));
  CHECK(j.at("model").at("params").at(0).at("layout").at("placements") ==
        json({"I(0)", "SS(0,2)", "S(0)"}));
  CHECK(j.at("model").at("params").at(1).at("dtype") == "fp32");
  CHECK(j.at("model").at("params").at(3).at("optimizer") == "adamw");
  CHECK(j.at("assignment").at("imbalance") == "inf");
  CHECK(j.at("buffers").at(0).at("gathered") == json({"dp_shard", "tp"}));
  const json& ops = j.at("ops");
  // alloc on everyone: kind and buffer only.
  CHECK(ops.at(0) == json({{"kind", "alloc"}, {"buffer", 0}}));
  // gather: the box names its fixed dim only, the group is a list of names.
  CHECK(ops.at(3) == json({{"kind", "gather"},
                           {"stream", 1},
                           {"ranks", {{"pp", 1}}},
                           {"group", {"dp_shard", "tp"}},
                           {"root", 3},
                           {"params", {1}},
                           {"deps", {1, 2}}}));
  CHECK(ops.at(4).at("ranks") == json({{"pp", 1}, {"dp_shard", 0}, {"tp", 1}}));
  CHECK(ops.at(8).at("direction") == "from_owners");
  CHECK(ops.at(10).at("period") == 4);
  // Non-default id and the default (empty) box.
  CHECK(ops.back() == json({{"id", 99}, {"kind", "barrier"}, {"ranks", nullptr}}));
  // A default op on everyone is just its kind.
  StepPlan tiny = plan;
  tiny.ops = {make_op(OpKind::barrier, 0, RankBox::everyone(plan.mesh()))};
  CHECK(plan_to_json(tiny).at("ops") == json::array({{{"kind", "barrier"}}}));
}

TEST_CASE("plan JSON keeps non-canonical placements and default layouts", "[plan_json]") {
  StepPlan plan = hand_made_plan();
  plan.model.params.push_back(DistributedParam{});  // default layout, empty shape
  plan.model.params.back().name = "bare";
  plan.model.params.back().index = 4;
  check_round_trip(plan);
  const json j = plan_to_json(plan);
  CHECK_FALSE(j.at("model").at("params").at(4).contains("layout"));
}

TEST_CASE("plan JSON errors name the path", "[plan_json]") {
  const json good = plan_to_json(hand_made_plan());
  auto with = [&](const json::json_pointer& where, json value) {
    json j = good;
    j[where] = std::move(value);
    return j;
  };
  CHECK_THAT(error_of(with("/ops/12/stream"_json_pointer, "one")),
             Catch::Contains("ops[12].stream: expected integer, got string"));
  CHECK_THAT(error_of(with("/ops/3/root"_json_pointer, 1.5)),
             Catch::Contains("ops[3].root: expected integer, got number"));
  CHECK_THAT(error_of(with("/ops/2/kind"_json_pointer, "teleport")),
             Catch::Contains("ops[2].kind: ") && Catch::Contains("teleport"));
  CHECK_THAT(error_of(with("/ops/3/group/1"_json_pointer, "ep")),
             Catch::Contains("ops[3].group[1]: no mesh dimension 'ep'"));
  CHECK_THAT(error_of(with("/ops/3/ranks/pp"_json_pointer, 2)),
             Catch::Contains("ops[3].ranks.pp: coordinate 2 is outside 0..1"));
  CHECK_THAT(error_of(with("/ops/3/ranks"_json_pointer, json::array())),
             Catch::Contains("ops[3].ranks: expected object"));
  CHECK_THAT(error_of(with("/ops/5/strem"_json_pointer, 1)),
             Catch::Contains("ops[5]: unknown key 'strem'"));
  CHECK_THAT(error_of(with("/ops/5/deps/0"_json_pointer, "3")),
             Catch::Contains("ops[5].deps[0]: expected integer, got string"));
  CHECK_THAT(error_of(with("/ops/8/direction"_json_pointer, "sideways")),
             Catch::Contains("ops[8].direction: ") && Catch::Contains("to_owners"));
  CHECK_THAT(error_of(with("/model/params/0/layout/placements/1"_json_pointer, "S(x)")),
             Catch::Contains("model.params[0].layout.placements[1]: 'S(x)' is not a placement"));
  CHECK_THAT(error_of(with("/model/params/0/layout/placements"_json_pointer, json({"R"}))),
             Catch::Contains("model.params[0].layout: "));
  CHECK_THAT(error_of(with("/model/params/1/dtype"_json_pointer, "fp64")),
             Catch::Contains("model.params[1].dtype: "));
  CHECK_THAT(error_of(with("/model/mesh/dims/0/size"_json_pointer, 0)),
             Catch::Contains("model.mesh: "));
  CHECK_THAT(error_of(with("/assignment/ns_flops_per_rank/2"_json_pointer, "many")),
             Catch::Contains("assignment.ns_flops_per_rank[2]: expected number, got string"));
  CHECK_THAT(error_of(with("/settings/optimizer/nesterov"_json_pointer, 1)),
             Catch::Contains("settings.optimizer.nesterov: expected boolean, got integer"));
  CHECK_THAT(error_of(with("/settings/optimizer/momentum"_json_pointer, 1.5)),
             Catch::Contains("momentum must lie in [0, 1)"));
  CHECK_THAT(error_of(with("/ops/0/tensor"_json_pointer, "weights")),
             Catch::Contains("unknown tensor role 'weights'"));
  CHECK_THAT(error_of(with("/streams"_json_pointer, "compute")),
             Catch::Contains("streams: expected array, got string"));
  CHECK_THAT(error_of(with("/ops/0/buffer"_json_pointer, 5000000000LL)),
             Catch::Contains("ops[0].buffer: integer 5000000000 is out of range"));
  CHECK_THAT(error_of(with("/format"_json_pointer, "something-else")),
             Catch::Contains("format: expected \"muonbed-plan\""));
  CHECK_THAT(error_of(with("/version"_json_pointer, 1)),
             Catch::Contains("version: plan format version 1 is not supported"));
  CHECK_THAT(error_of(json::array()), Catch::Contains("(top level): expected object, got array"));
  CHECK(error_of(good).empty());
}

TEST_CASE("plan JSON rejects plans it cannot name", "[plan_json]") {
  StepPlan plan = hand_made_plan();
  plan.ops[3].group = DimSet::of({5});
  CHECK_THROWS_AS(plan_to_json(plan), PlanError);
  plan = hand_made_plan();
  plan.ops[3].ranks.coord.push_back(0);
  CHECK_THROWS_AS(plan_to_json(plan), PlanError);
}

TEST_CASE("plan JSON round trip is exact on every built-in strategy's plans", "[plan_json]") {
  struct Case {
    std::vector<MeshDim> dims;
    std::string model;
  };
  const std::vector<Case> cases = {
      {{{"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}}, "tiny-dense"},
      {{{"pp", 2, DimRole::pp},
        {"dp_replicate", 2, DimRole::replicate},
        {"dp_shard", 2, DimRole::fsdp},
        {"tp", 2, DimRole::tp}},
       "tiny-dense"},
      {{{"dp_shard", 2, DimRole::fsdp}, {"ep", 2, DimRole::ep}}, "tiny-moe"},
  };
  for (const Case& c : cases) {
    const ShardedModel model =
        parallelize(*find_preset(c.model), DeviceMesh(c.dims, 4), ParallelRules{});
    for (const std::string& name : strategy_names()) {
      StrategyOptions options;
      options.name = name;
      if (name == "owner") {
        options.grad_sync.enabled = true;
        options.grad_sync.level_periods = {1, 2};
      }
      INFO("strategy " << name << " on " << model.mesh.describe());
      const StepPlan plan = build_plan(model, options, PlanSettings{});
      check_round_trip(plan);
      // Compactness: no op repeats a default field.
      const json written = plan_to_json(plan);
      for (const json& op : written.at("ops")) {
        CHECK_FALSE(op.contains("id"));
        if (op.contains("period")) CHECK(op.at("period") != 1);
        if (op.contains("stream")) CHECK(op.at("stream") != 0);
        if (op.contains("root")) CHECK(op.at("root") != -1);
      }
    }
  }
}

TEST_CASE("plan JSON round trip of a default plan", "[plan_json]") {
  const StepPlan plan;
  check_round_trip(plan);
  // An empty object is a default plan too.
  require_same(plan, plan_from_json(json::object()));
}

TEST_CASE("plan JSON round trip is exact on training-step plans", "[plan_json][training]") {
  // Every topology of the matrix with a training step (forward, backward, parameter and
  // activation collectives, pipeline sends), both overlap modes.
  for (const auto& topology : testing::topologies()) {
    for (const std::string overlap : {"none", "backward"}) {
      INFO(topology.name << ", overlap " << overlap);
      const ShardedModel model = testing::make_model(topology);
      PlanSettings settings;
      settings.training.enabled = true;
      settings.training.seq_len = 64;
      settings.training.micro_batch_size = 2;
      settings.training.tokens_per_step = 4 * 64 * 2 * 4;  // 4 micro-batches at any dp <= 4
      settings.training.experts_per_token = 2;
      settings.training.overlap = overlap;
      settings.training.flash_attention = overlap == "none";
      StrategyOptions options;
      options.name = "owner";
      const StepPlan plan = build_plan(model, options, settings);
      REQUIRE(has_training_ops(plan));
      check_round_trip(plan);
    }
  }
}
