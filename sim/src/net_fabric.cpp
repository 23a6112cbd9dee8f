// Weighted max-min sharing of the inter-node links by progressive filling, with pooled flows
// (see net_fabric.hpp).
#include "sim/src/net_fabric.hpp"
#include "sim/src/fluid_flows.hpp"

#include <algorithm>
#include <functional>
#include <limits>

namespace muonbed::sim {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::uint32_t kPoolBit = 0x80000000u;
// A link's rank packs the arrival of the first live flow on it with its position in that flow's
// route (routes cross a few links; 16 bits leave 2^48 arrivals).
constexpr int kRouteBits = 16;
// A lazily keyed entry whose share grew by more than this since it was keyed is not the minimum.
constexpr double kRegrown = 1e-12;
// How many flows ahead share_plain() prefetches a link's flows' views.
constexpr std::size_t kPrefetchAhead = 4;

// A flow whose bytes left clearly exceed what it moves by the earliest completion so far cannot
// come first, which spares most divisions (a multiplication instead); the minimum is the same.
// Inline, on plain values: it runs once per flow frozen (perf: 12 % of a 1,024-GPU all-to-all
// step as a call), and share_plain() keeps `earliest` in a register.
inline void consider_completion(double rate, double remaining, double last, double& earliest) {
  if (!(rate > 0)) return;
  remaining = std::max(0.0, remaining);
  if (remaining > (earliest - last) * rate * (1 + 1e-9)) return;
  earliest = std::min(earliest, last + remaining / rate);
}
}  // namespace

int NetFabric::add_link(double capacity_Bps) {
  capacity_.push_back(capacity_Bps);
  pools_of_link_.emplace_back();
  flows_of_link_.emplace_back();
  gone_of_link_.push_back(0);
  link_weight_.push_back(0);
  link_dirty_.push_back(0);
  return static_cast<int>(capacity_.size() - 1);
}

int NetFabric::add_pool(const std::vector<int>& links) {
  const int id = static_cast<int>(pools_.size());
  Pool p;
  p.links = links;
  p.min_capacity = kInf;
  for (int l : links) {
    p.min_capacity = std::min(p.min_capacity, capacity_[l]);
    std::vector<int>& of = pools_of_link_[l];
    if (of.size() == 1) pools_[of[0]].shared.push_back(l);  // shared from now on
    if (!of.empty()) p.shared.push_back(l);
    of.push_back(id);
  }
  pools_.push_back(std::move(p));
  return id;
}

void NetFabric::add(double now, const int* links, int nlinks, double bytes, double weight, int pool,
                    std::uint64_t token) {
  progress(now);
  Flow f{};
  f.first = static_cast<std::uint32_t>(link_pool_.size());
  f.count = static_cast<std::uint32_t>(nlinks);
  link_pool_.insert(link_pool_.end(), links, links + nlinks);
  link_at_.resize(link_pool_.size());
  f.pool = pool;
  f.size = bytes;
  f.weight = std::max(1.0, weight);
  f.seq = next_seq_++;
  f.token = token;
  std::uint32_t slot;
  if (free_slots_.empty()) {
    slot = static_cast<std::uint32_t>(flows_.size());
    flows_.push_back(f);
    remaining_.push_back(0);
    done_below_.push_back(0);
    rate_.push_back(0);
    view_.emplace_back();
  } else {  // the lowest free slot
    std::pop_heap(free_slots_.begin(), free_slots_.end(), std::greater<>());
    slot = free_slots_.back();
    free_slots_.pop_back();
    flows_[slot] = f;
  }
  slot_free_.resize(flows_.size(), 0);
  slot_free_[slot] = 0;
  slots_in_use_ = std::max(slots_in_use_, slot + 1);
  FrozenView& view = view_[slot];
  view.stamp = 0;
  view.count = f.count;
  view.weight = f.weight;
  std::copy_n(links, std::min(f.count, kInlineLinks), view.links);
  remaining_[slot] = bytes;
  done_below_[slot] = finished_below(bytes);
  rate_[slot] = 0;
  live_.push_back(slot);
  if (pool >= 0) ++live_pooled_;
  touch_links(f, slot, true);
}

