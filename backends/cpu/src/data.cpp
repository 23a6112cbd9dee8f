// Seeded step data (see backends/cpu/data.hpp).
#include "backends/cpu/data.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/base/errors.hpp"
#include "kernels/random.hpp"

namespace muonbed::cpu {

namespace {

constexpr double kGradientUnit = 1.0 / 16384.0;  // 2^-14
constexpr int kGradientRange = 256;              // |any partial sum| <= 256 units: bf16-exact

// The ep dim an EP slice is independent along (parallelize's expert stacks), or -1.
int ep_dim(const ShardedModel& model, const DistributedParam& dp) {
  if (dp.shape.size() != 3) return -1;
  const auto& placements = dp.layout.placements();
  for (int d = 0; d < model.mesh.ndims(); ++d)
    if (model.mesh.dim(d).role == DimRole::ep && placements[d].kind == PlacementKind::independent)
      return d;
  return -1;
}

std::size_t num_sources(const ShardedModel& model) {
  int n = 0;
  for (const auto& dp : model.params) n = std::max(n, dp.source + 1);
  return static_cast<std::size_t>(n);
}

Parameter as_parameter(const DistributedParam& dp, const std::vector<std::int64_t>& shape) {
  Parameter p;
  p.name = dp.name;
  p.shape = shape;
  p.dtype = dp.dtype;
  p.role = dp.role;
  p.layer = dp.layer;
  return p;
}

}  // namespace

SourceSlice source_slice(const ShardedModel& model, int param) {
  const auto& dp = model.params.at(param);
  SourceSlice s;
  s.source = dp.source;
  s.source_shape = dp.shape;
  const int e = ep_dim(model, dp);
  if (e >= 0) {
    const int slices = model.mesh.size(e);
    const int coord = dp.layout.placements()[e].coord;
    s.source_shape[0] = dp.shape[0] * slices;
    s.offset = coord * dp.numel();
  }
  return s;
}

Model source_model(const ShardedModel& model) {
  Model out;
  out.name = model.model_name;
  std::map<int, std::vector<int>> by_source;
  for (const auto& dp : model.params) by_source[dp.source].push_back(dp.index);
  int expected = 0;
  for (const auto& [source, params] : by_source) {
    const auto& first = model.params[params.front()];
    if (source != expected++)
      throw PlanError("the plan's model has no parameter of source " +
                      std::to_string(expected - 1) +
                      " (sources must be 0, 1, 2, ... to generate seeded data)");
    const SourceSlice slice = source_slice(model, first.index);
    std::int64_t covered = 0;
    for (int p : params) {
      const auto& dp = model.params[p];
      const SourceSlice sp = source_slice(model, p);
      if (sp.source_shape != slice.source_shape || (params.size() > 1 && ep_dim(model, dp) < 0))
        throw PlanError("params '" + first.name + "' and '" + dp.name + "' share source " +
                        std::to_string(source) + " without being EP slices of one stack");
      covered += dp.numel();
    }
    std::int64_t numel = 1;
    for (auto n : slice.source_shape) numel *= n;
    if (covered != numel)
      throw PlanError("the EP slices of source " + std::to_string(source) + " ('" + first.name +
                      "') do not cover its stack");
    Parameter p = as_parameter(first, slice.source_shape);
    if (ep_dim(model, first) >= 0) p.name = p.name.substr(0, p.name.rfind("[ep="));
    out.num_layers = std::max(out.num_layers, p.layer + 1);
    out.params.push_back(std::move(p));
  }
  return out;
}

RoutingRules source_routing(const ShardedModel& model) {
  // With every optional rule off, route() sends every matrix to Muon and every vector to AdamW;
  // the AdamW matrices are then named one by one.
  RoutingRules rules;
  rules.embeddings_to_adamw = false;
  rules.lm_head_to_adamw = false;
  rules.router_to_adamw = false;
  const Model source = source_model(model);
  for (const auto& dp : model.params) {
    const auto& p = source.params.at(dp.source);
    if (dp.optimizer == OptimizerKind::adamw && route(p, rules) == OptimizerKind::muon &&
        std::find(rules.force_adamw.begin(), rules.force_adamw.end(), p.name) ==
            rules.force_adamw.end())
      rules.force_adamw.push_back(p.name);
    if (dp.optimizer == OptimizerKind::muon && !p.is_matrix())
      throw PlanError("'" + dp.name + "' is routed to Muon but is not a matrix");
  }
  return rules;
}

float gradient_contribution(std::uint64_t seed, std::size_t sources, int source, int step,
                            int member, int members, std::int64_t index) {
  const int bound = std::max(1, kGradientRange / std::max(1, members));
  const std::uint64_t key = counter_key(
      counter_key(seed, grad_stream(sources, static_cast<std::size_t>(source), step + 1)),
      static_cast<std::uint64_t>(member));
  const double u = keyed_uniform(key, static_cast<std::uint64_t>(index));  // [-1, 1)
  const auto n = std::min<std::int64_t>(
      bound, static_cast<std::int64_t>(std::floor((u + 1.0) * 0.5 * (2 * bound + 1))) - bound);
  return static_cast<float>(static_cast<double>(n) * kGradientUnit);
}

void fill_parameters(const StepPlan& plan, const RankProgram& program, RankStore& store,
                     std::uint64_t seed) {
  const auto& model = plan.model;
  for (const auto& dp : model.params) {
    const ParamPieces& pieces = program.params.at(dp.index);
    if (!pieces.parameter.present()) continue;
    const SourceSlice slice = source_slice(model, dp.index);
    const Parameter source = as_parameter(dp, slice.source_shape);
    const double scale = init_scale(source), offset = init_offset(source);
    const std::uint64_t key =
        counter_key(seed, param_stream(static_cast<std::size_t>(slice.source)));
    std::vector<float> out(static_cast<std::size_t>(pieces.parameter.set.numel()));
    for_each_element(pieces.parameter.set, dp.shape, [&](std::int64_t f, std::int64_t p) {
      out[p] = static_cast<float>(
          offset + scale * keyed_uniform(key, static_cast<std::uint64_t>(slice.offset + f)));
    });
    // Stored in the parameter's dtype (rounded), as the reference's initial values are.
    store.write(pieces.parameter.tensor, pieces.parameter.offset,
                static_cast<std::int64_t>(out.size()), out.data());
  }
}

void fill_gradients(const StepPlan& plan, const RankProgram& program, RankStore& store,
                    std::uint64_t seed, int step) {
  const auto& model = plan.model;
  const std::size_t sources = num_sources(model);
  for (const auto& dp : model.params) {
    const ParamPieces& pieces = program.params.at(dp.index);
    if (!pieces.gradient.present()) continue;
    const SourceSlice slice = source_slice(model, dp.index);
    const bool active = step % pieces.gradient_period == 0;
    std::vector<float> out(static_cast<std::size_t>(pieces.gradient.set.numel()), 0.0f);
    const auto store_piece = [&] {
      store.write(pieces.gradient.tensor, pieces.gradient.offset,
                  static_cast<std::int64_t>(out.size()), out.data());
    };
    if (!active) {
      store_piece();
      continue;
    }
    const bool summed = pieces.gradient_reduced_over.empty();
    const GradientSync sync = gradient_sync(plan, dp.index);
    const int members = model.mesh.group_size(sync.reduced_over);
    for_each_element(pieces.gradient.set, dp.shape, [&](std::int64_t f, std::int64_t p) {
      const std::int64_t index = slice.offset + f;
      if (!summed) {
        out[p] = gradient_contribution(seed, sources, slice.source, step, pieces.gradient_member,
                                       pieces.gradient_members, index);
        return;
      }
      // The rank starts with the sum of every member's contribution (the sync happened earlier).
      float sum = 0.0f;
      for (int m = 0; m < members; ++m)
        sum += gradient_contribution(seed, sources, slice.source, step, m, members, index);
      out[p] = sum;
    });
    store_piece();  // exact in bf16 and fp32 (the header comment)
  }
}

ModelTensors<float> summed_gradients(const StepPlan& plan, const Model& model, std::uint64_t seed,
                                     int step) {
  const auto& sharded = plan.model;
  const std::size_t sources = num_sources(sharded);
  if (sources != model.params.size())
    throw PlanError("the plan's model has " + std::to_string(sources) +
                    " source parameters, the "
                    "reference model " +
                    std::to_string(model.params.size()));
  ModelTensors<float> out(model.params.size());
  std::vector<int> members(model.params.size(), 1), period(model.params.size(), 1);
  for (const auto& dp : sharded.params) {
    const GradientSync sync = gradient_sync(plan, dp.index);
    members[dp.source] = sharded.mesh.group_size(sync.reduced_over);
    period[dp.source] = sync.period;
  }
  for (std::size_t s = 0; s < model.params.size(); ++s) {
    const std::int64_t n = model.params[s].numel();
    out[s].assign(static_cast<std::size_t>(n), 0.0f);
    if (step % period[s] != 0) continue;  // a frozen level: no gradient
    for (std::int64_t i = 0; i < n; ++i) {
      float sum = 0.0f;
      for (int m = 0; m < members[s]; ++m)
        sum += gradient_contribution(seed, sources, static_cast<int>(s), step, m, members[s], i);
      out[s][static_cast<std::size_t>(i)] = sum;
    }
  }
  return out;
}

QkLogits step_logits(const Model& model, const OptimizerConfig& config, std::uint64_t seed,
                     int step) {
  std::int64_t query_heads = 0;
  for (const auto& p : model.params)
    if (p.role == ParamRole::attn_q && p.shape.size() == 2 && config.qk_clip.head_dim > 0)
      query_heads = p.rows() / config.qk_clip.head_dim;
  return random_max_logits(model.num_layers, query_heads, config.qk_clip.tau, seed, step + 1);
}

}  // namespace muonbed::cpu
