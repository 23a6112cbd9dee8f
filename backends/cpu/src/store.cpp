// Rank storage (see backends/cpu/store.hpp).
#include "backends/cpu/store.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "core/base/errors.hpp"
#include "kernels/bf16.hpp"

namespace muonbed::cpu {

namespace {

// An allocation a rank could not make: which one, how large, and what to do (instead of a bare
// std::bad_alloc from a rank that mpirun reports as a crash).
[[noreturn]] void out_of_memory(int rank, const std::string& what, std::int64_t bytes) {
  throw ExecutionError("rank " + std::to_string(rank) + ": out of memory allocating " + what +
                       " (" + std::to_string(bytes) + " bytes, " +
                       std::to_string((bytes + (1 << 20) - 1) >> 20) +
                       " MiB in the plan's dtypes); fix: a smaller model or fewer ranks per "
                       "machine, or a machine with more memory (the analytic and sim backends "
                       "predict it without allocating)");
}

void check_dtype(int rank, const ProgramTensor& t) {
  if (t.dtype != DType::fp32 && t.dtype != DType::bf16)
    throw ExecutionError("rank " + std::to_string(rank) + ": " + t.name + " is " +
                         std::string(to_string(t.dtype)) +
                         ", which the CPU executors do not store (fp32 and bf16 only); fix: give "
                         "the model's parameters and the optimizer state fp32 or bf16");
}

}  // namespace

void RankStore::widen(const Storage& s, std::int64_t at, std::int64_t n, float* out) {
  if (!s.fp32.empty()) {
    std::copy_n(s.fp32.data() + at, n, out);
  } else {
    bf16_bits_to_floats(s.bf16.data() + at, out, n);
  }
}

void RankStore::narrow(Storage& s, std::int64_t at, std::int64_t n, const float* in) {
  if (!s.fp32.empty()) {
    std::copy_n(in, n, s.fp32.data() + at);
  } else {
    floats_to_bf16_bits(in, s.bf16.data() + at, n);
  }
}

RankStore::RankStore(const RankProgram& program)
    : program_(&program), storage_(program.tensors.size()), live_(program.tensors.size(), 0) {
  try {
    for (const ProgramTensor& t : program.tensors) {
      check_dtype(program.rank, t);
      if (t.transient) continue;
      Storage& s = storage_[t.id];
      if (t.dtype == DType::fp32)
        s.fp32.assign(static_cast<std::size_t>(t.numel), 0.0f);
      else
        s.bf16.assign(static_cast<std::size_t>(t.numel), 0);
      live_[t.id] = 1;
      static_bytes_ += s.bytes();
    }
  } catch (const std::bad_alloc&) {
    out_of_memory(program.rank, "its static tensors (parameters, gradients, optimizer state)",
                  program.static_bytes);
  }
}

bool RankStore::scratch(int tensor) const {
  return program_->tensors.at(tensor).buffer < 0;
}

DType RankStore::dtype(int tensor) const {
  return program_->tensors.at(tensor).dtype;
}

void RankStore::allocate(int tensor) {
  const auto& t = program_->tensors.at(tensor);
  if (!t.transient || live_[tensor])
    throw ExecutionError("rank " + std::to_string(rank()) + ": allocating " + t.name +
                         (t.transient ? ", which is already allocated" : ", which is static"));
  Storage& s = storage_[tensor];
  try {
    // NaN: a read of an element nothing wrote fails the reference check. The storage is a
    // released buffer's where one is large enough (see spare_).
    const auto n = static_cast<std::size_t>(t.numel);
    if (t.dtype == DType::fp32) {
      take_spare(spare_fp32_, n, s.fp32);
      s.fp32.assign(n, std::numeric_limits<float>::quiet_NaN());
    } else {
      take_spare(spare_bf16_, n, s.bf16);
      s.bf16.assign(n, float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()));
    }
  } catch (const std::bad_alloc&) {
    out_of_memory(rank(), "buffer " + t.name, t.bytes);
  }
  live_[tensor] = 1;
  if (scratch(tensor)) {
    live_scratch_bytes_ += s.bytes();
    peak_scratch_bytes_ = std::max(peak_scratch_bytes_, live_scratch_bytes_);
  } else {
    live_bytes_ += s.bytes();
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  }
}

