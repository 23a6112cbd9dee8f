// A rank's memory on the CPU: the storage of a RankProgram's tensors (core/plan/program.hpp).
// Static tensors share one arena, laid out by the program's element offsets; transient buffers are
// allocated by their alloc op (filled with NaN, so a read of something never written shows up in
// the reference check) and freed by their release.
//
// Every element is stored as an fp32 value. Parameters, gradients and optimizer state are fp32
// (master copies; the plan counts them in the model's dtype). Update and result pieces hold values
// of the comm dtype: the handlers round to it whenever they write one, exactly as the reference
// rounds (kernels/reference_optimizer.hpp), and messages carry the comm dtype's bytes.
#pragma once

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
  float* data(int tensor);  // throws ExecutionError if the tensor is not live
  const float* data(int tensor) const;

  // Gathers a view's elements into out[0 .. view.count), scatters them back, adds them in.
  void read(const View& view, float* out) const;
  void write(const View& view, const float* in);
  void accumulate(const View& view, const float* in);
  std::vector<float> read(const View& view) const;

  // Transient bytes (the plan's dtypes) live now and at most so far: measured, not planned.
  std::int64_t live_transient_bytes() const { return live_bytes_; }
  std::int64_t peak_transient_bytes() const { return peak_bytes_; }

 private:
  template <typename Fn>
  void walk(const View& view, Fn&& fn) const;

  const RankProgram* program_;
  std::vector<float> arena_;
  std::vector<std::vector<float>> transient_;
  std::vector<char> live_;
  std::int64_t live_bytes_ = 0;
  std::int64_t peak_bytes_ = 0;
};

}  // namespace muonbed::cpu
