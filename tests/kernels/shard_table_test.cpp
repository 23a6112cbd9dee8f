// Shard offset tables against core's pack_shard/unpack_shard (for_each_element), for contiguous,
// strided and multi-dim shards, including every rank of real layouts on a 2-D mesh.
#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

#include "core/base/errors.hpp"
#include "core/model/layout.hpp"
#include "core/model/mesh.hpp"
#include "kernels/shard_table.hpp"

using namespace muonbed;

namespace {

IndexList ranges(std::vector<IndexRange> r) {
  return IndexList::from_ranges(std::move(r));
}

std::vector<double> iota_tensor(const std::vector<std::int64_t>& shape) {
  const std::int64_t n =
      std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  std::vector<double> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), 0.0);
  return t;
}

// pack with the table == pack_shard; unpack writes exactly the shard's elements back.
void check_against_core(const ShardIndexSet& set, const std::vector<std::int64_t>& shape) {
  const ShardOffsetTable table = make_shard_offset_table(set, shape);
  REQUIRE(table.numel() == set.numel());
  const std::vector<double> full = iota_tensor(shape);
  std::vector<double> want(static_cast<std::size_t>(set.numel())), got(want.size(), -1.0);
  pack_shard(set, shape, full.data(), want.data());
  pack_with_table(table, full.data(), got.data());
  CHECK(got == want);

  std::vector<double> back_core(full.size(), -1.0), back_table(full.size(), -1.0);
  unpack_shard(set, shape, want.data(), back_core.data());
  unpack_with_table(table, want.data(), back_table.data());
  CHECK(back_table == back_core);
}

}  // namespace

TEST_CASE("shard table equals core's pack order for hand-made index sets", "[shard_table]") {
  // 1-D: two ranges.
  check_against_core(ShardIndexSet{{ranges({{2, 5}, {8, 10}})}}, {12});
  // 2-D contiguous row block, strided rows x column block, everything.
  check_against_core(ShardIndexSet{{IndexList::range(2, 4), IndexList::range(0, 6)}}, {5, 6});
  check_against_core(ShardIndexSet{{ranges({{0, 2}, {4, 6}, {8, 10}}), ranges({{1, 3}, {5, 6}})}},
                     {10, 6});
  check_against_core(ShardIndexSet{{IndexList::range(0, 7), IndexList::range(0, 3)}}, {7, 3});
  // 3-D stack of experts: experts {1, 3}, strided rows, a column range.
  check_against_core(
      ShardIndexSet{{ranges({{1, 2}, {3, 4}}), ranges({{0, 1}, {2, 3}}), IndexList::range(1, 4)}},
      {4, 3, 5});
  // Empty shards have empty tables.
  const ShardIndexSet empty{{IndexList{}, IndexList::range(0, 4)}};
  CHECK(make_shard_offset_table(empty, {3, 4}).numel() == 0);
  CHECK(make_shard_offset_table(ShardIndexSet{{IndexList::range(0, 3), IndexList{}}}, {3, 4})
            .numel() == 0);
}

TEST_CASE("shard tables of every rank of FSDP+TP layouts cover the tensor once", "[shard_table]") {
  const DeviceMesh mesh({{"dp_shard", 2, DimRole::fsdp}, {"tp", 3, DimRole::tp}}, 8);
  const std::vector<std::int64_t> shape = {14, 9};
  const std::vector<std::vector<Placement>> layouts = {
      {Placement::strided_shard(0, 3), Placement::shard(0)},  // FSDP2 over TP on dim 0
      {Placement::shard(0), Placement::shard(1)},
      {Placement::shard(1), Placement::shard(0)},
  };
  for (const std::vector<Placement>& placements : layouts) {
    const TensorLayout layout(mesh, shape, placements);
    std::vector<int> hits(static_cast<std::size_t>(shape[0] * shape[1]), 0);
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
      const ShardIndexSet set = layout.index_set(mesh, rank);
      check_against_core(set, shape);
      const ShardOffsetTable table = make_shard_offset_table(set, shape);
      for (std::int64_t r : table.row_offsets)
        for (std::int64_t c : table.cols) ++hits[static_cast<std::size_t>(r + c)];
    }
    for (int h : hits) REQUIRE(h == 1);
  }
}

TEST_CASE("shard table rejects mismatched sets", "[shard_table]") {
  CHECK_THROWS_AS(make_shard_offset_table(ShardIndexSet{{IndexList::range(0, 2)}}, {2, 2}),
                  LayoutError);
  CHECK_THROWS_AS(make_shard_offset_table(
                      ShardIndexSet{{IndexList::range(0, 3), IndexList::range(0, 2)}}, {2, 2}),
                  LayoutError);
}