void RankStore::release(int tensor) {
  const auto& t = program_->tensors.at(tensor);
  if (!t.transient || !live_[tensor])
    throw ExecutionError("rank " + std::to_string(rank()) + ": releasing " + t.name +
                         ", which is not allocated");
  Storage& s = storage_[tensor];
  (scratch(tensor) ? live_scratch_bytes_ : live_bytes_) -= s.bytes();
  keep_spare(spare_fp32_, std::move(s.fp32));
  keep_spare(spare_bf16_, std::move(s.bf16));
  s = Storage{};
  live_[tensor] = 0;
}

template <typename T>
void RankStore::take_spare(std::vector<std::vector<T>>& spares, std::size_t n,
                           std::vector<T>& into) {
  std::size_t best = spares.size();
  for (std::size_t i = 0; i < spares.size(); ++i)
    if (spares[i].capacity() >= n &&
        (best == spares.size() || spares[i].capacity() < spares[best].capacity()))
      best = i;
  if (best == spares.size()) return;
  into = std::move(spares[best]);
  spares.erase(spares.begin() + static_cast<std::ptrdiff_t>(best));
}

template <typename T>
void RankStore::keep_spare(std::vector<std::vector<T>>& spares, std::vector<T>&& v) {
  if (v.capacity() == 0) return;
  v.clear();
  spares.push_back(std::move(v));
  // At most kMaxSpares, holding at most the peak of live buffers: the largest go first.
  const auto held = [&] {
    std::int64_t bytes = 0;
    for (const auto& x : spares) bytes += static_cast<std::int64_t>(x.capacity() * sizeof(T));
    return bytes;
  };
  while (!spares.empty() &&
         (spares.size() > kMaxSpares || held() > peak_bytes_ + peak_scratch_bytes_))
    spares.erase(std::max_element(spares.begin(), spares.end(), [](const auto& a, const auto& b) {
      return a.capacity() < b.capacity();
    }));
}

void RankStore::check_range(int tensor, std::int64_t offset, std::int64_t count) const {
  const auto& t = program_->tensors.at(tensor);
  if (!live_[tensor])
    throw ExecutionError("rank " + std::to_string(rank()) + ": " + t.name +
                         " is used while it is not allocated");
  if (offset < 0 || count < 0 || offset + count > t.numel)
    throw ExecutionError("rank " + std::to_string(rank()) + ": a run of " + std::to_string(count) +
                         " elements at " + std::to_string(offset) + " lies outside " + t.name +
                         " (" + std::to_string(t.numel) + " elements)");
}

void RankStore::read(int tensor, std::int64_t offset, std::int64_t count, float* out) const {
  check_range(tensor, offset, count);
  widen(storage_[tensor], offset, count, out);
}

void RankStore::write(int tensor, std::int64_t offset, std::int64_t count, const float* in) {
  check_range(tensor, offset, count);
  narrow(storage_[tensor], offset, count, in);
}

