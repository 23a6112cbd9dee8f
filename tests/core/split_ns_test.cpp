// split_ns_problem (core/plan/split_ns.hpp), exhaustively on small meshes: whether a group's
// slices of a matrix cover its split dim exactly once, against the count of every index the
// members hold. Layouts mix contiguous and strided shards of rows and columns, uneven sizes and
// replicated dims; groups and gathered dims run over every pair of disjoint subsets of the
// layout's shard dims, from every rank.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/model/parallelize.hpp"
#include "core/plan/split_ns.hpp"

using namespace muonbed;

namespace {

// Every index of the split dim held by the group's members, counted: exactly once each.
bool covers_exactly_once(const ShardedModel& model, int rank, DimSet gathered, DimSet group,
                         int dim) {
  const DistributedParam& dp = model.params.front();
  std::vector<int> count(static_cast<std::size_t>(dp.shape[static_cast<std::size_t>(dim)]), 0);
  for (int m : model.mesh.group_members(rank, group))
    for (std::int64_t i : dp.layout.index_set(model.mesh, m, gathered).dims[dim].to_vector())
      ++count[static_cast<std::size_t>(i)];
  for (int c : count)
    if (c != 1) return false;
  return true;
}

}  // namespace

TEST_CASE(
    "split_ns_problem: a group's slices cover the split dim exactly when every index "
    "is held once",
    "[split_ns]") {
  const std::vector<Placement> placements = {Placement::replicate(),
                                             Placement::shard(0),
                                             Placement::shard(1),
                                             Placement::strided_shard(0, 2),
                                             Placement::strided_shard(1, 2),
                                             Placement::strided_shard(0, 3)};
  const std::vector<std::vector<int>> meshes = {{2, 2}, {2, 3}, {3, 2}, {2, 2, 2}};
  const std::vector<std::vector<std::int64_t>> shapes = {{12, 4}, {4, 12}, {13, 5}, {6, 6}};
  std::map<std::string, int> outcomes;  // "cover", "no cover", other reasons
  for (const auto& sizes : meshes) {
    std::vector<MeshDim> dims;
    int world = 1;
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      dims.push_back({"d" + std::to_string(d), sizes[d], DimRole::fsdp});
      world *= sizes[d];
    }
    const DeviceMesh mesh(dims, world);
    const int nd = static_cast<int>(sizes.size());
    // every assignment of a placement to each mesh dim
    std::vector<std::size_t> pick(sizes.size(), 0);
    for (;;) {
      std::vector<Placement> chosen;
      for (std::size_t d = 0; d < sizes.size(); ++d) chosen.push_back(placements[pick[d]]);
      for (const auto& shape : shapes) {
        TensorLayout layout;
        try {
          layout = TensorLayout(mesh, shape, chosen);
        } catch (const Error&) {
          continue;  // a placement this shape cannot take
        }
        DistributedParam dp;
        dp.name = "w";
        dp.shape = shape;
        dp.layout = layout;
        const ShardedModel model{mesh, "split", {dp}};
        const DimSet shard = layout.shard_dims();
        for (std::uint32_t g = 1; g < (1u << nd); ++g) {
          const DimSet group{g};
          if ((group & shard) != group) continue;  // groups split along shard dims
          for (std::uint32_t h = 0; h < (1u << nd); ++h) {
            const DimSet gathered{h};
            if ((gathered & shard) != gathered || !(gathered & group).empty()) continue;
            for (int rank = 0; rank < world; ++rank) {
              INFO(layout.describe(mesh)
                   << ", group " << g << ", gathered " << h << ", rank " << rank);
              const std::string why = split_ns_problem(model, 0, rank, gathered, group);
              const bool cover_reason = why.find("exactly once") != std::string::npos;
              if (!why.empty() && !cover_reason) {
                ++outcomes["other"];
                continue;
              }
              const SplitNsSlice slice = split_ns_slice(model, 0, rank, gathered);
              const bool exact =
                  covers_exactly_once(model, rank, gathered, group, slice.rows ? 0 : 1);
              CHECK(why.empty() == exact);
              ++outcomes[exact ? "cover" : "no cover"];
            }
          }
        }
      }
      std::size_t d = 0;
      while (d < pick.size() && ++pick[d] == placements.size()) pick[d++] = 0;
      if (d == pick.size()) break;
    }
  }
  // Both answers, many times each, and the other reasons too: the check is not vacuous.
  CHECK(outcomes["cover"] > 100);
  CHECK(outcomes["no cover"] > 100);
  CHECK(outcomes["other"] > 100);
}
