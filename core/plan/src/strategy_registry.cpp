// The strategy registry and what strategies declare: which options each reads (the experiment
// validator, summaries and the key reference ask here), the default assignment, the replicated
// schedule every strategy's small matrices share, and the options' JSON form.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/base/errors.hpp"
#include "core/plan/assignment.hpp"
#include "core/plan/strategy.hpp"

namespace muonbed {

namespace {

std::map<std::string, StrategyFactory>& registry() {
  static std::map<std::string, StrategyFactory> r;
  return r;
}

// One instance per registered name, made on first use.
std::map<std::string, std::unique_ptr<Strategy>>& instances() {
  static std::map<std::string, std::unique_ptr<Strategy>> i;
  return i;
}

// Read by every strategy, whatever it lists.
constexpr std::string_view kAlwaysRead[] = {"name", "preset", "grad_sync"};

}  // namespace

void register_strategy(StrategyFactory factory) {
  std::unique_ptr<Strategy> made = factory();
  const std::string name = made->name();
  registry()[name] = factory;
  instances()[name] = std::move(made);
}

const Strategy* find_strategy_or_null(const std::string& name) {
  const auto it = instances().find(name);
  return it == instances().end() ? nullptr : it->second.get();
}

const Strategy& find_strategy(const std::string& name) {
  if (const Strategy* s = find_strategy_or_null(name)) return *s;
  std::string known;
  for (const auto& n : strategy_names()) known += (known.empty() ? "" : ", ") + n;
  throw PlanError("unknown strategy '" + name + "'; known strategies: " + known +
                  " (a strategy is one file that registers itself: README, 'Writing a "
                  "strategy')");
}

std::vector<std::string> strategy_names() {
  std::vector<const Strategy*> all;
  for (const auto& [name, s] : instances()) all.push_back(s.get());
  std::stable_sort(all.begin(), all.end(), [](const Strategy* a, const Strategy* b) {
    return a->listing_order() < b->listing_order();
  });
  std::vector<std::string> names;
  for (const Strategy* s : all) names.push_back(s->name());
  return names;
}

Assignment Strategy::assign(const ShardedModel& model, const StrategyOptions& o,
                            int ns_steps) const {
  const auto policy = o.assign == "explicit" ? make_explicit_assign_policy(o.explicit_owners)
                                             : make_assign_policy(o.assign);
  return policy->assign(model, ns_steps);
}

const std::vector<std::string_view>& replicated_schedule_options() {
  static const std::vector<std::string_view> options = {"prefetch_count", "comm_lanes", "order"};
  return options;
}

Schedule replicated_schedule(const StrategyOptions& o) {
  Schedule s;
  s.gather = make_gather_policy("all_gather");
  s.redistribute = make_redistribute_policy("none");
  s.ns = NsPlacement::every_holder;
  s.depth = o.prefetch_count;
  s.lanes = o.comm_lanes;
  return s;
}

const std::vector<std::string_view>& strategy_option_keys() {
  static const std::vector<std::string_view> keys = {"name",
                                                     "preset",
                                                     "grad_sync",
                                                     "assign",
                                                     "explicit_owners",
                                                     "small_param_threshold",
                                                     "async_gpu_parallelism",
                                                     "prefetch_count",
                                                     "gather",
                                                     "split_ns",
                                                     "comm_lanes",
                                                     "order",
                                                     "chunk_size",
                                                     "chunk_by_shape",
                                                     "chunk_sizing",
                                                     "max_chunks_in_flight"};
  return keys;
}

bool strategy_reads_option(const StrategyOptions& s, std::string_view option) {
  for (const std::string_view always : kAlwaysRead)
    if (option == always) return true;
  const Strategy* strategy = find_strategy_or_null(s.name);
  if (!strategy) return true;  // an unknown strategy is refused elsewhere, by name
  const std::vector<std::string_view> own = strategy->options();
  const auto lists = [&](std::string_view key) {
    return std::find(own.begin(), own.end(), key) != own.end();
  };
  if (option == "chunk_size" && s.chunk_sizing == "ns_cost") return false;
  // The small matrices' replicated schedule reads its options whatever the strategy.
  if (lists("small_param_threshold") && s.small_param_threshold > 0) {
    const auto& small = replicated_schedule_options();
    if (std::find(small.begin(), small.end(), option) != small.end()) return true;
  }
  const auto& keys = strategy_option_keys();
  if (std::find(keys.begin(), keys.end(), option) == keys.end())
    return true;  // an option no table knows is not refused here
  return lists(option);
}

std::string strategies_reading_option(std::string_view option) {
  const auto& keys = strategy_option_keys();
  if (std::find(keys.begin(), keys.end(), option) == keys.end()) return "every strategy";
  std::string out;
  for (const std::string& name : strategy_names()) {
    const std::vector<std::string_view> own = find_strategy(name).options();
    const bool always =
        std::find(std::begin(kAlwaysRead), std::end(kAlwaysRead), option) != std::end(kAlwaysRead);
    if (always || std::find(own.begin(), own.end(), option) != own.end())
      out += (out.empty() ? "" : ", ") + name;
  }
  return out.empty() ? "no strategy" : out;
}

bool strategy_option_is_default(const StrategyOptions& s, std::string_view option) {
  const StrategyOptions d;
  if (option == "assign") return s.assign == d.assign;
  if (option == "explicit_owners") return s.explicit_owners.empty();
  if (option == "async_gpu_parallelism") return s.async_gpu_parallelism == d.async_gpu_parallelism;
  if (option == "prefetch_count") return s.prefetch_count == d.prefetch_count;
  if (option == "gather") return s.gather == d.gather;
  if (option == "chunk_size") return s.chunk_size == d.chunk_size;
  if (option == "max_chunks_in_flight") return s.max_chunks_in_flight == d.max_chunks_in_flight;
  if (option == "small_param_threshold") return s.small_param_threshold == d.small_param_threshold;
  if (option == "comm_lanes") return s.comm_lanes == d.comm_lanes;
  if (option == "order") return s.order == d.order;
  if (option == "chunk_by_shape") return s.chunk_by_shape == d.chunk_by_shape;
  if (option == "chunk_sizing") return s.chunk_sizing == d.chunk_sizing;
  if (option == "split_ns") return !s.split_ns.enabled;
  if (option == "grad_sync") return !s.grad_sync.enabled;
  return false;  // name, preset: always a setting
}

void reset_unread_options(StrategyOptions& s) {
  std::vector<std::string_view> unread;
  for (const std::string_view key : strategy_option_keys())
    if (!strategy_reads_option(s, key)) unread.push_back(key);
  const StrategyOptions d;
  for (const std::string_view key : unread) {
    if (key == "assign") s.assign = d.assign;
    if (key == "explicit_owners") s.explicit_owners.clear();
    if (key == "async_gpu_parallelism") s.async_gpu_parallelism = d.async_gpu_parallelism;
    if (key == "prefetch_count") s.prefetch_count = d.prefetch_count;
    if (key == "gather") s.gather = d.gather;
    if (key == "chunk_size") s.chunk_size = d.chunk_size;
    if (key == "max_chunks_in_flight") s.max_chunks_in_flight = d.max_chunks_in_flight;
    if (key == "small_param_threshold") s.small_param_threshold = d.small_param_threshold;
    if (key == "comm_lanes") s.comm_lanes = d.comm_lanes;
    if (key == "order") s.order = d.order;
    if (key == "chunk_by_shape") s.chunk_by_shape = d.chunk_by_shape;
    if (key == "chunk_sizing") s.chunk_sizing = d.chunk_sizing;
    if (key == "split_ns") s.split_ns = d.split_ns;
  }
}

std::string StrategyOptions::to_json_text() const {
  nlohmann::ordered_json j;
  j["name"] = name;
  j["assign"] = assign;
  if (!explicit_owners.empty()) j["explicit_owners"] = explicit_owners;
  j["async_gpu_parallelism"] = async_gpu_parallelism;
  j["prefetch_count"] = prefetch_count;
  j["gather"] = gather;
  j["chunk_size"] = chunk_size;
  j["max_chunks_in_flight"] = max_chunks_in_flight;
  j["small_param_threshold"] = small_param_threshold;
  // Written only when set, so plans of earlier versions keep their text.
  if (comm_lanes != 1) j["comm_lanes"] = comm_lanes;
  if (order != "plan") j["order"] = order;
  if (chunk_by_shape) j["chunk_by_shape"] = true;
  if (chunk_sizing != "count") j["chunk_sizing"] = chunk_sizing;
  if (split_ns.enabled)
    j["split_ns"] = {{"max_members", split_ns.max_members}, {"threshold", split_ns.threshold}};
  if (!preset.empty()) j["preset"] = preset;
  j["grad_sync"] = {{"enabled", grad_sync.enabled}, {"level_periods", grad_sync.level_periods}};
  return j.dump();
}

}  // namespace muonbed
