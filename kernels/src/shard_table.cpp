// Builds the row/column offset table of a shard (see kernels/shard_table.hpp).
#include "kernels/shard_table.hpp"

#include <string>

#include "core/base/errors.hpp"
#include "core/model/layout.hpp"

namespace muonbed {

ShardOffsetTable make_shard_offset_table(const ShardIndexSet& set,
                                         const std::vector<std::int64_t>& shape) {
  if (shape.empty()) throw LayoutError("shard table: a tensor needs at least one dim");
  if (set.dims.size() != shape.size()) {
    throw LayoutError("shard table: index set has " + std::to_string(set.dims.size()) +
                      " dims but the tensor has " + std::to_string(shape.size()));
  }
  const std::size_t nd = shape.size();
  std::vector<std::vector<std::int64_t>> indices(nd);
  for (std::size_t d = 0; d < nd; ++d) {
    indices[d] = set.dims[d].to_vector();
    for (std::int64_t i : indices[d]) {
      if (i < 0 || i >= shape[d]) {
        throw LayoutError("shard table: index " + std::to_string(i) + " outside dim " +
                          std::to_string(d) + " of size " + std::to_string(shape[d]));
      }
    }
  }
  std::vector<std::int64_t> stride(nd, 1);
  for (std::size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];

  ShardOffsetTable table;
  table.full_numel = stride[0] * shape[0];
  table.cols = indices[nd - 1];
  // Odometer over the leading dims, last leading dim fastest: row-major order of the tensor.
  table.row_offsets.push_back(0);
  for (std::size_t d = 0; d + 1 < nd; ++d) {
    std::vector<std::int64_t> next;
    next.reserve(table.row_offsets.size() * indices[d].size());
    for (std::int64_t base : table.row_offsets) {
      for (std::int64_t i : indices[d]) next.push_back(base + i * stride[d]);
    }
    table.row_offsets = std::move(next);
  }
  if (table.cols.empty()) table.row_offsets.clear();  // an empty shard has no rows either
  return table;
}

}  // namespace muonbed
