// Offset tables that move a rank's shard of a tensor (any ShardIndexSet: contiguous, strided,
// several dims) between the full row-major tensor and the shard's contiguous buffer. The table is
// built once on the host; the CPU copies below and the CUDA pack/unpack kernels (kernels/gpu.hpp)
// read the same table, so a GPU copy can be checked against core's pack_shard element by element.
//
// A shard is the product of one index list per dim. The table keeps the last dim's indices
// (`cols`) and, for every combination of the leading dims' indices in row-major order, the full
// tensor offset of that row (`row_offsets`). Packed element i * cols.size() + j is full element
// row_offsets[i] + cols[j]: the packed order is the row-major order of the full tensor, as in
// for_each_element. A 1-D tensor has one row at offset 0.
//
// Plain C++17 (ShardIndexSet is only forward-declared): the CUDA sources include it.
#pragma once

#include <cstdint>
#include <vector>

namespace muonbed {

struct ShardIndexSet;

struct ShardOffsetTable {
  std::vector<std::int64_t> row_offsets;
  std::vector<std::int64_t> cols;
  std::int64_t full_numel = 0;  // elements of the full tensor (bounds for checks)

  std::int64_t numel() const { return static_cast<std::int64_t>(row_offsets.size() * cols.size()); }
};

// Throws LayoutError when set.dims.size() != shape.size() or an index is out of range.
ShardOffsetTable make_shard_offset_table(const ShardIndexSet& set,
                                         const std::vector<std::int64_t>& shape);

// packed[i] = full[...] and back, on the CPU. T is any trivially copyable element type.
template <typename T>
void pack_with_table(const ShardOffsetTable& table, const T* full, T* packed) {
  const std::int64_t ncols = static_cast<std::int64_t>(table.cols.size());
  for (std::size_t i = 0; i < table.row_offsets.size(); ++i) {
    const T* row = full + table.row_offsets[i];
    T* out = packed + static_cast<std::int64_t>(i) * ncols;
    for (std::int64_t j = 0; j < ncols; ++j) out[j] = row[table.cols[j]];
  }
}
template <typename T>
void unpack_with_table(const ShardOffsetTable& table, const T* packed, T* full) {
  const std::int64_t ncols = static_cast<std::int64_t>(table.cols.size());
  for (std::size_t i = 0; i < table.row_offsets.size(); ++i) {
    T* row = full + table.row_offsets[i];
    const T* in = packed + static_cast<std::int64_t>(i) * ncols;
    for (std::int64_t j = 0; j < ncols; ++j) row[table.cols[j]] = in[j];
  }
}

}  // namespace muonbed
