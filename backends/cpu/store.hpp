// A rank's memory on the CPU: the storage of a RankProgram's tensors (core/plan/program.hpp), each
// in its plan dtype (ProgramTensor::dtype): fp32 elements as floats, bf16 elements as their 16
// bits. Static tensors are held from construction (zero); transient buffers are allocated by their
// alloc op (filled with NaN, so a read of something never written shows up in the reference
// check) and freed by their release.
//
// Handlers compute in fp32: read() widens exactly, write() rounds to nearest even to the tensor's
// dtype (kernels/bf16.hpp, as the GPU's __float2bfloat16_rn), accumulate() adds in fp32 to the
// stored value and rounds the sum. So a parameter in bf16 is read, updated in fp32 and stored back
// in bf16, as the single-device reference does (kernels/reference_optimizer.hpp with
// round_to_storage_dtypes), and the bytes the store holds are the plan's: its static bytes are
// rank_memory's static_bytes and its peak of live buffers in plan order is rank_memory's
// peak_transient_bytes (tests/backends/memory_test.cpp).
//
// Accounting counts the storage the store holds (bytes of the vectors, not a formula): static
// bytes, live and peak plan buffers, and apart from them scratch, the transient tensors that are no
// plan Buffer (a split Newton-Schulz's workspace, which rank_memory leaves out by design like NS's
// own scratch). The handlers' fp32 working copies of one op's operands are not in the store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/plan/program.hpp"

namespace muonbed::cpu {

class RankStore {
 public:
  explicit RankStore(const RankProgram& program);

  const RankProgram& program() const { return *program_; }
  int rank() const { return program_->rank; }

  void allocate(int tensor);  // throws ExecutionError if it is static or already allocated
  void release(int tensor);
  bool live(int tensor) const { return live_.at(tensor) != 0; }
  DType dtype(int tensor) const;  // the tensor's plan dtype, as stored

  // Elements [offset, offset + count) of a tensor: widened to fp32, rounded to its dtype. Throw
  // ExecutionError if the tensor is not live or the range is outside it.
  void read(int tensor, std::int64_t offset, std::int64_t count, float* out) const;
  void write(int tensor, std::int64_t offset, std::int64_t count, const float* in);
  std::vector<float> read(int tensor, std::int64_t offset, std::int64_t count) const;
  // The storage of an fp32 tensor itself (the split Newton-Schulz workspace, which the handlers
  // update in place); throws ExecutionError for a tensor of another dtype.
  float* fp32_data(int tensor);
  // The raw storage in the tensor's dtype, ProgramTensor::bytes bytes: what a GPU executor
  // uploads and downloads as it is.
  std::byte* bytes(int tensor);
  const std::byte* bytes(int tensor) const;

  // Gathers a view's elements into out[0 .. view.count), scatters them back, adds them in.
  void read(const View& view, float* out) const;
  void write(const View& view, const float* in);
  void accumulate(const View& view, const float* in);
  std::vector<float> read(const View& view) const;
  // A view's elements encoded in a wire dtype (fp32 or bf16, little-endian bytes), and written
  // back from it: exactly read() then rounding to the wire dtype, and decoding then write(), but
  // a run stored in the wire's dtype is copied as it is (the CPU executors' messages move the
  // stored bits without widening and rounding them back, as a GPU's copies do).
  void read_wire(const View& view, DType wire, std::byte* out) const;
  void write_wire(const View& view, DType wire, const std::byte* in);

  // Bytes held (measured from the storage): static tensors, live plan buffers now and at most so
  // far, their sum's peak; scratch (transient tensors that are no plan buffer) apart.
  std::int64_t static_bytes() const { return static_bytes_; }
  std::int64_t live_transient_bytes() const { return live_bytes_; }
  std::int64_t peak_transient_bytes() const { return peak_bytes_; }
  std::int64_t peak_bytes() const { return static_bytes_ + peak_bytes_; }
  std::int64_t peak_scratch_bytes() const { return peak_scratch_bytes_; }

 private:
  // One tensor's elements: floats (fp32) or bf16 bits; the other vector stays empty.
  struct Storage {
    std::vector<float> fp32;
    std::vector<std::uint16_t> bf16;
    std::int64_t bytes() const {
      return static_cast<std::int64_t>(fp32.size() * sizeof(float) +
                                       bf16.size() * sizeof(std::uint16_t));
    }
  };
  void check_range(int tensor, std::int64_t offset, std::int64_t count) const;
  // Elements [at, at + n) widened to fp32 / rounded to the storage's dtype, unchecked.
  static void widen(const Storage& s, std::int64_t at, std::int64_t n, float* out);
  static void narrow(Storage& s, std::int64_t at, std::int64_t n, const float* in);
  template <typename Fn>
  void walk(const View& view, Fn&& fn) const;
  bool scratch(int tensor) const;

  // Released buffers' storage, reused by the next alloc it fits (smallest that fits): a step
  // allocates its transient buffers again every step, and fresh pages cost the OS's zero-fill
  // and a fault per page on the rank's own core, which a GPU's caching allocator does not pay.
  // At most kMaxSpares per dtype are kept, holding at most the peak of live buffers (so the
  // rank's memory stays within twice its plan peak); the accounting counts live elements only.
  static constexpr std::size_t kMaxSpares = 64;
  template <typename T>
  static void take_spare(std::vector<std::vector<T>>& spares, std::size_t n, std::vector<T>& into);
  template <typename T>
  void keep_spare(std::vector<std::vector<T>>& spares, std::vector<T>&& v);
  std::vector<std::vector<float>> spare_fp32_;
  std::vector<std::vector<std::uint16_t>> spare_bf16_;

  const RankProgram* program_;
  std::vector<Storage> storage_;
  std::vector<char> live_;
  std::int64_t static_bytes_ = 0;
  std::int64_t live_bytes_ = 0;
  std::int64_t peak_bytes_ = 0;
  std::int64_t live_scratch_bytes_ = 0;
  std::int64_t peak_scratch_bytes_ = 0;
};

}  // namespace muonbed::cpu
