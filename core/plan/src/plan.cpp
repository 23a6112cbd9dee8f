// Step plans: rank boxes, per-op data sizes derived from layouts, FLOPs, memory, rank summaries
// and structural validation. Nothing here stores per-rank tables: sizes are computed on demand.
#include "core/plan/plan.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "core/base/errors.hpp"
#include "core/plan/split_ns.hpp"
#include "core/plan/training.hpp"

namespace muonbed {

namespace {

constexpr std::pair<OpKind, std::string_view> kOpNames[] = {
    {OpKind::alloc, "alloc"},
    {OpKind::release, "release"},
    {OpKind::momentum, "momentum"},
    {OpKind::newton_schulz, "newton_schulz"},
    {OpKind::apply_update, "apply_update"},
    {OpKind::adamw, "adamw"},
    {OpKind::pack, "pack"},
    {OpKind::unpack, "unpack"},
    {OpKind::all_gather, "all_gather"},
    {OpKind::gather, "gather"},
    {OpKind::scatter, "scatter"},
    {OpKind::broadcast, "broadcast"},
    {OpKind::all_to_all, "all_to_all"},
    {OpKind::reduce_scatter, "reduce_scatter"},
    {OpKind::all_reduce, "all_reduce"},
    {OpKind::send, "send"},
    {OpKind::recv, "recv"},
    {OpKind::barrier, "barrier"},
    {OpKind::split_newton_schulz, "split_newton_schulz"},
    {OpKind::forward, "forward"},
    {OpKind::backward, "backward"},
};

std::int64_t comm_bytes(const StepPlan& plan) {
  return bytes_of(plan.settings.comm_dtype());
}

// Elements of param p that `rank` holds before the op (the piece rule of plan.hpp).
std::int64_t piece_numel(const StepPlan& plan, int p, int rank, DimSet gathered) {
  return plan.model.params[p].layout.shard_numel(plan.model.mesh, rank, gathered);
}

std::int64_t pieces_bytes(const StepPlan& plan, const Op& op, int rank, DimSet gathered) {
  // Activations are sized by the op; parameters move in their own dtype; the rest in the comm
  // dtype.
  if (op.tensor == TensorRole::activation) return op.bytes;
  std::int64_t total = 0;
  if (op.tensor == TensorRole::parameter) {
    for (int p : op.params)
      total += piece_numel(plan, p, rank, gathered) * bytes_of(plan.model.params[p].dtype);
    return total;
  }
  for (int p : op.params) total += piece_numel(plan, p, rank, gathered);
  return total * comm_bytes(plan);
}

std::int64_t owned_full_bytes(const StepPlan& plan, const Op& op, int rank) {
  std::int64_t total = 0;
  for (int p : op.params)
    if (plan.assignment.owner[p] == rank) total += plan.model.params[p].numel();
  return total * comm_bytes(plan);
}

// all_to_all: bytes `from` sends to `to` (both members of one group instance).
std::int64_t all_to_all_bytes(const StepPlan& plan, const Op& op, int from, int to) {
  // Activations (the EP token exchange): each member's buffer split evenly over the group.
  if (op.tensor == TensorRole::activation)
    return op.bytes / std::max(1, plan.mesh().group_size(op.group));
  std::int64_t total = 0;
  for (int p : op.params) {
    const int owner = plan.assignment.owner[p];
    if (op.direction == AllToAllDirection::to_owners) {
      if (owner == to) total += piece_numel(plan, p, from, op.gathered);
    } else {
      if (owner == from) total += piece_numel(plan, p, to, op.gathered);
    }
  }
  return total * comm_bytes(plan);
}

// torch.chunk-style share of `total` for member i of n (used by all_reduce's logical split).
std::int64_t chunk_share(std::int64_t total, int n, int i) {
  const std::int64_t chunk = (total + n - 1) / n;
  return std::clamp<std::int64_t>(total - chunk * i, 0, chunk);
}

// split_newton_schulz: bytes member `me` sends member `i` (and, by symmetry, receives from it):
// the norm all-reduce (fp32) and one Gram all-reduce per step (comm dtype), each a reduce-scatter
// of torch.chunk parts then an all-gather of them, as all_reduce.
std::int64_t split_ns_pair_bytes(const StepPlan& plan, const Op& op, int rank, int n, int me,
                                 int i) {
  const SplitNsExchange x = split_ns_exchange(plan, op, rank);
  const auto pair = [&](std::int64_t total) {
    return chunk_share(total, n, i) + chunk_share(total, n, me);
  };
  return pair(x.norm_elements) * bytes_of(DType::fp32) +
         x.steps * pair(x.gram_elements) * comm_bytes(plan);
}

}  // namespace

std::string_view to_string(OpKind kind) {
  for (const auto& [k, name] : kOpNames)
    if (k == kind) return name;
  return "?";
}

OpKind op_kind_from_string(std::string_view text) {
  for (const auto& [k, name] : kOpNames)
    if (name == text) return k;
  throw PlanError("unknown op kind '" + std::string(text) + "'");
}

constexpr std::pair<TensorRole, std::string_view> kRoleNames[] = {
    {TensorRole::none, "none"},           {TensorRole::gradient, "gradient"},
    {TensorRole::update, "update"},       {TensorRole::result, "result"},
    {TensorRole::parameter, "parameter"}, {TensorRole::activation, "activation"},
};

std::string_view to_string(TensorRole role) {
  for (const auto& [r, name] : kRoleNames)
    if (r == role) return name;
  return "?";
}

TensorRole tensor_role_from_string(std::string_view text) {
  for (const auto& [r, name] : kRoleNames)
    if (name == text) return r;
  throw PlanError("unknown tensor role '" + std::string(text) +
                  "'; known: none, gradient, update, result, parameter, activation");
}

TensorRole default_tensor(const Op& op) {
  switch (op.kind) {
    case OpKind::gather:
      return TensorRole::update;
    case OpKind::scatter:
    case OpKind::broadcast:
      return TensorRole::result;
    case OpKind::all_gather:
    case OpKind::pack:
      return op.owned_only ? TensorRole::result : TensorRole::update;
    case OpKind::unpack:
    case OpKind::split_newton_schulz:  // reads the update, leaves the result in its place
      return TensorRole::update;
    case OpKind::all_to_all:
      return op.direction == AllToAllDirection::to_owners ? TensorRole::update : TensorRole::result;
    case OpKind::reduce_scatter:
    case OpKind::all_reduce:
      return TensorRole::gradient;
    default:
      return TensorRole::none;
  }
}

bool is_memory(OpKind kind) {
  return kind == OpKind::alloc || kind == OpKind::release;
}
bool is_compute(OpKind kind) {
  switch (kind) {
    case OpKind::momentum:
    case OpKind::newton_schulz:
    case OpKind::apply_update:
    case OpKind::adamw:
    case OpKind::pack:
    case OpKind::unpack:
    case OpKind::forward:
    case OpKind::backward:
      return true;
    default:
      return false;
  }
}
bool is_collective(OpKind kind) {
  return !is_memory(kind) && !is_compute(kind);
}

RankBox RankBox::everyone(const DeviceMesh& mesh) {
  return RankBox{std::vector<int>(mesh.ndims(), kAll)};
}

RankBox RankBox::single(const DeviceMesh& mesh, int rank) {
  return RankBox{mesh.coords(rank)};
}

bool RankBox::contains(const DeviceMesh& mesh, int rank) const {
  for (int d = 0; d < static_cast<int>(coord.size()); ++d)
    if (coord[d] != kAll && mesh.coord(rank, d) != coord[d]) return false;
  return true;
}

std::int64_t RankBox::count(const DeviceMesh& mesh) const {
  std::int64_t n = 1;
  for (int d = 0; d < static_cast<int>(coord.size()); ++d)
    if (coord[d] == kAll) n *= mesh.size(d);
  return n;
}

std::vector<int> RankBox::ranks(const DeviceMesh& mesh) const {
  // Odometer over the free dims, innermost fastest, so ranks come out ascending.
  std::vector<int> c(coord.size());
  for (std::size_t d = 0; d < coord.size(); ++d) c[d] = coord[d] == kAll ? 0 : coord[d];
  std::vector<int> result;
  result.reserve(static_cast<std::size_t>(count(mesh)));
  while (true) {
    result.push_back(mesh.rank_of(c));
    int d = static_cast<int>(coord.size()) - 1;
    for (; d >= 0; --d) {
      if (coord[d] != kAll) continue;
      if (++c[d] < mesh.size(d)) break;
      c[d] = 0;
    }
    if (d < 0) break;
  }
  return result;
}

DimSet RankBox::free_dims() const {
  DimSet s;
  for (int d = 0; d < static_cast<int>(coord.size()); ++d)
    if (coord[d] == kAll) s = s.with(d);
  return s;
}

int StepPlan::hyper_period() const {
  // lcm in 64 bits, refused once it leaves int: coprime periods multiply (and std::lcm on int
  // overflows silently). Experiments keep it at most 2^20 (strategy.grad_sync.level_periods).
  std::int64_t period = 1;
  for (const auto& op : ops) {
    if (op.period < 1)
      throw PlanError("op " + std::to_string(op.id) + " has period " + std::to_string(op.period) +
                      "; periods must be >= 1");
    period = period / std::gcd(period, std::int64_t{op.period}) * op.period;
    if (period > std::numeric_limits<int>::max())
      throw PlanError(
          "the plan's hyper-period (the least common multiple of its op periods) "
          "exceeds 2^31 steps; fix: use level periods with a small common multiple");
  }
  return static_cast<int>(period);
}

std::int64_t piece_bytes(const StepPlan& plan, const Op& op, int rank) {
  const auto& mesh = plan.mesh();
  switch (op.kind) {
    case OpKind::broadcast:
      return pieces_bytes(plan, op, mesh.group_member(rank, op.group, op.root), op.gathered);
    case OpKind::all_gather:
      return op.owned_only ? owned_full_bytes(plan, op, rank)
                           : pieces_bytes(plan, op, rank, op.gathered);
    case OpKind::barrier:
      return 0;
    default:
      return pieces_bytes(plan, op, rank, op.gathered);
  }
}

std::vector<int> param_classes(const ShardedModel& model,
                               const std::function<bool(int, int)>& same) {
  std::vector<int> out(model.params.size());
  std::map<std::vector<std::int64_t>, std::vector<int>> by_shape;  // class names per shape
  for (std::size_t p = 0; p < model.params.size(); ++p) {
    std::vector<int>& names = by_shape[model.params[p].shape];
    const int me = static_cast<int>(p);
    const auto it = std::find_if(names.begin(), names.end(), [&](int q) { return same(q, me); });
    out[p] = it != names.end() ? *it : me;
    if (it == names.end()) names.push_back(me);
  }
  return out;
}

// piece_bytes reads of a param its layout, dtype, and (owned_only gathers) owner and size.
PieceBytes::PieceBytes(const StepPlan& plan)
    : plan_(plan),
      signature_of_op_(plan.ops.size(), -1),
      param_class_(param_classes(plan.model, [&plan](int p, int q) {
        const DistributedParam &a = plan.model.params[p], &b = plan.model.params[q];
        return a.dtype == b.dtype && a.layout == b.layout &&
               plan.assignment.owner[p] == plan.assignment.owner[q];
      })) {}

std::int64_t PieceBytes::operator()(int op, int rank) {
  int& signature = signature_of_op_.at(static_cast<std::size_t>(op));
  if (signature < 0) {
    const Op& o = plan_.ops[op];
    std::vector<int> classes;
    classes.reserve(o.params.size());
    for (int p : o.params) classes.push_back(param_class_[static_cast<std::size_t>(p)]);
    const auto [at, added] = signatures_.try_emplace(
        {static_cast<int>(o.kind), static_cast<int>(o.tensor), o.gathered.bits, o.group.bits,
         o.root, o.owned_only, o.bytes, std::move(classes)},
        static_cast<int>(known_.size()));
    if (added) known_.emplace_back();
    signature = at->second;
  }
  std::vector<std::int64_t>& row = known_[static_cast<std::size_t>(signature)];
  if (row.empty()) row.assign(static_cast<std::size_t>(plan_.mesh().world_size()), -1);
  std::int64_t& bytes = row.at(static_cast<std::size_t>(rank));
  if (bytes < 0) bytes = piece_bytes(plan_, plan_.ops[op], rank);
  return bytes;
}

std::vector<std::int64_t> bytes_sent(const StepPlan& plan, const Op& op, int rank) {
  const auto& mesh = plan.mesh();
  const int n = mesh.group_size(op.group);
  const int me = mesh.group_index(rank, op.group);
  std::vector<std::int64_t> out(n, 0);
  auto member = [&](int i) { return mesh.group_member(rank, op.group, i); };
  switch (op.kind) {
    case OpKind::gather:
      if (me != op.root) out[op.root] = pieces_bytes(plan, op, rank, op.gathered);
      break;
    case OpKind::scatter:
      if (me == op.root)
        for (int i = 0; i < n; ++i)
          if (i != me) out[i] = pieces_bytes(plan, op, member(i), op.gathered);
      break;
    case OpKind::broadcast:
      if (me == op.root)
        for (int i = 0; i < n; ++i)
          if (i != me) out[i] = pieces_bytes(plan, op, rank, op.gathered);
      break;
    case OpKind::all_gather: {
      const auto mine = piece_bytes(plan, op, rank);
      for (int i = 0; i < n; ++i)
        if (i != me) out[i] = mine;
      break;
    }
    case OpKind::all_to_all:
      for (int i = 0; i < n; ++i)
        if (i != me) out[i] = all_to_all_bytes(plan, op, rank, member(i));
      break;
    case OpKind::reduce_scatter:
      // Each member sends every other member that member's part of its input.
      for (int i = 0; i < n; ++i)
        if (i != me) out[i] = pieces_bytes(plan, op, member(i), op.gathered);
      break;
    case OpKind::all_reduce: {
      // Logically a reduce-scatter of equal parts followed by an all-gather of them; parts are
      // whole elements (torch.chunk of the concatenated pieces).
      const auto width = comm_bytes(plan);
      const auto total = pieces_bytes(plan, op, rank, op.gathered) / width;
      for (int i = 0; i < n; ++i)
        if (i != me) out[i] = (chunk_share(total, n, i) + chunk_share(total, n, me)) * width;
      break;
    }
    case OpKind::send:
    case OpKind::recv:
      if (me == op.root) out[op.peer] = pieces_bytes(plan, op, rank, op.gathered);
      break;
    case OpKind::split_newton_schulz:
      for (int i = 0; i < n; ++i)
        if (i != me) out[i] = split_ns_pair_bytes(plan, op, rank, n, me, i);
      break;
    default:
      break;
  }
  return out;
}

std::vector<PairBytes> all_to_all_transfers(const StepPlan& plan, const Op& op,
                                            const std::vector<int>& members) {
  std::vector<PairBytes> out;
  if (op.kind != OpKind::all_to_all || members.empty()) return out;
  const DeviceMesh& mesh = plan.mesh();
  const int n = static_cast<int>(members.size());
  if (op.tensor == TensorRole::activation) {
    // The EP token exchange names no params: every member sends every other its even share
    // (all_to_all_bytes, the one rule).
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (i != j)
          if (const std::int64_t b = all_to_all_bytes(plan, op, members[i], members[j]); b > 0)
            out.push_back({i, j, b});
    return out;
  }
  const int leader = mesh.group_leader(members.front(), op.group);
  const std::int64_t width = comm_bytes(plan);
  for (int p : op.params) {
    const int owner = plan.assignment.owner[p];
    if (owner < 0 || owner >= mesh.world_size() || mesh.group_leader(owner, op.group) != leader)
      continue;
    const int o = mesh.group_index(owner, op.group);
    for (int i = 0; i < n; ++i) {
      if (i == o) continue;
      const std::int64_t b = piece_numel(plan, p, members[i], op.gathered) * width;
      if (b <= 0) continue;
      if (op.direction == AllToAllDirection::to_owners)
        out.push_back({i, o, b});
      else
        out.push_back({o, i, b});
    }
  }
  return out;
}

std::vector<std::int64_t> bytes_received(const StepPlan& plan, const Op& op, int rank) {
  const auto& mesh = plan.mesh();
  const int n = mesh.group_size(op.group);
  const int me = mesh.group_index(rank, op.group);
  std::vector<std::int64_t> in(n, 0);
  auto member = [&](int i) { return mesh.group_member(rank, op.group, i); };
  switch (op.kind) {
    case OpKind::gather:
      if (me == op.root)
        for (int i = 0; i < n; ++i)
          if (i != me) in[i] = pieces_bytes(plan, op, member(i), op.gathered);
      break;
    case OpKind::scatter:
      if (me != op.root) in[op.root] = pieces_bytes(plan, op, rank, op.gathered);
      break;
    case OpKind::broadcast:
      if (me != op.root) in[op.root] = pieces_bytes(plan, op, member(op.root), op.gathered);
      break;
    case OpKind::all_gather:
      for (int i = 0; i < n; ++i)
        if (i != me) in[i] = piece_bytes(plan, op, member(i));
      break;
    case OpKind::all_to_all:
      for (int i = 0; i < n; ++i)
        if (i != me) in[i] = all_to_all_bytes(plan, op, member(i), rank);
      break;
    case OpKind::reduce_scatter:
      for (int i = 0; i < n; ++i)
        if (i != me) in[i] = pieces_bytes(plan, op, rank, op.gathered);
      break;
    case OpKind::all_reduce:
      for (int i = 0; i < n; ++i) {
        if (i == me) continue;
        const auto width = comm_bytes(plan);
        const auto total = pieces_bytes(plan, op, member(i), op.gathered) / width;
        in[i] = (chunk_share(total, n, me) + chunk_share(total, n, i)) * width;
      }
      break;
    case OpKind::send:
    case OpKind::recv:
      if (me == op.peer) in[op.root] = pieces_bytes(plan, op, member(op.root), op.gathered);
      break;
    case OpKind::split_newton_schulz:
      for (int i = 0; i < n; ++i)
        if (i != me) in[i] = split_ns_pair_bytes(plan, op, rank, n, me, i);
      break;
    default:
      break;
  }
  return in;
}

std::int64_t collective_bytes(const StepPlan& plan, const Op& op, int rank) {
  const auto& mesh = plan.mesh();
  const int n = mesh.group_size(op.group);
  switch (op.kind) {
    case OpKind::gather:
    case OpKind::scatter:
    case OpKind::all_gather: {
      // The assembled buffer: the sum of the members' pieces or contributions.
      std::int64_t total = 0;
      for (int i = 0; i < n; ++i)
        total += piece_bytes(plan, op, mesh.group_member(rank, op.group, i));
      return total;
    }
    case OpKind::reduce_scatter:
      // The input every member holds: its piece with the group's dims gathered.
      return pieces_bytes(plan, op, rank, op.gathered | op.group);
    case OpKind::all_to_all: {
      // nccl-tests counts the whole send buffer of a rank, its own part included.
      std::int64_t total = all_to_all_bytes(plan, op, rank, rank);
      for (auto b : bytes_sent(plan, op, rank)) total += b;
      return total;
    }
    case OpKind::barrier:
      return 0;
    case OpKind::split_newton_schulz: {  // everything the member all-reduces in one NS run
      const SplitNsExchange x = split_ns_exchange(plan, op, rank);
      return x.norm_elements * bytes_of(DType::fp32) + x.steps * x.gram_elements * comm_bytes(plan);
    }
    default:
      return piece_bytes(plan, op, rank);
  }
}

std::int64_t buffer_bytes(const StepPlan& plan, const Buffer& buffer, int rank) {
  std::int64_t total = 0;
  for (int p : buffer.params) {
    if (buffer.owned_only && plan.assignment.owner[p] != rank) continue;
    total += piece_numel(plan, p, rank, buffer.gathered);
  }
  return total * comm_bytes(plan);
}

std::vector<MatrixWork> ns_work(const StepPlan& plan, const Op& op, int rank) {
  std::vector<MatrixWork> work;
  if (op.kind != OpKind::newton_schulz) return work;
  for (int p : op.params) {
    if (op.owned_only && plan.assignment.owner[p] != rank) continue;
    const auto& dp = plan.model.params[p];
    if (!dp.layout.holds(plan.mesh(), rank)) continue;
    work.push_back({newton_schulz_flops(dp.rows(), dp.cols(), op.ns_steps, dp.batch()),
                    static_cast<double>(std::min(dp.rows(), dp.cols())), dp.rows(), dp.cols(),
                    dp.batch()});
  }
  return work;
}

std::int64_t elementwise_numel(const StepPlan& plan, const Op& op, int rank) {
  std::int64_t total = 0;
  for (int p : op.params) {
    if (op.owned_only && plan.assignment.owner[p] != rank) continue;
    total += piece_numel(plan, p, rank, op.gathered);
  }
  return total;
}

double op_flops(const StepPlan& plan, const Op& op, int rank) {
  switch (op.kind) {
    case OpKind::forward:
    case OpKind::backward:
      return training_op_flops(plan, op, rank);
    case OpKind::split_newton_schulz:
      return split_ns_flops(plan, op, rank);
    case OpKind::newton_schulz: {
      double total = 0;
      for (const auto& w : ns_work(plan, op, rank)) total += w.flops;
      return total;
    }
    case OpKind::momentum:
    case OpKind::apply_update:
    case OpKind::adamw:
      return elementwise_flops_per_element(plan, op.kind) * elementwise_numel(plan, op, rank);
    default:
      return 0;
  }
}

double elementwise_flops_per_element(const StepPlan& plan, OpKind kind) {
  switch (kind) {
    case OpKind::momentum:
      // buf = beta*buf + g (2 flops/element); Nesterov adds g + beta*buf (2 more).
      return plan.settings.optimizer.muon.nesterov ? 4.0 : 2.0;
    case OpKind::apply_update:
      // p = p*(1 - lr*wd) - lr*scale*u: 4 flops/element.
      return 4.0;
    case OpKind::adamw:
      // Two moment updates, bias corrections, sqrt, divide, decay, update: ~14 flops/element.
      return 14.0;
    default:
      return 0;
  }
}

double useful_step_flops(const StepPlan& plan) {
  const double muon_per_element = elementwise_flops_per_element(plan, OpKind::momentum) +
                                  elementwise_flops_per_element(plan, OpKind::apply_update);
  const double adamw_per_element = elementwise_flops_per_element(plan, OpKind::adamw);
  double total = 0;
  for (const auto& dp : plan.model.params) {
    const double n = static_cast<double>(dp.numel());
    if (dp.optimizer == OptimizerKind::muon)
      total += newton_schulz_flops(dp.rows(), dp.cols(), plan.settings.ns_steps(), dp.batch()) +
               muon_per_element * n;
    else
      total += adamw_per_element * n;
  }
  return total;
}

double elementwise_memory_bytes(const StepPlan& plan, OpKind kind, double n) {
  const double state = bytes_of(plan.settings.state_dtype);
  const double comm = static_cast<double>(comm_bytes(plan));
  switch (kind) {
    case OpKind::momentum:  // read grad, read+write momentum, write update
      return n * (comm + 2 * state + comm);
    case OpKind::apply_update:  // read+write param, read update
      return n * 3 * comm;
    case OpKind::adamw:  // read+write param, read grad, read+write two moments
      return n * (3 * comm + 4 * state);
    case OpKind::pack:
    case OpKind::unpack:
      return n * 2 * comm;
    default:
      return 0;
  }
}

double op_memory_bytes(const StepPlan& plan, const Op& op, int rank) {
  const double comm = static_cast<double>(comm_bytes(plan));
  switch (op.kind) {
    case OpKind::momentum:
    case OpKind::apply_update:
    case OpKind::adamw:
    case OpKind::pack:
    case OpKind::unpack:
      return elementwise_memory_bytes(plan, op.kind,
                                      static_cast<double>(elementwise_numel(plan, op, rank)));
    case OpKind::newton_schulz: {
      // Per iteration: read X twice, write A, read A twice, write B, write X (bf16 storage).
      double total = 0;
      for (int p : op.params) {
        if (op.owned_only && plan.assignment.owner[p] != rank) continue;
        const auto& dp = plan.model.params[p];
        if (!dp.layout.holds(plan.mesh(), rank)) continue;
        const double m = static_cast<double>(std::min(dp.rows(), dp.cols()));
        const double k = static_cast<double>(std::max(dp.rows(), dp.cols()));
        total += op.ns_steps * static_cast<double>(dp.batch()) * comm * (3 * m * k + 3 * m * m);
      }
      return total;
    }
    default:
      return 0;
  }
}

namespace {

// Activations a rank keeps: what the experiment gives (memory.activations_GiB), else, in a
// training step, what its layers and micro-batches hold (core/plan/training.hpp).
std::int64_t training_activations(const ShardedModel& model, const PlanSettings& settings) {
  if (settings.training_memory.activations_bytes > 0 || !settings.training.enabled)
    return settings.training_memory.activations_bytes;
  return training_activation_bytes(model, settings.training);
}

// Bytes per element of a param's gradient slot: the wider of its dtype and the comm dtype.
std::int64_t gradient_width(const DistributedParam& dp, std::int64_t comm) {
  return std::max<std::int64_t>(bytes_of(dp.dtype), comm);
}

// The fp32 master copy of a shard of `shard` elements, if the rule keeps one for this param.
std::int64_t master_weight_bytes(const DistributedParam& dp, std::int64_t shard,
                                 MasterWeights master) {
  const bool lower = bytes_of(dp.dtype) < bytes_of(DType::fp32);
  const bool kept = master == MasterWeights::fp32 || (master == MasterWeights::automatic && lower);
  return kept ? shard * bytes_of(DType::fp32) : 0;
}

// rank_memory's static tensors by part, and the peak of its transient buffers.
struct StaticMemory {
  std::int64_t parameters = 0;
  std::int64_t master_weights = 0;  // fp32 copies under MasterWeights (training_memory only)
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t peak_transient = 0;
};

// Per buffer, the lowest index of a buffer with the same params, gathered dims and ownership:
// those hold the same bytes on every rank (a training step allocates each layer's gather buffer
// once per micro-batch group), so static_memory sizes each such class once per rank.
std::vector<int> same_buffers(const StepPlan& plan) {
  std::vector<int> same(plan.buffers.size());
  std::map<std::tuple<std::vector<int>, std::uint32_t, bool>, int> first;
  for (std::size_t b = 0; b < plan.buffers.size(); ++b) {
    const Buffer& buffer = plan.buffers[b];
    same[b] = first
                  .try_emplace({buffer.params, buffer.gathered.bits, buffer.owned_only},
                               static_cast<int>(b))
                  .first->second;
  }
  return same;
}

// `same`: same_buffers(plan), or empty (then computed here).
StaticMemory static_memory(const StepPlan& plan, int rank, const std::vector<int>& same = {}) {
  StaticMemory memory;
  const auto& mesh = plan.mesh();
  const auto& params = plan.model.params;
  const std::int64_t state = bytes_of(plan.settings.state_dtype);
  const std::int64_t comm = comm_bytes(plan);
  // The pieces the step keeps (core/plan/program.hpp): the gradient it starts with (the input of
  // the first sync op, else the piece its first reader computes on), momentum where the momentum op
  // computes, AdamW moments where the adamw op does.
  const std::size_t n = params.size();
  // An all_gather of a gradient's TP slices (strategies that need whole gradients) leaves the
  // whole piece in the slot too.
  std::vector<std::int64_t> gradient(n, 0), momentum(n, 0), moments(n, 0), gathered(n, 0);
  std::vector<char> gradient_found(n, 0);
  for (const auto& op : plan.ops) {
    const bool gradient_gather = op.kind == OpKind::all_gather && op.tensor == TensorRole::gradient;
    const bool sync =
        op.kind == OpKind::reduce_scatter || op.kind == OpKind::all_reduce || gradient_gather;
    const bool reader = op.kind == OpKind::momentum || op.kind == OpKind::adamw;
    if ((!sync && !reader) || !op.ranks.contains(mesh, rank)) continue;
    if (gradient_gather)
      for (int p : op.params)
        if (params[p].layout.holds(mesh, rank))
          gathered[p] = std::max(gathered[p], piece_numel(plan, p, rank, op.gathered | op.group));
    const DimSet input = op.kind == OpKind::reduce_scatter ? op.gathered | op.group : op.gathered;
    for (int p : op.params) {
      if (!params[p].layout.holds(mesh, rank)) continue;
      if (reader && op.owned_only && plan.assignment.owner[p] != rank) continue;
      const std::int64_t piece = piece_numel(plan, p, rank, input);
      if (!gradient_found[p]) {
        gradient_found[p] = 1;
        gradient[p] = piece;
      }
      if (op.kind == OpKind::momentum) momentum[p] = piece;
      if (op.kind == OpKind::adamw) moments[p] = piece;
    }
  }
  const MasterWeights master = plan.settings.training_memory.master_weights;
  // In a training step each layer's gradient is synced as its backward ends (FSDP2's per-layer
  // reduce-scatter): the slot keeps the synced piece, and one layer's unsynced gradient is held
  // at a time (the largest layer's, counted once on top).
  const bool per_layer = plan.settings.training.enabled;
  std::map<int, std::int64_t> unsynced_by_layer;
  for (const auto& dp : params) {
    if (!dp.layout.holds(mesh, rank)) continue;
    const std::int64_t shard = dp.layout.shard_numel(mesh, rank);
    // The gradient slot also holds Muon's update and result outside transient buffers.
    const std::int64_t slot =
        per_layer ? std::max({shard, momentum[dp.index], gathered[dp.index]})
                  : std::max({shard, gradient[dp.index], momentum[dp.index], gathered[dp.index]});
    if (per_layer && gradient[dp.index] > slot)
      unsynced_by_layer[dp.layer] += (gradient[dp.index] - slot) * gradient_width(dp, comm);
    memory.parameters += shard * bytes_of(dp.dtype);
    memory.gradients += slot * gradient_width(dp, comm);
    memory.optimizer_state += (momentum[dp.index] + 2 * moments[dp.index]) * state;
    memory.master_weights += master_weight_bytes(dp, shard, master);
  }
  std::int64_t largest_unsynced = 0;
  for (const auto& [layer, bytes] : unsynced_by_layer)
    largest_unsynced = std::max(largest_unsynced, bytes);
  memory.gradients += largest_unsynced;
  std::int64_t live = 0;
  const std::vector<int>& same_buffer = same.empty() ? same_buffers(plan) : same;
  std::vector<std::int64_t> sized(plan.buffers.size(), -1);  // per class of same_buffer
  for (const auto& op : plan.ops) {
    if (!is_memory(op.kind) || !op.ranks.contains(mesh, rank)) continue;
    std::int64_t& bytes = sized[static_cast<std::size_t>(same_buffer.at(op.buffer))];
    if (bytes < 0) bytes = buffer_bytes(plan, plan.buffers[op.buffer], rank);
    live += op.kind == OpKind::alloc ? bytes : -bytes;
    memory.peak_transient = std::max(memory.peak_transient, live);
  }
  return memory;
}

}  // namespace

RankMemory rank_memory(const StepPlan& plan, int rank) {
  const StaticMemory m = static_memory(plan, rank);
  RankMemory memory;
  memory.static_bytes = m.parameters + m.gradients + m.optimizer_state;
  memory.peak_transient_bytes = m.peak_transient;
  return memory;
}

std::int64_t ns_workspace_bytes(std::int64_t rows, std::int64_t cols, std::int64_t batch) {
  const std::int64_t m = std::min(rows, cols);
  const std::int64_t bf16 = bytes_of(DType::bf16);
  return batch * (2 * rows * cols + 2 * m * m) * bf16;
}

namespace {

TrainingMemory training_memory_of(const StepPlan& plan, int rank, const std::vector<int>& same) {
  const StaticMemory m = static_memory(plan, rank, same);
  TrainingMemory memory;
  memory.parameters = m.parameters;
  memory.master_weights = m.master_weights;
  memory.gradients = m.gradients;
  memory.optimizer_state = m.optimizer_state;
  // The largest Newton-Schulz call this rank makes: one call at a time per compute stream, and
  // the scratch of one call is freed before the next.
  std::int64_t workspace = 0;
  for (const auto& op : plan.ops) {
    if (op.kind != OpKind::newton_schulz || !op.ranks.contains(plan.mesh(), rank)) continue;
    for (const MatrixWork& w : ns_work(plan, op, rank))
      workspace = std::max(workspace, ns_workspace_bytes(w.rows, w.cols, w.batch));
  }
  memory.step_buffers = m.peak_transient;
  memory.ns_workspace = workspace;
  memory.activations = training_activations(plan.model, plan.settings);
  memory.reserved = plan.settings.training_memory.reserved_bytes;
  memory.overlapping =
      plan.settings.training.enabled && plan.settings.training.overlap == "backward";
  return memory;
}

}  // namespace

TrainingMemory training_memory(const StepPlan& plan, int rank) {
  return training_memory_of(plan, rank, {});
}

namespace {

// Ranks whose memory figures are equal, so that each class is computed once: every rank's static
// memory and transient buffers cost ranks x (params + op pieces) shard sizes, too slow for
// `muonbed plan` at 16,384 ranks. static_memory and training_memory see a rank only through which
// op boxes contain it (its coordinates where a box fixes one), which params it holds and the sizes
// of its pieces (TensorLayout::size_breaks), and which params it owns. So ranks that own none and
// whose coordinates lie, dim by dim, in the same intervals between those breaks get equal figures;
// an owner is a class of its own.
struct RankClasses {
  std::vector<int> class_of;        // index = rank
  std::vector<int> representative;  // index = class: its lowest rank
};

RankClasses memory_classes(const StepPlan& plan) {
  const DeviceMesh& mesh = plan.mesh();
  const int world = mesh.world_size();
  const int nd = mesh.ndims();
  // interval[d][c]: which interval between dim d's breaks holds coordinate c; count[d] of them.
  std::vector<std::vector<int>> interval(nd);
  std::vector<int> count(nd, 1);
  std::vector<int> breaks;
  for (int d = 0; d < nd; ++d) {
    const int k = mesh.size(d);
    breaks.clear();
    for (const auto& dp : plan.model.params) dp.layout.size_breaks(d, breaks);
    for (const auto& op : plan.ops) {
      if (d >= static_cast<int>(op.ranks.coord.size()) || op.ranks.coord[d] == RankBox::kAll)
        continue;
      breaks.push_back(op.ranks.coord[d]);
      breaks.push_back(op.ranks.coord[d] + 1);
    }
    std::erase_if(breaks, [&](int b) { return b <= 0 || b >= k; });
    std::sort(breaks.begin(), breaks.end());
    breaks.erase(std::unique(breaks.begin(), breaks.end()), breaks.end());
    interval[d].resize(k);
    std::size_t passed = 0;
    for (int c = 0; c < k; ++c) {
      while (passed < breaks.size() && breaks[passed] <= c) ++passed;
      interval[d][c] = static_cast<int>(passed);
    }
    count[d] = static_cast<int>(breaks.size()) + 1;
  }
  std::vector<char> owns(world, 0);
  for (int owner : plan.assignment.owner)
    if (owner >= 0 && owner < world) owns[owner] = 1;
  // Each dim has at most its size of intervals, so the keys number at most world.
  std::vector<int> class_of_key(world, -1);
  RankClasses classes;
  classes.class_of.resize(world);
  for (int r = 0; r < world; ++r) {
    int key = 0;
    for (int d = 0; d < nd; ++d) key = key * count[d] + interval[d][mesh.coord(r, d)];
    int& known = class_of_key[key];
    if (owns[r] || known < 0) {
      classes.class_of[r] = static_cast<int>(classes.representative.size());
      classes.representative.push_back(r);
      if (!owns[r]) known = classes.class_of[r];
    } else {
      classes.class_of[r] = known;
    }
  }
  return classes;
}

}  // namespace

std::vector<TrainingMemory> training_memories(const StepPlan& plan) {
  const RankClasses classes = memory_classes(plan);
  std::vector<TrainingMemory> of_class;
  of_class.reserve(classes.representative.size());
  const std::vector<int> same = same_buffers(plan);
  for (int r : classes.representative) of_class.push_back(training_memory_of(plan, r, same));
  std::vector<TrainingMemory> out;
  out.reserve(classes.class_of.size());
  for (int c : classes.class_of) out.push_back(of_class[c]);
  return out;
}

TrainingMemory training_memory_floor(const ShardedModel& model, const PlanSettings& settings,
                                     int rank) {
  TrainingMemory memory;
  const std::int64_t comm = bytes_of(settings.comm_dtype());
  for (const auto& dp : model.params) {
    if (!dp.layout.holds(model.mesh, rank)) continue;
    const std::int64_t shard = dp.layout.shard_numel(model.mesh, rank);
    memory.parameters += shard * bytes_of(dp.dtype);
    memory.gradients += shard * gradient_width(dp, comm);
    memory.master_weights +=
        master_weight_bytes(dp, shard, settings.training_memory.master_weights);
  }
  memory.activations = training_activations(model, settings);
  memory.reserved = settings.training_memory.reserved_bytes;
  return memory;
}

MemoryFeasibility memory_feasibility(const std::vector<TrainingMemory>& ranks,
                                     std::int64_t limit_bytes) {
  MemoryFeasibility f;
  f.limit_bytes = limit_bytes;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::int64_t peak = ranks[r].peak_bytes();
    if (r == 0 || peak > f.peak_bytes) {
      f.peak_bytes = peak;
      f.peak_rank = static_cast<int>(r);
      f.peak = ranks[r];
    }
    if (limit_bytes > 0 && peak > limit_bytes) ++f.over_ranks;
  }
  return f;
}

