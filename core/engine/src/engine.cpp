// The plan execution engine (see core/engine/engine.hpp): per-op facts and group arithmetic, and
// the cursor that advances each local rank's streams as completions arrive.
#include "core/engine/engine.hpp"

#include <algorithm>
#include <bit>

#include "core/base/errors.hpp"

namespace muonbed {

// ------------------------------------------------------------------------------------------------
// PlanIndex

PlanIndex::PlanIndex(const StepPlan& plan) : plan_(&plan) {
  const DeviceMesh& m = plan.model.mesh;
  world_ = m.world_size();
  nd_ = m.ndims();
  coords_.resize(static_cast<std::size_t>(world_) * nd_);
  for (int r = 0; r < world_; ++r)
    for (int d = 0; d < nd_; ++d) coords_[static_cast<std::size_t>(r) * nd_ + d] = m.coord(r, d);
  const int nops = static_cast<int>(plan.ops.size());
  stream_ops_.assign(std::max<std::size_t>(1, plan.streams.size()), {});
  info_.resize(nops);
  for (int i = 0; i < nops; ++i) {
    const Op& op = plan.ops[i];
    Info& info = info_[i];
    const std::string where =
        "plan op " + std::to_string(i) + (op.label.empty() ? "" : " ('" + op.label + "')") + ": ";
    if (op.stream < 0 || op.stream >= static_cast<int>(stream_ops_.size()))
      throw PlanError(where + "stream " + std::to_string(op.stream) + " does not exist");
    if (static_cast<int>(op.ranks.coord.size()) != nd_)
      throw PlanError(where + "its rank box has " + std::to_string(op.ranks.coord.size()) +
                      " coordinates for a mesh of " + std::to_string(nd_) + " dims");
    if (op.period < 1) throw PlanError(where + "period " + std::to_string(op.period) + " < 1");
    for (int dep : op.deps)
      if (dep < 0 || dep >= i)
        throw PlanError(where + "dependency " + std::to_string(dep) + " is not an earlier op");
    info.cls = is_compute(op.kind)  ? OpClass::compute
               : is_memory(op.kind) ? OpClass::memory
                                    : OpClass::collective;
    info.stream = op.stream;
    info.period = op.period;
    info.pair = op.kind == OpKind::send || op.kind == OpKind::recv;
    for (int d = 0; d < nd_; ++d) {
      const int c = op.ranks.coord[d];
      if (c == RankBox::kAll) {
        if (info.cls == OpClass::collective && op.group.contains(d)) {
          info.group_dims.push_back(d);
          info.group_sizes.push_back(m.size(d));
          info.group_strides.push_back(m.stride(d));
          info.group_size *= m.size(d);
        } else {
          info.outer_dims.push_back(d);
        }
      } else {
        if (c < 0 || c >= m.size(d))
          throw PlanError(where + "rank box coordinate " + std::to_string(c) + " is outside '" +
                          m.dim(d).name + "'");
        info.fixed.emplace_back(d, c);
      }
    }
    if (info.cls == OpClass::collective && (op.group.bits & ~op.ranks.free_dims().bits) != 0)
      throw PlanError(where + "its group spans dims that are not free in its rank box");
    if (info.pair && (op.root < 0 || op.root >= info.group_size || op.peer < 0 ||
                      op.peer >= info.group_size || op.peer == op.root))
      throw PlanError(where + "send/recv needs distinct root and peer inside its group of " +
                      std::to_string(info.group_size));
    info.position = static_cast<int>(stream_ops_[op.stream].size());
    stream_ops_[op.stream].push_back(i);
  }
  index_by_key();
}

void PlanIndex::index_by_key() {
  const DeviceMesh& m = mesh();
  const int nops = num_ops();
  // Each op's pattern and key (engine.hpp, KeyRange).
  for (int i = 0; i < nops; ++i) {
    Info& info = info_[i];
    std::uint64_t bits = 0;
    std::int64_t linear = 0;
    for (const auto& [d, c] : info.fixed) {
      bits |= std::uint64_t{1} << d;
      linear += static_cast<std::int64_t>(c) * m.stride(d);
    }
    const auto found = std::find(patterns_.begin(), patterns_.end(), bits);
    info.pattern = static_cast<int>(found - patterns_.begin());
    if (found == patterns_.end()) patterns_.push_back(bits);
    info.key = static_cast<std::int64_t>(info.pattern) * world_ + linear;
  }
  if (patterns_.empty()) patterns_.push_back(0);
  const std::size_t np = patterns_.size();
  rank_keys_.resize(static_cast<std::size_t>(world_) * np);
  for (int r = 0; r < world_; ++r)
    for (std::size_t p = 0; p < np; ++p) {
      std::int64_t linear = 0;
      for (int d = 0; d < nd_; ++d)
        if ((patterns_[p] >> d) & 1u)
          linear += static_cast<std::int64_t>(coord(r, d)) * m.stride(d);
      rank_keys_[static_cast<std::size_t>(r) * np + p] =
          static_cast<std::int64_t>(p) * world_ + linear;
    }
  // Groups `items` (key, value) by key into ranges over `values`, keys ascending and values in
  // their order within a key.
  const auto group = [](std::vector<std::pair<std::int64_t, int>>& items,
                        std::vector<KeyRange>& ranges, std::vector<int>& values) {
    std::stable_sort(items.begin(), items.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [key, value] : items) {
      if (ranges.empty() || ranges.back().key != key) {
        const int at = static_cast<int>(values.size());
        ranges.push_back({key, at, at});
      }
      values.push_back(value);
      ranges.back().end = static_cast<int>(values.size());
    }
  };
  const int ns = num_streams();
  stream_patterns_.assign(ns, {});
  stream_keys_.assign(ns, {});
  stream_positions_.assign(ns, {});
  std::vector<std::pair<std::int64_t, int>> items;
  for (int s = 0; s < ns; ++s) {
    items.clear();
    const std::vector<int>& list = stream_ops_[s];
    for (int pos = 0; pos < static_cast<int>(list.size()); ++pos) {
      const Info& info = info_[list[pos]];
      items.emplace_back(info.key, pos);
      std::vector<int>& patterns = stream_patterns_[s];
      if (std::find(patterns.begin(), patterns.end(), info.pattern) == patterns.end())
        patterns.push_back(info.pattern);
    }
    group(items, stream_keys_[s], stream_positions_[s]);
  }
  dep_key_begin_.assign(static_cast<std::size_t>(nops) + 1, 0);
  for (int i = 0; i < nops; ++i) {
    items.clear();
    for (int d : plan_->ops[i].deps) items.emplace_back(info_[d].key, d);
    dep_key_begin_[i] = static_cast<int>(dep_keys_.size());
    std::vector<KeyRange> ranges;
    std::vector<int> values;
    group(items, ranges, values);
    const int offset = static_cast<int>(grouped_deps_.size());
    for (KeyRange& r : ranges) {
      r.begin += offset;
      r.end += offset;
      dep_keys_.push_back(r);
    }
    grouped_deps_.insert(grouped_deps_.end(), values.begin(), values.end());
  }
  dep_key_begin_[nops] = static_cast<int>(dep_keys_.size());
}

const PlanIndex::KeyRange* PlanIndex::find_key(const std::vector<KeyRange>& ranges, int begin,
                                               int end, std::int64_t key) const {
  const auto it = std::lower_bound(ranges.begin() + begin, ranges.begin() + end, key,
                                   [](const KeyRange& r, std::int64_t k) { return r.key < k; });
  return it != ranges.begin() + end && it->key == key ? &*it : nullptr;
}

int PlanIndex::next_position(int stream, int rank, int pos) const {
  // The next op of the rank is often a few positions on: look there before the binary searches.
  const std::vector<int>& list = stream_ops_[stream];
  const int near = std::min(static_cast<int>(list.size()), pos + kProbe);
  for (; pos < near; ++pos)
    if (contains(list[pos], rank)) return pos;
  if (pos == static_cast<int>(list.size())) return pos;
  const std::vector<int>& positions = stream_positions_[stream];
  const std::vector<KeyRange>& keys = stream_keys_[stream];
  int next = static_cast<int>(stream_ops_[stream].size());
  for (int p : stream_patterns_[stream]) {
    const KeyRange* r = find_key(keys, 0, static_cast<int>(keys.size()), rank_key(rank, p));
    if (!r) continue;
    const auto it = std::lower_bound(positions.begin() + r->begin, positions.begin() + r->end, pos);
    if (it != positions.begin() + r->end) next = std::min(next, *it);
  }
  return next;
}

std::vector<int> PlanIndex::all_ranks() const {
  std::vector<int> ranks(static_cast<std::size_t>(world_));
  for (int r = 0; r < world_; ++r) ranks[r] = r;
  return ranks;
}

bool PlanIndex::contains(int op, int rank) const {
  const int* c = coords_.data() + static_cast<std::size_t>(rank) * nd_;
  for (const auto& [d, v] : info_[op].fixed)
    if (c[d] != v) return false;
  return true;
}

int PlanIndex::leader(int op, int rank) const {
  const Info& info = info_[op];
  int leader = rank;
  for (std::size_t i = 0; i < info.group_dims.size(); ++i)
    leader -= coord(rank, info.group_dims[i]) * info.group_strides[i];
  return leader;
}

int PlanIndex::group_index(int op, int rank) const {
  const Info& info = info_[op];
  int index = 0;
  for (std::size_t i = 0; i < info.group_dims.size(); ++i)
    index = index * info.group_sizes[i] + coord(rank, info.group_dims[i]);
  return index;
}

int PlanIndex::member(int op, int leader, int index) const {
  const Info& info = info_[op];
  int rank = leader;
  for (int i = static_cast<int>(info.group_dims.size()) - 1; i >= 0; --i) {
    rank += (index % info.group_sizes[i]) * info.group_strides[i];
    index /= info.group_sizes[i];
  }
  return rank;
}

std::vector<int> PlanIndex::members(int op, int leader) const {
  std::vector<int> out(static_cast<std::size_t>(info_[op].group_size));
  for (int i = 0; i < info_[op].group_size; ++i) out[i] = member(op, leader, i);
  return out;
}

std::vector<int> PlanIndex::participants(int op, int leader) const {
  if (info_[op].pair) {
    const Op& o = plan_->ops[op];
    return {member(op, leader, o.root), member(op, leader, o.peer)};
  }
  return members(op, leader);
}

// ------------------------------------------------------------------------------------------------
// Engine

Engine::Engine(const PlanIndex& index, OpHandler& handler, std::vector<int> local_ranks)
    : index_(index), handler_(handler), local_(std::move(local_ranks)) {
  std::sort(local_.begin(), local_.end());
  local_.erase(std::unique(local_.begin(), local_.end()), local_.end());
  local_of_.assign(index_.world_size(), -1);
  for (std::size_t i = 0; i < local_.size(); ++i) {
    const int r = local_[i];
    if (r < 0 || r >= index_.world_size())
      throw Error("engine: rank " + std::to_string(r) + " is outside the plan's " +
                  std::to_string(index_.world_size()) + " ranks");
    local_of_[r] = static_cast<int>(i);
  }
  ns_ = index_.num_streams();
  const std::size_t slots = local_.size() * static_cast<std::size_t>(ns_);
  pos_.assign(slots, 0);
  dep_op_.assign(slots, -1);
  dep_next_.assign(slots, 0);
  busy_.assign(slots, 0);
  ended_.assign(slots, 1);
  sleeping_.assign(slots, 0);
  first_sleeper_.assign(slots, -1);
  sleeper_next_.assign(slots, -1);
  words_ = (ns_ + 63) / 64;
  waiting_.assign(local_.size() * static_cast<std::size_t>(words_), 0);
  streams_left_.assign(local_.size(), 0);
  queued_.assign(local_.size(), 0);
}

void Engine::begin_step(int step) {
  if (ranks_left_ != 0) throw Error("engine: step " + std::to_string(step_) + " is not done");
  if (!open_.empty()) throw Error("engine: collective instances of the last step are still open");
  step_ = step;
  std::fill(pos_.begin(), pos_.end(), 0);
  std::fill(dep_op_.begin(), dep_op_.end(), -1);
  std::fill(sleeping_.begin(), sleeping_.end(), 0);
  std::fill(first_sleeper_.begin(), first_sleeper_.end(), -1);
  std::fill(sleeper_next_.begin(), sleeper_next_.end(), -1);
  for (std::size_t k = 0; k < busy_.size(); ++k) set_state(k, false, false);
  std::fill(streams_left_.begin(), streams_left_.end(), ns_);
  ranks_left_ = static_cast<int>(local_.size());
  for (std::size_t i = 0; i < local_.size(); ++i) schedule(static_cast<int>(i));
  drain();
}

int Engine::head(int rank, int stream) const {
  const int local = local_of_.at(rank);
  if (local < 0 || ended_[slot(local, stream)]) return -1;
  const auto& list = index_.stream_ops(stream);
  const int pos = pos_[slot(local, stream)];
  return pos < static_cast<int>(list.size()) ? list[pos] : -1;
}

bool Engine::busy(int rank, int stream) const {
  const int local = local_of_.at(rank);
  return local >= 0 && busy_[slot(local, stream)];
}

// Has `rank` completed dep `d` (or, for an op inactive in this step, passed it with its own deps
// completed)? -1 if so, else a stream of the rank that has to move on before it can be.
int Engine::dep_blocker(int rank, int local, int d) const {
  if (pos_[slot(local, index_.stream(d))] <= index_.position(d)) return index_.stream(d);
  if (index_.active(d, step_)) return -1;
  int blocker = -1;
  index_.for_each_rank_dep(d, rank, [&](const int* begin, const int* end) {
    for (const int* dd = begin; dd != end; ++dd)
      if ((blocker = dep_blocker(rank, local, *dd)) >= 0) return false;
    return true;
  });
  return blocker;
}

// Are the deps of the op at the head of a stream complete on the rank (those it takes part in)?
// Resumes after the deps found complete before: dep_next_ counts them, in the fixed order of
// PlanIndex::for_each_rank_dep. If not, the stream sleeps until the stream it waits for moves.
bool Engine::head_deps_ok(int rank, int local, int stream, int op) {
  const std::size_t k = slot(local, stream);
  if (dep_op_[k] != op) {
    dep_op_[k] = op;
    dep_next_[k] = 0;
  }
  int& next = dep_next_[k];
  int skipped = 0;  // deps of the runs before the current one
  int blocker = -1;
  const bool ok = index_.for_each_rank_dep(op, rank, [&](const int* begin, const int* end) {
    const int n = static_cast<int>(end - begin);
    for (const int* d = begin + std::min(n, next - skipped); d < end; ++d, ++next)
      if ((blocker = dep_blocker(rank, local, *d)) >= 0) return false;
    skipped += n;
    return true;
  });
  if (!ok) sleep_until_moves(k, slot(local, blocker));
  return ok;
}

// Stream slot k waits for slot `on` to move: it leaves the waiting set (drain() skips it) and
// joins the list of slots `on` wakes. Advancing a sleeping stream would only find the same
// incomplete dep again: with hundreds of streams per rank blocked on deps, retrying each on every
// completion of its rank was most of `muonbed plan` at 1,024 ranks.
void Engine::sleep_until_moves(std::size_t k, std::size_t on) {
  sleeping_[k] = 1;
  set_state(k, false, false);
  sleeper_next_[k] = first_sleeper_[on];
  first_sleeper_[on] = static_cast<int>(k);
}

// Slot k moved (its position changed): the streams sleeping on it wait again, to be advanced in
// the ongoing or the next pass of drain() over the rank, as if they had been retried all along.
void Engine::moved(std::size_t k) {
  for (int w = first_sleeper_[k]; w >= 0;) {
    const int next = sleeper_next_[w];
    sleeping_[w] = 0;
    set_state(static_cast<std::size_t>(w), false, false);
    sleeper_next_[w] = -1;
    w = next;
  }
  first_sleeper_[k] = -1;
}

void Engine::schedule(int local) {
  if (!queued_[local]) {
    queued_[local] = 1;
    queue_.push_back(local);
  }
}

void Engine::set_state(std::size_t k, bool busy, bool ended) {
  busy_[k] = busy;
  ended_[k] = ended;
  const bool idle = busy || ended || sleeping_[k];
  const std::size_t local = k / ns_, s = k % ns_;
  std::uint64_t& word = waiting_[local * words_ + s / 64];
  const std::uint64_t bit = std::uint64_t{1} << (s % 64);
  word = idle ? word & ~bit : word | bit;
}

// The first stream >= from of a local rank that is neither busy nor ended (ns_ if none).
int Engine::next_waiting(int local, int from) const {
  if (from >= ns_) return ns_;
  const std::uint64_t* words = waiting_.data() + static_cast<std::size_t>(local) * words_;
  int w = from / 64;
  std::uint64_t word = words[w] & (~std::uint64_t{0} << (from % 64));
  while (word == 0) {
    if (++w == words_) return ns_;
    word = words[w];
  }
  return w * 64 + std::countr_zero(word);
}

void Engine::drain() {
  if (draining_) return;  // a completion reported from inside a handler call: the loop below
  draining_ = true;
  while (head_ < queue_.size()) {
    const int local = queue_[head_++];
    queued_[local] = 0;
    // Every stream in order, as advance(local, s) for s = 0 .. ns_-1 would (it returns at once on
    // a busy or ended stream); the state is read afresh after each call, which may change it.
    for (int s = next_waiting(local, 0); s < ns_; s = next_waiting(local, s + 1)) advance(local, s);
  }
  queue_.clear();
  head_ = 0;
  draining_ = false;
}

// Moves stream s of a local rank forward until it starts an op that takes time, blocks, or ends.
void Engine::advance(int local, int s) {
  const std::size_t k = slot(local, s);
  if (busy_[k] || ended_[k] || sleeping_[k]) return;
  const int rank = local_[local];
  const std::vector<int>& list = index_.stream_ops(s);
  int& pos = pos_[k];
  while (true) {
    if (pos < static_cast<int>(list.size()) && !index_.contains(list[pos], rank)) {
      pos = index_.next_position(s, rank, pos);
      moved(k);
    }
    if (pos == static_cast<int>(list.size())) {
      set_state(k, false, true);
      if (--streams_left_[local] == 0) {
        --ranks_left_;
        handler_.rank_done(rank);
      }
      return;
    }
    const int op = list[pos];
    if (!index_.active(op, step_)) {  // passes through without occupying the stream
      ++pos;
      moved(k);
      schedule(local);  // other streams of the rank may depend on it
      continue;
    }
    if (!head_deps_ok(rank, local, s, op)) return;  // re-checked when this rank completes an op
    handler_.reached(rank, op);
    switch (index_.op_class(op)) {
      case OpClass::memory:
        handler_.memory(rank, op);
        ++pos;
        moved(k);
        schedule(local);
        continue;
      case OpClass::compute:
        set_state(k, true, false);
        handler_.start_compute(rank, op);
        return;
      case OpClass::collective:
        set_state(k, true, false);
        arrive(rank, op);
        return;
    }
  }
}

void Engine::complete(int rank, int stream) {
  const int local = local_of_[rank];
  const std::size_t k = slot(local, stream);
  set_state(k, false, false);
  ++pos_[k];
  moved(k);
  schedule(local);
}

void Engine::finish_compute(int rank, int op) {
  const int local = rank >= 0 && rank < index_.world_size() ? local_of_[rank] : -1;
  const int s = index_.stream(op);
  if (local < 0 || !busy_[slot(local, s)] || head(rank, s) != op)
    throw Error("engine: finish_compute(" + std::to_string(rank) + ", " + std::to_string(op) +
                ") for an op that is not running");
  complete(rank, s);
  drain();
}

void Engine::arrive(int rank, int op) {
  const Op& o = index_.plan().ops[op];
  if (index_.is_pair(op)) {
    const int me = index_.group_index(op, rank);
    if (me != o.root && me != o.peer) {  // not part of this transfer: passes through
      complete(rank, o.stream);
      return;
    }
  }
  handler_.arrived(rank, op);
  const int leader = index_.leader(op, rank);
  const std::int64_t key = static_cast<std::int64_t>(op) * index_.world_size() + leader;
  auto [it, inserted] = open_.try_emplace(key, -1);
  if (inserted) {
    int id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = static_cast<int>(instances_.size());
      instances_.emplace_back();
      counts_.emplace_back();
    }
    CollectiveInstance& inst = instances_[id];
    inst.id = id;
    inst.op = op;
    inst.leader = leader;
    inst.participants = index_.participants(op, leader);
    Open& count = counts_[id];
    count.arrived = 0;
    count.expected = 0;
    for (int m : inst.participants)
      if (local_of_[m] >= 0) ++count.expected;
    it->second = id;
  }
  const int id = it->second;
  if (++counts_[id].arrived == counts_[id].expected) {
    open_.erase(it);
    handler_.start_collective(instances_[id]);
  }
}

