// PlanBuilder: the plan under construction that strategies' building blocks emit ops into
// (core/plan/schedule.hpp).
#include <algorithm>

#include "core/base/errors.hpp"
#include "core/plan/schedule.hpp"

namespace muonbed {

PlanBuilder::PlanBuilder(ShardedModel model, Assignment assignment, PlanSettings settings) {
  plan_.model = std::move(model);
  plan_.assignment = std::move(assignment);
  plan_.settings = settings;
}

int PlanBuilder::stream(const std::string& name) {
  const auto it = std::find(plan_.streams.begin(), plan_.streams.end(), name);
  if (it != plan_.streams.end()) return static_cast<int>(it - plan_.streams.begin());
  plan_.streams.push_back(name);
  return static_cast<int>(plan_.streams.size()) - 1;
}

int PlanBuilder::add_buffer(std::string name, std::vector<int> params, DimSet gathered,
                            bool owned_only) {
  Buffer b;
  b.id = static_cast<int>(plan_.buffers.size());
  b.name = std::move(name);
  b.params = std::move(params);
  b.gathered = gathered;
  b.owned_only = owned_only;
  plan_.buffers.push_back(std::move(b));
  return plan_.buffers.back().id;
}

int PlanBuilder::emit(Op op) {
  op.id = static_cast<int>(plan_.ops.size());
  std::sort(op.deps.begin(), op.deps.end());
  op.deps.erase(std::unique(op.deps.begin(), op.deps.end()), op.deps.end());
  for (int dep : op.deps)
    if (dep < 0 || dep >= op.id) throw PlanError("internal: op depends on a later op");
  if (op.ranks.coord.empty()) op.ranks = RankBox::everyone(mesh());
  if (op.tensor == TensorRole::none) op.tensor = default_tensor(op);
  plan_.ops.push_back(std::move(op));
  return plan_.ops.back().id;
}

RankBox PlanBuilder::holders_box(int p) const {
  RankBox box = RankBox::everyone(mesh());
  const auto& layout = param(p).layout;
  for (int d = 0; d < mesh().ndims(); ++d)
    if (layout.independent_dims().contains(d)) box.coord[d] = layout.placements()[d].coord;
  return box;
}

RankBox PlanBuilder::box_through(int p, int rank, DimSet fixed) const {
  RankBox box = holders_box(p);
  for (int d = 0; d < mesh().ndims(); ++d)
    if (fixed.contains(d)) box.coord[d] = mesh().coord(rank, d);
  return box;
}

StepPlan PlanBuilder::finish(std::string strategy_name, std::string options_json) {
  plan_.strategy = std::move(strategy_name);
  plan_.strategy_options = std::move(options_json);
  validate_plan(plan_);
  return std::move(plan_);
}

}  // namespace muonbed