// Adds the flow in `slot` to its links' lists and weights, or removes it; either way its links'
// keys need re-sorting. A removed entry is marked gone in place (the list keeps its order of
// arrival, and erasing from the middle of a link's long list moved the rest: perf, 4 % of a
// 1,024-GPU all-to-all step); a list is packed once half of it is gone.
void NetFabric::touch_links(const Flow& f, std::uint32_t slot, bool added) {
  for (std::uint32_t k = 0; k < f.count; ++k) {
    const int l = link_pool_[f.first + k];
    std::vector<OnLink>& of = flows_of_link_[l];
    if (added) {
      link_at_[f.first + k] = static_cast<std::uint32_t>(of.size());
      of.push_back({slot, k});  // arrivals come in order: the list stays sorted by arrival
      link_weight_[l] += f.weight;
    } else {
      of[link_at_[f.first + k]].slot = kGone;
      link_weight_[l] -= f.weight;
      if (2 * ++gone_of_link_[l] >= of.size()) pack_link(l);
    }
    if (!link_dirty_[l]) {
      link_dirty_[l] = 1;
      dirty_links_.push_back(l);
    }
  }
}

// Drops the gone entries of link l's list, keeping the others' order, and tells their flows
// where their entries moved.
void NetFabric::pack_link(int l) {
  std::vector<OnLink>& of = flows_of_link_[l];
  std::size_t keep = 0;
  for (const OnLink& e : of) {
    if (e.slot == kGone) continue;
    link_at_[flows_[e.slot].first + e.k] = static_cast<std::uint32_t>(keep);
    of[keep++] = e;
  }
  of.resize(keep);
  gone_of_link_[l] = 0;
}

// As progress_flows(), over the slots up to the last one in use (free ones move at rate 0).
void NetFabric::progress(double now) {
  const double dt = now - last_;
  if (dt > 0) {
    double* remaining = remaining_.data();
    const double* rate = rate_.data();
    for (std::size_t i = 0; i < slots_in_use_; ++i) remaining[i] -= rate[i] * dt;
  }
  last_ = std::max(last_, now);
}

void NetFabric::advance(double now, std::vector<std::uint64_t>& done) {
  progress(now);
  std::size_t keep = 0;
  for (std::uint32_t slot : live_) {
    if (!(remaining_[slot] <= done_below_[slot])) {  // flow_finished(), without the Flow
      live_[keep++] = slot;
      continue;
    }
    const Flow& f = flows_[slot];
    done.push_back(f.token);
    touch_links(f, slot, false);
    if (f.pool >= 0) --live_pooled_;
    rate_[slot] = 0;
    slot_free_[slot] = 1;
    free_slots_.push_back(slot);
    std::push_heap(free_slots_.begin(), free_slots_.end(), std::greater<>());
  }
  live_.resize(keep);
  while (slots_in_use_ > 0 && slot_free_[slots_in_use_ - 1]) --slots_in_use_;
  if (link_pool_.size() > 4096 && link_pool_.size() > 16 * live_.size()) compact_pool();
}

void NetFabric::compact_pool() {
  std::vector<int> pool;
  std::vector<std::uint32_t> at;
  pool.reserve(link_pool_.size() / 2);
  at.reserve(link_pool_.size() / 2);
  for (std::uint32_t slot : live_) {
    Flow& f = flows_[slot];
    const auto first = static_cast<std::uint32_t>(pool.size());
    pool.insert(pool.end(), link_pool_.begin() + f.first, link_pool_.begin() + f.first + f.count);
    at.insert(at.end(), link_at_.begin() + f.first, link_at_.begin() + f.first + f.count);
    f.first = first;
  }
  link_pool_ = std::move(pool);
  link_at_ = std::move(at);
}

