// Lowering of step plans to rank programs (see core/plan/program.hpp): index-set algebra for
// element maps, and a symbolic pass over the plan in order that resolves every piece an op reads or
// writes to storage of the rank.
#include "core/plan/program.hpp"

#include "core/plan/training.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "core/base/errors.hpp"
#include "core/plan/split_ns.hpp"

namespace muonbed {

std::string_view to_string(PieceRole role) {
  switch (role) {
    case PieceRole::parameter:
      return "parameter";
    case PieceRole::gradient:
      return "gradient";
    case PieceRole::momentum:
      return "momentum";
    case PieceRole::adam_m:
      return "adam_m";
    case PieceRole::adam_v:
      return "adam_v";
    case PieceRole::update:
      return "update";
    case PieceRole::result:
      return "result";
    case PieceRole::staging:
      return "staging";
  }
  return "?";
}

// ------------------------------------------------------------------------------------------------
// Index-set algebra

namespace {

bool list_contains(const IndexList& outer, const IndexList& inner) {
  const auto& rs = outer.ranges();
  for (const IndexRange& r : inner.ranges()) {
    auto it = std::upper_bound(rs.begin(), rs.end(), r.begin,
                               [](std::int64_t v, const IndexRange& o) { return v < o.begin; });
    if (it == rs.begin()) return false;
    --it;
    if (r.end > it->end) return false;  // outer ranges are maximal: a range lies inside one
  }
  return true;
}

// Position of `index` in the sorted list (the index must be in it).
class ListPositions {
 public:
  explicit ListPositions(const IndexList& list) : ranges_(list.ranges()) {
    prefix_.reserve(ranges_.size());
    std::int64_t total = 0;
    for (const IndexRange& r : ranges_) {
      prefix_.push_back(total);
      total += r.size();
    }
  }
  std::int64_t operator()(std::int64_t index) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), index,
                               [](std::int64_t v, const IndexRange& o) { return v < o.begin; });
    const std::size_t i = static_cast<std::size_t>(it - ranges_.begin()) - 1;
    return prefix_[i] + (index - ranges_[i].begin);
  }

 private:
  const std::vector<IndexRange>& ranges_;
  std::vector<std::int64_t> prefix_;
};

void push_run(std::vector<Run>& runs, std::int64_t sequence, std::int64_t tensor,
              std::int64_t length) {
  if (length <= 0) return;
  if (!runs.empty()) {
    Run& last = runs.back();
    if (last.sequence + last.length == sequence && last.tensor + last.length == tensor) {
      last.length += length;
      return;
    }
  }
  runs.push_back({sequence, tensor, length});
}

// Appends `part` to `into`, its sequence offsets shifted past what `into` holds.
void append(View& into, const View& part) {
  for (const Segment& s : part.segments) {
    if (s.runs.empty()) continue;
    if (into.segments.empty() || into.segments.back().tensor != s.tensor)
      into.segments.push_back({s.tensor, {}});
    auto& runs = into.segments.back().runs;
    for (const Run& r : s.runs) push_run(runs, r.sequence + into.count, r.tensor, r.length);
  }
  into.count += part.count;
}

View make_view(int tensor, std::int64_t offset, const std::vector<Run>& runs, std::int64_t count) {
  View v;
  v.count = count;
  if (count == 0) return v;
  Segment s{tensor, {}};
  s.runs.reserve(runs.size());
  for (const Run& r : runs) s.runs.push_back({r.sequence, r.tensor + offset, r.length});
  v.segments.push_back(std::move(s));
  return v;
}

View contiguous_view(int tensor, std::int64_t offset, std::int64_t count) {
  return make_view(tensor, offset, {{0, 0, count}}, count);
}

}  // namespace

bool contains(const ShardIndexSet& outer, const ShardIndexSet& inner) {
  if (inner.numel() == 0) return true;
  if (outer.dims.size() != inner.dims.size()) return false;
  for (std::size_t d = 0; d < inner.dims.size(); ++d)
    if (!list_contains(outer.dims[d], inner.dims[d])) return false;
  return true;
}

