// The whole-model reference step on a tiny dense model (hidden 64, 2 layers): routing and state,
// two steps against the formulas recomputed in the test, determinism, fp32/bf16 against fp64,
// QK-clip on the right rows, and shards generated in place equal to shards of the full tensors.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/base/errors.hpp"
#include "core/model/layout.hpp"
#include "core/model/mesh.hpp"
#include "core/model/model.hpp"
#include "kernels/reference_optimizer.hpp"
#include "tests/kernels/linalg_helpers.hpp"

using namespace muonbed;

namespace {

Model tiny_model() {
  DenseSpec spec;
  spec.name = "kernels-test-dense";
  spec.hidden = 64;
  spec.layers = 2;
  spec.heads = 4;  // head_dim 16
  spec.kv_heads = 2;
  spec.ffn = 128;
  spec.vocab = 96;
  return make_dense(spec);
}

OptimizerConfig test_config() {
  OptimizerConfig c;
  c.muon.lr = 0.02;
  c.muon.weight_decay = 0.1;
  c.muon.adjust_lr_fn = LrScaleRule::match_rms_adamw;  // differs per shape
  c.adamw.lr = 1e-3;
  c.adamw.weight_decay = 0.01;
  return c;
}

}  // namespace

TEST_CASE("routing puts matrices in the Muon group and the rest in AdamW", "[reference]") {
  const Model model = tiny_model();
  const ReferenceOptimizer<double> opt(model, test_config());
  int muon = 0;
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const Parameter& p = model.params[i];
    const bool want_muon =
        p.is_matrix() && p.role != ParamRole::embedding && p.role != ParamRole::lm_head;
    INFO(p.name);
    CHECK((opt.kind(i) == OptimizerKind::muon) == want_muon);
    CHECK(static_cast<std::int64_t>(opt.momentum_buffer(i).size()) == (want_muon ? p.numel() : 0));
    CHECK(static_cast<std::int64_t>(opt.adam_m(i).size()) == (want_muon ? 0 : p.numel()));
    muon += want_muon;
  }
  CHECK(muon == 2 * 7);  // q, k, v, o, gate, up, down per layer
}

TEST_CASE("two reference steps equal the formulas recomputed by hand", "[reference]") {
  const Model model = tiny_model();
  const OptimizerConfig config = test_config();
  ReferenceOptimizer<double> opt(model, config);
  ModelTensors<double> params = random_params<double>(model, 11);
  ModelTensors<double> want = params;
  ModelTensors<double> buf(model.params.size()), m(model.params.size()), v(model.params.size());
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    buf[i].assign(want[i].size(), 0.0);
    m[i].assign(want[i].size(), 0.0);
    v[i].assign(want[i].size(), 0.0);
  }

  for (int t = 1; t <= 2; ++t) {
    const ModelTensors<double> grads = random_grads<double>(model, 11, t);
    opt.step(params, grads);
    for (std::size_t i = 0; i < model.params.size(); ++i) {
      const Parameter& p = model.params[i];
      const std::size_t n = want[i].size();
      if (opt.kind(i) == OptimizerKind::muon) {
        // EMA momentum, Nesterov blend, NS, then p (1 - lr wd) - lr * 0.2 sqrt(max dim) * O.
        std::vector<double> u(n);
        for (std::size_t j = 0; j < n; ++j) {
          buf[i][j] = 0.95 * buf[i][j] + 0.05 * grads[i][j];
          u[j] = 0.05 * grads[i][j] + 0.95 * buf[i][j];
        }
        newton_schulz(u.data(), u.data(), MatrixShape{1, p.rows(), p.cols()},
                      NsConfig::keller_jordan(5));
        const double scale =
            0.02 * 0.2 * std::sqrt(static_cast<double>(std::max(p.rows(), p.cols())));
        for (std::size_t j = 0; j < n; ++j) {
          want[i][j] = want[i][j] * (1 - 0.02 * 0.1) - scale * u[j];
        }
      } else {
        for (std::size_t j = 0; j < n; ++j) {
          const double g = grads[i][j];
          m[i][j] = 0.9 * m[i][j] + 0.1 * g;
          v[i][j] = 0.999 * v[i][j] + 0.001 * g * g;
          const double mhat = m[i][j] / (1 - std::pow(0.9, t));
          const double vhat = v[i][j] / (1 - std::pow(0.999, t));
          want[i][j] = want[i][j] * (1 - 1e-3 * 0.01) - 1e-3 * mhat / (std::sqrt(vhat) + 1e-8);
        }
      }
      INFO(p.name << " step " << t);
      REQUIRE(test::relative_error(params[i], want[i]) < 1e-12);
      if (opt.kind(i) == OptimizerKind::muon) {
        CHECK(test::relative_error(opt.momentum_buffer(i), buf[i]) < 1e-14);
      } else {
        CHECK(test::relative_error(opt.adam_v(i), v[i]) < 1e-14);
      }
    }
  }
  CHECK(opt.steps_taken() == 2);
}