void NetFabric::share() {
  update_order();
  if (++stamp_ == 0) {  // wrapped: forget every stamp
    std::fill(link_stamp_.begin(), link_stamp_.end(), 0);
    for (FrozenView& view : view_) view.stamp = 0;
    for (Pool& p : pools_) p.stamp = 0;
    stamp_ = 1;
  }
  // The next completion is the earliest over the flows' new rates: share_plain() takes each
  // flow's as it freezes it (its bytes left are at hand then), after share_with_pools() a pass
  // over the slots does (free ones have rate 0).
  next_completion_ = kInf;
  if (live_pooled_ == 0) {
    share_plain();
  } else {
    share_with_pools();
    for (std::uint32_t slot = 0; slot < rate_.size(); ++slot)
      consider_completion(rate_[slot], remaining_[slot], last_, next_completion_);
  }
  next_ = next_completion_ < kInf ? next_completion_ : -1;
}

// Re-keys the links whose flows changed and merges them back into order_ (one pass).
void NetFabric::update_order() {
  if (dirty_links_.empty()) return;
  fresh_keys_.clear();
  for (int l : dirty_links_) {
    const std::vector<OnLink>& of = flows_of_link_[l];
    if (of.size() == gone_of_link_[l]) continue;  // no live flow on it
    const OnLink* first = of.data();
    while (first->slot == kGone) ++first;
    const Flow& f = flows_[first->slot];
    const std::uint32_t at = first->k;  // its first place in that flow's route
    // share_with_pools() keys a link by max(0, capacity) / weight before anything freezes
    fresh_keys_.push_back(
        {std::max(0.0, capacity_[l]) / link_weight_[l], (f.seq << kRouteBits) | at, l});
  }
  std::sort(fresh_keys_.begin(), fresh_keys_.end());
  order_scratch_.clear();
  auto fresh = fresh_keys_.begin();
  for (const LinkKey& key : order_) {
    if (link_dirty_[key.link]) continue;
    while (fresh != fresh_keys_.end() && *fresh < key) order_scratch_.push_back(*fresh++);
    order_scratch_.push_back(key);
  }
  order_scratch_.insert(order_scratch_.end(), fresh, fresh_keys_.end());
  order_.swap(order_scratch_);
  for (int l : dirty_links_) link_dirty_[l] = 0;
  dirty_links_.clear();
}

