// Tests of the parallelization rules: placements chosen for FSDP, TP (column/row), FSDP on TP
// (strided), HSDP, EP slices, PP stages and a 4-D mesh; that every distributed parameter's
// shards cover its tensor exactly; overrides; and the wording of rule errors.
#include <catch2/catch.hpp>

#include <map>

#include "core/base/errors.hpp"
#include "core/model/parallelize.hpp"

using namespace muonbed;

namespace {

Model preset(const std::string& name) {
  auto m = find_preset(name);
  REQUIRE(m.has_value());
  return *m;
}

DeviceMesh make_mesh(std::vector<std::pair<std::string, int>> dims, int gpus_per_node = 8) {
  std::vector<MeshDim> out;
  for (auto& [name, size] : dims) {
    DimRole role{};
    REQUIRE(default_role_for_name(name, role));
    out.push_back({name, size, role});
  }
  return DeviceMesh(out, gpus_per_node);
}

const DistributedParam& by_name(const ShardedModel& m, const std::string& name) {
  for (const DistributedParam& p : m.params)
    if (p.name == name) return p;
  FAIL("no distributed parameter " << name);
  return m.params.front();
}

std::vector<Placement> P(std::initializer_list<Placement> ps) {
  return ps;
}
const Placement R = Placement::replicate();
Placement S(int d) {
  return Placement::shard(d);
}
Placement SS(int d, int f) {
  return Placement::strided_shard(d, f);
}
Placement I(int c) {
  return Placement::independent(c);
}

// Every distributed parameter: held somewhere, and each shard group of a holder partitions it.
void check_coverage(const ShardedModel& m) {
  const DeviceMesh& mesh = m.mesh;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const DistributedParam& p = m.params[i];
    INFO("param " << p.name << " " << p.layout.describe(mesh));
    REQUIRE(p.index == static_cast<int>(i));
    REQUIRE(p.layout.shape() == p.shape);
    const DimSet shard = p.layout.shard_dims();
    int holders = 0;
    for (int r = 0; r < mesh.world_size(); ++r) {
      if (!p.layout.holds(mesh, r)) {
        REQUIRE(p.layout.shard_numel(mesh, r) == 0);
        continue;
      }
      ++holders;
      if (mesh.group_leader(r, shard) != r) continue;
      std::vector<int> count(p.numel(), 0);
      for (int q : mesh.group_members(r, shard))
        for_each_element(p.layout.index_set(mesh, q), p.shape,
                         [&](std::int64_t f, std::int64_t) { ++count[f]; });
      for (int c : count) REQUIRE(c == 1);
      REQUIRE(p.layout.shard_numel(mesh, r, shard) == p.numel());
    }
    REQUIRE(holders > 0);
  }
}

}  // namespace

TEST_CASE("FSDP: everything Shard(0), expert stacks shard rows", "[parallelize]") {
  const ShardedModel m = parallelize(preset("tiny-moe"), make_mesh({{"dp_shard", 4}}), {});
  CHECK(m.model_name == "tiny-moe");
  CHECK(by_name(m, "layers.0.attn.q").layout.placements() == P({S(0)}));
  CHECK(by_name(m, "layers.0.attn.o").layout.placements() == P({S(0)}));
  CHECK(by_name(m, "norm").layout.placements() == P({S(0)}));
  CHECK(by_name(m, "layers.1.moe.experts.down").layout.placements() == P({S(1)}));
  CHECK(by_name(m, "layers.1.moe.experts.down").shape == std::vector<std::int64_t>{8, 64, 32});
  check_coverage(m);
  // Bytes: every element once over the 4 ranks.
  std::int64_t bytes = 0;
  for (int r = 0; r < 4; ++r) bytes += m.shard_bytes(r);
  CHECK(bytes == preset("tiny-moe").numel() * 2);

  ParallelRules cols;
  cols.fsdp_tensor_dim = 1;
  const ShardedModel c = parallelize(preset("tiny-moe"), make_mesh({{"dp_shard", 4}}), cols);
  CHECK(by_name(c, "layers.0.attn.q").layout.placements() == P({S(1)}));
  CHECK(by_name(c, "norm").layout.placements() == P({S(0)}));
  CHECK(by_name(c, "layers.1.moe.experts.up").layout.placements() == P({S(2)}));
  ParallelRules bad;
  bad.fsdp_tensor_dim = 2;
  REQUIRE_THROWS_WITH(parallelize(preset("tiny-dense"), make_mesh({{"dp_shard", 4}}), bad),
                      Catch::Contains("fsdp_tensor_dim"));
}

