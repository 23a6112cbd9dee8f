// The step from a parsed experiment point to its plan. Kept apart from experiment.cpp so that
// code which only parses experiments (and its tests) does not link the strategies' planner.
#include "core/experiment/experiment.hpp"

namespace muonbed {

StepPlan plan_experiment(const Experiment& experiment) {
  return build_plan(*shared_shard_model(experiment), experiment.strategy,
                    experiment.plan_settings());
}

}  // namespace muonbed