// Progressive filling without pooled flows, on the kept structures: the same steps in the same
// order as share_with_pools() takes on these flows (its heap pops entries by (level, local
// index), and the local indices follow the links' ranks), so the rates are the same to the bit.
// The links' initial keys come sorted from order_; an entry whose link's share grew since it
// was keyed goes to the small heap regrown_, and the next entry is the smaller of the two heads.
//
// The freezing loop runs once per live flow at every instant (most of a 1,024-GPU all-to-all
// step): it works on local pointers and keeps the earliest completion in a local, since every
// store into a link's state could otherwise alias the members and force them to be re-read, and
// it keeps the saturated link's own weight in a register instead of updating it per flow.
void NetFabric::share_plain() {
  plain_links_.resize(capacity_.size());
  LinkState* const state = plain_links_.data();
  for (const LinkKey& key : order_)  // every live flow's links are there
    state[key.link] = {capacity_[key.link], link_weight_[key.link]};
  const Flow* const flows = flows_.data();
  const int* const route_links = link_pool_.data();
  const double* const remaining = remaining_.data();
  double* const rate = rate_.data();
  FrozenView* const views = view_.data();
  const std::uint32_t stamp = stamp_;
  const double last = last_;
  double earliest = next_completion_;
  regrown_.clear();
  std::size_t next = 0;
  for (;;) {
    LinkKey e;
    if (next < order_.size() && (regrown_.empty() || order_[next] < regrown_.front())) {
      e = order_[next++];
    } else if (!regrown_.empty()) {
      std::pop_heap(regrown_.begin(), regrown_.end(), std::greater<>());
      e = regrown_.back();
      regrown_.pop_back();
    } else {
      break;
    }
    const int l = e.link;
    double weight = state[l].weight;
    if (!(weight > 0.5)) continue;  // every flow on it froze: weights count flows
    const double level = std::max(0.0, state[l].residual) / weight;
    if (level > e.level * (1 + kRegrown)) {  // grew since it was keyed: not the minimum yet
      regrown_.push_back({level, e.rank, l});
      std::push_heap(regrown_.begin(), regrown_.end(), std::greater<>());
      continue;
    }
    // Its unfrozen flows, until none is left (its weight counts them). Nothing reads this
    // link's state again once they froze, so it is not updated per flow.
    state[l].weight = 0;
    const OnLink* const on_link = flows_of_link_[l].data();
    const std::size_t count = flows_of_link_[l].size();
    for (std::size_t i = 0; i < count; ++i) {
      // the views lie in no useful order: fetch a few flows ahead (perf: the stamp's load
      // missing the cache was a quarter of the solve)
      if (i + kPrefetchAhead < count) {
        const std::uint32_t ahead = on_link[i + kPrefetchAhead].slot;
        if (ahead != kGone) {
          __builtin_prefetch(&views[ahead]);
          __builtin_prefetch(&remaining[ahead]);
        }
      }
      const std::uint32_t slot = on_link[i].slot;
      if (slot == kGone) continue;
      FrozenView& f = views[slot];
      if (f.stamp == stamp) continue;
      f.stamp = stamp;
      const double flow_rate = rate[slot] = f.weight * level;
      consider_completion(flow_rate, remaining[slot], last, earliest);
      const int* links = f.count <= kInlineLinks ? f.links : route_links + flows[slot].first;
      for (std::uint32_t k = 0; k < f.count; ++k) {
        if (links[k] == l) continue;
        LinkState& b = state[links[k]];
        b.residual -= flow_rate;
        b.weight -= f.weight;
      }
      weight -= f.weight;
      if (!(weight > 0.5)) break;
    }
  }
  next_completion_ = earliest;
}

// Share per unit of weight that active link `a` would give its unfrozen flows now.
double NetFabric::link_level(std::uint32_t a) const {
  double residual = residual_[a], weight = weights_[a];
  for (int p : pools_of_link_[active_[a]]) {
    const Pool& pool = pools_[p];
    if (pool.stamp != stamp_) continue;
    residual -= pool.frozen_rate;
    weight += pool.unfrozen;
  }
  return weight > 0.5 ? std::max(0.0, residual) / weight : kInf;  // weights count flows
}

void NetFabric::freeze(std::uint32_t i, double level) {
  frozen_[i] = 1;
  const Flow& f = live(i);
  const double rate = rate_[live_[i]] = f.weight * level;
  for (std::uint32_t k = 0; k < f.count; ++k) {
    const std::uint32_t b = local_[link_pool_[f.first + k]];
    residual_[b] -= rate;
    weights_[b] -= f.weight;
  }
  if (f.pool >= 0) {
    Pool& p = pools_[f.pool];
    p.unfrozen -= 1;
    p.frozen_rate += level;
  }
}

