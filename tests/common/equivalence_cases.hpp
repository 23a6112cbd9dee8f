// Cases shared by the equivalence tests of the loopback executor (tests/backends) and of the MPI
// executor under mpirun (tests/mpi): the two optimizer variants every plan is checked in, a model
// whose shapes split unevenly, and the plan surgery of the negative controls.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "backends/cpu/check.hpp"
#include "core/model/parallelize.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/program.hpp"
#include "core/plan/strategy.hpp"

namespace muonbed::testing {

struct Variant {
  std::string name;
  DType comm = DType::bf16;
  MomentumForm form = MomentumForm::lerp;
  bool nesterov = true;
  bool qk_clip = true;
};

inline const Variant kVariants[] = {
    {"bf16 comm, lerp momentum, Nesterov, QK-clip", DType::bf16, MomentumForm::lerp, true, true},
    {"fp32 comm, classic momentum, no Nesterov", DType::fp32, MomentumForm::classic, false, false},
};

inline PlanSettings settings_of(const Variant& v, const Model& model) {
  PlanSettings s;
  auto& o = s.optimizer;
  o.comm_dtype = v.comm;
  o.muon.lr = 0.02;  // large enough that every step moves every parameter visibly
  o.muon.momentum_form = v.form;
  o.muon.nesterov = v.nesterov;
  o.adamw.lr = 0.01;
  o.qk_clip.enabled = v.qk_clip;
  o.qk_clip.tau = 50.0;  // logits are uniform on [0, 100): about half of the heads clip
  o.qk_clip.head_dim = model.head_dim;
  return s;
}

// How far a plan with split Newton-Schulz may be from the reference (absolute, on parameters and
// state after the steps of a test): its Grams are sums in another order than the single-device
// product, all-reduced in the comm dtype (bf16: 8 bits of mantissa), so the orthogonalized update
// differs in its last bf16 bits, times lr 0.02 and Muon's shape scale per step. A Gram missing
// the other members' parts (the negative controls) moves the update by O(1) instead.
inline constexpr double kSplitNsTolerance = 2e-3;
// The check of such plans: kSplitNsTolerance, plus one unit in the last place of the parameter's
// dtype per step (bf16 parameters round at every step on both sides: a difference within the
// tolerance before a rounding can be one unit more after it).
inline constexpr cpu::CheckTolerance kSplitNsCheck{kSplitNsTolerance, 0, 1};

inline bool splits_ns(const StepPlan& plan) {
  return std::any_of(plan.ops.begin(), plan.ops.end(),
                     [](const Op& op) { return op.kind == OpKind::split_newton_schulz; });
}

// Negative control of split Newton-Schulz: each member keeps its own partial Gram (the Gram
// all-reduce's messages dropped), as if the all-reduce were skipped.
inline void drop_gram_all_reduce(RankProgram& program) {
  for (RankOp& op : program.ops) {
    if (op.kind != OpKind::split_newton_schulz) continue;
    for (std::size_t ph = 2; ph < op.phases.size(); ++ph) {
      op.phases[ph].sends.clear();
      op.phases[ph].recvs.clear();
    }
  }
}

// Shapes that split unevenly (torch.chunk leaves trailing shards smaller or empty), 1xN and Nx1
// matrices, an expert stack, and parameters of both optimizers, on two layers.
inline Model odd_model() {
  Model m;
  m.name = "odd";
  m.num_layers = 2;
  m.head_dim = 2;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, ParamRole role, int layer) {
    m.params.push_back({std::move(name), std::move(shape), DType::bf16, role, layer});
  };
  add("embed", {13, 6}, ParamRole::embedding, -1);
  add("layers.0.attn_norm", {7}, ParamRole::norm, 0);
  add("layers.0.attn.q", {8, 6}, ParamRole::attn_q, 0);
  add("layers.0.attn.k", {4, 6}, ParamRole::attn_k, 0);
  add("layers.0.row", {1, 7}, ParamRole::other_matrix, 0);
  add("layers.0.column", {9, 1}, ParamRole::other_matrix, 0);
  add("layers.0.small", {3, 8}, ParamRole::other_matrix, 0);
  add("layers.1.moe.experts.up", {6, 5, 3}, ParamRole::expert_up, 1);
  add("layers.1.mlp.down", {5, 10}, ParamRole::mlp_down, 1);
  add("norm", {7}, ParamRole::norm, -1);
  add("lm_head", {13, 6}, ParamRole::lm_head, -1);
  return m;
}