MemoryFeasibility memory_feasibility(const StepPlan& plan, std::int64_t limit_bytes) {
  return memory_feasibility(training_memories(plan), limit_bytes);
}

namespace {

std::string gib_text(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return text;
}

}  // namespace

std::string memory_feasibility_text(const MemoryFeasibility& f, std::string_view device,
                                    int world_size) {
  const TrainingMemory& m = f.peak;
  // The parts that are there (a floor has no optimizer state or transients yet).
  std::string parts = "parameters " + gib_text(m.parameters);
  const auto part = [&](const char* name, std::int64_t bytes) {
    if (bytes > 0) parts += std::string(", ") + name + " " + gib_text(bytes);
  };
  part("fp32 master weights", m.master_weights);
  part("gradients", m.gradients);
  part("optimizer state", m.optimizer_state);
  part("transients", m.transients());
  part("activations", m.activations);
  part("reserved", m.reserved);
  std::string text = "peak " + gib_text(f.peak_bytes) + " GiB on rank " +
                     std::to_string(f.peak_rank) + " (" + parts + " GiB)";
  if (f.limit_bytes <= 0) return text + "; no memory limit known for " + std::string(device);
  if (f.feasible())
    return text + " fits the " + gib_text(f.limit_bytes) + " GiB of one " + std::string(device);
  return text + " exceeds the " + gib_text(f.limit_bytes) + " GiB of one " + std::string(device) +
         " on " + std::to_string(f.over_ranks) + " of " + std::to_string(world_size) + " ranks";
}

