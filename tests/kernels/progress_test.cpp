// Progress points (kernels/progress.hpp): a thread's hook runs between the pieces of a CPU
// Newton-Schulz (once after each of its three products per step, per matrix), never nested, only
// on the thread that installed it, and is restored when its scope ends; the result is bit for bit
// the one without a hook.
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/newton_schulz.hpp"
#include "kernels/progress.hpp"
#include "kernels/random.hpp"

using namespace muonbed;

namespace {

struct Counter {
  int calls = 0;
  int nested_seen = 0;
  int depth = 0;
};

void count_call(void* state) {
  auto& c = *static_cast<Counter*>(state);
  ++c.calls;
  if (c.depth++ > 0) ++c.nested_seen;
  progress_point();  // a hook's own progress point is ignored, not a recursion
  --c.depth;
}

std::vector<float> random_input(const MatrixShape& shape) {
  std::vector<float> g(static_cast<std::size_t>(shape.numel()));
  fill_uniform(g.data(), shape.numel(), 7, 3, 1.0);
  return g;
}

}  // namespace

TEST_CASE("progress points: three per Newton-Schulz step per matrix, results unchanged",
          "[progress]") {
  for (const MatrixShape shape : {MatrixShape{1, 24, 40}, MatrixShape{3, 40, 24}}) {
    const NsConfig config = NsConfig::keller_jordan(5);
    const std::vector<float> g = random_input(shape);
    std::vector<float> plain(g.size()), hooked(g.size());
    newton_schulz(g.data(), plain.data(), shape, config);
    Counter counter;
    {
      ScopedProgressHook hook(&count_call, &counter);
      newton_schulz(g.data(), hooked.data(), shape, config);
    }
    CHECK(counter.calls == 3 * 5 * static_cast<int>(shape.batch));
    CHECK(counter.nested_seen == 0);
    CHECK(std::memcmp(plain.data(), hooked.data(), plain.size() * sizeof(float)) == 0);
    // The scope ended: no hook any more.
    newton_schulz(g.data(), hooked.data(), shape, config);
    CHECK(counter.calls == 3 * 5 * static_cast<int>(shape.batch));
  }
}

TEST_CASE("progress points: hooks are per thread and nest as scopes", "[progress]") {
  Counter outer, inner, other;
  ScopedProgressHook outer_hook(&count_call, &outer);
  progress_point();
  {
    ScopedProgressHook inner_hook(&count_call, &inner);
    progress_point();
    std::thread([&] {
      progress_point();  // this thread installed nothing
      ScopedProgressHook mine(&count_call, &other);
      progress_point();
    }).join();
  }
  progress_point();
  CHECK(outer.calls == 2);
  CHECK(inner.calls == 1);
  CHECK(other.calls == 1);
}
