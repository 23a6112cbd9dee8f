// The distinct step patterns of a plan's hyper-period (see core/engine/measurement.hpp).
#include "core/engine/measurement.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "core/base/errors.hpp"

namespace muonbed {

namespace {

constexpr std::int64_t kMaxPatternSteps = std::int64_t{1} << 20;  // as estimate() counts them

}  // namespace

std::vector<StepPatternSpec> step_patterns(const StepPlan& plan) {
  std::vector<int> periods;
  for (const Op& op : plan.ops) periods.push_back(op.period);
  std::sort(periods.begin(), periods.end());
  periods.erase(std::unique(periods.begin(), periods.end()), periods.end());
  std::int64_t steps = 1;
  for (int p : periods) {
    if (p < 1) throw PlanError("step_patterns: an op has period " + std::to_string(p));
    steps = std::min(kMaxPatternSteps, steps / std::gcd(steps, static_cast<std::int64_t>(p)) * p);
  }
  // Pattern of step k: which distinct periods divide k; patterns listed by their first step.
  std::map<std::vector<bool>, std::size_t> index;
  std::vector<StepPatternSpec> out;
  std::vector<bool> key(periods.size());
  for (std::int64_t k = 0; k < steps; ++k) {
    for (std::size_t i = 0; i < periods.size(); ++i) key[i] = k % periods[i] == 0;
    auto [it, inserted] = index.try_emplace(key, out.size());
    if (inserted) out.push_back({static_cast<int>(k), 0});
    ++out[it->second].count;
  }
  return out;
}

std::int64_t pattern_steps(const std::vector<StepPatternSpec>& patterns) {
  std::int64_t n = 0;
  for (const auto& p : patterns) n += p.count;
  return n;
}

}  // namespace muonbed
