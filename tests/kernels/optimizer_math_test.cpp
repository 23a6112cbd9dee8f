// Elementwise optimizer formulas against small cases worked out by hand (the arithmetic is in
// the comments), in fp64 and fp32.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/base/errors.hpp"
#include "kernels/optimizer_math.hpp"

using namespace muonbed;

TEMPLATE_TEST_CASE("classic momentum with and without Nesterov", "[momentum]", float, double) {
  const double tol = std::is_same_v<TestType, float> ? 1e-6 : 1e-14;
  MomentumParams params{0.9, true, MomentumForm::classic};
  TestType buf = 1, g = 2, u = 0;
  // buf = 0.9 * 1 + 2 = 2.9; update = 2 + 0.9 * 2.9 = 4.61
  momentum_update(params, &g, &buf, &u, 1);
  CHECK(buf == Approx(2.9).epsilon(tol));
  CHECK(u == Approx(4.61).epsilon(tol));
  // next g = -1: buf = 0.9 * 2.9 - 1 = 1.61; update = -1 + 0.9 * 1.61 = 0.449
  g = -1;
  momentum_update(params, &g, &buf, &u, 1);
  CHECK(buf == Approx(1.61).epsilon(tol));
  CHECK(u == Approx(0.449).epsilon(tol));

  params.nesterov = false;
  buf = 1, g = 2;
  momentum_update(params, &g, &buf, &u, 1);  // update is the buffer: 2.9
  CHECK(u == Approx(2.9).epsilon(tol));
  CHECK(buf == u);
}

TEMPLATE_TEST_CASE("lerp momentum (torch.optim.Muon) with and without Nesterov", "[momentum]",
                   float, double) {
  const double tol = std::is_same_v<TestType, float> ? 1e-6 : 1e-14;
  MomentumParams params{0.9, true, MomentumForm::lerp};
  std::vector<TestType> buf = {1, 0}, g = {2, 4}, u(2);
  // buf = 1 + 0.1 * (2 - 1) = 1.1; update = lerp(2, 1.1, 0.9) = 2 + 0.9 * (1.1 - 2) = 1.19
  // from zero state: buf = 0.1 * 4 = 0.4; update = 4 + 0.9 * (0.4 - 4) = 0.76
  momentum_update(params, g.data(), buf.data(), u.data(), 2);
  CHECK(buf[0] == Approx(1.1).epsilon(tol));
  CHECK(u[0] == Approx(1.19).epsilon(tol));
  CHECK(buf[1] == Approx(0.4).epsilon(tol));
  CHECK(u[1] == Approx(0.76).epsilon(tol));

  params.nesterov = false;
  buf = {1, 0};
  momentum_update(params, g.data(), buf.data(), u.data(), 2);
  CHECK(u[0] == Approx(1.1).epsilon(tol));
  CHECK(u[1] == Approx(0.4).epsilon(tol));

  // The update may be written over the gradient (update aliases grad).
  buf = {1, 0};
  params.nesterov = true;
  momentum_update(params, g.data(), buf.data(), g.data(), 2);
  CHECK(g[0] == Approx(1.19).epsilon(tol));
}

TEST_CASE("torch_lerp is exact at both ends", "[momentum]") {
  const float a = 0.1f, b = 0.7f;
  CHECK(torch_lerp(a, b, 0.0f) == a);
  CHECK(torch_lerp(a, b, 1.0f) == b);
  CHECK(torch_lerp(a, b, 0.5f) == Approx(0.4f));
}

TEST_CASE("learning-rate scale rules", "[lr]") {
  CHECK(lr_scale(LrScaleRule::none, 4096, 11008) == 1.0);
  CHECK(lr_scale(LrScaleRule::original, 4096, 11008) == 1.0);  // wide: max(1, 0.37) = 1
  CHECK(lr_scale(LrScaleRule::original, 64, 16) == 2.0);       // sqrt(64 / 16)
  CHECK(lr_scale(LrScaleRule::original, 11008, 4096) == Approx(std::sqrt(2.6875)));
  CHECK(lr_scale(LrScaleRule::match_rms_adamw, 100, 25) == Approx(2.0));  // 0.2 * sqrt(100)
  CHECK(lr_scale(LrScaleRule::match_rms_adamw, 25, 100) == Approx(2.0));
  CHECK(lr_scale(LrScaleRule::match_rms_adamw, 4096, 11008) == Approx(0.2 * 104.91901638));
  CHECK(lr_scale_rule_from_string("match_rms_adamw") == LrScaleRule::match_rms_adamw);
  CHECK_THROWS_WITH(lr_scale_rule_from_string("spectral"), Catch::Contains("original"));
  CHECK(momentum_form_from_string("classic") == MomentumForm::classic);
  CHECK_THROWS_AS(momentum_form_from_string("ema"), Error);
}