void Engine::finish_collective(int instance) {
  if (instance < 0 || instance >= static_cast<int>(instances_.size()) ||
      instances_[instance].op < 0)
    throw Error("engine: finish_collective(" + std::to_string(instance) +
                ") for an instance that is not running");
  CollectiveInstance& inst = instances_[instance];
  const int stream = index_.stream(inst.op);
  for (int m : inst.participants)
    if (local_of_[m] >= 0) complete(m, stream);
  inst.op = -1;
  free_.push_back(instance);
  drain();
}

std::string Engine::missing_members(int rank, int op) const {
  if (index_.op_class(op) != OpClass::collective) return "";
  const std::vector<int> group = index_.participants(op, index_.leader(op, rank));
  const int stream = index_.stream(op);
  std::string out;
  int named = 0, missing = 0, unknown = 0;
  for (int m : group) {
    const int local = local_of_[m];
    if (local < 0) {
      ++unknown;  // another process's rank: its state is not known here
      continue;
    }
    const std::size_t k = slot(local, stream);
    if (!ended_[k] && head(m, stream) == op && busy_[k]) continue;
    ++missing;
    if (named++ >= 8) continue;
    out += (out.empty() ? "" : "; ") + std::string("rank ") + std::to_string(m);
    if (ended_[k])
      out += " finished the stream";
    else
      out += " is at op " + std::to_string(head(m, stream)) + " ('" +
             index_.plan().ops[head(m, stream)].label + "')";
  }
  std::string text;
  if (missing > 0) {
    if (missing > 8) out += "; and " + std::to_string(missing - 8) + " more";
    text = "; " + std::to_string(missing) + " of " + std::to_string(group.size()) +
           " members never arrived: " + out;
  } else if (unknown == 0) {
    text = "; every member arrived";
  }
  if (unknown > 0)
    text += "; waiting for " + std::to_string(unknown) + " member" + (unknown == 1 ? "" : "s") +
            " in other processes";
  return text;
}

