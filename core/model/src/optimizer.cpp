// String forms and validation of the optimizer configuration (see core/model/optimizer.hpp).
#include "core/model/optimizer.hpp"

#include <cmath>
#include <string>

#include "core/base/errors.hpp"

namespace muonbed {

std::string_view to_string(MomentumForm form) {
  return form == MomentumForm::classic ? "classic" : "lerp";
}

MomentumForm momentum_form_from_string(std::string_view text) {
  if (text == "classic") return MomentumForm::classic;
  if (text == "lerp") return MomentumForm::lerp;
  throw Error("unknown momentum form '" + std::string(text) + "'; valid: classic, lerp");
}

std::string_view to_string(LrScaleRule rule) {
  switch (rule) {
    case LrScaleRule::none:
      return "none";
    case LrScaleRule::original:
      return "original";
    case LrScaleRule::match_rms_adamw:
      return "match_rms_adamw";
  }
  return "?";
}

LrScaleRule lr_scale_rule_from_string(std::string_view text) {
  for (LrScaleRule r : {LrScaleRule::none, LrScaleRule::original, LrScaleRule::match_rms_adamw})
    if (text == to_string(r)) return r;
  throw Error("unknown adjust_lr_fn '" + std::string(text) +
              "'; valid: original, match_rms_adamw, none");
}

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw Error("optimizer config: " + what);
}

bool finite_at_least(double value, double low) {
  return std::isfinite(value) && value >= low;
}

}  // namespace

void validate(const OptimizerConfig& config) {
  const MuonConfig& m = config.muon;
  require(finite_at_least(m.lr, 0), "muon lr must be finite and >= 0");
  require(finite_at_least(m.weight_decay, 0), "muon weight_decay must be finite and >= 0");
  require(finite_at_least(m.momentum, 0) && m.momentum < 1, "momentum must lie in [0, 1)");
  require(finite_at_least(m.eps, 0), "eps must be finite and >= 0");
  require(m.ns_steps >= 1 && m.ns_steps <= 100, "ns_steps must lie in 1..100");
  require(m.ns_coefficients == "keller" || m.ns_coefficients == "keller_jordan" ||
              m.ns_coefficients == "polar_express" || m.ns_coefficients == "custom",
          "ns_coefficients '" + m.ns_coefficients +
              "' is not keller, polar_express or a list of [a, b, c]");
  if (m.ns_coefficients == "custom") {
    require(static_cast<int>(m.custom_coefficients.size()) == m.ns_steps,
            "custom coefficients list " + std::to_string(m.custom_coefficients.size()) +
                " steps but ns_steps is " + std::to_string(m.ns_steps));
    for (const NsStepCoefficients& s : m.custom_coefficients)
      require(std::isfinite(s.a) && std::isfinite(s.b) && std::isfinite(s.c),
              "a custom Newton-Schulz coefficient is not finite");
  } else {
    require(m.custom_coefficients.empty(),
            "custom coefficients are given but ns_coefficients is '" + m.ns_coefficients + "'");
  }
  const AdamWConfig& a = config.adamw;
  require(finite_at_least(a.lr, 0), "adamw lr must be finite and >= 0");
  require(finite_at_least(a.beta1, 0) && a.beta1 < 1 && finite_at_least(a.beta2, 0) && a.beta2 < 1,
          "adamw betas must lie in [0, 1)");
  require(finite_at_least(a.eps, 0), "adamw eps must be finite and >= 0");
  require(finite_at_least(a.weight_decay, 0), "adamw weight_decay must be finite and >= 0");
  const QkClipConfig& q = config.qk_clip;
  if (q.enabled) {
    require(std::isfinite(q.tau) && q.tau > 0, "qk_clip tau must be finite and > 0");
    require(q.head_dim > 0, "qk_clip needs head_dim (rows per attention head) > 0");
  }
}

}  // namespace muonbed
