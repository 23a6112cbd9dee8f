// Split Newton-Schulz (see core/plan/split_ns.hpp): which slices can split, what they exchange and
// the FLOPs a member computes. What that costs on a modelled cluster is the engine's
// (core/engine/src/split_ns_cost.cpp).
#include "core/plan/split_ns.hpp"

#include <algorithm>
#include <vector>

#include "core/base/errors.hpp"

namespace muonbed {

namespace {

// The slice of p that `rank` holds with `gathered` gathered; sets `why` when it is not a slice
// along one dim, whole along the other, split along the long dim.
SplitNsSlice slice_of(const ShardedModel& model, int p, int rank, DimSet gathered,
                      std::string& why) {
  SplitNsSlice s;
  const DistributedParam& dp = model.params.at(p);
  if (dp.shape.size() != 2) {
    why = "'" + dp.name + "' is a stack of matrices; only 2-D matrices split";
    return s;
  }
  if (!dp.layout.holds(model.mesh, rank)) {
    why = "rank " + std::to_string(rank) + " holds nothing of '" + dp.name + "'";
    return s;
  }
  // Sizes suffice here (the lists are built for the message only): this runs for every member of
  // every candidate group and every NS op's cost.
  const std::vector<std::int64_t> piece = dp.layout.shard_shape(model.mesh, rank, gathered);
  const bool whole_rows = piece[0] == dp.shape[0];
  const bool whole_cols = piece[1] == dp.shape[1];
  if (whole_rows == whole_cols) {
    why = "rank " + std::to_string(rank) + "'s piece " +
          dp.layout.index_set(model.mesh, rank, gathered).to_string() + " of '" + dp.name + "' " +
          (whole_rows ? "is the whole matrix" : "is whole along neither dim");
    return s;
  }
  s.rows = whole_cols;  // whole columns: a slice of rows
  s.gram = s.rows ? dp.shape[1] : dp.shape[0];
  s.split = s.rows ? dp.shape[0] : dp.shape[1];
  s.part = s.rows ? piece[0] : piece[1];
  if (s.gram > s.split)
    why = "'" + dp.name + "' [" + std::to_string(dp.shape[0]) + ", " + std::to_string(dp.shape[1]) +
          "] would split along its short dim (" + std::to_string(s.split) +
          "): its Grams would be larger than the matrix";
  return s;
}

}  // namespace

std::string split_ns_problem(const ShardedModel& model, int p, int rank, DimSet gathered,
                             DimSet group) {
  std::string why;
  const SplitNsSlice mine = slice_of(model, p, rank, gathered, why);
  if (!why.empty()) return why;
  const DistributedParam& dp = model.params.at(p);
  // The members' slices split the same dim and cover it exactly once: their index ranges, in
  // order, tile [0, split) (ranges rather than indices: a 1,024-GPU plan checks matrices of
  // thousands of rows per candidate group, and sorting every index was a sixth of planning).
  std::vector<IndexRange> ranges;
  for (int m : model.mesh.group_members(rank, group)) {
    const SplitNsSlice s = slice_of(model, p, m, gathered, why);
    if (!why.empty()) return why;
    if (s.rows != mine.rows)
      return "members of the group split '" + dp.name + "' along different dims";
    const ShardIndexSet piece = dp.layout.index_set(model.mesh, m, gathered);
    for (const IndexRange& r : piece.dims[mine.rows ? 0 : 1].ranges())
      if (r.size() > 0) ranges.push_back(r);
  }
  std::sort(ranges.begin(), ranges.end(), [](const IndexRange& a, const IndexRange& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::int64_t covered = 0;  // [0, covered) tiled so far
  bool exact = true;
  for (std::size_t i = 0; exact && i < ranges.size(); ++i) {
    exact = ranges[i].begin == covered;  // before: an index twice; after: one missing
    covered = ranges[i].end;
  }
  exact = exact && covered == mine.split;
  if (!exact)
    return "the group's slices of '" + dp.name + "' do not cover its " +
           (mine.rows ? "rows" : "columns") + " exactly once";
  return "";
}

SplitNsSlice split_ns_slice(const ShardedModel& model, int p, int rank, DimSet gathered) {
  std::string why;
  const SplitNsSlice s = slice_of(model, p, rank, gathered, why);
  if (!why.empty()) throw PlanError("split Newton-Schulz: " + why);
  return s;
}

SplitNsExchange split_ns_exchange(const StepPlan& plan, const Op& op, int rank) {
  SplitNsExchange x;
  x.steps = op.ns_steps;
  for (int p : op.params) {
    const SplitNsSlice s = split_ns_slice(plan.model, p, rank, op.gathered);
    x.norm_elements += 1;
    x.gram_elements += s.gram * s.gram;
  }
  return x;
}

double split_ns_flops(const StepPlan& plan, const Op& op, int rank) {
  double total = 0;
  for (int p : op.params) {
    const SplitNsSlice s = split_ns_slice(plan.model, p, rank, op.gathered);
    const double g = static_cast<double>(s.gram), n = static_cast<double>(s.part);
    total += op.ns_steps * (4.0 * g * g * n + 2.0 * g * g * g);
  }
  return total;
}

}  // namespace muonbed
