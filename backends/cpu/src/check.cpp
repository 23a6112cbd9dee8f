// The reference check of executed plans (see backends/cpu/check.hpp).
#include "backends/cpu/check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string_view>

#include "backends/cpu/data.hpp"
#include "core/base/errors.hpp"

namespace muonbed::cpu {

namespace {

ReferenceOptions reference_options(const StepPlan& plan) {
  ReferenceOptions o;
  o.ns_precision = NsPrecision::fp32;
  o.round_to_comm_dtype = true;
  o.round_to_storage_dtypes = true;  // parameters in their dtype, state in the plan's
  o.state_dtype = plan.settings.state_dtype;
  return o;
}

std::string multi_index(std::int64_t index, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> coords(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    coords[d] = shape[d] > 0 ? index % shape[d] : 0;
    index = shape[d] > 0 ? index / shape[d] : 0;
  }
  std::string out = "[";
  for (std::size_t d = 0; d < coords.size(); ++d)
    out += (d ? ", " : "") + std::to_string(coords[d]);
  return out + "]";
}

std::string value(float v) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  std::ostringstream os;
  os << std::setprecision(9) << v << " (0x" << std::hex << std::setw(8) << std::setfill('0') << bits
     << ")";
  return os.str();
}

// One unit in the last place of `dtype` at `magnitude` (its binade's spacing): how far two values
// that were within a tolerance before rounding to the dtype may be after it.
double storage_ulp(DType dtype, double magnitude) {
  const int mantissa_bits = dtype == DType::bf16 ? 7 : 23;
  int exponent = 0;
  std::frexp(std::max(magnitude, double{std::numeric_limits<float>::min()}), &exponent);
  return std::ldexp(1.0, exponent - 1 - mantissa_bits);
}

}  // namespace

ReferenceRun::ReferenceRun(const StepPlan& plan, Model model, RoutingRules routing,
                           std::uint64_t seed)
    : plan_(plan),
      seed_(seed),
      optimizer_(std::move(model), plan.settings.optimizer, std::move(routing),
                 reference_options(plan)) {
  params_ = random_params<float>(optimizer_.model(), seed_);
  optimizer_.round_to_storage(params_);
  initial_ = params_;
  for (const auto& dp : plan.model.params) {
    const auto s = static_cast<std::size_t>(dp.source);
    if (optimizer_.kind(s) != dp.optimizer)
      throw PlanError("the reference routes '" + dp.name + "' to another optimizer than the plan");
    if (optimizer_.model().params.at(s).dtype != dp.dtype)
      throw PlanError("the reference stores '" + dp.name + "' in " +
                      std::string(to_string(optimizer_.model().params.at(s).dtype)) +
                      " but the plan in " + std::string(to_string(dp.dtype)));
  }
}

ReferenceRun::ReferenceRun(const StepPlan& plan, std::uint64_t seed)
    : ReferenceRun(plan, source_model(plan.model), source_routing(plan.model), seed) {}

void ReferenceRun::run_to(int steps) {
  for (; steps_ < steps; ++steps_) {
    const ModelTensors<float> grads = summed_gradients(plan_, optimizer_.model(), seed_, steps_);
    const QkLogits logits = step_logits(optimizer_.model(), optimizer_.config(), seed_, steps_);
    optimizer_.step(params_, grads, &logits);
  }
}

std::optional<Mismatch> first_mismatch(const StepPlan& plan, const RankStore& store,
                                       const ReferenceRun& reference, double tolerance) {
  return first_mismatch(plan, store, reference, CheckTolerance{tolerance, 0});
}

std::optional<Mismatch> first_mismatch(const StepPlan& plan, const RankStore& store,
                                       const ReferenceRun& reference,
                                       const CheckTolerance& tolerance) {
  const RankProgram& program = store.program();
  for (const auto& dp : plan.model.params) {
    const ParamPieces& pieces = program.params.at(dp.index);
    if (!pieces.held) continue;
    const SourceSlice slice = source_slice(plan.model, dp.index);
    const auto s = static_cast<std::size_t>(slice.source);
    const std::pair<const char*, std::pair<const PieceRef*, const std::vector<float>*>> roles[] = {
        {"parameter", {&pieces.parameter, &reference.params().at(s)}},
        {"momentum", {&pieces.momentum, &reference.optimizer().momentum_buffer(s)}},
        {"adam_m", {&pieces.adam_m, &reference.optimizer().adam_m(s)}},
        {"adam_v", {&pieces.adam_v, &reference.optimizer().adam_v(s)}},
    };
    // The parameter's largest movement since step 0 (over all of it, not only this rank's piece).
    double movement_bound = 0;
    if (tolerance.movement > 0) {
      const std::vector<float>& now = reference.params().at(s);
      const std::vector<float>& before = reference.initial_params().at(s);
      std::int64_t numel = 1;
      for (const std::int64_t d : dp.shape) numel *= d;
      double moved = 0;
      for (std::int64_t f = 0; f < numel; ++f) {
        const auto i = static_cast<std::size_t>(slice.offset + f);
        moved = std::max(moved, std::abs(static_cast<double>(now.at(i)) - before.at(i)));
      }
      movement_bound = tolerance.movement * moved;
    }
    for (const auto& [name, what] : roles) {
      const auto& [ref, want] = what;
      if (!ref->present()) continue;
      const double allowed = std::max(tolerance.absolute,
                                      std::string_view(name) == "parameter" ? movement_bound : 0.0);
      const std::vector<float> got = store.read(ref->tensor, ref->offset, ref->set.numel());
      const DType dtype = store.dtype(ref->tensor);
      std::optional<Mismatch> found;
      for_each_element(ref->set, dp.shape, [&](std::int64_t f, std::int64_t p) {
        if (found) return;
        const float w = want->at(static_cast<std::size_t>(slice.offset + f));
        if (std::memcmp(&got[p], &w, sizeof w) == 0) return;
        // Both sides are rounded to the tensor's dtype at the end of every step: values within
        // `allowed` before a rounding are within `allowed` plus one unit in the last place after
        // it, and the next step starts from those values, so S steps add S units.
        const double difference = std::abs(static_cast<double>(got[p]) - w);
        const double rounding = tolerance.rounding_units * reference.steps() *
                                storage_ulp(dtype, std::max(std::abs(got[p]), std::abs(w)));
        if (allowed > 0 && std::isfinite(got[p]) && difference <= allowed + rounding) return;
        Mismatch m;
        m.rank = store.rank();
        m.param = dp.index;
        m.tensor = std::string(name) + " of '" + dp.name + "'";
        m.element = f;
        m.got = got[p];
        m.want = w;
        std::ostringstream bound;
        if (allowed > 0) {
          bound << " (allowed difference " << std::setprecision(3) << allowed;
          if (tolerance.rounding_units > 0)
            bound << " + " << tolerance.rounding_units * reference.steps() << " "
                  << to_string(dtype) << " ulp";
          bound << ")";
        }
        m.message = "rank " + std::to_string(m.rank) + ": " + m.tensor +
                    " differs from the single-device reference after " +
                    std::to_string(reference.steps()) + " step" +
                    (reference.steps() == 1 ? "" : "s") + " at element " +
                    multi_index(f, dp.shape) + " (first of its piece " + ref->set.to_string() +
                    "): got " + value(m.got) + ", want " + value(m.want) + bound.str();
        found = std::move(m);
      });
      if (found) return found;
    }
  }
  return std::nullopt;
}

}  // namespace muonbed::cpu