TEST_CASE("TP: column and row parallel", "[parallelize]") {
  const ShardedModel m = parallelize(preset("tiny-moe"), make_mesh({{"tp", 2}}), {});
  for (const char* col : {"layers.0.attn.q", "layers.0.attn.k", "layers.0.attn.v",
                          "layers.0.mlp.up", "layers.0.mlp.gate", "layers.1.moe.shared.up"})
    CHECK(by_name(m, col).layout.placements() == P({S(0)}));
  for (const char* row : {"layers.0.attn.o", "layers.0.mlp.down", "layers.1.moe.shared.down"})
    CHECK(by_name(m, row).layout.placements() == P({S(1)}));
  CHECK(by_name(m, "embed").layout.placements() == P({S(0)}));
  CHECK(by_name(m, "lm_head").layout.placements() == P({S(0)}));
  CHECK(by_name(m, "norm").layout.placements() == P({R}));
  CHECK(by_name(m, "layers.1.moe.router").layout.placements() == P({R}));
  // Without ep, expert stacks are TP-sharded like dense layers, one dim further in.
  CHECK(by_name(m, "layers.1.moe.experts.up").layout.placements() == P({S(1)}));
  CHECK(by_name(m, "layers.1.moe.experts.gate").layout.placements() == P({S(1)}));
  CHECK(by_name(m, "layers.1.moe.experts.down").layout.placements() == P({S(2)}));
  check_coverage(m);

  ParallelRules rules;
  rules.tp_shard_embeddings = false;
  const ShardedModel n = parallelize(preset("tiny-dense"), make_mesh({{"tp", 2}}), rules);
  CHECK(by_name(n, "embed").layout.placements() == P({R}));
  CHECK(by_name(n, "lm_head").layout.placements() == P({R}));
}

TEST_CASE("FSDP + TP: strided shards when both cut the same dim", "[parallelize]") {
  const ShardedModel m =
      parallelize(preset("tiny-dense"), make_mesh({{"dp_shard", 2}, {"tp", 2}}), {});
  CHECK(by_name(m, "layers.0.attn.q").layout.placements() == P({SS(0, 2), S(0)}));
  CHECK(by_name(m, "layers.0.attn.o").layout.placements() == P({S(0), S(1)}));
  CHECK(by_name(m, "embed").layout.placements() == P({SS(0, 2), S(0)}));
  CHECK(by_name(m, "norm").layout.placements() == P({S(0), R}));
  check_coverage(m);
  // FSDP2 on TP: the TP shard of q (rows [0,32) at tp 0) is halved by dp_shard.
  const auto& q = by_name(m, "layers.0.attn.q");
  CHECK(q.layout.index_set(m.mesh, 0).dims[0] == IndexList::range(0, 16));
  CHECK(q.layout.index_set(m.mesh, 2).dims[0] == IndexList::range(16, 32));
  CHECK(q.layout.index_set(m.mesh, 1).dims[0] == IndexList::range(32, 48));

  // FSDP inner to TP: plain Shard (it shards within the TP shard already).
  const ShardedModel inner =
      parallelize(preset("tiny-dense"), make_mesh({{"tp", 2}, {"dp_shard", 2}}), {});
  CHECK(by_name(inner, "layers.0.attn.q").layout.placements() == P({S(0), S(0)}));
  check_coverage(inner);

  // Two TP-like dims inner to FSDP multiply the split factor.
  DeviceMesh two_tp(
      {{"dp_shard", 2, DimRole::fsdp}, {"tp_a", 2, DimRole::tp}, {"tp_b", 2, DimRole::tp}}, 8);
  const ShardedModel t = parallelize(preset("tiny-dense"), two_tp, {});
  CHECK(by_name(t, "layers.0.mlp.up").layout.placements() == P({SS(0, 4), S(0), S(0)}));
  check_coverage(t);
}