std::vector<Run> runs_between(const ShardIndexSet& inner, const ShardIndexSet& outer) {
  std::vector<Run> runs;
  if (inner.numel() == 0) return runs;
  if (!contains(outer, inner))
    throw LayoutError("element map: " + inner.to_string() + " is not inside " + outer.to_string());
  const std::size_t nd = inner.dims.size();
  std::vector<std::int64_t> stride(nd, 1);  // of outer's packed order
  for (std::size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * outer.dims[d].size();
  // Positions in outer of inner's indices along every dim but the last.
  std::vector<std::vector<std::int64_t>> positions(nd);
  for (std::size_t d = 0; d + 1 < nd; ++d) {
    const ListPositions pos(outer.dims[d]);
    positions[d].reserve(static_cast<std::size_t>(inner.dims[d].size()));
    for (const IndexRange& r : inner.dims[d].ranges())
      for (std::int64_t i = r.begin; i < r.end; ++i) positions[d].push_back(pos(i));
  }
  // The last dim: inner's ranges map to contiguous positions of outer.
  std::vector<std::pair<std::int64_t, std::int64_t>> last;  // (position in outer, length)
  {
    const ListPositions pos(outer.dims[nd - 1]);
    for (const IndexRange& r : inner.dims[nd - 1].ranges())
      last.emplace_back(pos(r.begin), r.size());
  }
  std::int64_t sequence = 0;
  std::vector<std::size_t> digit(nd > 0 ? nd - 1 : 0, 0);
  while (true) {
    std::int64_t base = 0;
    for (std::size_t d = 0; d + 1 < nd; ++d) base += positions[d][digit[d]] * stride[d];
    for (const auto& [p, len] : last) {
      push_run(runs, sequence, base + p, len);
      sequence += len;
    }
    int d = static_cast<int>(nd) - 2;
    for (; d >= 0; --d) {
      if (++digit[d] < positions[d].size()) break;
      digit[d] = 0;
    }
    if (d < 0) break;
  }
  return runs;
}

View slice(const View& view, std::int64_t begin, std::int64_t end) {
  View out;
  begin = std::max<std::int64_t>(0, begin);
  end = std::min(end, view.count);
  if (end <= begin) return out;
  out.count = end - begin;
  for (const Segment& s : view.segments) {
    Segment clipped{s.tensor, {}};
    for (const Run& r : s.runs) {
      const std::int64_t lo = std::max(begin, r.sequence);
      const std::int64_t hi = std::min(end, r.sequence + r.length);
      if (hi <= lo) continue;
      clipped.runs.push_back({lo - begin, r.tensor + (lo - r.sequence), hi - lo});
    }
    if (!clipped.runs.empty()) out.segments.push_back(std::move(clipped));
  }
  return out;
}

std::string describe(const RankProgram& program, const View& view) {
  std::string out;
  for (const Segment& s : view.segments) {
    if (s.runs.empty()) continue;
    const std::string name = s.tensor >= 0 && s.tensor < static_cast<int>(program.tensors.size())
                                 ? program.tensors[s.tensor].name
                                 : "tensor " + std::to_string(s.tensor);
    std::int64_t lo = s.runs.front().tensor, hi = lo;
    for (const Run& r : s.runs) {
      lo = std::min(lo, r.tensor);
      hi = std::max(hi, r.tensor + r.length);
    }
    out += (out.empty() ? "" : " + ") + name + "[" + std::to_string(lo) + ":" + std::to_string(hi) +
           ")";
  }
  return out.empty() ? "(nothing)" : out;
}

GradientSync gradient_sync(const StepPlan& plan, int param) {
  GradientSync sync;
  bool first = true;
  for (const Op& op : plan.ops) {
    const bool reduction = op.kind == OpKind::reduce_scatter || op.kind == OpKind::all_reduce;
    // TP slices a strategy gathers whole (core/plan/src/build_plan.cpp): synced, not summed.
    const bool gathered = op.kind == OpKind::all_gather && op.tensor == TensorRole::gradient;
    if (!reduction && !gathered) continue;
    if (std::find(op.params.begin(), op.params.end(), param) == op.params.end()) continue;
    if (reduction) sync.reduced_over = sync.reduced_over | op.group;
    if (first) sync.period = op.period;
    first = false;
  }
  return sync;
}

// ------------------------------------------------------------------------------------------------
// The lowering pass

namespace {

PieceRole piece_role(TensorRole role) {
  switch (role) {
    case TensorRole::gradient:
      return PieceRole::gradient;
    case TensorRole::update:
      return PieceRole::update;
    case TensorRole::result:
      return PieceRole::result;
    case TensorRole::parameter:  // FSDP's gathers of a training step
      return PieceRole::parameter;
    case TensorRole::none:
    case TensorRole::activation:  // sized by the op, in the activation workspace
      break;
  }
  return PieceRole::update;
}

std::string set_string(const ShardIndexSet& set) {
  return set.numel() == 0 ? "{}" : set.to_string();
}

// Pieces an op must also keep in the gradient slot: (plan op, param) -> (role, set).
using Keeps = std::map<std::pair<int, int>, std::pair<PieceRole, ShardIndexSet>>;

class Lowering {
 public:
  Lowering(const StepPlan& plan, int rank, const LowerOptions& options, const Keeps& keeps,
           bool probe)
      : plan_(plan),
        mesh_(plan.model.mesh),
        rank_(rank),
        options_(options),
        keeps_(keeps),
        probe_(probe),
        training_(has_training_ops(plan)) {}

  Keeps keep_requests;

  RankProgram run() {
    const int nparams = static_cast<int>(plan_.model.params.size());
    prog_.rank = rank_;
    prog_.op_index.assign(plan_.ops.size(), -1);
    prog_.params.resize(nparams);
    entries_.resize(nparams);
    lost_.resize(nparams);
    gradient_slot_.assign(nparams, -1);
    buffer_tensor_.assign(plan_.buffers.size(), -1);
    link_staging();
    start_state();
    for (const Op& op : plan_.ops) {
      if (!op.ranks.contains(mesh_, rank_)) continue;
      op_ = &op;
      RankOp rop;
      rop.op = op.id;
      rop.kind = op.kind;
      rop.moves = op.tensor;
      lower(op, rop);
      apply_keeps(op, rop);
      prog_.op_index[op.id] = static_cast<int>(prog_.ops.size());
      prog_.ops.push_back(std::move(rop));
    }
    op_ = nullptr;
    finish();
    return std::move(prog_);
  }

 private:
  struct Entry {
    PieceRole role = PieceRole::update;
    int tensor = -1;
    std::int64_t offset = 0;
    ShardIndexSet set;
    int producer = -1;  // plan op, -1: the step's start
  };
  struct Slot {
    int param;
    std::int64_t offset;
    ShardIndexSet set;
  };

  // ---- errors
  [[noreturn]] void fail(const std::string& what) const {
    std::string where = "lowering rank " + std::to_string(rank_);
    if (op_)
      where += ", plan op " + std::to_string(op_->id) + " (" + std::string(to_string(op_->kind)) +
               (op_->label.empty() ? "" : " '" + op_->label + "'") + ")";
    throw PlanError(where + ": " + what);
  }
  std::string param_name(int p) const { return "'" + plan_.model.params.at(p).name + "'"; }

  // ---- layouts
  const DistributedParam& param(int p) const { return plan_.model.params.at(p); }
  ShardIndexSet piece(int p, int rank, DimSet gathered) const {
    return param(p).layout.index_set(mesh_, rank, gathered);
  }
  ShardIndexSet full(int p) const {
    ShardIndexSet s;
    for (std::int64_t n : param(p).shape) s.dims.push_back(IndexList::range(0, n));
    return s;
  }
  bool holds(int p) const { return param(p).layout.holds(mesh_, rank_); }
  // The empty piece of p (an empty list per tensor dim; ShardIndexSet{} would be a scalar).
  ShardIndexSet none(int p) const {
    ShardIndexSet s;
    s.dims.resize(param(p).shape.size());
    return s;
  }
  int owner(int p) const { return plan_.assignment.owner.at(p); }

  // ---- tensors
  int add_tensor(std::string name, PieceRole role, DType dtype, int p, int buffer, bool transient) {
    ProgramTensor t;
    t.id = static_cast<int>(prog_.tensors.size());
    t.name = std::move(name);
    t.role = role;
    t.dtype = dtype;
    t.param = p;
    t.buffer = buffer;
    t.transient = transient;
    t.numel = -1;  // set when laid out
    prog_.tensors.push_back(std::move(t));
    slots_.emplace_back();
    live_.push_back(!transient);
    return prog_.tensors.back().id;
  }
  void grow(int tensor, std::int64_t numel) {
    auto& t = prog_.tensors[tensor];
    t.numel = std::max(t.numel, numel);
  }
  DType wider(DType a, DType b) const { return bytes_of(a) >= bytes_of(b) ? a : b; }
  int gradient_slot(int p) {
    if (gradient_slot_[p] < 0) {
      gradient_slot_[p] =
          add_tensor("gradient slot of " + param_name(p), PieceRole::gradient,
                     wider(param(p).dtype, plan_.settings.comm_dtype()), p, -1, false);
      grow(gradient_slot_[p], 0);
    }
    return gradient_slot_[p];
  }
  int static_tensor(PieceRole role, int p, const ShardIndexSet& set, PieceRef& ref) {
    if (ref.present()) {
      if (!(ref.set == set))
        fail(std::string(to_string(role)) + " of " + param_name(p) + " is " + set_string(set) +
             " here but " + set_string(ref.set) + " in an earlier op");
      return ref.tensor;
    }
    const DType dtype = role == PieceRole::parameter ? param(p).dtype : plan_.settings.state_dtype;
    ref.tensor = add_tensor(std::string(to_string(role)) + " of " + param_name(p), role, dtype, p,
                            -1, false);
    ref.offset = 0;
    ref.set = set;
    grow(ref.tensor, set.numel());
    return ref.tensor;
  }

  // ---- the state the step starts with
  void start_state() {
    for (const auto& dp : plan_.model.params) {
      const int p = dp.index;
      ParamPieces& pp = prog_.params[p];
      pp.held = holds(p);
      if (!pp.held) continue;
      static_tensor(PieceRole::parameter, p, piece(p, rank_, DimSet{}), pp.parameter);
      // A training step reads parameters as pieces (FSDP gathers them into buffers).
      if (training_)
        entries_[p].push_back({PieceRole::parameter, pp.parameter.tensor, 0, pp.parameter.set, -1});
      grow(gradient_slot(p), pp.parameter.set.numel());  // results come back at least here
      // The gradient: the input of its first sync op, else the piece its first reader computes on.
      const Op* first = nullptr;
      for (const Op& op : plan_.ops) {
        if (!op.ranks.contains(mesh_, rank_)) continue;
        if (std::find(op.params.begin(), op.params.end(), p) == op.params.end()) continue;
        const bool sync = op.kind == OpKind::reduce_scatter || op.kind == OpKind::all_reduce ||
                          (op.kind == OpKind::all_gather && op.tensor == TensorRole::gradient);
        const bool reader = (op.kind == OpKind::momentum || op.kind == OpKind::adamw) &&
                            (!op.owned_only || owner(p) == rank_);
        if (sync || reader) {
          first = &op;
          break;
        }
      }
      if (first == nullptr) continue;
      const DimSet input =
          first->kind == OpKind::reduce_scatter ? first->gathered | first->group : first->gathered;
      const ShardIndexSet set = piece(p, rank_, input);
      const int slot = gradient_slot(p);
      grow(slot, set.numel());
      pp.gradient = {slot, 0, set};
      entries_[p].push_back({PieceRole::gradient, slot, 0, set, -1});
      const GradientSync sync = gradient_sync(plan_, p);
      if (first->kind == OpKind::reduce_scatter || first->kind == OpKind::all_reduce ||
          first->kind == OpKind::all_gather) {
        pp.gradient_reduced_over = sync.reduced_over;
        pp.gradient_member = mesh_.group_index(rank_, sync.reduced_over);
        pp.gradient_members = mesh_.group_size(sync.reduced_over);
        pp.gradient_period = sync.period;
      }
    }
  }

  // ---- staging links: pack -> next all_to_all, all_to_all -> unpack, per (params, tensor)
  void link_staging() {
    using Key = std::pair<std::vector<int>, TensorRole>;
    std::map<Key, int> pending_pack, last_a2a;
    for (const Op& op : plan_.ops) {
      if (!op.ranks.contains(mesh_, rank_)) continue;
      op_ = &op;
      const Key key{op.params, op.tensor};
      if (op.kind == OpKind::release) release_op_[op.buffer] = op.id;
      if (op.kind == OpKind::pack || op.kind == OpKind::unpack) {
        if (op.buffer < 0 || op.buffer >= static_cast<int>(plan_.buffers.size()))
          fail(
              "names no staging buffer (Op::buffer): pack and unpack stage through an allocated "
              "buffer, which rank_memory counts");
        staging_buffer_.insert(op.buffer);
      }
      if (op.kind == OpKind::pack) {
        if (pending_pack.count(key)) fail("packs again before its all_to_all ran");
        pending_pack[key] = op.id;
      } else if (op.kind == OpKind::all_to_all) {
        if (auto it = pending_pack.find(key); it != pending_pack.end()) {
          pack_target_[it->second] = op.id;
          send_staging_[op.id] = plan_.ops[it->second].buffer;
          pending_pack.erase(it);
        }
        last_a2a[key] = op.id;
      } else if (op.kind == OpKind::unpack) {
        auto it = last_a2a.find(key);
        if (it == last_a2a.end())
          fail("no all_to_all of the same params and tensor ran before it on this rank");
        unpack_source_[op.id] = it->second;
        if (recv_staging_.count(it->second)) fail("a second unpack of one all_to_all");
        recv_staging_[it->second] = op.buffer;
        last_a2a.erase(it);
      }
    }
    if (!pending_pack.empty()) {
      op_ = &plan_.ops[pending_pack.begin()->second];
      fail("no all_to_all of the same params and tensor follows it on this rank");
    }
    op_ = nullptr;
  }

  // ---- pieces: reads and writes
  std::vector<Entry>::reverse_iterator find_entry(PieceRole role, int p, const ShardIndexSet& set) {
    auto& list = entries_[p];
    return std::find_if(list.rbegin(), list.rend(),
                        [&](const Entry& e) { return e.role == role && contains(e.set, set); });
  }

  // The storage a written piece goes to: a live buffer slot of exactly this set, else the
  // gradient slot. When several live buffers have one (a mesh dim of size 1 makes one stage's
  // piece equal another's), the one released last: the piece is read again by later stages.
  std::pair<int, std::int64_t> designated(int p, const ShardIndexSet& set, bool slot_only) {
    if (!slot_only) {
      int best = -1;
      std::int64_t offset = 0;
      for (int t : live_order_) {
        for (const Slot& s : slots_[t]) {
          if (s.param != p || !(s.set == set)) continue;
          if (best < 0 || release_at(t) > release_at(best)) {
            best = t;
            offset = s.offset;
          }
        }
      }
      if (best >= 0) return {best, offset};
    }
    const int slot = gradient_slot(p);
    grow(slot, set.numel());
    return {slot, 0};
  }

  View read(PieceRole role, int p, const ShardIndexSet& set) {
    if (set.numel() == 0) return {};
    auto it = find_entry(role, p, set);
    if (it != entries_[p].rend()) {
      if (!live_[it->tensor]) fail("internal: entry in a released tensor");
      return make_view(it->tensor, it->offset, runs_between(set, it->set), set.numel());
    }
    if (probe_ && role != PieceRole::parameter) {  // a gathered parameter is gathered again
      for (auto lost = lost_[p].rbegin(); lost != lost_[p].rend(); ++lost) {
        if (lost->role == role && contains(lost->set, set)) {
          // Keep what is read; when different parts are read, the whole piece.
          auto [it, added] =
              keep_requests.emplace(std::make_pair(lost->producer, p), std::make_pair(role, set));
          if (!added && !(it->second.second == set)) it->second.second = lost->set;
          break;
        }
      }
    }
    if (!options_.allow_stale_reads)
      fail("reads the " + std::string(to_string(role)) + " of " + param_name(p) + " " +
           set_string(set) + ", which no earlier op produced on this rank" + held_summary(p));
    const auto [tensor, offset] = designated(p, set, false);
    return contiguous_view(tensor, offset, set.numel());
  }

  std::string held_summary(int p) const {
    std::string out;
    for (const Entry& e : entries_[p])
      out += (out.empty() ? "" : ", ") + std::string(to_string(e.role)) + " " + set_string(e.set) +
             " in " + prog_.tensors[e.tensor].name;
    return out.empty() ? " (it holds nothing of it)" : " (it holds: " + out + ")";
  }

  void forget_overlaps(int p, int tensor, std::int64_t offset, std::int64_t numel) {
    auto& list = entries_[p];
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Entry& e) {
                                return e.tensor == tensor && e.offset < offset + numel &&
                                       offset < e.offset + e.set.numel();
                              }),
               list.end());
  }

  // Newton-Schulz (whole or split) overwrites the update it read, one contiguous run, with the
  // result: records piece (result, p, set) there, written by op `op_id`.
  void result_in_place(int p, const ShardIndexSet& set, const View& data, int op_id,
                       const std::string& what) {
    if (data.segments.size() != 1 || data.segments[0].runs.size() != 1)
      fail("internal: " + what + " of " + param_name(p) + " is not contiguous");
    const Run& r = data.segments[0].runs[0];
    const int tensor = data.segments[0].tensor;
    forget_overlaps(p, tensor, r.tensor, set.numel());
    entries_[p].push_back({PieceRole::result, tensor, r.tensor, set, op_id});
  }

  // Writes piece (role, p, set); returns where (identity layout) and records it.
  View write(PieceRole role, int p, const ShardIndexSet& set, bool slot_only = false) {
    if (set.numel() == 0) return {};
    const auto [tensor, offset] = designated(p, set, slot_only);
    forget_overlaps(p, tensor, offset, set.numel());
    entries_[p].push_back({role, tensor, offset, set, op_ ? op_->id : -1});
    return contiguous_view(tensor, offset, set.numel());
  }

  // ---- ops
  void lower(const Op& op, RankOp& rop) {
    switch (op.kind) {
      case OpKind::alloc:
        return alloc(op, rop);
      case OpKind::release:
        return release(op, rop);
      case OpKind::momentum:
        return momentum(op, rop);
      case OpKind::newton_schulz:
        return newton_schulz(op, rop);
      case OpKind::apply_update:
        return apply_update(op, rop);
      case OpKind::adamw:
        return adamw(op, rop);
      case OpKind::pack:
        return pack(op, rop);
      case OpKind::unpack:
        return unpack(op, rop);
      case OpKind::split_newton_schulz:
        return split_newton_schulz(op, rop);
      case OpKind::forward:
      case OpKind::backward:
        return training_gemms(op, rop);
      default:
        return collective(op, rop);
    }
  }

  void alloc(const Op& op, RankOp& rop) {
    const Buffer& b = plan_.buffers.at(op.buffer);
    if (buffer_tensor_[op.buffer] >= 0) fail("buffer '" + b.name + "' allocated twice");
    const bool staging = staging_buffer_.count(op.buffer) > 0;
    const int t =
        add_tensor("buffer '" + b.name + "'", staging ? PieceRole::staging : PieceRole::update,
                   plan_.settings.comm_dtype(), -1, op.buffer, true);
    buffer_tensor_[op.buffer] = t;
    if (!staging) {
      std::int64_t offset = 0;
      for (int p : b.params) {
        if (b.owned_only && owner(p) != rank_) continue;
        ShardIndexSet set = piece(p, rank_, b.gathered);
        const std::int64_t n = set.numel();
        slots_[t].push_back({p, offset, std::move(set)});
        offset += n;
      }
      prog_.tensors[t].numel = offset;
    }
    live_[t] = true;
    live_order_.push_back(t);
    rop.tensor = t;
  }

  void release(const Op& op, RankOp& rop) {
    const int t = buffer_tensor_.at(op.buffer);
    if (t < 0 || !live_[t])
      fail("releases buffer '" + plan_.buffers.at(op.buffer).name +
           "', which is not allocated on this rank");
    live_[t] = false;
    live_order_.erase(std::find(live_order_.begin(), live_order_.end(), t));
    for (std::size_t p = 0; p < entries_.size(); ++p) {
      auto& list = entries_[p];
      for (const Entry& e : list)
        if (e.tensor == t) lost_[p].push_back(e);
      list.erase(
          std::remove_if(list.begin(), list.end(), [&](const Entry& e) { return e.tensor == t; }),
          list.end());
    }
    rop.tensor = t;
  }

  bool computes(const Op& op, int p) const {
    return holds(p) && (!op.owned_only || owner(p) == rank_);
  }

  QkClipRows qk_clip_rows(int p, const ShardIndexSet& set) {
    QkClipRows qk;
    const auto& cfg = plan_.settings.optimizer.qk_clip;
    const auto& dp = param(p);
    if (!cfg.enabled || (dp.role != ParamRole::attn_q && dp.role != ParamRole::attn_k)) return qk;
    if (dp.shape.size() != 2 || cfg.head_dim <= 0 || dp.rows() % cfg.head_dim != 0 || dp.layer < 0)
      fail("qk_clip: " + param_name(p) + " is not a [heads * " + std::to_string(cfg.head_dim) +
           ", cols] matrix of a layer");
    qk.enabled = true;
    qk.key = dp.role == ParamRole::attn_k;
    qk.layer = dp.layer;
    qk.head_dim = cfg.head_dim;
    qk.heads = dp.rows() / cfg.head_dim;
    for (const auto& other : plan_.model.params)
      if (other.role == ParamRole::attn_q && other.layer == dp.layer && other.shape.size() == 2)
        qk.query_heads = other.rows() / cfg.head_dim;
    if (qk.query_heads == 0)
      fail("qk_clip: layer " + std::to_string(dp.layer) +
           " has no attn_q matrix to take the "
           "query heads of " +
           param_name(p) + " from");
    if (set.numel() > 0) {
      qk.global_rows = set.dims[0].to_vector();
      qk.cols = set.dims[1].size();
    }
    return qk;
  }

  void momentum(const Op& op, RankOp& rop) {
    for (int p : op.params) {
      if (!computes(op, p)) continue;
      if (param(p).optimizer != OptimizerKind::muon)
        fail("computes momentum of " + param_name(p) + ", which AdamW updates");
      const ShardIndexSet set = piece(p, rank_, op.gathered);
      MomentumTask task;
      task.param = p;
      task.gradient = read(PieceRole::gradient, p, set);
      PieceRef& ref = prog_.params[p].momentum;
      static_tensor(PieceRole::momentum, p, set, ref);
      task.momentum = contiguous_view(ref.tensor, 0, set.numel());
      task.update = write(PieceRole::update, p, set);
      rop.momentum.push_back(std::move(task));
    }
  }

  void newton_schulz(const Op& op, RankOp& rop) {
    for (int p : op.params) {
      if (!computes(op, p)) continue;
      const auto& dp = param(p);
      const ShardIndexSet set = piece(p, rank_, DimSet::all(mesh_.ndims()));
      if (!(set == full(p)))
        fail("Newton-Schulz needs the whole of " + param_name(p) + " but the rank's piece is " +
             set_string(set));
      NewtonSchulzTask task;
      task.param = p;
      task.batch = dp.batch();
      task.rows = dp.rows();
      task.cols = dp.cols();
      task.data = read(PieceRole::update, p, set);
      result_in_place(p, set, task.data, op.id, "the full update");
      rop.newton_schulz.push_back(std::move(task));
    }
  }

  void apply_update(const Op& op, RankOp& rop) {
    for (int p : op.params) {
      if (!holds(p)) continue;
      const ShardIndexSet set = piece(p, rank_, op.gathered);
      const PieceRef& pref = prog_.params[p].parameter;
      ApplyTask task;
      task.param = p;
      task.rows = param(p).rows();
      task.cols = param(p).cols();
      task.result = read(PieceRole::result, p, set);
      task.parameter = make_view(pref.tensor, 0, runs_between(set, pref.set), set.numel());
      task.qk_clip = qk_clip_rows(p, set);
      rop.apply.push_back(std::move(task));
    }
  }

  void adamw(const Op& op, RankOp& rop) {
    for (int p : op.params) {
      if (!computes(op, p)) continue;
      const ShardIndexSet set = piece(p, rank_, op.gathered);
      ParamPieces& pp = prog_.params[p];
      AdamwTask task;
      task.param = p;
      task.gradient = read(PieceRole::gradient, p, set);
      task.parameter =
          make_view(pp.parameter.tensor, 0, runs_between(set, pp.parameter.set), set.numel());
      static_tensor(PieceRole::adam_m, p, set, pp.adam_m);
      static_tensor(PieceRole::adam_v, p, set, pp.adam_v);
      task.adam_m = contiguous_view(pp.adam_m.tensor, 0, set.numel());
      task.adam_v = contiguous_view(pp.adam_v.tensor, 0, set.numel());
      task.qk_clip = qk_clip_rows(p, set);
      rop.adamw.push_back(std::move(task));
    }
  }

  // ---- collectives

  struct GroupInfo {
    std::vector<int> members;
    int me = 0;
    int n = 1;
  };
  GroupInfo group_of(const Op& op) const {
    GroupInfo g;
    g.members = mesh_.group_members(rank_, op.group);
    g.n = static_cast<int>(g.members.size());
    g.me = mesh_.group_index(rank_, op.group);
    return g;
  }

  // The set of param p that member s sends member j (empty when nothing), plan.hpp's rules.
  ShardIndexSet sent_set(const Op& op, const GroupInfo& g, int s, int j, int p) const {
    const int rs = g.members[s], rj = g.members[j];
    const DimSet G = op.gathered;
    switch (op.kind) {
      case OpKind::gather:
        return j == op.root ? piece(p, rs, G) : none(p);
      case OpKind::scatter:
        return s == op.root ? piece(p, rj, G) : none(p);
      case OpKind::broadcast:
        return s == op.root ? piece(p, rs, G) : none(p);
      case OpKind::all_gather:
        if (op.owned_only) return owner(p) == rs ? full(p) : none(p);
        return piece(p, rs, G);
      case OpKind::all_to_all:
        if (op.direction == AllToAllDirection::to_owners)
          return owner(p) == rj ? piece(p, rs, G) : none(p);
        return owner(p) == rs ? piece(p, rj, G) : none(p);
      case OpKind::reduce_scatter:
        return piece(p, rj, G);
      case OpKind::send:
      case OpKind::recv:
        return s == op.root && j == op.peer ? piece(p, rs, G) : none(p);
      default:
        return none(p);
    }
  }

  // The piece member j ends with (the receive target), when it receives anything of p.
  ShardIndexSet target_set(const Op& op, const GroupInfo& g, int j, int p) const {
    const int rj = g.members[j];
    const DimSet G = op.gathered;
    switch (op.kind) {
      case OpKind::gather:
      case OpKind::all_gather:
        if (op.kind == OpKind::all_gather && op.owned_only) return full(p);
        return piece(p, rj, G | op.group);
      case OpKind::all_to_all:
        return op.direction == AllToAllDirection::to_owners ? piece(p, rj, G | op.group)
                                                            : piece(p, rj, G);
      case OpKind::broadcast:
        return piece(p, g.members[op.root], G);
      case OpKind::send:
      case OpKind::recv:
        return piece(p, g.members[op.root], G);
      default:  // scatter, reduce_scatter
        return piece(p, rj, G);
    }
  }

  int communicator(const Op& op, const GroupInfo& g) {
    const int leader = g.members.front();
    const auto key = std::make_tuple(op.stream, op.group.bits, leader);
    auto it = communicators_.find(key);
    if (it != communicators_.end()) return it->second;
    Communicator c;
    c.id = static_cast<int>(prog_.communicators.size());
    c.stream = op.stream;
    c.dims = op.group;
    c.members = g.members;
    prog_.communicators.push_back(c);
    communicators_[key] = c.id;
    return c.id;
  }

  void collective(const Op& op, RankOp& rop) {
    const GroupInfo g = group_of(op);
    rop.communicator = communicator(op, g);
    rop.group_index = g.me;
    rop.wire_dtype = plan_.settings.comm_dtype();
    if (op.kind == OpKind::barrier) return;
    if ((op.kind == OpKind::send || op.kind == OpKind::recv) && g.me != op.root &&
        g.me != op.peer) {
      rop.bystander = true;
      return;
    }
    if (op.tensor == TensorRole::activation) return activation(op, rop, g);
    for (int p : op.params)
      if (!holds(p)) fail("moves " + param_name(p) + ", which this rank does not hold");
    if (op.tensor == TensorRole::parameter) {
      // Parameters travel in their dtype (plan.hpp's pieces_bytes), as the CPU emulates it.
      const DType dtype = op.params.empty() ? DType::fp32 : param(op.params.front()).dtype;
      rop.wire_dtype = bytes_of(dtype) == 2 ? DType::bf16 : DType::fp32;
    }
    if (op.kind == OpKind::all_reduce) return all_reduce(op, rop, g);
    const PieceRole role = piece_role(op.tensor);
    const bool reduce = op.kind == OpKind::reduce_scatter;
    const int params = static_cast<int>(op.params.size());
    auto sent = [&](int s, int j, int k) { return sent_set(op, g, s, j, op.params[k]); };

    ExchangePhase phase;
    phase.reduce = reduce;
    // 1. Reads: every send and the own part, before anything is written.
    const auto send_staging = send_staging_.find(op.id);
    std::vector<std::int64_t> send_block;  // staged: offsets of the blocks per member
    int send_tensor = -1;
    if (send_staging != send_staging_.end()) {
      send_tensor = live_buffer(send_staging->second);
      send_block = blocks(g, params, [&](int j, int k) { return sent(g.me, j, k); });
    }
    for (int j = 0; j < g.n; ++j) {
      View data;
      if (send_tensor >= 0) {
        data = contiguous_view(send_tensor, send_block[j], send_block[j + 1] - send_block[j]);
      } else {
        for (int k = 0; k < params; ++k) {
          const ShardIndexSet x = sent(g.me, j, k);
          if (x.numel() == 0) continue;
          const View part = read(role, op.params[k], x);
          append(data, part);
        }
      }
      if (j == g.me) {
        phase.self_source = std::move(data);
      } else if (data.count > 0) {
        phase.sends.push_back({j, g.members[j], data.count, 0, std::move(data)});
      }
    }
    // 2. Writes: targets of what this rank receives.
    const auto recv_staging = recv_staging_.find(op.id);
    if (recv_staging != recv_staging_.end()) {
      const int tensor = live_buffer(recv_staging->second);
      const auto block = blocks(g, params, [&](int s, int k) { return sent(s, g.me, k); });
      set_staging_size(tensor, block.back());
      for (int s = 0; s < g.n; ++s) {
        View data = contiguous_view(tensor, block[s], block[s + 1] - block[s]);
        if (s == g.me)
          phase.self_target = std::move(data);
        else if (data.count > 0)
          phase.recvs.push_back({s, g.members[s], data.count, 0, std::move(data)});
      }
    } else {
      std::vector<View> target(params);
      std::vector<ShardIndexSet> target_sets(params);
      for (int k = 0; k < params; ++k) {
        bool receives = false;
        for (int s = 0; s < g.n && !receives; ++s) receives = sent(s, g.me, k).numel() > 0;
        if (!receives) continue;
        target_sets[k] = target_set(op, g, g.me, op.params[k]);
        target[k] = write(role, op.params[k], target_sets[k]);
        if (role == PieceRole::parameter &&
            !prog_.tensors[target[k].segments.front().tensor].transient)
          fail("gathers " + param_name(op.params[k]) + " " + set_string(target_sets[k]) +
               " but no live buffer has a slot of that piece (it would overwrite the gradient)");
      }
      for (int s = 0; s < g.n; ++s) {
        View data;
        for (int k = 0; k < params; ++k) {
          const ShardIndexSet x = sent(s, g.me, k);
          if (x.numel() == 0) continue;
          if (!contains(target_sets[k], x))
            fail("member " + std::to_string(s) + " sends " + set_string(x) + " of " +
                 param_name(op.params[k]) + ", outside the piece " + set_string(target_sets[k]) +
                 " this rank ends with");
          const auto& seg = target[k].segments.front();
          append(data, make_view(seg.tensor, seg.runs.front().tensor,
                                 runs_between(x, target_sets[k]), x.numel()));
        }
        if (s == g.me)
          phase.self_target = std::move(data);
        else if (data.count > 0)
          phase.recvs.push_back({s, g.members[s], data.count, 0, std::move(data)});
      }
    }
    if (phase.self_source.count != phase.self_target.count)
      fail("internal: own part of " + std::to_string(phase.self_source.count) + " elements read, " +
           std::to_string(phase.self_target.count) + " written");
    if (!reduce && phase.self_source == phase.self_target)
      phase.self_source = phase.self_target = {};
    number(phase);
    rop.phases.push_back(std::move(phase));
  }

  // all_reduce: the concatenated pieces V (op order) are split like torch.chunk into one part per
  // member; phase 1 reduce-scatters the parts, phase 2 all-gathers them (plan.hpp's byte counts).
  void all_reduce(const Op& op, RankOp& rop, const GroupInfo& g) {
    const PieceRole role = piece_role(op.tensor);
    View v;
    std::int64_t total = 0;
    for (int p : op.params) {
      const ShardIndexSet set = piece(p, rank_, op.gathered);
      for (int m : g.members)
        if (!(piece(p, m, op.gathered) == set))
          fail("all_reduce of " + param_name(p) + ": members hold different pieces (" +
               set_string(set) + " here, " + set_string(piece(p, m, op.gathered)) + " on rank " +
               std::to_string(m) + ")");
      append(v, read(role, p, set));
      total += set.numel();
    }
    for (int p : op.params) {  // in place: the same storage now holds the reduced pieces
      auto it = find_entry(role, p, piece(p, rank_, op.gathered));
      if (it != entries_[p].rend()) it->producer = op.id;
    }
    all_reduce_phases(v, total, g, rop);
  }

  // The two phases of an all-reduce of the `total` elements of v (in place).
  static void all_reduce_phases(const View& v, std::int64_t total, const GroupInfo& g,
                                RankOp& rop) {
    const std::int64_t chunk = (total + g.n - 1) / g.n;
    auto part = [&](int i) {
      const std::int64_t b = std::min(total, chunk * i);
      return slice(v, b, std::min(total, b + chunk));
    };
    ExchangePhase scatter, gather;
    scatter.reduce = true;
    for (int j = 0; j < g.n; ++j) {
      if (j == g.me) continue;
      View mine = part(j);
      if (mine.count > 0) scatter.sends.push_back({j, g.members[j], mine.count, 0, mine});
      View theirs = part(g.me);
      if (theirs.count > 0) scatter.recvs.push_back({j, g.members[j], theirs.count, 0, theirs});
      View own = part(g.me);
      if (own.count > 0) gather.sends.push_back({j, g.members[j], own.count, 0, own});
      View back = part(j);
      if (back.count > 0) gather.recvs.push_back({j, g.members[j], back.count, 0, back});
    }
    scatter.self_source = scatter.self_target = part(g.me);
    number(scatter);
    number(gather);
    rop.phases.push_back(std::move(scatter));
    rop.phases.push_back(std::move(gather));
  }

  // ---- the training step (core/plan/training.hpp)

  // forward / backward: one task per matrix piece the rank computes with (TrainingMatrix).
  void training_gemms(const Op& op, RankOp& rop) {
    for (const TrainingMatrix& m : training_matrices(plan_, op, rank_)) {
      TrainingGemmTask task;
      task.param = m.param;
      task.weight = read(PieceRole::parameter, m.param, m.set);
      task.matrices = m.matrices;
      task.rows = m.rows;
      task.cols = m.cols;
      task.token_rows = m.token_rows;
      task.attention_chunks = m.attention_chunks;
      task.chunk_rows = m.chunk_rows;
      task.keys = m.keys;
      task.width = m.width;
      rop.training.push_back(std::move(task));
    }
  }

  // The static tensor every activation collective of the rank moves through, grown to `numel`.
  int activation_workspace(std::int64_t numel) {
    if (activation_workspace_ < 0)
      activation_workspace_ =
          add_tensor("activation workspace", PieceRole::staging, DType::bf16, -1, -1, false);
    grow(activation_workspace_, numel);
    return activation_workspace_;
  }

  // An activation collective (TP all_reduce, CP all_gather, EP all_to_all, PP send): Op::bytes of
  // bf16 activations per member (plan.hpp's sizes), seeded data in the activation workspace.
  void activation(const Op& op, RankOp& rop, const GroupInfo& g) {
    rop.wire_dtype = DType::bf16;
    const std::int64_t count = (op.bytes + 1) / 2;  // bf16 elements
    ExchangePhase phase;
    switch (op.kind) {
      case OpKind::all_reduce: {
        const int ws = activation_workspace(count);
        return all_reduce_phases(contiguous_view(ws, 0, count), count, g, rop);
      }
      case OpKind::all_gather: {  // member s's part at block s
        const int ws = activation_workspace(count * g.n);
        const View mine = contiguous_view(ws, count * g.me, count);
        for (int j = 0; j < g.n; ++j) {
          if (j == g.me || count == 0) continue;
          phase.sends.push_back({j, g.members[j], count, 0, mine});
          phase.recvs.push_back({j, g.members[j], count, 0, contiguous_view(ws, count * j, count)});
        }
        break;
      }
      case OpKind::all_to_all: {  // the send buffer's block j to member j (all_to_all_bytes)
        const std::int64_t block = count / g.n;
        const int ws = activation_workspace(2 * count);
        for (int j = 0; j < g.n; ++j) {
          const View out = contiguous_view(ws, block * j, block);
          const View in = contiguous_view(ws, count + block * j, block);
          if (j == g.me) {
            phase.self_source = out;
            phase.self_target = in;
          } else if (block > 0) {
            phase.sends.push_back({j, g.members[j], block, 0, out});
            phase.recvs.push_back({j, g.members[j], block, 0, in});
          }
        }
        break;
      }
      case OpKind::send:
      case OpKind::recv: {
        const int ws = activation_workspace(count);
        const View message = contiguous_view(ws, 0, count);
        if (count == 0) break;
        if (g.me == op.root)
          phase.sends.push_back({op.peer, g.members[op.peer], count, 0, message});
        else
          phase.recvs.push_back({op.root, g.members[op.root], count, 0, message});
        break;
      }
      default:
        fail("activations move by all_reduce, all_gather, all_to_all or send, not " +
             std::string(to_string(op.kind)));
    }
    number(phase);
    rop.phases.push_back(std::move(phase));
  }

  // split_newton_schulz (core/plan/split_ns.hpp): each member's slice stays where the gather left
  // it and becomes its slice of the result in place; the norms and Grams are all-reduced through
  // the op's workspace (RankOp::tensor).
  void split_newton_schulz(const Op& op, RankOp& rop) {
    const GroupInfo g = group_of(op);
    rop.communicator = communicator(op, g);
    rop.group_index = g.me;
    rop.wire_dtype = plan_.settings.comm_dtype();
    std::int64_t grams = 0;
    const int params = static_cast<int>(op.params.size());
    for (int k = 0; k < params; ++k) {
      const int p = op.params[k];
      if (!holds(p)) fail("splits the NS of " + param_name(p) + ", which this rank does not hold");
      const SplitNsSlice s = split_ns_slice(plan_.model, p, rank_, op.gathered);
      const ShardIndexSet set = piece(p, rank_, op.gathered);
      SplitNsTask task;
      task.param = p;
      task.rows = s.rows;
      task.gram = s.gram;
      task.part = s.part;
      task.norm_offset = k;
      task.gram_offset = grams;
      grams += s.gram * s.gram;
      task.data = read(PieceRole::update, p, set);
      if (set.numel() > 0) result_in_place(p, set, task.data, op.id, "the slice");
      rop.split_ns.push_back(std::move(task));
    }
    const int ws = add_tensor("split NS workspace of plan op " + std::to_string(op.id),
                              PieceRole::staging, DType::fp32, -1, -1, true);
    prog_.tensors[ws].numel = std::max<std::int64_t>(params, grams);
    rop.tensor = ws;
    all_reduce_phases(contiguous_view(ws, 0, params), params, g, rop);
    all_reduce_phases(contiguous_view(ws, 0, grams), grams, g, rop);
  }

  static void number(ExchangePhase& phase) {
    std::int64_t d = 0;
    for (Transfer& t : phase.sends) {
      t.displacement = d;
      d += t.count;
    }
    d = 0;
    for (Transfer& t : phase.recvs) {
      t.displacement = d;
      d += t.count;
    }
  }

  // Block offsets (size n + 1) of a staging layout: block i holds, for every param in op order,
  // the set set_of(i, k).
  template <typename SetOf>
  static std::vector<std::int64_t> blocks(const GroupInfo& g, int params, SetOf&& set_of) {
    std::vector<std::int64_t> offsets(g.n + 1, 0);
    for (int i = 0; i < g.n; ++i) {
      std::int64_t n = 0;
      for (int k = 0; k < params; ++k) n += set_of(i, k).numel();
      offsets[i + 1] = offsets[i] + n;
    }
    return offsets;
  }

  int live_buffer(int buffer) {
    const int t = buffer_tensor_.at(buffer);
    if (t < 0 || !live_[t])
      fail("stages through buffer '" + plan_.buffers.at(buffer).name +
           "', which is not allocated on this rank at this point");
    return t;
  }

  void set_staging_size(int tensor, std::int64_t numel) {
    auto& t = prog_.tensors[tensor];
    if (t.numel >= 0 && t.numel != numel)
      fail("staging " + t.name + " is laid out for " + std::to_string(t.numel) +
           " elements and again for " + std::to_string(numel));
    t.numel = numel;
  }

  void pack(const Op& op, RankOp& rop) {
    const Op& a2a = plan_.ops.at(pack_target_.at(op.id));
    const GroupInfo g = group_of(a2a);
    const PieceRole role = piece_role(op.tensor);
    const int tensor = live_buffer(op.buffer);
    const auto block = blocks(g, static_cast<int>(a2a.params.size()), [&](int j, int k) {
      return sent_set(a2a, g, g.me, j, a2a.params[k]);
    });
    set_staging_size(tensor, block.back());
    LocalCopy copy;
    for (int j = 0; j < g.n; ++j) {
      for (int p : a2a.params) {
        const ShardIndexSet x = sent_set(a2a, g, g.me, j, p);
        if (x.numel() == 0) continue;
        if (op.owned_only && owner(p) != rank_)
          fail("packs only owned params but the all_to_all sends " + param_name(p));
        if (!contains(piece(p, rank_, op.gathered), x))
          fail("packs " + set_string(piece(p, rank_, op.gathered)) + " of " + param_name(p) +
               " but its all_to_all sends " + set_string(x));
        append(copy.source, read(role, p, x));
      }
    }
    copy.target = contiguous_view(tensor, 0, copy.source.count);
    if (copy.source.count > 0) rop.copies.push_back(std::move(copy));
  }

  void unpack(const Op& op, RankOp& rop) {
    const Op& a2a = plan_.ops.at(unpack_source_.at(op.id));
    const GroupInfo g = group_of(a2a);
    const PieceRole role = piece_role(op.tensor);
    const int tensor = live_buffer(op.buffer);
    std::map<int, std::pair<ShardIndexSet, View>> target;  // param -> (set, location)
    LocalCopy copy;
    for (int s = 0; s < g.n; ++s) {
      for (int p : a2a.params) {
        const ShardIndexSet x = sent_set(a2a, g, s, g.me, p);
        if (x.numel() == 0) continue;
        auto it = target.find(p);
        if (it == target.end()) {
          if (std::find(op.params.begin(), op.params.end(), p) == op.params.end() ||
              (op.owned_only && owner(p) != rank_))
            fail("does not unpack " + param_name(p) + ", which its all_to_all delivers");
          ShardIndexSet set = piece(p, rank_, op.gathered);
          View where = write(role, p, set);
          it = target.emplace(p, std::make_pair(std::move(set), std::move(where))).first;
        }
        const auto& [set, where] = it->second;
        if (!contains(set, x))
          fail("unpacks " + set_string(set) + " of " + param_name(p) + " but member " +
               std::to_string(s) + " sent " + set_string(x));
        const auto& seg = where.segments.front();
        append(copy.target,
               make_view(seg.tensor, seg.runs.front().tensor, runs_between(x, set), x.numel()));
      }
    }
    copy.source = contiguous_view(tensor, 0, copy.target.count);
    if (copy.target.count > 0) rop.copies.push_back(std::move(copy));
  }

  // ---- keeps: pieces the op leaves in a transient buffer that a later op reads after the
  // buffer's release (apply_update reads the results replicated NS or an all-gather left in a
  // buffer; a stage of a mesh dim of size 1 lands where the next stage would have put it).
  void apply_keeps(const Op& op, RankOp& rop) {
    for (int p : op.params) {
      const auto keep = keeps_.find({op.id, p});
      if (keep == keeps_.end()) continue;
      // Named copies, not a structured binding: clang 14 cannot capture bindings in a lambda.
      const auto& role = keep->second.first;
      const auto& set = keep->second.second;
      auto it = std::find_if(entries_[p].rbegin(), entries_[p].rend(), [&](const Entry& e) {
        return e.role == role && e.producer == op.id && contains(e.set, set);
      });
      if (it == entries_[p].rend() || !prog_.tensors[it->tensor].transient) continue;
      LocalCopy copy;
      copy.source = make_view(it->tensor, it->offset, runs_between(set, it->set), set.numel());
      copy.target = write(role, p, set, /*slot_only=*/true);
      if (copy.source.count > 0) rop.keep.push_back(std::move(copy));
    }
  }

  // ---- sizes, offsets, memory
  void finish() {
    std::int64_t bytes = 0;
    for (ProgramTensor& t : prog_.tensors) {
      if (t.transient && t.numel < 0) {  // a staging buffer this rank never stages through
        const Buffer& b = plan_.buffers.at(t.buffer);
        t.numel = 0;
        for (int p : b.params)
          if (!b.owned_only || owner(p) == rank_) t.numel += piece(p, rank_, b.gathered).numel();
      }
      t.numel = std::max<std::int64_t>(t.numel, 0);
      t.bytes = t.numel * bytes_of(t.dtype);
      if (t.transient) continue;
      t.offset = bytes;
      bytes += t.bytes;
    }
    prog_.static_bytes = bytes;
    std::int64_t live = 0;
    for (const RankOp& op : prog_.ops) {
      if (op.kind == OpKind::alloc) live += prog_.tensors[op.tensor].bytes;
      if (op.kind == OpKind::release) live -= prog_.tensors[op.tensor].bytes;
      prog_.peak_transient_bytes = std::max(prog_.peak_transient_bytes, live);
    }
  }

  const StepPlan& plan_;
  const DeviceMesh& mesh_;
  int rank_;
  LowerOptions options_;
  const Keeps& keeps_;
  bool probe_;
  bool training_;
  int activation_workspace_ = -1;
  RankProgram prog_;
  const Op* op_ = nullptr;
  std::vector<std::vector<Entry>> entries_;
  std::vector<std::vector<Entry>> lost_;  // pieces that were in released buffers (for keeps)
  std::vector<int> gradient_slot_;
  std::vector<int> buffer_tensor_;
  std::vector<std::vector<Slot>> slots_;  // per tensor
  std::vector<char> live_;                // per tensor
  std::vector<int> live_order_;           // live buffers, oldest first
  std::set<int> staging_buffer_;
  std::map<int, int> pack_target_, unpack_source_, send_staging_, recv_staging_;
  std::map<int, int> release_op_;  // buffer -> the op that releases it on this rank
  int release_at(int tensor) const {
    const auto it = release_op_.find(prog_.tensors[tensor].buffer);
    return it == release_op_.end() ? static_cast<int>(plan_.ops.size()) : it->second;
  }
  std::map<std::tuple<int, std::uint32_t, int>, int> communicators_;
};