std::vector<float> RankStore::read(int tensor, std::int64_t offset, std::int64_t count) const {
  std::vector<float> out(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
  read(tensor, offset, count, out.data());
  return out;
}

float* RankStore::fp32_data(int tensor) {
  const auto& t = program_->tensors.at(tensor);
  check_range(tensor, 0, 0);
  if (t.dtype != DType::fp32)
    throw ExecutionError("rank " + std::to_string(rank()) + ": " + t.name + " is " +
                         std::string(to_string(t.dtype)) + ", not fp32");
  return storage_[tensor].fp32.data();
}

std::byte* RankStore::bytes(int tensor) {
  return const_cast<std::byte*>(static_cast<const RankStore*>(this)->bytes(tensor));
}

const std::byte* RankStore::bytes(int tensor) const {
  check_range(tensor, 0, 0);
  const Storage& s = storage_[tensor];
  return !s.fp32.empty() ? reinterpret_cast<const std::byte*>(s.fp32.data())
                         : reinterpret_cast<const std::byte*>(s.bf16.data());
}

template <typename Fn>
void RankStore::walk(const View& view, Fn&& fn) const {
  // Checked once per segment (the tensor is live) and per run (bounds), so that the element loops
  // of views with many short runs (strided pieces, all_to_all staging) stay cheap.
  for (const Segment& s : view.segments) {
    check_range(s.tensor, 0, 0);
    const std::int64_t numel = program_->tensors[s.tensor].numel;
    for (const Run& r : s.runs) {
      if (r.tensor < 0 || r.length < 0 || r.tensor + r.length > numel || r.sequence < 0 ||
          r.sequence + r.length > view.count)
        throw ExecutionError("rank " + std::to_string(rank()) + ": a run of " +
                             std::to_string(r.length) + " elements at " + std::to_string(r.tensor) +
                             " (sequence offset " + std::to_string(r.sequence) + ") lies outside " +
                             program_->tensors[s.tensor].name + " (" + std::to_string(numel) +
                             " elements) or its view of " + std::to_string(view.count));
      fn(s.tensor, r.tensor, r.sequence, r.length);
    }
  }
}

void RankStore::read(const View& view, float* out) const {
  walk(view, [&](int tensor, std::int64_t at, std::int64_t seq, std::int64_t n) {
    widen(storage_[tensor], at, n, out + seq);
  });
}

void RankStore::write(const View& view, const float* in) {
  walk(view, [&](int tensor, std::int64_t at, std::int64_t seq, std::int64_t n) {
    narrow(storage_[tensor], at, n, in + seq);
  });
}

void RankStore::read_wire(const View& view, DType wire, std::byte* out) const {
  if (wire != DType::fp32 && wire != DType::bf16)
    throw ExecutionError("wire dtype " + std::string(to_string(wire)) + " is not emulated");
  const std::int64_t width = bytes_of(wire);
  walk(view, [&](int tensor, std::int64_t at, std::int64_t seq, std::int64_t n) {
    const Storage& s = storage_[tensor];
    std::byte* to = out + seq * width;
    if (n == 0) return;
    if (!s.fp32.empty() && wire == DType::fp32) {
      std::memcpy(to, s.fp32.data() + at, static_cast<std::size_t>(n) * 4);
    } else if (s.fp32.empty() && wire == DType::bf16) {
      std::memcpy(to, s.bf16.data() + at, static_cast<std::size_t>(n) * 2);
    } else if (wire == DType::bf16) {  // fp32 stored: rounded to the wire
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint16_t b = float_to_bf16_bits(s.fp32[static_cast<std::size_t>(at + i)]);
        std::memcpy(to + 2 * i, &b, 2);
      }
    } else {  // bf16 stored, fp32 wire: widened exactly
      for (std::int64_t i = 0; i < n; ++i) {
        const float f = bf16_bits_to_float(s.bf16[static_cast<std::size_t>(at + i)]);
        std::memcpy(to + 4 * i, &f, 4);
      }
    }
  });
}

void RankStore::write_wire(const View& view, DType wire, const std::byte* in) {
  if (wire != DType::fp32 && wire != DType::bf16)
    throw ExecutionError("wire dtype " + std::string(to_string(wire)) + " is not emulated");
  const std::int64_t width = bytes_of(wire);
  walk(view, [&](int tensor, std::int64_t at, std::int64_t seq, std::int64_t n) {
    Storage& s = storage_[tensor];
    const std::byte* from = in + seq * width;
    if (n == 0) return;
    if (!s.fp32.empty() && wire == DType::fp32) {
      std::memcpy(s.fp32.data() + at, from, static_cast<std::size_t>(n) * 4);
    } else if (s.fp32.empty() && wire == DType::bf16) {
      std::memcpy(s.bf16.data() + at, from, static_cast<std::size_t>(n) * 2);
    } else if (wire == DType::bf16) {  // fp32 stored: the bf16 value, exactly
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t b = 0;
        std::memcpy(&b, from + 2 * i, 2);
        s.fp32[static_cast<std::size_t>(at + i)] = bf16_bits_to_float(b);
      }
    } else {  // bf16 stored, fp32 wire: rounded to the storage
      for (std::int64_t i = 0; i < n; ++i) {
        float f = 0;
        std::memcpy(&f, from + 4 * i, 4);
        s.bf16[static_cast<std::size_t>(at + i)] = float_to_bf16_bits(f);
      }
    }
  });
}

void RankStore::accumulate(const View& view, const float* in) {
  // Each message is added in fp32 to the stored value and the sum rounded to the destination's
  // dtype: one rounding per message, as a reduction in the buffer's dtype rounds per hop.
  walk(view, [&](int tensor, std::int64_t at, std::int64_t seq, std::int64_t n) {
    Storage& s = storage_[tensor];
    if (!s.fp32.empty()) {
      float* out = s.fp32.data() + at;
      for (std::int64_t i = 0; i < n; ++i) out[i] += in[seq + i];
    } else {
      std::uint16_t* out = s.bf16.data() + at;
      for (std::int64_t i = 0; i < n; ++i)
        out[i] = float_to_bf16_bits(bf16_bits_to_float(out[i]) + in[seq + i]);
    }
  });
}

std::vector<float> RankStore::read(const View& view) const {
  std::vector<float> out(static_cast<std::size_t>(view.count));
  read(view, out.data());
  return out;
}

}  // namespace muonbed::cpu