TEST_CASE("HSDP: replicate then shard", "[parallelize]") {
  const ShardedModel m =
      parallelize(preset("tiny-dense"), make_mesh({{"dp_replicate", 2}, {"dp_shard", 4}}), {});
  for (const DistributedParam& p : m.params) CHECK(p.layout.placements() == P({R, S(0)}));
  check_coverage(m);
  std::int64_t bytes = 0;
  for (int r = 0; r < 8; ++r) bytes += m.shard_bytes(r);
  CHECK(bytes == 2 * preset("tiny-dense").numel() * 2);  // two replicas, bf16
  // Two replicate dims (dp_replicate and cp) are both Replicate.
  const ShardedModel cp = parallelize(
      preset("tiny-dense"), make_mesh({{"dp_replicate", 2}, {"cp", 2}, {"dp_shard", 2}}), {});
  CHECK(by_name(cp, "layers.1.attn.v").layout.placements() == P({R, R, S(0)}));
}

TEST_CASE("EP: expert stacks split into independent slices", "[parallelize]") {
  const Model model = preset("tiny-moe");
  const ShardedModel m = parallelize(model, make_mesh({{"dp_shard", 2}, {"ep", 4}, {"tp", 2}}), {});
  for (int c = 0; c < 4; ++c) {
    const DistributedParam& up =
        by_name(m, "layers.2.moe.experts.up[ep=" + std::to_string(c) + "]");
    CHECK(up.shape == std::vector<std::int64_t>{2, 32, 64});
    CHECK(up.role == ParamRole::expert_up);
    CHECK(up.layer == 2);
    CHECK(model.params[up.source].name == "layers.2.moe.experts.up");
    // fsdp shards rows, ep owns the slice, tp replicates experts.
    CHECK(up.layout.placements() == P({S(1), I(c), R}));
  }
  CHECK(by_name(m, "layers.2.moe.experts.down[ep=3]").layout.placements() == P({S(1), I(3), R}));
  CHECK(by_name(m, "layers.2.moe.router").layout.placements() == P({S(0), R, R}));
  CHECK(by_name(m, "layers.2.attn.q").layout.placements() == P({SS(0, 2), R, S(0)}));
  // 3 MoE layers x 3 stacks x 4 slices replace 9 stacks.
  CHECK(m.params.size() == model.params.size() + 9 * 3);
  check_coverage(m);
  // The slices partition the stack's bytes: the model's total is unchanged.
  std::int64_t numel = 0;
  for (const DistributedParam& p : m.params) numel += p.numel();
  CHECK(numel == model.numel());

  REQUIRE_THROWS_WITH(parallelize(model, make_mesh({{"ep", 3}}, 3), {}),
                      Catch::Contains("8 experts") && Catch::Contains("not divisible") &&
                          Catch::Contains("ep") && Catch::Contains("1, 2, 4, 8"));
}

