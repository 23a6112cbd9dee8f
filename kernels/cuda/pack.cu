// Shard pack/unpack on the device: moves a rank's shard (any ShardIndexSet, strided included)
// between the full row-major tensor and a contiguous buffer, reading the host-built offset table
// (kernels/shard_table.hpp). Element types are moved as raw 2-, 4- or 8-byte words.
#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/gpu.hpp"

namespace muonbed {
namespace {

// packed[p] = full[rows[p / ncols] + cols[p % ncols]]: consecutive threads read consecutive
// columns of a row, so contiguous column runs coalesce.
template <typename Word>
__global__ void pack_kernel(const Word* full, Word* packed, const long long* rows,
                            const long long* cols, long long ncols, long long total) {
  for (long long p = blockIdx.x * 256LL + threadIdx.x; p < total; p += 256LL * gridDim.x) {
    packed[p] = full[rows[p / ncols] + cols[p % ncols]];
  }
}

template <typename Word>
__global__ void unpack_kernel(const Word* packed, Word* full, const long long* rows,
                              const long long* cols, long long ncols, long long total) {
  for (long long p = blockIdx.x * 256LL + threadIdx.x; p < total; p += 256LL * gridDim.x) {
    full[rows[p / ncols] + cols[p % ncols]] = packed[p];
  }
}

template <typename Word>
void launch(CudaContext& ctx, const DeviceShardTable& t, const void* src, void* dst, bool pack) {
  const long long total = t.numel();
  const auto* rows = reinterpret_cast<const long long*>(t.row_offsets());
  const auto* cols = reinterpret_cast<const long long*>(t.cols());
  if (pack) {
    pack_kernel<Word><<<cuda_detail::grid_for(total), 256, 0, ctx.stream()>>>(
        static_cast<const Word*>(src), static_cast<Word*>(dst), rows, cols, t.num_cols(), total);
  } else {
    unpack_kernel<Word><<<cuda_detail::grid_for(total), 256, 0, ctx.stream()>>>(
        static_cast<const Word*>(src), static_cast<Word*>(dst), rows, cols, t.num_cols(), total);
  }
  MUONBED_CUDA_CHECK(cudaGetLastError());
}

void dispatch(CudaContext& ctx, const DeviceShardTable& t, const void* src, void* dst,
              int element_bytes, bool pack) {
  if (t.numel() == 0) return;
  switch (element_bytes) {
    case 2:
      return launch<std::uint16_t>(ctx, t, src, dst, pack);
    case 4:
      return launch<std::uint32_t>(ctx, t, src, dst, pack);
    case 8:
      return launch<std::uint64_t>(ctx, t, src, dst, pack);
    default:
      throw Error("shard pack/unpack: element size " + std::to_string(element_bytes) +
                  " bytes; supported: 2, 4, 8");
  }
}

}  // namespace

DeviceShardTable::DeviceShardTable(const ShardOffsetTable& table)
    : num_rows_(static_cast<std::int64_t>(table.row_offsets.size())),
      num_cols_(static_cast<std::int64_t>(table.cols.size())) {
  static_assert(sizeof(long long) == sizeof(std::int64_t), "offsets are uploaded as int64");
  if (numel() == 0) {
    num_rows_ = num_cols_ = 0;
    return;
  }
  rows_ = to_device(table.row_offsets);
  cols_ = to_device(table.cols);
}

void pack_shard_cuda(CudaContext& ctx, const DeviceShardTable& table, const void* full,
                     void* packed, int element_bytes) {
  dispatch(ctx, table, full, packed, element_bytes, true);
}

void unpack_shard_cuda(CudaContext& ctx, const DeviceShardTable& table, const void* packed,
                       void* full, int element_bytes) {
  dispatch(ctx, table, packed, full, element_bytes, false);
}

}  // namespace muonbed