std::string_view to_string(MasterWeights master) {
  switch (master) {
    case MasterWeights::automatic:
      return "auto";
    case MasterWeights::fp32:
      return "fp32";
    case MasterWeights::none:
      return "none";
  }
  return "?";
}

MasterWeights master_weights_from_string(std::string_view text) {
  if (text == "auto") return MasterWeights::automatic;
  if (text == "fp32") return MasterWeights::fp32;
  if (text == "none") return MasterWeights::none;
  throw Error("unknown master_weights '" + std::string(text) + "'; use auto, fp32 or none");
}

RankSummary summarize_rank(const StepPlan& plan, int rank) {
  RankSummary s;
  s.rank = rank;
  for (int p = 0; p < static_cast<int>(plan.assignment.owner.size()); ++p)
    if (plan.assignment.owner[p] == rank) ++s.matrices_owned;
  for (const auto& op : plan.ops) {
    if (!op.ranks.contains(plan.mesh(), rank)) continue;
    if (op.kind == OpKind::newton_schulz || op.kind == OpKind::split_newton_schulz)
      s.ns_flops += op_flops(plan, op, rank);
    if (is_collective(op.kind) && op.kind != OpKind::barrier) {
      for (auto b : bytes_sent(plan, op, rank)) s.bytes_sent += b;
      for (auto b : bytes_received(plan, op, rank)) s.bytes_received += b;
    }
  }
  s.memory = rank_memory(plan, rank);
  return s;
}

