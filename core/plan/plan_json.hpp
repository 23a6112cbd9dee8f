// JSON form of step plans (and of the sharded model inside them). Round trip is exact:
// plan_from_json(plan_to_json(p)) rebuilds a plan equal in every field.
#pragma once

#include <nlohmann/json.hpp>

#include "core/plan/plan.hpp"

namespace muonbed {

nlohmann::json plan_to_json(const StepPlan& plan);
StepPlan plan_from_json(const nlohmann::json& json);  // throws PlanError on malformed input

}  // namespace muonbed
