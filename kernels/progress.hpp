// Progress points inside long CPU kernels. A process that drives communication from the same
// thread that computes (an MPI rank with one core: Open MPI moves a message only inside an MPI
// call of its receiver) cannot wait for a Newton-Schulz to end before it serves its peers, and a
// second thread would take the core from the kernel on every wake-up. Such a caller installs a
// hook for its thread; the CPU kernels call progress_point() between their pieces of work (after
// each GEMM of Newton-Schulz, between slices of an elementwise update), which calls the hook.
// Without a hook a progress point costs one thread-local load.
#pragma once

namespace muonbed {

using ProgressHook = void (*)(void* state);

// Installs `hook(state)` as this thread's progress hook for the scope's lifetime (the previous
// one is restored after it). A hook must not call progress_point itself (the call is ignored).
class ScopedProgressHook {
 public:
  ScopedProgressHook(ProgressHook hook, void* state);
  ~ScopedProgressHook();
  ScopedProgressHook(const ScopedProgressHook&) = delete;
  ScopedProgressHook& operator=(const ScopedProgressHook&) = delete;

 private:
  ProgressHook previous_hook_;
  void* previous_state_;
};

void progress_point();

// Elements an elementwise update processes between two progress points (about 0.1-0.5 ms of
// AdamW on one core: short against the messages it lets through, long against the call).
inline constexpr long long kProgressSliceElements = 1 << 16;

}  // namespace muonbed
