// Element maps tested in CuTe's spirit, on random meshes, layouts and shapes (seeded): every
// plan of every strategy variant is lowered for every rank, then
//   * structure: no destination element is written twice by one phase (a reducing phase writes
//     each element of the own part once and adds each peer's part into it at most once), and
//     per-peer counts are plan.hpp's bytes_sent / bytes_received for every op, rank and peer;
//   * identity: the plan runs on the loopback executor with numerics replaced by data movement
//     (the update is the gradient, NS the identity, split NS too: its members keep their slices,
//     the parameter becomes the result) and
//     gradients that encode their element's full index, so every element that travels to an
//     owner and back (gather then scatter, all_to_all there and back, all-gathers, reductions)
//     must come home to the right place: each parameter piece equals the encoding of its own
//     indices summed over the gradient's sync group.
#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "backends/cpu/data.hpp"
#include "backends/loopback/loopback.hpp"
#include "core/base/errors.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

#ifndef MAPS_SEED
#define MAPS_SEED 2024
#endif
#ifndef MAPS_TRIALS
#define MAPS_TRIALS 120
#endif

namespace {

struct Case {
  DeviceMesh mesh;
  Model model;
  ParallelRules rules;
};

Case random_case(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<MeshDim> dims;
  const DimRole roles[] = {DimRole::fsdp, DimRole::tp, DimRole::replicate, DimRole::ep,
                           DimRole::pp};
  const int ndims = pick(1, 3);
  bool ep = false, pp = false;
  for (int d = 0; d < ndims; ++d) {
    DimRole role = roles[pick(0, 4)];
    if ((role == DimRole::ep && ep) || (role == DimRole::pp && pp)) role = DimRole::fsdp;
    ep = ep || role == DimRole::ep;
    pp = pp || role == DimRole::pp;
    dims.push_back({"d" + std::to_string(d), pick(1, 3), role});
  }
  int world = 1;
  for (const auto& d : dims) world *= d.size;
  Case c{DeviceMesh(dims, world), {}, {}};
  int ep_size = 1;
  for (const auto& d : dims)
    if (d.role == DimRole::ep) ep_size = d.size;
  c.model.name = "random";
  c.model.num_layers = 3;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, ParamRole role, int layer) {
    // fp32 parameters (and so fp32 gradient slots): the encodings are exact only in fp32.
    c.model.params.push_back({std::move(name), std::move(shape), DType::fp32, role, layer});
  };
  add("embed", {pick(1, 9), pick(1, 5)}, ParamRole::embedding, -1);
  for (int layer = 0; layer < 3; ++layer) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    add(p + "norm", {pick(1, 7)}, ParamRole::norm, layer);
    add(p + "attn.q", {pick(1, 9), pick(1, 9)}, ParamRole::attn_q, layer);
    add(p + "mlp.down", {pick(1, 6), pick(1, 11)}, ParamRole::mlp_down, layer);
    add(p + "other", {pick(1, 3), pick(1, 3)}, ParamRole::other_matrix, layer);
    add(p + "experts.up", {ep_size * pick(1, 2), pick(1, 5), pick(1, 4)}, ParamRole::expert_up,
        layer);
  }
  add("lm_head", {pick(1, 9), pick(1, 5)}, ParamRole::lm_head, -1);
  c.rules.fsdp_tensor_dim = pick(0, 1);
  if (pick(0, 1)) c.rules.tp_dim_per_param["layers.1.attn.q"] = 1;
  return c;
}

// Numerics replaced by data movement.
void move_only(const RankOp& op, cpu::RankStore& store, const cpu::StepContext&) {
  auto copy = [&](const View& from, const View& to) {
    const std::vector<float> values = store.read(from);
    store.write(to, values.data());
  };
  for (const auto& t : op.momentum) copy(t.gradient, t.update);
  for (const auto& t : op.apply) copy(t.result, t.parameter);
  for (const auto& t : op.adamw) copy(t.gradient, t.parameter);
  for (const auto& c : op.copies) copy(c.source, c.target);
  cpu::run_keep(op, store);
}

// Member m's contribution to element `index`: the sum over the members is the encoding.
float encoded(std::int64_t source, std::int64_t index, int member) {
  return static_cast<float>((source * 4096 + index + 1) * 8 + member);
}

void fill_encoded(const StepPlan& plan, const RankProgram& program, cpu::RankStore& store) {
  for (const auto& dp : plan.model.params) {
    const ParamPieces& pieces = program.params[dp.index];
    if (!pieces.gradient.present()) continue;
    const cpu::SourceSlice slice = cpu::source_slice(plan.model, dp.index);
    const GradientSync sync = gradient_sync(plan, dp.index);
    const int members = plan.model.mesh.group_size(sync.reduced_over);
    std::vector<float> out(static_cast<std::size_t>(pieces.gradient.set.numel()));
    for_each_element(pieces.gradient.set, dp.shape, [&](std::int64_t f, std::int64_t p) {
      if (!pieces.gradient_reduced_over.empty()) {
        out[p] = encoded(slice.source, slice.offset + f, pieces.gradient_member);
        return;
      }
      float sum = 0;
      for (int m = 0; m < members; ++m) sum += encoded(slice.source, slice.offset + f, m);
      out[p] = sum;
    });
    store.write(pieces.gradient.tensor, pieces.gradient.offset,
                static_cast<std::int64_t>(out.size()), out.data());
  }
}