TEST_CASE("EP with dense_over_ep shard: dense weights cut over fsdp x ep", "[parallelize]") {
  ParallelRules shard;
  shard.dense_over_ep = DenseOverEp::shard;
  const Model model = preset("tiny-moe");
  const DeviceMesh mesh = make_mesh({{"dp_shard", 2}, {"ep", 4}, {"tp", 2}});
  const ShardedModel s = parallelize(model, mesh, shard);
  const ShardedModel r = parallelize(model, mesh, {});
  // ep joins the fsdp rule: StridedShard under TP of the same dim, Shard otherwise.
  CHECK(by_name(s, "layers.2.attn.q").layout.placements() == P({SS(0, 2), SS(0, 2), S(0)}));
  CHECK(by_name(s, "layers.2.attn.o").layout.placements() == P({S(0), S(0), S(1)}));
  CHECK(by_name(s, "layers.2.moe.router").layout.placements() == P({S(0), S(0), R}));
  CHECK(by_name(s, "norm").layout.placements() == P({S(0), S(0), R}));
  CHECK(by_name(s, "embed").layout.placements() == P({SS(0, 2), SS(0, 2), S(0)}));
  // Expert slices are as without the option.
  for (int c = 0; c < 4; ++c) {
    const std::string name = "layers.2.moe.experts.down[ep=" + std::to_string(c) + "]";
    CHECK(by_name(s, name).layout.placements() == by_name(r, name).layout.placements());
  }
  check_coverage(s);
  // What an fsdp x ep group gathers is exactly what the fsdp group gathers without the option:
  // the TP-local piece, now cut dp_shard x ep = 8 ways instead of 2.
  const DimSet fsdp = DimSet::of({0}), fsdp_ep = DimSet::of({0, 1});
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].shape.size() == 3) continue;
    INFO(s.params[i].name);
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
      CHECK(s.params[i].layout.index_set(mesh, rank, fsdp_ep) ==
            r.params[i].layout.index_set(mesh, rank, fsdp));
      CHECK(s.params[i].layout.shard_numel(mesh, rank) * 4 ==
            r.params[i].layout.shard_numel(mesh, rank));  // tiny-moe's dims divide by 16
    }
  }

  // Hand-computed, a norm of 64 on dp_shard 2 x ep 4: rank (d, e) holds [8 (4d + e), +8), the
  // flat chunk torchtitan's FSDP takes on its dp_shard_cp mesh (ep innermost); with ep outer the
  // order follows the mesh: rank (e, d) holds [8 (2e + d), +8).
  Model norm_only;
  norm_only.name = "norm";
  norm_only.params.push_back({"norm", {64}, DType::bf16, ParamRole::norm, -1});
  for (const bool ep_inner : {true, false}) {
    const DeviceMesh m = ep_inner ? make_mesh({{"dp_shard", 2}, {"ep", 4}})
                                  : make_mesh({{"ep", 4}, {"dp_shard", 2}});
    const ShardedModel n = parallelize(norm_only, m, shard);
    for (int rank = 0; rank < 8; ++rank) {
      INFO("ep inner " << ep_inner << ", rank " << rank);
      CHECK(n.params[0].layout.index_set(m, rank).dims[0] ==
            IndexList::range(8 * rank, 8 * rank + 8));
    }
  }
  // Uneven, 7 over dp_shard 3 x ep 2: DTensor's nested chunks [0,3) [3,6) [6,7), each cut in two
  // (a flat chunk would give [0,2) [2,4) [4,6) [6,7) and two empty pieces).
  norm_only.params[0].shape = {7};
  const DeviceMesh m3 = make_mesh({{"dp_shard", 3}, {"ep", 2}});
  const ShardedModel u = parallelize(norm_only, m3, shard);
  const IndexList expected[] = {IndexList::range(0, 2), IndexList::range(2, 3),
                                IndexList::range(3, 5), IndexList::range(5, 6),
                                IndexList::range(6, 7), IndexList{}};
  for (int rank = 0; rank < 6; ++rank) {
    INFO("rank " << rank);
    CHECK(u.params[0].layout.index_set(m3, rank).dims[0] == expected[rank]);
  }
  check_coverage(u);

  // Every order of the dims, with PP, HSDP's replicate dim and an ep dim without fsdp, covers
  // every tensor exactly once per replica, and dense weights shard over ep in all of them.
  const std::vector<std::vector<std::pair<std::string, int>>> meshes = {
      {{"ep", 2}, {"dp_shard", 3}, {"tp", 2}},
      {{"dp_shard", 2}, {"tp", 2}, {"ep", 2}},
      {{"pp", 2}, {"dp_shard", 2}, {"ep", 2}, {"tp", 2}},
      {{"dp_replicate", 2}, {"ep", 4}},
      {{"dp_replicate", 2}, {"ep", 2}, {"dp_shard", 3}},
  };
  for (const auto& dims : meshes) {
    const DeviceMesh m = make_mesh(dims, 2);
    const ShardedModel d = parallelize(model, m, shard);
    INFO(m.describe());
    check_coverage(d);
    const int ep = m.find("ep");
    CHECK(by_name(d, "layers.1.attn.v").layout.placements()[ep].is_shard());
    CHECK(by_name(d, "layers.1.moe.experts.up[ep=1]").layout.placements()[ep] == I(1));
  }
}