namespace {

// One collective instance's bytes sent and received per member, summed over its peers: the totals
// of bytes_sent and bytes_received, computed once per instance instead of once per member and
// peer (all_to_all over n members was O(n^2 x params) per instance that way).
void add_instance_traffic(const StepPlan& plan, const Op& op, const std::vector<int>& members,
                          std::vector<RankSummary>& out) {
  const int n = static_cast<int>(members.size());
  const std::int64_t width = comm_bytes(plan);
  const auto sent = [&](int i, std::int64_t b) { out[members[i]].bytes_sent += b; };
  const auto received = [&](int i, std::int64_t b) { out[members[i]].bytes_received += b; };
  const auto pieces = [&](int i) { return pieces_bytes(plan, op, members[i], op.gathered); };
  switch (op.kind) {
    case OpKind::gather:
    case OpKind::scatter: {
      // Every member but the root moves its own piece to (gather) or from (scatter) the root.
      std::int64_t total = 0;
      for (int i = 0; i < n; ++i) {
        if (i == op.root) continue;
        const std::int64_t b = pieces(i);
        total += b;
        op.kind == OpKind::gather ? sent(i, b) : received(i, b);
      }
      op.kind == OpKind::gather ? received(op.root, total) : sent(op.root, total);
      break;
    }
    case OpKind::broadcast: {
      const std::int64_t b = pieces(op.root);
      sent(op.root, (n - 1) * b);
      for (int i = 0; i < n; ++i)
        if (i != op.root) received(i, b);
      break;
    }
    case OpKind::all_gather:
    case OpKind::reduce_scatter: {
      // all_gather: each member sends its piece to every other and receives theirs.
      // reduce_scatter: each member sends every other that member's part, and receives its own
      // part from each.
      std::vector<std::int64_t> piece(n);
      std::int64_t total = 0;
      for (int i = 0; i < n; ++i) {
        piece[i] = op.kind == OpKind::all_gather ? piece_bytes(plan, op, members[i]) : pieces(i);
        total += piece[i];
      }
      for (int i = 0; i < n; ++i) {
        const std::int64_t own = (n - 1) * piece[i], others = total - piece[i];
        op.kind == OpKind::all_gather ? sent(i, own) : sent(i, others);
        op.kind == OpKind::all_gather ? received(i, others) : received(i, own);
      }
      break;
    }
    case OpKind::all_reduce: {
      // Member `me` of total T_me sends each other member i chunk_share(T_me, i) +
      // chunk_share(T_me, me) (bytes_sent), and the chunk shares of one total sum to it.
      std::vector<std::int64_t> total(n);
      std::map<std::int64_t, int> totals;  // distinct totals and how many members hold each
      std::int64_t own_shares = 0;         // sum over i of chunk_share(T_i, n, i)
      for (int i = 0; i < n; ++i) {
        total[i] = pieces(i) / width;
        ++totals[total[i]];
        own_shares += chunk_share(total[i], n, i);
      }
      for (int me = 0; me < n; ++me) {
        const std::int64_t mine = chunk_share(total[me], n, me);
        sent(me, (total[me] - mine + (n - 1) * mine) * width);
        std::int64_t from_others = -mine + (own_shares - mine);
        for (const auto& [t, count] : totals) from_others += count * chunk_share(t, n, me);
        received(me, from_others * width);
      }
      break;
    }
    case OpKind::all_to_all:
      for (const PairBytes& t : all_to_all_transfers(plan, op, members)) {
        sent(t.from, t.bytes);
        received(t.to, t.bytes);
      }
      break;
    case OpKind::send:
    case OpKind::recv: {
      const std::int64_t b = pieces(op.root);
      sent(op.root, b);
      received(op.peer, b);
      break;
    }
    case OpKind::split_newton_schulz:
      // Symmetric: each member exchanges with every other its part and theirs of each all-reduce.
      for (int me = 0; me < n; ++me) {
        const SplitNsExchange x = split_ns_exchange(plan, op, members[me]);
        const auto pairs = [&](std::int64_t t) {
          const std::int64_t mine = chunk_share(t, n, me);
          return t - mine + (n - 1) * mine;
        };
        const std::int64_t b = pairs(x.norm_elements) * bytes_of(DType::fp32) +
                               x.steps * pairs(x.gram_elements) * width;
        sent(me, b);
        received(me, b);
      }
      break;
    default:
      break;
  }
}

}  // namespace