// Dense weights sharded over the fsdp dims and ep together (parallel.dense_over_ep: shard, the
// layout of torchtitan and Megatron) on `model`: ep inner and outer to the fsdp dim, under TP, and
// uneven (odd_model's 13, 7 and 5 rows over 3 x 2 ranks leave trailing pieces small or empty).
struct DenseOverEpCase {
  std::string name;
  std::string model;  // "odd" (odd_model) or a preset
  std::vector<MeshDim> dims;
};

inline std::vector<DenseOverEpCase> dense_over_ep_cases() {
  return {
      {"tiny-moe, FSDP 2 x EP 2",
       "tiny-moe",
       {{"dp_shard", 2, DimRole::fsdp}, {"ep", 2, DimRole::ep}}},
      {"tiny-moe, EP 2 x FSDP 2 x TP 2",
       "tiny-moe",
       {{"ep", 2, DimRole::ep}, {"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}}},
      {"odd, FSDP 3 x EP 2 (uneven)",
       "odd",
       {{"dp_shard", 3, DimRole::fsdp}, {"ep", 2, DimRole::ep}}},
      {"odd, DP 2 x EP 2 (dense sharded over ep alone)",
       "odd",
       {{"dp_replicate", 2, DimRole::replicate}, {"ep", 2, DimRole::ep}}},
  };
}

inline ParallelRules dense_over_ep_rules() {
  ParallelRules rules;
  rules.dense_over_ep = DenseOverEp::shard;
  return rules;
}

// The negative control of both executors' equivalence tests: `model` over 4 FSDP ranks with the
// flat gather (variant 0), two scatters of same-shape matrices from different owners each made
// to scatter from the other owner, which holds no result of that matrix. `first` and `second` are
// their op ids (-1: the plan has no such pair).
struct SwappedScatters {
  StepPlan plan;
  int first = -1;
  int second = -1;
};
inline SwappedScatters swapped_scatter_owners(const Model& model) {
  const ShardedModel sharded =
      parallelize(model, DeviceMesh({{"dp_shard", 4, DimRole::fsdp}}, 4), ParallelRules{});
  StrategyOptions options;
  options.gather = "flat";
  SwappedScatters out{build_plan(sharded, options, settings_of(kVariants[0], model))};
  const StepPlan& plan = out.plan;
  for (const Op& a : plan.ops)
    for (const Op& b : plan.ops)
      if (out.first < 0 && a.kind == OpKind::scatter && b.kind == OpKind::scatter &&
          a.root != b.root &&
          plan.model.params[a.params[0]].shape == plan.model.params[b.params[0]].shape) {
        out.first = a.id;
        out.second = b.id;
      }
  if (out.first >= 0) std::swap(out.plan.ops[out.first].root, out.plan.ops[out.second].root);
  return out;
}

// The plan without op `id`: later ids shift down, and ops that depended on it inherit its deps.
inline StepPlan drop_op(StepPlan plan, int id) {
  const std::vector<int> inherited = plan.ops[id].deps;
  plan.ops.erase(plan.ops.begin() + id);
  for (Op& op : plan.ops) {
    std::vector<int> deps;
    for (int d : op.deps) {
      if (d == id)
        deps.insert(deps.end(), inherited.begin(), inherited.end());
      else
        deps.push_back(d > id ? d - 1 : d);
    }
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    op.deps = deps;
    if (op.id > id) --op.id;
  }
  validate_plan(plan);
  return plan;
}

}  // namespace muonbed::testing
