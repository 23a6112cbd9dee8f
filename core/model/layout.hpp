// Placements of a tensor on a device mesh and the exact index sets each rank holds.
//
// A parameter has one Placement per mesh dimension. Shards are applied to mesh dimensions left
// to right (outermost first), each splitting the index list the previous ones left, as DTensor
// does. Splits follow torch.chunk: chunk size ceil(n/k), so trailing shards are smaller or empty.
//
//   Shard(d)             the current index list of tensor dim d is cut into k chunks; the rank
//                        takes chunk `coord`.
//   StridedShard(d, f)   the current list is first viewed as f chunks (torch.chunk), each is cut
//                        into k pieces, and the rank takes piece `coord` of every chunk. This is
//                        FSDP2's _StridedShard on top of TP: with mesh [dp_shard, tp] and both
//                        sharding dim 0, dp_shard is StridedShard(0, tp) and tp is Shard(0).
//   Replicate            every coordinate holds the same data.
//   Independent(c)       the tensor exists only at coordinate c of this dimension (PP stages own
//                        layers, EP ranks own experts); elsewhere a rank holds nothing of it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/model/mesh.hpp"

namespace muonbed {

enum class PlacementKind { replicate, shard, strided_shard, independent };

struct Placement {
  PlacementKind kind = PlacementKind::replicate;
  int tensor_dim = 0;    // shard, strided_shard
  int split_factor = 1;  // strided_shard
  int coord = 0;         // independent

  static Placement replicate() { return {}; }
  static Placement shard(int tensor_dim) { return {PlacementKind::shard, tensor_dim, 1, 0}; }
  static Placement strided_shard(int tensor_dim, int split_factor) {
    return {PlacementKind::strided_shard, tensor_dim, split_factor, 0};
  }
  static Placement independent(int coord) { return {PlacementKind::independent, 0, 1, coord}; }
  bool is_shard() const {
    return kind == PlacementKind::shard || kind == PlacementKind::strided_shard;
  }
  bool operator==(const Placement&) const = default;
  std::string to_string() const;  // "R", "S(0)", "SS(0,8)", "I(3)"
};

struct IndexRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;  // exclusive
  std::int64_t size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};

// A sorted set of indices along one tensor dimension, stored as disjoint, non-adjacent ranges
// (a contiguous shard is one range, a strided shard many).
class IndexList {
 public:
  IndexList() = default;
  static IndexList range(std::int64_t begin, std::int64_t end);
  // Builds from ranges in any order; overlapping or adjacent ranges are merged.
  static IndexList from_ranges(std::vector<IndexRange> ranges);

  const std::vector<IndexRange>& ranges() const { return ranges_; }
  std::int64_t size() const;
  bool empty() const { return ranges_.empty(); }
  bool contains(std::int64_t index) const;
  // The i-th smallest index (0 <= i < size()).
  std::int64_t at(std::int64_t i) const;
  // The sub-list of positions [begin, end) of this list.
  IndexList slice(std::int64_t begin, std::int64_t end) const;
  IndexList unite(const IndexList& other) const;
  std::vector<std::int64_t> to_vector() const;
  bool operator==(const IndexList&) const = default;

 private:
  std::vector<IndexRange> ranges_;
};

// The part of a tensor a rank holds: the cartesian product of one IndexList per tensor dim.
struct ShardIndexSet {
  std::vector<IndexList> dims;
  std::int64_t numel() const;
  bool empty() const { return numel() == 0; }
  std::string to_string() const;  // "{0:2,4:6} x {0:8}" (ranges begin:end per tensor dim)
  bool operator==(const ShardIndexSet&) const = default;
};

// Calls fn(full_offset, packed_offset) for every element of `set` in row-major order of the
// full tensor of `shape`; packed offsets count 0, 1, 2, ... (the shard's contiguous buffer).
void for_each_element(const ShardIndexSet& set, const std::vector<std::int64_t>& shape,
                      const std::function<void(std::int64_t, std::int64_t)>& fn);