TEST_CASE("PP: contiguous stages, embedding first, head last", "[parallelize]") {
  const ShardedModel m =
      parallelize(preset("tiny-moe"), make_mesh({{"pp", 2}, {"dp_shard", 2}}), {});
  CHECK(by_name(m, "embed").layout.placements() == P({I(0), S(0)}));
  CHECK(by_name(m, "layers.1.attn.q").layout.placements() == P({I(0), S(0)}));
  CHECK(by_name(m, "layers.2.attn.q").layout.placements() == P({I(1), S(0)}));
  CHECK(by_name(m, "layers.3.moe.experts.up").layout.placements() == P({I(1), S(1)}));
  CHECK(by_name(m, "norm").layout.placements() == P({I(1), S(0)}));
  CHECK(by_name(m, "lm_head").layout.placements() == P({I(1), S(0)}));
  check_coverage(m);

  // torch.chunk of 32 layers over 5 stages: 7,7,7,7,4.
  const ShardedModel l = parallelize(preset("llama-7b"), make_mesh({{"pp", 5}}, 1), {});
  std::map<int, int> blocks_per_stage;
  for (const DistributedParam& p : l.params)
    if (p.name.ends_with(".attn.q")) ++blocks_per_stage[p.layout.placements()[0].coord];
  CHECK(blocks_per_stage == std::map<int, int>{{0, 7}, {1, 7}, {2, 7}, {3, 7}, {4, 4}});
  CHECK(by_name(l, "layers.27.attn.q").layout.placements() == P({I(3)}));
  CHECK(by_name(l, "layers.28.attn.q").layout.placements() == P({I(4)}));
  CHECK(by_name(l, "lm_head").layout.placements() == P({I(4)}));
  // GPT-2's position embedding lives with the token embedding.
  const ShardedModel g = parallelize(preset("gpt2-124m"), make_mesh({{"pp", 4}}, 4), {});
  CHECK(by_name(g, "pos_embed").layout.placements() == P({I(0)}));
  CHECK(by_name(g, "norm.bias").layout.placements() == P({I(3)}));

  REQUIRE_THROWS_WITH(
      parallelize(preset("tiny-dense"), make_mesh({{"pp", 3}}, 3), {}),
      Catch::Contains("3 stages") && Catch::Contains("2 layers") && Catch::Contains("at most 2"));
}

TEST_CASE("4-D meshes cover every parameter", "[parallelize]") {
  const ShardedModel d =
      parallelize(preset("tiny-dense"),
                  make_mesh({{"pp", 2}, {"dp_replicate", 2}, {"dp_shard", 2}, {"tp", 2}}), {});
  CHECK(by_name(d, "layers.1.mlp.gate").layout.placements() == P({I(1), R, SS(0, 2), S(0)}));
  CHECK(by_name(d, "layers.0.mlp.down").layout.placements() == P({I(0), R, S(0), S(1)}));
  CHECK(by_name(d, "layers.0.mlp_norm").layout.placements() == P({I(0), R, S(0), R}));
  check_coverage(d);
  const ShardedModel e = parallelize(
      preset("tiny-moe"), make_mesh({{"pp", 2}, {"dp_shard", 2}, {"ep", 2}, {"tp", 2}}), {});
  CHECK(by_name(e, "layers.3.moe.experts.down[ep=1]").layout.placements() ==
        P({I(1), S(1), I(1), R}));
  CHECK(by_name(e, "layers.0.attn.q").layout.placements() == P({I(0), SS(0, 2), R, S(0)}));
  check_coverage(e);
  // Every rank holds something, and AdamW/Muon lists partition the parameters.
  for (int r = 0; r < e.mesh.world_size(); ++r) CHECK(e.shard_bytes(r) > 0);
  CHECK(e.muon_params().size() + e.adamw_params().size() == e.params.size());
  for (int i : e.muon_params()) CHECK(e.params[i].optimizer == OptimizerKind::muon);
  for (int i : e.adamw_params()) CHECK(e.params[i].optimizer == OptimizerKind::adamw);
}