std::vector<RankSummary> summarize_ranks(const StepPlan& plan,
                                         const std::vector<TrainingMemory>* training) {
  const DeviceMesh& mesh = plan.mesh();
  const int world = mesh.world_size();
  std::vector<RankSummary> out(world);
  for (int r = 0; r < world; ++r) out[r].rank = r;
  for (int owner : plan.assignment.owner)
    if (owner >= 0 && owner < world) ++out[owner].matrices_owned;
  std::vector<int> members;
  for (const Op& op : plan.ops) {
    if (op.kind == OpKind::newton_schulz || op.kind == OpKind::split_newton_schulz)
      for (int r : op.ranks.ranks(mesh)) out[r].ns_flops += op_flops(plan, op, r);
    if (!is_collective(op.kind) || op.kind == OpKind::barrier) continue;
    for (int r : op.ranks.ranks(mesh)) {
      if (mesh.group_leader(r, op.group) != r) continue;
      members = mesh.group_members(r, op.group);
      add_instance_traffic(plan, op, members, out);
    }
  }
  const std::vector<TrainingMemory> computed =
      training ? std::vector<TrainingMemory>{} : training_memories(plan);
  for (int r = 0; r < world; ++r)
    out[r].memory = (training ? training->at(r) : computed[r]).optimizer_step();
  return out;
}

