// Work a simulation process does beside its simulation, on a thread of its own: the record's
// plan figures while the step is simulated, the Chrome trace while the record is filled. The
// result comes through a future; without a thread to be had, the work runs when asked for.
#pragma once

#include <future>
#include <system_error>
#include <utility>

#ifdef __linux__
#include <sys/resource.h>
#include <unistd.h>
#endif

namespace muonbed::sim {

// `fn` on a thread of its own. `yielding`: at the lowest priority (Linux), so that it takes a
// core only where the simulations leave one idle (a point's AdamW twin ends well before it).
template <typename Fn>
auto beside(Fn fn, bool yielding) -> std::future<decltype(fn())> {
  auto run = [fn = std::move(fn), yielding]() mutable {
#ifdef __linux__
    if (yielding) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
#else
    (void)yielding;
#endif
    return fn();
  };
  try {
    return std::async(std::launch::async, run);  // a copy: `run` is still whole if this throws
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, std::move(run));
  }
}

}  // namespace muonbed::sim
