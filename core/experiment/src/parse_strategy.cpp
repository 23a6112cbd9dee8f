// Experiment YAML, how the step runs: the `parallel:` rules, the `optimizer:` map
// (torch.optim.Muon's names plus muonbed's) and the `strategy:` map, whose options are checked
// against what the named strategy reads.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/experiment/src/experiment_parsing.hpp"

namespace muonbed::experiment_parsing {

namespace {

const Parameter* find_param(const Model& model, const std::string& name) {
  for (const Parameter& p : model.params)
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<std::string> param_names(const Model& model) {
  std::vector<std::string> names;
  for (const Parameter& p : model.params) names.push_back(p.name);
  return names;
}

[[noreturn]] void unknown_param(const Context& ctx, const Field& at, const Model& model,
                                const std::string& name, const std::string& what) {
  const std::vector<std::string> names = param_names(model);
  fail(ctx, at,
       what + " names " + quote(name) + ", which is not a parameter of model '" + model.name + "'" +
           did_you_mean(name, names),
       "use a parameter name such as '" + (names.size() > 1 ? names[1] : names.front()) +
           "' (run 'muonbed validate --params FILE' to list them)");
}

void require_param(const Context& ctx, const Field& at, const Model& model, const std::string& name,
                   const std::string& what) {
  if (!find_param(model, name)) unknown_param(ctx, at, model, name, what);
}

}  // namespace

void read_parallel(const Context& ctx, const MapReader& top, const Model& model,
                   ParallelRules& rules) {
  const Field* field = top.find("parallel");
  if (!field) return;
  const MapReader p(ctx, *field, kParallelKeys);
  p.read("fsdp_tensor_dim", rules.fsdp_tensor_dim, 0, 1);
  p.read("tp_shard_embeddings", rules.tp_shard_embeddings);
  if (std::string text; p.read_choice("dense_over_ep", text, kDenseOverEp))
    rules.dense_over_ep = text == "shard" ? DenseOverEp::shard : DenseOverEp::replicate;
  if (const Field* t = p.find("tp_dim_per_param")) {
    std::unordered_map<std::string_view, const Parameter*> by_name;
    for (const Parameter& param : model.params) by_name.emplace(param.name, &param);
    for (const Field& f : map_entries(ctx, *t, "tp_dim_per_param: {layers.0.attn.o: 1}")) {
      const std::string name = f.key.Scalar();
      const auto found = by_name.find(name);
      if (found == by_name.end())
        unknown_param(ctx, Field{f.key, f.key, f.path}, model, name, "tp_dim_per_param");
      const Parameter* param = found->second;
      const int ndim = static_cast<int>(param->shape.size());
      const std::int64_t dim = to_int(ctx, f, 0);
      if (dim >= ndim)
        fail(ctx, f,
             "tp_dim_per_param['" + name + "'] = " + std::to_string(dim) +
                 " is out of range for shape " + shape_text(param->shape),
             "use a tensor dim in 0.." + std::to_string(ndim - 1));
      rules.tp_dim_per_param[name] = static_cast<int>(dim);
    }
  }
}

namespace {

bool uses_mla(const Model& model) {
  return std::any_of(model.params.begin(), model.params.end(), [](const Parameter& p) {
    return p.role == ParamRole::attn_q_up || p.role == ParamRole::attn_kv_up;
  });
}

}  // namespace

void read_optimizer(const Context& ctx, const MapReader& top, const Model& model,
                    OptimizerConfig& opt, RoutingRules& routing) {
  const Field* field = top.find("optimizer");
  if (!field) return;
  if (field->value.IsMap())
    for (const auto& entry : field->value) {
      if (!entry.first.IsScalar()) continue;
      for (const auto& [old_key, now] : kRenamedOptimizerKeys)
        if (entry.first.Scalar() == old_key)
          fail(ctx, entry.first,
               "'optimizer." + old_key +
                   "' was renamed (muonbed follows torch.optim.Muon's and AdamW's names)",
               "write " + now);
    }
  const MapReader o(ctx, *field, kOptimizerKeys);
  constexpr double kHuge = std::numeric_limits<double>::max();
  MuonConfig& muon = opt.muon;
  o.read("lr", muon.lr, 0, kHuge, true);
  o.read("weight_decay", muon.weight_decay, 0, kHuge);
  if (const Field* f = o.find("momentum")) {
    muon.momentum = to_double(ctx, *f, 0, 1);
    if (muon.momentum >= 1)
      fail(ctx, *f, "'optimizer.momentum' = " + f->value.Scalar() + " must be below 1",
           "use a momentum in [0, 1), typically 0.95");
  }
  o.read("nesterov", muon.nesterov);
  if (const Field* f = o.find("momentum_form"))
    muon.momentum_form = momentum_form_from_string(to_choice(ctx, *f, {"lerp", "classic"}));
  o.read("ns_steps", muon.ns_steps, 1, 100);
  o.read("eps", muon.eps, 0, 1);
  if (const Field* f = o.find("adjust_lr_fn"))
    muon.adjust_lr_fn =
        lr_scale_rule_from_string(to_choice(ctx, *f, {"original", "match_rms_adamw", "none"}));
  if (const Field* f = o.find("comm_dtype")) opt.comm_dtype = read_dtype(ctx, *f);

  // ns_coefficients: a set's name, one torch-style [a, b, c] for every step, or one per step.
  if (const Field* f = o.find("ns_coefficients")) {
    const std::string example = "ns_coefficients: [[3.4445, -4.775, 2.0315], ...]";
    if (f->value.IsScalar()) {
      muon.ns_coefficients = to_choice(ctx, *f, {"keller", "keller_jordan", "polar_express"});
      if (muon.ns_coefficients == "keller_jordan") muon.ns_coefficients = "keller";
    } else {
      const std::vector<Field> items = list_items(ctx, *f);
      const auto read_triple = [&](const Field& step) {
        const std::vector<Field> abc = list_items(ctx, step);
        if (abc.size() != 3)
          fail(ctx, step,
               "'" + step.path + "' has " + std::to_string(abc.size()) + " numbers, not 3",
               "write each step as [a, b, c], e.g. " + example);
        return NsStepCoefficients{to_double(ctx, abc[0], -1e6, 1e6),
                                  to_double(ctx, abc[1], -1e6, 1e6),
                                  to_double(ctx, abc[2], -1e6, 1e6)};
      };
      if (items.empty())
        fail(ctx, *f, "'optimizer.ns_coefficients' is an empty list",
             "name a set (keller, polar_express) or give " + example);
      muon.ns_coefficients = "custom";
      if (!items.front().value.IsSequence()) {
        // torch.optim.Muon's form: one (a, b, c) used at every step.
        const NsStepCoefficients abc = read_triple(*f);
        muon.custom_coefficients.assign(static_cast<std::size_t>(muon.ns_steps), abc);
      } else {
        for (const Field& step : items) muon.custom_coefficients.push_back(read_triple(step));
        if (static_cast<int>(items.size()) != muon.ns_steps) {
          if (o.find("ns_steps"))
            fail(ctx, *f,
                 "ns_coefficients lists " + std::to_string(items.size()) +
                     " steps but ns_steps is " + std::to_string(muon.ns_steps),
                 "give one [a, b, c] per Newton-Schulz step, or set ns_steps: " +
                     std::to_string(items.size()));
          muon.ns_steps = static_cast<int>(items.size());
        }
      }
    }
  }

  if (const Field* a = o.find("adamw")) {
    const MapReader ar(ctx, *a, kAdamWKeys);
    ar.read("lr", opt.adamw.lr, 0, kHuge, true);
    ar.read("eps", opt.adamw.eps, 0, 1);
    ar.read("weight_decay", opt.adamw.weight_decay, 0, kHuge);
    if (const Field* f = ar.find("betas")) {
      const std::vector<Field> betas = list_items(ctx, *f);
      if (betas.size() != 2)
        fail(ctx, *f, "'optimizer.adamw.betas' has " + std::to_string(betas.size()) + " values",
             "write betas: [0.9, 0.999] (beta1, beta2)");
      double* out[2] = {&opt.adamw.beta1, &opt.adamw.beta2};
      for (int i = 0; i < 2; ++i) {
        *out[i] = to_double(ctx, betas[i], 0, 1);
        if (*out[i] >= 1)
          fail(ctx, betas[i],
               "'" + betas[i].path + "' = " + betas[i].value.Scalar() + " must be below 1",
               "use a value in [0, 1)");
      }
    }
  }
  if (const Field* q = o.find("qk_clip")) {
    const MapReader qr(ctx, *q, kQkClipKeys);
    qr.read("enabled", opt.qk_clip.enabled);
    qr.read("tau", opt.qk_clip.tau, 0, kHuge, true);
    qr.read("head_dim", opt.qk_clip.head_dim, 0, std::int64_t{1} << 20);
    if (opt.qk_clip.enabled && opt.qk_clip.head_dim == 0) {
      // The model's attention head size, when the model says it.
      opt.qk_clip.head_dim = model.head_dim;
      if (opt.qk_clip.head_dim <= 0 && !uses_mla(model))
        fail(ctx, *q, "qk_clip is enabled but the head size is unknown for this model",
             "give optimizer.qk_clip.head_dim (rows per attention head of attn_q / attn_k)");
    }
    // MuonClip of MLA rescales the head blocks of q_b and kv_b (Kimi K2); muonbed clips attn_q
    // and attn_k only, and would silently clip nothing here.
    if (opt.qk_clip.enabled && uses_mla(model))
      fail(ctx, *q,
           "qk_clip is enabled, but model '" + model.name +
               "' uses multi-head latent attention (attn_q_up / attn_kv_up), which muonbed's "
               "QK-clip does not cover",
           "set qk_clip: {enabled: false}");
  }

  if (const Field* r = o.find("routing")) {
    const MapReader rr(ctx, *r, kRoutingKeys);
    rr.read("embeddings_to_adamw", routing.embeddings_to_adamw);
    rr.read("lm_head_to_adamw", routing.lm_head_to_adamw);
    rr.read("router_to_adamw", routing.router_to_adamw);
    if (const Field* f = rr.find("force_adamw")) {
      for (const Field& item : list_items(ctx, *f)) {
        const std::string name = to_string_value(ctx, item);
        require_param(ctx, item, model, name, "optimizer.routing.force_adamw");
        routing.force_adamw.push_back(name);
      }
    }
  }
}

void read_strategy(const Context& ctx, const MapReader& top, const MeshSection& mesh,
                   const Model& model, StrategyOptions& s, OptionUses& uses) {
  const Field* field = top.find("strategy");
  if (!field) return;
  const MapReader st(ctx, *field, kStrategyKeys);

  if (st.find("preset")) {  // the preset first; the other keys override it
    std::string preset;
    st.read_choice("preset", preset, strategy_preset_names());
    s = strategy_preset(preset, mesh.mesh.world_size());
  }
  st.read_choice("name", s.name, strategy_names());
  std::vector<std::string> policies = assign_policy_names();
  if (std::find(policies.begin(), policies.end(), "explicit") == policies.end())
    policies.push_back("explicit");  // made by make_explicit_assign_policy, not the registry
  st.read_choice("assign", s.assign, policies);
  st.read("async_gpu_parallelism", s.async_gpu_parallelism);
  st.read("prefetch_count", s.prefetch_count, 0, 1024);
  if (const Field* g = st.find("gather")) {
    s.gather = to_string_value(ctx, *g);
    try {
      make_gather_policy(s.gather);
    } catch (const Error& e) {
      fail(ctx, *g,
           "unknown gather policy '" + s.gather + "'" +
               did_you_mean(s.gather, {"hierarchical", "rails", "flat"}),
           std::string("use hierarchical, rails or flat (") + e.what() + ")");
    }
  }
  st.read("chunk_size", s.chunk_size, 1, 1 << 20);
  st.read("max_chunks_in_flight", s.max_chunks_in_flight, 1, 1 << 20);
  st.read("small_param_threshold", s.small_param_threshold, 0);
  st.read("comm_lanes", s.comm_lanes, 1, 4096);
  st.read_choice("order", s.order, {"plan", "lpt"});
  st.read("chunk_by_shape", s.chunk_by_shape);
  st.read_choice("chunk_sizing", s.chunk_sizing, {"count", "ns_cost"});
  if (const Field* f = st.find("split_ns")) {
    // split_ns: true | false, or a map (its presence enables it unless enabled: false).
    if (f->value.IsScalar()) {
      s.split_ns.enabled = to_bool(ctx, *f);
    } else {
      const MapReader sn(ctx, *f, kSplitNsKeys);
      s.split_ns.enabled = true;
      sn.read("enabled", s.split_ns.enabled);
      sn.read("max_members", s.split_ns.max_members, 2, 16384);
      sn.read("threshold", s.split_ns.threshold, 0.0, 1e9);
    }
    if (s.split_ns.enabled && !strategy_reads_option(s, "split_ns"))
      fail(ctx, f->key,
           "'strategy.split_ns' needs a strategy whose staged gathers leave each member of a "
           "split group its slice (" +
               strategies_reading_option("split_ns") + "), not '" + s.name + "'",
           "set strategy.name: owner, or remove split_ns");
    if (s.split_ns.enabled && s.gather != "hierarchical" && s.gather != "rails" &&
        s.gather != "flat")
      fail(ctx, f->key, "'strategy.split_ns' needs a staged gather, not '" + s.gather + "'",
           "set strategy.gather: hierarchical, rails or flat, or remove split_ns");
  }
  if (const Field* f = st.find("explicit_owners")) {
    if (s.assign != "explicit")
      fail(ctx, f->key,
           "'strategy.explicit_owners' is given but strategy.assign is '" + s.assign + "'",
           "set assign: explicit, or remove explicit_owners");
    for (const Field& owner :
         map_entries(ctx, *f, "explicit_owners: {layers.0.attn.q: 0, layers.0.attn.k: 1}"))
      s.explicit_owners[owner.key.Scalar()] =
          static_cast<int>(to_int(ctx, owner, 0, mesh.mesh.world_size() - 1));
  } else if (s.assign == "explicit") {
    fail(ctx, *st.find("assign"), "strategy.assign: explicit needs 'explicit_owners'",
         "add explicit_owners: {PARAM_NAME: RANK, ...} under strategy, one entry per Muon matrix");
  }
  if (const Field* g = st.find("grad_sync")) {
    const MapReader gs(ctx, *g, kGradSyncKeys);
    gs.read("enabled", s.grad_sync.enabled);
    if (const Field* lp = gs.find("level_periods")) {
      const std::vector<Field> items = list_items(ctx, *lp);
      if (items.empty())
        fail(ctx, *lp, "'strategy.grad_sync.level_periods' is empty",
             "give one period per level, e.g. level_periods: [1, 2, 4]");
      const int max_levels = std::max(1, model.num_layers);
      if (static_cast<int>(items.size()) > max_levels)
        fail(ctx, *lp,
             "grad_sync has " + std::to_string(items.size()) + " levels but model '" + model.name +
                 "' has only " + std::to_string(model.num_layers) + " layers to split into levels",
             "use at most " + std::to_string(max_levels) + " level periods");
      s.grad_sync.level_periods.clear();
      std::int64_t hyper_period = 1;
      for (const Field& item : items) {
        const std::int64_t period = to_int(ctx, item, 1, kMaxHyperPeriod);
        s.grad_sync.level_periods.push_back(static_cast<int>(period));
        // Both factors are at most 2^20, so the product cannot overflow.
        hyper_period = hyper_period / std::gcd(hyper_period, period) * period;
        if (hyper_period > kMaxHyperPeriod)
          fail(ctx, item,
               "the level periods up to here repeat only every " + std::to_string(hyper_period) +
                   " steps (their least common multiple), more than " +
                   std::to_string(kMaxHyperPeriod) + " (2^20)",
               "use periods whose least common multiple is at most " +
                   std::to_string(kMaxHyperPeriod) +
                   ", e.g. powers of two such as [1, 2, 4, 8] (coprime periods multiply)");
      }
    }
  }
  // Which options this point gives a setting that its strategy reads (an option no point reads
  // is an error: check_strategy_options), then the unread ones back to their defaults.
  for (const std::string& key : kStrategyKeys) {
    const Field* f = st.find(key);
    if (f == nullptr || strategy_option_is_default(s, key)) continue;
    auto [it, fresh] = uses.try_emplace(key);
    if (fresh) {
      it->second.ctx = ctx;
      // A swept option's key is written into the tree without a mark: point at its value in
      // `sweep:` then.
      it->second.at = f->key.IsDefined() && !f->key.Mark().is_null() ? f->key : f->value;
    }
    it->second.strategies.insert(s.name);
    it->second.read = it->second.read || strategy_reads_option(s, key);
  }
  reset_unread_options(s);
}

}  // namespace muonbed::experiment_parsing