void validate_plan(const StepPlan& plan) {
  const auto& mesh = plan.mesh();
  const int nparams = static_cast<int>(plan.model.params.size());
  std::map<int, int> open_buffers;  // buffer -> alloc op
  auto fail = [&](const Op& op, const std::string& what) {
    throw PlanError("plan op " + std::to_string(op.id) + " (" + std::string(to_string(op.kind)) +
                    (op.label.empty() ? "" : " '" + op.label + "'") + "): " + what);
  };
  for (int i = 0; i < static_cast<int>(plan.ops.size()); ++i) {
    const Op& op = plan.ops[i];
    if (op.id != i) fail(op, "id must equal its position " + std::to_string(i));
    if (op.stream < 0 || op.stream >= static_cast<int>(plan.streams.size()))
      fail(op, "stream " + std::to_string(op.stream) + " does not exist");
    if (static_cast<int>(op.ranks.coord.size()) != mesh.ndims())
      fail(op, "rank box has " + std::to_string(op.ranks.coord.size()) + " coords, mesh has " +
                   std::to_string(mesh.ndims()) + " dims");
    for (int d = 0; d < mesh.ndims(); ++d) {
      const int c = op.ranks.coord[d];
      if (c != RankBox::kAll && (c < 0 || c >= mesh.size(d)))
        fail(op, "rank box coordinate " + std::to_string(c) + " outside dim " + mesh.dim(d).name);
    }
    if (op.period < 1) fail(op, "period must be >= 1");
    for (int dep : op.deps)
      if (dep < 0 || dep >= i) fail(op, "dependency " + std::to_string(dep) + " is not earlier");
    for (int p : op.params)
      if (p < 0 || p >= nparams) fail(op, "parameter " + std::to_string(p) + " does not exist");
    if (is_collective(op.kind)) {
      if ((op.group & op.ranks.free_dims()) != op.group)
        fail(op, "group dims must be free dims of its rank box");
      const int n = mesh.group_size(op.group);
      const bool rooted = op.kind == OpKind::gather || op.kind == OpKind::scatter ||
                          op.kind == OpKind::broadcast || op.kind == OpKind::send ||
                          op.kind == OpKind::recv;
      if (rooted && (op.root < 0 || op.root >= n))
        fail(op, "root " + std::to_string(op.root) + " outside its group of " + std::to_string(n));
      if ((op.kind == OpKind::send || op.kind == OpKind::recv) &&
          (op.peer < 0 || op.peer >= n || op.peer == op.root))
        fail(op, "peer must be another member of the group");
      // Every member of every instance must hold the params it moves.
      for (int p : op.params) {
        const auto& layout = plan.model.params[p].layout;
        for (int d = 0; d < mesh.ndims(); ++d) {
          if (!layout.independent_dims().contains(d)) continue;
          if (op.ranks.coord[d] != layout.placements()[d].coord)
            fail(op, "moves '" + plan.model.params[p].name + "' on ranks that do not hold it");
        }
      }
    }
    if (op.kind == OpKind::split_newton_schulz) {
      if (op.group.empty()) fail(op, "split Newton-Schulz needs a group to split over");
      if (op.owned_only) fail(op, "split Newton-Schulz runs on every member: owned_only is off");
      if (op.ns_steps < 1) fail(op, "ns_steps must be >= 1");
      const int first = op.ranks.ranks(mesh).front();
      for (int p : op.params) {
        if (plan.model.params[p].optimizer != OptimizerKind::muon)
          fail(op, "splits the NS of '" + plan.model.params[p].name + "', which AdamW updates");
        const std::string why = split_ns_problem(plan.model, p, first, op.gathered, op.group);
        if (!why.empty()) fail(op, why);
      }
    }
    const bool moves_data = is_collective(op.kind) && op.kind != OpKind::barrier;
    if (moves_data || op.kind == OpKind::pack || op.kind == OpKind::unpack) {
      const bool reduction = op.kind == OpKind::reduce_scatter || op.kind == OpKind::all_reduce;
      if (op.tensor == TensorRole::none)
        fail(op, "moves data but names no tensor (gradient, update or result)");
      if (op.tensor == TensorRole::activation) {
        // The training step's activations: sized by the op, no params.
        const bool fits = op.kind == OpKind::all_reduce || op.kind == OpKind::all_gather ||
                          op.kind == OpKind::all_to_all || op.kind == OpKind::send ||
                          op.kind == OpKind::recv;
        if (!fits) fail(op, "activations move by all_reduce, all_gather, all_to_all or send");
        if (op.bytes < 0) fail(op, "activation bytes must not be negative");
        if (!op.params.empty()) fail(op, "an activation collective names no params");
      } else if (op.tensor == TensorRole::parameter) {
        if (op.kind != OpKind::all_gather || op.owned_only)
          fail(op, "parameters move by an all_gather of the members' shards only");
      } else if (op.tensor == TensorRole::gradient && op.kind == OpKind::all_gather) {
        // TP slices of a gradient that a strategy needs whole (core/plan/src/build_plan.cpp).
        if (op.owned_only) fail(op, "a gradient all_gather moves the members' pieces only");
      } else if (reduction != (op.tensor == TensorRole::gradient)) {
        fail(op, reduction
                     ? "reductions move the gradient, not the " + std::string(to_string(op.tensor))
                     : "only reductions and all_gathers move the gradient");
      }
    } else if (op.tensor != TensorRole::none) {
      fail(op, "names a tensor (" + std::string(to_string(op.tensor)) +
                   ") but moves no data; leave it none");
    }
    if ((op.kind == OpKind::pack || op.kind == OpKind::unpack) && op.buffer != -1 &&
        (op.buffer < 0 || op.buffer >= static_cast<int>(plan.buffers.size())))
      fail(op, "staging buffer " + std::to_string(op.buffer) + " does not exist");
    if (!is_memory(op.kind) && op.kind != OpKind::pack && op.kind != OpKind::unpack &&
        op.buffer != -1)
      fail(op, "names buffer " + std::to_string(op.buffer) +
                   " but only alloc, release, pack and unpack use buffers");
    if (is_memory(op.kind)) {
      if (op.buffer < 0 || op.buffer >= static_cast<int>(plan.buffers.size()))
        fail(op, "buffer " + std::to_string(op.buffer) + " does not exist");
      if (op.kind == OpKind::alloc) {
        if (open_buffers.count(op.buffer)) fail(op, "buffer allocated twice");
        open_buffers[op.buffer] = op.id;
      } else {
        if (!open_buffers.count(op.buffer)) fail(op, "buffer released before allocation");
        if (!(plan.ops[open_buffers[op.buffer]].ranks == op.ranks))
          fail(op, "buffer released on other ranks than it was allocated on");
        open_buffers.erase(op.buffer);
      }
    }
  }
  if (!open_buffers.empty()) {
    const auto& op = plan.ops[open_buffers.begin()->second];
    fail(op, "buffer " + plan.buffers[op.buffer].name + " is never released");
  }
}

}  // namespace muonbed