// One tensor laid out on a mesh. Cheap to copy: holds shape and placements, not data.
class TensorLayout {
 public:
  TensorLayout() = default;
  // Throws LayoutError when placements.size() != mesh.ndims(), a tensor dim is out of range,
  // a split factor < 1 or an independent coordinate outside its mesh dimension.
  TensorLayout(const DeviceMesh& mesh, std::vector<std::int64_t> shape,
               std::vector<Placement> placements);

  const std::vector<std::int64_t>& shape() const { return shape_; }
  const std::vector<Placement>& placements() const { return placements_; }
  std::int64_t numel() const;

  DimSet shard_dims() const;        // mesh dims whose placement is a (strided) shard
  DimSet replicate_dims() const;    // mesh dims with Replicate
  DimSet independent_dims() const;  // mesh dims with Independent

  // True if `rank` sits at the independent coordinates (it may still hold an empty shard).
  bool holds(const DeviceMesh& mesh, int rank) const;
  // Exact index set of `rank`; empty if !holds(rank).
  ShardIndexSet index_set(const DeviceMesh& mesh, int rank) const;
  // The union of the index sets of `rank`'s group along `gathered` (what a member holds after
  // gathering over those dims). Independent dims in `gathered` are ignored.
  ShardIndexSet index_set(const DeviceMesh& mesh, int rank, DimSet gathered) const;
  std::int64_t shard_numel(const DeviceMesh& mesh, int rank) const;
  std::int64_t shard_numel(const DeviceMesh& mesh, int rank, DimSet gathered) const;
  // The size of each tensor dim of index_set(mesh, rank, gathered), without building its lists
  // (their product is shard_numel; all 0 where !holds(rank)).
  std::vector<std::int64_t> shard_shape(const DeviceMesh& mesh, int rank, DimSet gathered) const;

  // Appends the coordinates of mesh dim `dim` at which what a rank holds of this tensor may
  // change: between two consecutive breaks (0 and the dim's size bound the first and last
  // interval) nothing differs. Ranks whose coordinates lie, dim by dim, in the same intervals
  // agree on holds() and on shard_numel(mesh, rank, gathered) for every `gathered` (their index
  // sets may differ). The planner computes memory once per such class of ranks (core/plan).
  // Unsorted, possibly repeated; none for a replicated dim.
  void size_breaks(int dim, std::vector<int>& out) const;

  std::string describe(const DeviceMesh& mesh) const;  // "[4096,11008] dp_shard:S(0) tp:S(1)"

  // Same shape, placements and mesh sizes: every rank holds the same piece of either.
  bool operator==(const TensorLayout& o) const {
    return shape_ == o.shape_ && placements_ == o.placements_ && mesh_sizes_ == o.mesh_sizes_;
  }

 private:
  // Throws LayoutError if `mesh` has other dimension sizes than the one this layout was built
  // for, or `rank` is outside it.
  void check_mesh(const DeviceMesh& mesh, int rank) const;
  // Reused buffers of extent(): size distributions as (size, count) pairs.
  struct SizeScratch {
    std::vector<std::pair<std::int64_t, std::int64_t>> dist, next, values;
  };
  // The size of tensor dim d of index_set(mesh, rank, gathered) for a rank that holds the tensor.
  std::int64_t extent(const DeviceMesh& mesh, int rank, DimSet gathered, int d,
                      SizeScratch& scratch) const;

  std::vector<std::int64_t> shape_;
  std::vector<Placement> placements_;
  std::vector<int> mesh_sizes_;
};

// Copies `rank`'s shard out of a full row-major tensor into a contiguous buffer, and back.
template <typename T>
void pack_shard(const ShardIndexSet& set, const std::vector<std::int64_t>& shape, const T* full,
                T* packed) {
  for_each_element(set, shape, [&](std::int64_t f, std::int64_t p) { packed[p] = full[f]; });
}
template <typename T>
void unpack_shard(const ShardIndexSet& set, const std::vector<std::int64_t>& shape, const T* packed,
                  T* full) {
  for_each_element(set, shape, [&](std::int64_t f, std::int64_t p) { full[f] = packed[p]; });
}

}  // namespace muonbed