TEMPLATE_TEST_CASE("decoupled weight decay and update", "[apply]", float, double) {
  // p = 2 * (1 - 0.1 * 0.5) - 0.3 * 0.5 = 1.9 - 0.15 = 1.75;  p = -1 * 0.95 - 0.3 * -2 = -0.35
  std::vector<TestType> p = {2, -1}, u = {0.5, -2};
  apply_update(ApplyParams{0.1, 0.3, 0.5}, p.data(), u.data(), 2);
  CHECK(p[0] == Approx(1.75));
  CHECK(p[1] == Approx(-0.35));
}

TEMPLATE_TEST_CASE("AdamW two steps", "[adamw]", float, double) {
  const double tol = std::is_same_v<TestType, float> ? 1e-6 : 1e-12;
  const AdamWConfig params{0.1, 0.9, 0.999, 1e-8, 0.1};
  TestType p = 1, g = 0.5, m = 0, v = 0;
  // t=1: p = 1 * 0.99 = 0.99; m = 0.05; v = 0.001 * 0.25 = 0.00025
  //      bias corrections 0.1 and 0.001: step size 1, denom = sqrt(0.00025 / 0.001) + eps = 0.5+eps
  //      p = 0.99 - 0.05 / (0.5 + 1e-8) = 0.890000002
  adamw_update(params, 1, &p, &g, &m, &v, 1);
  CHECK(m == Approx(0.05).epsilon(tol));
  CHECK(v == Approx(0.00025).epsilon(tol));
  CHECK(p == Approx(0.890000002).epsilon(tol));
  // t=2, g = -0.5: p = 0.890000002 * 0.99; m = 0.05 + 0.1 * (-0.55) = -0.005;
  //      v = 0.00025 * 0.999 + 0.00025 = 0.00049975; corrections 0.19 and 0.001999:
  //      denom = sqrt(0.00049975 / 0.001999) + eps = 0.5 + eps; step size 0.1 / 0.19
  //      p = 0.88110000198 + (0.1 / 0.19) * 0.005 / 0.5 = 0.88636315977
  g = -0.5;
  adamw_update(params, 2, &p, &g, &m, &v, 1);
  CHECK(m == Approx(-0.005).epsilon(tol * 10));
  CHECK(v == Approx(0.00049975).epsilon(tol));
  CHECK(p == Approx(0.8863631597694736).epsilon(tol));
  CHECK_THROWS_AS(adamw_update(params, 0, &p, &g, &m, &v, 1), Error);
}

TEST_CASE("QK-clip scales the rows of heads whose logit exceeded tau", "[qk_clip]") {
  // Logits 50 and 400 with tau 100: head 0 untouched, head 1 scaled by sqrt(100 / 400) = 0.5.
  const std::vector<double> scales = qk_clip_head_scales({50, 400}, 100);
  REQUIRE(scales.size() == 2);
  CHECK(scales[0] == 1.0);
  CHECK(scales[1] == 0.5);
  // head_dim 2: rows 0-1 are head 0, rows 2-3 head 1.
  std::vector<double> w(4 * 3, 1.0);
  qk_clip_rows(w.data(), 4, 3, 2, scales);
  for (int j = 0; j < 3; ++j) {
    CHECK(w[0 * 3 + j] == 1.0);
    CHECK(w[1 * 3 + j] == 1.0);
    CHECK(w[2 * 3 + j] == 0.5);
    CHECK(w[3 * 3 + j] == 0.5);
  }
  // A strided shard holding global rows 1 and 3: head 0 and head 1.
  std::vector<float> shard(2 * 3, 4.0f);
  const std::int64_t rows[] = {1, 3};
  qk_clip_rows(shard.data(), 2, 3, 2, scales, rows);
  CHECK(shard[0] == 4.0f);
  CHECK(shard[3] == 2.0f);
  CHECK_THROWS_AS(qk_clip_rows(w.data(), 6, 2, 2, scales), Error);  // head 2 has no scale

  // GQA: 4 query heads on 2 key heads: key head 0 sees max(50, 400), key head 1 max(120, 90);
  // scales 0.5 and sqrt(100 / 120).
  const std::vector<double> kv = kv_group_max_logits({50, 400, 120, 90}, 2);
  CHECK(kv == std::vector<double>{400, 120});
  const std::vector<double> kv_scales = qk_clip_head_scales(kv, 100);
  CHECK(kv_scales[1] == Approx(0.9128709292));
  CHECK_THROWS_AS(kv_group_max_logits({1, 2, 3}, 2), Error);
}