std::string Engine::stall_report(int max_ranks) const {
  const StepPlan& plan = index_.plan();
  std::string out;
  int shown = 0;
  for (std::size_t local = 0; local < local_.size() && shown < max_ranks; ++local) {
    if (streams_left_[local] == 0) continue;
    const int rank = local_[local];
    for (int s = 0; s < ns_; ++s) {
      const std::size_t k = slot(static_cast<int>(local), s);
      if (ended_[k]) continue;
      const int op = index_.stream_ops(s)[pos_[k]];
      std::string waiting;
      for (int d : index_.deps(op))
        if (index_.contains(d, rank) && dep_blocker(rank, static_cast<int>(local), d) >= 0)
          waiting +=
              (waiting.empty() ? "" : ", ") + std::to_string(d) + " ('" + plan.ops[d].label + "')";
      const std::string stream =
          s < static_cast<int>(plan.streams.size()) ? plan.streams[s] : std::to_string(s);
      out += (out.empty() ? "" : "\n") + std::string("rank ") + std::to_string(rank) +
             " waits at op " + std::to_string(op) + " ('" + plan.ops[op].label + "', " +
             std::string(to_string(plan.ops[op].kind)) + ") on stream '" + stream + "' " +
             (busy_[k] ? "(started" + missing_members(rank, op) + ")"
                       : "(waiting for ops " + waiting + ")");
    }
    ++shown;
  }
  return out;
}

}  // namespace muonbed
