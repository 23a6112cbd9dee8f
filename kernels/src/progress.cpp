#include "kernels/progress.hpp"

namespace muonbed {
namespace {

struct HookSlot {
  ProgressHook hook = nullptr;
  void* state = nullptr;
  bool running = false;  // inside the hook: nested progress points are ignored
};
thread_local HookSlot slot;

}  // namespace

ScopedProgressHook::ScopedProgressHook(ProgressHook hook, void* state)
    : previous_hook_(slot.hook), previous_state_(slot.state) {
  slot.hook = hook;
  slot.state = state;
}

ScopedProgressHook::~ScopedProgressHook() {
  slot.hook = previous_hook_;
  slot.state = previous_state_;
}

void progress_point() {
  if (slot.hook == nullptr || slot.running) return;
  slot.running = true;
  struct Reset {
    ~Reset() { slot.running = false; }
  } reset;
  slot.hook(slot.state);
}

}  // namespace muonbed