// Progressive filling: the link with the smallest share per unit of weight among its unfrozen
// flows saturates first; its flows (and the pooled flows of its pools) get that share times their
// weight and leave the other links. Every link's share only grows as flows freeze, so the heap
// keeps lower bounds and re-evaluates an entry when it reaches the top (lazy keys). Flows are
// numbered here by their place in live_ (arrival order), links by first appearance among them.
void NetFabric::share_with_pools() {
  link_stamp_.resize(capacity_.size(), 0);
  local_.resize(capacity_.size());
  active_.clear();
  active_pools_.clear();
  const auto activate = [this](int l) {
    if (link_stamp_[l] == stamp_) return;
    link_stamp_[l] = stamp_;
    local_[l] = static_cast<std::uint32_t>(active_.size());
    active_.push_back(l);
  };
  for (std::size_t i = 0; i < live_.size(); ++i) {
    const Flow& f = live(i);
    for (std::uint32_t k = 0; k < f.count; ++k) activate(link_pool_[f.first + k]);
    if (f.pool < 0) continue;
    Pool& p = pools_[f.pool];
    if (p.stamp != stamp_) {
      p.stamp = stamp_;
      p.unfrozen = 0;
      p.frozen_rate = 0;
      p.special = 0;
      p.flows.clear();
      active_pools_.push_back(f.pool);
    }
    p.unfrozen += 1;
    p.flows.push_back(static_cast<std::uint32_t>(i));
  }
  // A pool's links used by plain flows or by other pools need their own entry.
  for (int p : active_pools_)
    for (int l : pools_[p].shared) activate(l);
  const std::size_t n = active_.size();
  residual_.resize(n);
  weights_.assign(n, 0);
  by_link_start_.assign(n + 1, 0);
  for (std::size_t a = 0; a < n; ++a) {
    residual_[a] = capacity_[active_[a]];
    for (int p : pools_of_link_[active_[a]])
      if (pools_[p].stamp == stamp_) ++pools_[p].special;
  }
  for (std::uint32_t slot : live_) {
    const Flow& f = flows_[slot];
    for (std::uint32_t k = 0; k < f.count; ++k) {
      const std::uint32_t a = local_[link_pool_[f.first + k]];
      ++by_link_start_[a + 1];
      weights_[a] += f.weight;
    }
  }
  for (std::size_t a = 0; a < n; ++a) by_link_start_[a + 1] += by_link_start_[a];
  by_link_.resize(by_link_start_[n]);
  cursor_.assign(by_link_start_.begin(), by_link_start_.end() - 1);
  for (std::size_t i = 0; i < live_.size(); ++i) {
    const Flow& f = live(i);
    for (std::uint32_t k = 0; k < f.count; ++k)
      by_link_[cursor_[local_[link_pool_[f.first + k]]]++] = static_cast<std::uint32_t>(i);
  }
  frozen_.assign(live_.size(), 0);

  std::vector<HeapEntry>& heap = heap_;
  heap.clear();
  for (std::size_t a = 0; a < n; ++a) {
    const double level = link_level(static_cast<std::uint32_t>(a));
    if (level < kInf) heap.push_back({level, static_cast<std::uint32_t>(a)});
  }
  for (int p : active_pools_) {
    const Pool& pool = pools_[p];
    if (pool.special < pool.links.size())  // it has plain links: one entry for all of them
      heap.push_back({pool.min_capacity / pool.unfrozen, static_cast<std::uint32_t>(p) | kPoolBit});
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const HeapEntry e = heap.back();
    heap.pop_back();
    const bool is_pool = (e.id & kPoolBit) != 0;
    const std::uint32_t id = e.id & ~kPoolBit;
    double level;
    if (is_pool) {
      const Pool& pool = pools_[id];
      if (pool.unfrozen < 0.5) continue;
      level = std::max(0.0, pool.min_capacity - pool.frozen_rate) / pool.unfrozen;
    } else {
      level = link_level(id);
      if (level == kInf) continue;
    }
    if (level > e.level * (1 + kRegrown)) {  // grew since it was keyed: not the minimum yet
      heap.push_back({level, e.id});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
      continue;
    }
    const auto freeze_pool = [this, level](Pool& pool) {
      if (pool.unfrozen < 0.5) return;
      for (std::uint32_t i : pool.flows)
        if (!frozen_[i]) freeze(i, level);
    };
    if (is_pool) {
      freeze_pool(pools_[id]);
      continue;
    }
    for (std::uint32_t k = by_link_start_[id]; k < by_link_start_[id + 1]; ++k)
      if (!frozen_[by_link_[k]]) freeze(by_link_[k], level);
    for (int p : pools_of_link_[active_[id]])
      if (pools_[p].stamp == stamp_) freeze_pool(pools_[p]);
  }
}

}  // namespace muonbed::sim
