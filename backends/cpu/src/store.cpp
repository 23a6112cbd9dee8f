// Rank storage (see backends/cpu/store.hpp).
#include "backends/cpu/store.hpp"

#include <limits>
#include <new>
#include <string>

#include "core/base/errors.hpp"

namespace muonbed::cpu {

namespace {

// An allocation a rank could not make: which one, how large, and what to do (instead of a bare
// std::bad_alloc from a rank that mpirun reports as a crash).
[[noreturn]] void out_of_memory(int rank, const std::string& what, std::int64_t numel) {
  throw ExecutionError("rank " + std::to_string(rank) + ": out of memory allocating " + what +
                       " (" + std::to_string(numel) + " fp32 elements, " +
                       std::to_string((numel * 4 + (1 << 20) - 1) >> 20) +
                       " MiB); fix: a smaller model or fewer ranks per machine, or a machine "
                       "with more memory (the analytic and sim backends predict it without "
                       "allocating)");
}

std::vector<float> allocate_arena(const RankProgram& program) {
  try {
    return std::vector<float>(static_cast<std::size_t>(program.static_numel), 0.0f);
  } catch (const std::bad_alloc&) {
    out_of_memory(program.rank, "its static tensors (parameters, gradients, optimizer state)",
                  program.static_numel);
  }
}

}  // namespace

RankStore::RankStore(const RankProgram& program)
    : program_(&program),
      arena_(allocate_arena(program)),
      transient_(program.tensors.size()),
      live_(program.tensors.size(), 0) {
  for (const auto& t : program.tensors) live_[t.id] = t.transient ? 0 : 1;
}

void RankStore::allocate(int tensor) {
  const auto& t = program_->tensors.at(tensor);
  if (!t.transient || live_[tensor])
    throw ExecutionError("rank " + std::to_string(rank()) + ": allocating " + t.name +
                         (t.transient ? ", which is already allocated" : ", which is static"));
  try {
    transient_[tensor].assign(static_cast<std::size_t>(t.numel),
                              std::numeric_limits<float>::quiet_NaN());
  } catch (const std::bad_alloc&) {
    out_of_memory(rank(), "buffer " + t.name, t.numel);
  }
  live_[tensor] = 1;
  live_bytes_ += t.bytes;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
}

void RankStore::release(int tensor) {
  const auto& t = program_->tensors.at(tensor);
  if (!t.transient || !live_[tensor])
    throw ExecutionError("rank " + std::to_string(rank()) + ": releasing " + t.name +
                         ", which is not allocated");
  transient_[tensor] = {};
  live_[tensor] = 0;
  live_bytes_ -= t.bytes;
}

float* RankStore::data(int tensor) {
  return const_cast<float*>(static_cast<const RankStore*>(this)->data(tensor));
}

const float* RankStore::data(int tensor) const {
  const auto& t = program_->tensors.at(tensor);
  if (!live_[tensor])
    throw ExecutionError("rank " + std::to_string(rank()) + ": " + t.name +
                         " is used while it is not allocated");
  return t.transient ? transient_[tensor].data() : arena_.data() + t.element_offset;
}

template <typename Fn>
void RankStore::walk(const View& view, Fn&& fn) const {
  for (const Segment& s : view.segments) {
    const auto& t = program_->tensors.at(s.tensor);
    const float* base = data(s.tensor);
    for (const Run& r : s.runs) {
      if (r.tensor < 0 || r.tensor + r.length > t.numel || r.sequence < 0 ||
          r.sequence + r.length > view.count)
        throw ExecutionError("rank " + std::to_string(rank()) + ": a run of " +
                             std::to_string(r.length) + " elements at " + std::to_string(r.tensor) +
                             " lies outside " + t.name + " (" + std::to_string(t.numel) +
                             " elements)");
      fn(const_cast<float*>(base) + r.tensor, r.sequence, r.length);
    }
  }
}

void RankStore::read(const View& view, float* out) const {
  walk(view,
       [&](float* at, std::int64_t seq, std::int64_t n) { std::copy(at, at + n, out + seq); });
}

void RankStore::write(const View& view, const float* in) {
  walk(view,
       [&](float* at, std::int64_t seq, std::int64_t n) { std::copy(in + seq, in + seq + n, at); });
}

void RankStore::accumulate(const View& view, const float* in) {
  walk(view, [&](float* at, std::int64_t seq, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) at[i] += in[seq + i];
  });
}

std::vector<float> RankStore::read(const View& view) const {
  std::vector<float> out(static_cast<std::size_t>(view.count));
  read(view, out.data());
  return out;
}

}  // namespace muonbed::cpu