TEST_CASE("tp_dim_per_param overrides and its errors", "[parallelize]") {
  ParallelRules rules;
  rules.tp_dim_per_param = {{"layers.0.attn.q", 1}, {"layers.1.attn.o", 0}};
  const ShardedModel m =
      parallelize(preset("tiny-dense"), make_mesh({{"dp_shard", 2}, {"tp", 2}}), rules);
  CHECK(by_name(m, "layers.0.attn.q").layout.placements() == P({S(0), S(1)}));
  CHECK(by_name(m, "layers.1.attn.o").layout.placements() == P({SS(0, 2), S(0)}));
  CHECK(by_name(m, "layers.1.attn.q").layout.placements() == P({SS(0, 2), S(0)}));
  check_coverage(m);

  rules.tp_dim_per_param = {{"layers.0.attn.k", 2}};
  REQUIRE_THROWS_WITH(parallelize(preset("tiny-dense"), make_mesh({{"tp", 2}}), rules),
                      Catch::Contains("layers.0.attn.k") && Catch::Contains("out of range") &&
                          Catch::Contains("[32,64]"));
  rules.tp_dim_per_param = {{"layers.9.attn.k", 0}};
  REQUIRE_THROWS_WITH(parallelize(preset("tiny-dense"), make_mesh({{"tp", 2}}), rules),
                      Catch::Contains("layers.9.attn.k") && Catch::Contains("not a parameter"));
}

TEST_CASE("routing flows into distributed parameters", "[parallelize]") {
  ParallelRules rules;
  rules.routing.force_adamw = {"layers.0.mlp.up"};
  const ShardedModel m = parallelize(preset("tiny-moe"), make_mesh({{"ep", 2}}, 2), rules);
  CHECK(by_name(m, "layers.0.mlp.up").optimizer == OptimizerKind::adamw);
  CHECK(by_name(m, "layers.1.moe.experts.up[ep=1]").optimizer == OptimizerKind::muon);
  CHECK(by_name(m, "embed").optimizer == OptimizerKind::adamw);
  CHECK(by_name(m, "layers.1.moe.experts.up[ep=1]").bytes() == 4 * 32 * 64 * 2);
}

TEST_CASE("shard_explicitly validates and indexes", "[parallelize]") {
  const DeviceMesh mesh = make_mesh({{"dp_shard", 2}, {"tp", 2}}, 4);
  std::vector<DistributedParam> ps(2);
  ps[0].name = "a";
  ps[0].shape = {8, 4};
  ps[0].layout = TensorLayout(mesh, {8, 4}, {SS(0, 2), S(0)});
  ps[1].name = "b";
  ps[1].shape = {6};
  ps[1].optimizer = OptimizerKind::adamw;
  ps[1].layout = TensorLayout(mesh, {6}, {S(0), R});
  const ShardedModel m = shard_explicitly(mesh, "explicit", ps);
  CHECK(m.params[1].index == 1);
  CHECK(m.muon_params() == std::vector<int>{0});
  CHECK(m.adamw_params() == std::vector<int>{1});
  CHECK(m.shard_bytes(0) == (8 + 3) * 2);
  check_coverage(m);

  auto mismatch = ps;
  mismatch[1].shape = {7};
  REQUIRE_THROWS_WITH(shard_explicitly(mesh, "x", mismatch),
                      Catch::Contains("'b'") && Catch::Contains("differs"));
  auto dup = ps;
  dup[1].name = "a";
  REQUIRE_THROWS_WITH(shard_explicitly(mesh, "x", dup), Catch::Contains("twice"));
  const DeviceMesh other = make_mesh({{"tp", 2}}, 2);
  REQUIRE_THROWS_WITH(shard_explicitly(other, "x", ps),
                      Catch::Contains("'a'") && Catch::Contains("placements"));
}

TEST_CASE("large models parallelize quickly", "[parallelize]") {
  const Model model = preset("llama-70b");
  const ShardedModel m = parallelize(
      model, make_mesh({{"pp", 4}, {"dp_replicate", 2}, {"dp_shard", 16}, {"tp", 8}}), {});
  std::int64_t bytes = 0;
  for (int r = 0; r < m.mesh.world_size(); ++r) bytes += m.shard_bytes(r);
  // Two replicas, bf16; norms also replicate over the 8 TP ranks.
  std::int64_t norms = 0;
  for (const Parameter& p : model.params)
    if (p.shape.size() == 1) norms += p.numel();
  CHECK(bytes == 2 * (model.numel() + 7 * norms) * 2);
  const ShardedModel ds =
      parallelize(preset("deepseek-v3"), make_mesh({{"dp_shard", 8}, {"ep", 32}, {"tp", 8}}), {});
  std::int64_t numel = 0;
  for (const DistributedParam& p : ds.params) numel += p.numel();
  CHECK(numel == preset("deepseek-v3").numel());
}