// The splits every rank makes in one order (RankProgram::splits): one per (stream, group dims) of
// the plan's collectives, ordered by (stream, dims bits), with this rank's communicator of each.
std::vector<CommunicatorSplit> communicator_splits(const StepPlan& plan,
                                                   const RankProgram& program) {
  std::set<std::pair<int, std::uint32_t>> ids;
  for (const Op& op : plan.ops)
    if (is_collective(op.kind)) ids.insert({op.stream, op.group.bits});
  std::vector<CommunicatorSplit> out;
  for (const auto& [stream, bits] : ids) {
    CommunicatorSplit s;
    s.stream = stream;
    s.dims = DimSet{bits};
    for (const Communicator& c : program.communicators) {
      if (c.stream != stream || c.dims.bits != bits) continue;
      if (s.communicator >= 0)
        throw PlanError("lowering: rank " + std::to_string(program.rank) +
                        " has two communicators of stream " + std::to_string(stream) +
                        " over the same dims");
      const auto me = std::find(c.members.begin(), c.members.end(), program.rank);
      if (me == c.members.end())
        throw PlanError("lowering: rank " + std::to_string(program.rank) +
                        " is not a member of its own communicator " + std::to_string(c.id));
      s.communicator = c.id;
      s.color = c.members.front();
      s.key = static_cast<int>(me - c.members.begin());
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace

bool issued_in_step(const StepPlan& plan, const RankProgram& program, int plan_op, int step) {
  const RankOp* r = program.find(plan_op);
  return r != nullptr && !r->bystander &&
         plan.active_in_step(plan.ops.at(static_cast<std::size_t>(plan_op)), step);
}

std::vector<int> wait_list(const StepPlan& plan, const RankProgram& program, int plan_op,
                           int step) {
  const int stream = plan.ops.at(static_cast<std::size_t>(plan_op)).stream;
  std::vector<int> out;
  std::set<int> visited;
  std::function<void(int)> wait_for;
  auto issued = [&](int op) { return issued_in_step(plan, program, op, step); };
  // The ops before program op index `i` on plan stream `on`, back to the first issued one.
  auto wait_for_stream_before = [&](int i, int on) {
    for (int k = i - 1; k >= 0; --k) {
      const int q = program.ops[static_cast<std::size_t>(k)].op;
      if (plan.ops[static_cast<std::size_t>(q)].stream != on) continue;
      wait_for(q);
      if (issued(q)) break;
    }
  };
  wait_for = [&](int d) {
    const int i = program.op_index.at(static_cast<std::size_t>(d));
    if (i < 0 || !visited.insert(d).second) return;
    const Op& op = plan.ops[static_cast<std::size_t>(d)];
    if (issued(d)) {
      if (op.stream != stream) out.push_back(d);
      return;
    }
    for (int dep : op.deps) wait_for(dep);
    if (plan.active_in_step(op, step)) wait_for_stream_before(i, op.stream);  // a bystander
  };
  for (int d : plan.ops.at(static_cast<std::size_t>(plan_op)).deps) wait_for(d);
  wait_for_stream_before(program.op_index.at(static_cast<std::size_t>(plan_op)), stream);
  std::sort(out.begin(), out.end());
  return out;
}

RankProgram lower_rank_program(const StepPlan& plan, int rank, const LowerOptions& options) {
  if (rank < 0 || rank >= plan.model.mesh.world_size())
    throw PlanError("lowering: rank " + std::to_string(rank) + " is outside the plan's " +
                    std::to_string(plan.model.mesh.world_size()) + " ranks");
  // Pass 1 finds the results apply_update reads after their buffer is released; pass 2 lowers
  // with the producing ops keeping the rank's own piece of them.
  const Keeps none;
  LowerOptions probe_options = options;
  probe_options.allow_stale_reads = true;
  Lowering probe(plan, rank, probe_options, none, /*probe=*/true);
  probe.run();
  Lowering lowering(plan, rank, options, probe.keep_requests, /*probe=*/false);
  RankProgram program = lowering.run();
  program.splits = communicator_splits(plan, program);
  const int hyper_period = plan.hyper_period();
  for (RankOp& op : program.ops) {
    op.stream_waits.assign(static_cast<std::size_t>(hyper_period), {});
    for (int step = 0; step < hyper_period; ++step)
      if (issued_in_step(plan, program, op.op, step))
        op.stream_waits[static_cast<std::size_t>(step)] = wait_list(plan, program, op.op, step);
  }
  return program;
}

}  // namespace muonbed