// Checks that no phase writes an element twice (see the header comment).
void check_structure(const RankProgram& program) {
  for (const RankOp& op : program.ops) {
    for (const auto& phase : op.phases) {
      INFO("rank " << program.rank << " op " << op.op);
      std::set<std::pair<int, std::int64_t>> own;
      auto each = [](const View& v, auto&& fn) {
        for (const auto& s : v.segments)
          for (const auto& r : s.runs)
            for (std::int64_t k = 0; k < r.length; ++k) fn(s.tensor, r.tensor + k);
      };
      each(phase.self_target, [&](int t, std::int64_t e) { CHECK(own.insert({t, e}).second); });
      std::set<std::pair<int, std::int64_t>> written = own;
      for (const auto& recv : phase.recvs) {
        std::set<std::pair<int, std::int64_t>> mine;
        each(recv.data, [&](int t, std::int64_t e) {
          CHECK(mine.insert({t, e}).second);
          if (phase.reduce)
            CHECK(own.count({t, e}) == 1);  // added into the own part
          else
            CHECK(written.insert({t, e}).second);  // written once in the phase
        });
      }
    }
  }
}

}  // namespace

TEST_CASE("element maps bring every element home on random meshes and layouts", "[maps]") {
  std::mt19937 rng(MAPS_SEED);
  int plans = 0;
  for (int trial = 0; trial < MAPS_TRIALS; ++trial) {
    const Case c = random_case(rng);
    ShardedModel sharded;
    try {
      sharded = parallelize(c.model, c.mesh, c.rules);
    } catch (const LayoutError&) {
      continue;  // e.g. more pipeline stages than layers: not a layout to test
    }
    for (const auto& options : testing::strategies()) {
      PlanSettings settings;
      settings.optimizer.comm_dtype = DType::fp32;  // encodings are exact only in fp32
      const StepPlan plan = build_plan(sharded, options, settings);
      ++plans;
      std::string roles;
      for (const auto& d : c.mesh.dims())
        roles += " " + d.name + ":" + std::string(to_string(d.role));
      INFO("mesh " << c.mesh.describe() << roles << ", fsdp_tensor_dim " << c.rules.fsdp_tensor_dim
                   << ", strategy " << options.to_json_text());
      for (int r = 0; r < c.mesh.world_size(); ++r) {
        const RankProgram program = lower_rank_program(plan, r);
        check_structure(program);
        for (const Op& op : plan.ops) {
          const RankOp* rop = program.find(op.id);
          if (rop == nullptr || !is_collective(op.kind)) continue;
          std::vector<std::int64_t> sent(c.mesh.group_size(op.group), 0), received = sent;
          for (std::size_t ph = 0; ph < rop->phases.size(); ++ph) {
            // Split NS: its Gram all-reduce (phases 2-3) runs once per NS step.
            const int times = op.kind == OpKind::split_newton_schulz && ph >= 2 ? op.ns_steps : 1;
            for (const auto& t : rop->phases[ph].sends) sent[t.peer] += times * t.count * 4;
            for (const auto& t : rop->phases[ph].recvs) received[t.peer] += times * t.count * 4;
          }
          CHECK(sent == bytes_sent(plan, op, r));
          CHECK(received == bytes_received(plan, op, r));
        }
      }
      LoopbackOptions options_run;
      options_run.compute = move_only;
      options_run.edit_program = [](RankProgram& p) {  // split NS as the identity: no exchange
        for (RankOp& op : p.ops)
          if (op.kind == OpKind::split_newton_schulz) {
            op.kind = OpKind::barrier;
            op.phases.clear();
            op.split_ns.clear();
          }
      };
      options_run.initial = [](const RankProgram&, cpu::RankStore&) {};
      options_run.inputs = [&plan](const RankProgram& p, cpu::RankStore& s, int) {
        fill_encoded(plan, p, s);
      };
      LoopbackExecutor executor(plan, options_run);
      executor.run(1);
      for (int r = 0; r < c.mesh.world_size(); ++r) {
        const RankProgram& program = executor.program(r);
        for (const auto& dp : plan.model.params) {
          const ParamPieces& pieces = program.params[dp.index];
          if (!pieces.held) continue;
          const cpu::SourceSlice slice = cpu::source_slice(plan.model, dp.index);
          const int members = c.mesh.group_size(gradient_sync(plan, dp.index).reduced_over);
          const std::vector<float> got = executor.store(r).read(
              pieces.parameter.tensor, pieces.parameter.offset, pieces.parameter.set.numel());
          for_each_element(pieces.parameter.set, dp.shape, [&](std::int64_t f, std::int64_t p) {
            float want = 0;
            for (int m = 0; m < members; ++m) want += encoded(slice.source, slice.offset + f, m);
            if (got[p] != want) {
              INFO("rank " << r << ", " << dp.name << " element " << f);
              CHECK(got[p] == want);
            }
          });
        }
      }
    }
  }
  CHECK(plans > 800);
}