TEST_CASE("reference steps are deterministic and fp32 / bf16 track fp64", "[reference]") {
  const Model model = tiny_model();
  OptimizerConfig config = test_config();
  ReferenceOptimizer<double> a(model, config), b(model, config);
  ModelTensors<double> pa = random_params<double>(model, 3), pb = pa;
  const ModelTensors<double> p0 = pa;
  for (int t = 1; t <= 3; ++t) {
    a.step(pa, random_grads<double>(model, 3, t));
    b.step(pb, random_grads<double>(model, 3, t));
  }
  CHECK(pa == pb);

  for (NsPrecision precision : {NsPrecision::fp32, NsPrecision::bf16}) {
    ReferenceOptimizer<float> f(model, config, {}, ReferenceOptions{precision});
    ModelTensors<float> pf = random_params<float>(model, 3);
    const ModelTensors<float> pf0 = pf;
    for (int t = 1; t <= 3; ++t) f.step(pf, random_grads<float>(model, 3, t));
    for (std::size_t i = 0; i < model.params.size(); ++i) {
      // Compare what the steps changed; the parameters themselves differ by fp32 rounding.
      std::vector<double> d64(pa[i].size()), d32(pa[i].size());
      for (std::size_t j = 0; j < d64.size(); ++j) {
        d64[j] = pa[i][j] - p0[i][j];
        d32[j] = static_cast<double>(pf[i][j]) - static_cast<double>(pf0[i][j]);
      }
      INFO(model.params[i].name << " " << to_string(precision));
      CHECK(test::relative_error(d32, d64) < (precision == NsPrecision::fp32 ? 1e-4 : 3e-2));
    }
  }
}

TEST_CASE("QK-clip rescales the query and key rows of clipped heads only", "[reference]") {
  const Model model = tiny_model();
  OptimizerConfig config = test_config();
  config.qk_clip = {true, 100.0, 16};
  OptimizerConfig plain = test_config();
  ReferenceOptimizer<double> clip(model, config), noclip(model, plain);
  ModelTensors<double> pc = random_params<double>(model, 5), pn = pc;
  const ModelTensors<double> grads = random_grads<double>(model, 5, 1);
  QkLogits logits;
  logits.per_layer = {{50, 400, 120, 90}, {10, 20, 30, 40}};
  clip.step(pc, grads, &logits);
  noclip.step(pn, grads);

  // Layer 0: q heads scaled by 1, 0.5, sqrt(100/120), 1; k heads (2, GQA) by 0.5, sqrt(100/120).
  const double s120 = std::sqrt(100.0 / 120.0);
  const std::vector<double> q_scales = {1, 0.5, s120, 1}, k_scales = {0.5, s120};
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const Parameter& p = model.params[i];
    INFO(p.name);
    const bool clipped =
        p.layer == 0 && (p.role == ParamRole::attn_q || p.role == ParamRole::attn_k);
    if (!clipped) {
      CHECK(pc[i] == pn[i]);
      continue;
    }
    const std::vector<double>& scales = p.role == ParamRole::attn_q ? q_scales : k_scales;
    REQUIRE(p.rows() == 16 * static_cast<std::int64_t>(scales.size()));
    for (std::int64_t r = 0; r < p.rows(); ++r) {
      for (std::int64_t c = 0; c < p.cols(); ++c) {
        const std::size_t j = static_cast<std::size_t>(r * p.cols() + c);
        REQUIRE(pc[i][j] == Approx(pn[i][j] * scales[r / 16]).epsilon(1e-14));
      }
    }
  }

  CHECK_THROWS_AS(clip.step(pc, grads), Error);  // logits required
  config.qk_clip.head_dim = 0;
  CHECK_THROWS_AS(ReferenceOptimizer<double>(model, config), Error);
}

TEST_CASE("reference step rejects mismatched tensors", "[reference]") {
  const Model model = tiny_model();
  ReferenceOptimizer<double> opt(model, test_config());
  ModelTensors<double> params = random_params<double>(model, 1);
  ModelTensors<double> grads = random_grads<double>(model, 1, 1);
  grads.pop_back();
  CHECK_THROWS_AS(opt.step(params, grads), Error);
  grads = random_grads<double>(model, 1, 1);
  grads[0].pop_back();
  CHECK_THROWS_AS(opt.step(params, grads), Error);
  CHECK(opt.steps_taken() == 0);
}

TEST_CASE("generated shards equal the same shards of the full random tensors", "[reference]") {
  const Model model = tiny_model();
  const ModelTensors<float> full = random_params<float>(model, 9);
  const ModelTensors<float> grads = random_grads<float>(model, 9, 4);
  const DeviceMesh mesh({{"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}}, 8);
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const Parameter& p = model.params[i];
    const std::vector<Placement> placements =
        p.is_matrix() ? std::vector<Placement>{Placement::strided_shard(0, 2), Placement::shard(0)}
                      : std::vector<Placement>{Placement::shard(0), Placement::replicate()};
    const TensorLayout layout(mesh, p.shape, placements);
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
      const ShardIndexSet set = layout.index_set(mesh, rank);
      std::vector<float> want(static_cast<std::size_t>(set.numel()));
      pack_shard(set, p.shape, full[i].data(), want.data());
      CHECK(generate_shard<float>(set, p.shape, 9, param_stream(i), init_scale(p),
                                  init_offset(p)) == want);
      pack_shard(set, p.shape, grads[i].data(), want.data());
      CHECK(generate_shard<float>(set, p.shape, 9, grad_stream(model.params.size(), i, 4), 1e-2) ==
            want);
    }
  }
  // Gradients differ between steps and are never all zero.
  const ModelTensors<float> other = random_grads<float>(model, 9, 5);
  CHECK(other[0] != grads[0]);
  bool any_nonzero = false;
  for (float g : grads[0]) any_nonzero = any_nonzero || g != 0.0f;
  CHECK(any_nonzero);
}
