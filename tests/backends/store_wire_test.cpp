// The CPU store's message path (backends/cpu/store.hpp): read_wire and write_wire move a view's
// elements in a wire dtype, copying runs stored in that dtype as they are. They must give exactly
// the bytes of the reference path the handlers used before (read() widening to fp32, then
// encode_into rounding to the wire; decode, then write() rounding to the storage), for every
// storage and wire dtype pair, on a view whose runs cross tensors of both dtypes. And a released
// buffer's storage, reused by the next alloc, comes back NaN-poisoned and counted as new.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/handlers.hpp"
#include "backends/cpu/store.hpp"
#include "core/base/errors.hpp"

using namespace muonbed;

namespace {

ProgramTensor tensor(int id, DType dtype, std::int64_t numel, bool transient) {
  ProgramTensor t;
  t.id = id;
  t.name = "t" + std::to_string(id);
  t.dtype = dtype;
  t.numel = numel;
  t.bytes = numel * bytes_of(dtype);
  t.transient = transient;
  t.buffer = transient ? id : -1;
  return t;
}

// Tensors 0 (fp32) and 1 (bf16) static, 2 (fp32) and 3 (bf16) transient, 40 elements each.
RankProgram program() {
  RankProgram p;
  p.tensors = {tensor(0, DType::fp32, 40, false), tensor(1, DType::bf16, 40, false),
               tensor(2, DType::fp32, 40, true), tensor(3, DType::bf16, 40, true)};
  return p;
}

// 30 elements: 7 from `a` at 3, 11 from `b` at 20, 12 from `a` at 25 (runs out of order).
View crossing(int a, int b) {
  View v;
  v.count = 30;
  v.segments.push_back({a, {{0, 3, 7}, {18, 25, 12}}});
  v.segments.push_back({b, {{7, 20, 11}}});
  return v;
}

// Values that bf16 cannot hold (rounding matters), of both signs, and a few exact ones.
std::vector<float> values(int n, float salt) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = (i % 5 == 0)
                                         ? static_cast<float>(i)
                                         : std::sin(0.37f * static_cast<float>(i) + salt) * 3.1f;
  return v;
}

std::vector<std::byte> bytes_of_floats(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST_CASE("store: read_wire and write_wire equal widening, rounding and decoding bit for bit",
          "[store]") {
  const RankProgram p = program();
  cpu::RankStore store(p);
  store.write(0, 0, 40, values(40, 0.1f).data());
  store.write(1, 0, 40, values(40, 0.7f).data());
  store.allocate(2);
  store.allocate(3);
  for (const DType wire : {DType::fp32, DType::bf16}) {
    CAPTURE(to_string(wire));
    const std::int64_t width = bytes_of(wire);
    for (const auto& [from, to] : {std::pair{0, 1}, std::pair{1, 0}}) {
      const View source = crossing(from, to);
      // The reference: read() in fp32, then encode_into the wire.
      std::vector<float> widened(30);
      store.read(source, widened.data());
      std::vector<std::byte> want(static_cast<std::size_t>(30 * width));
      cpu::encode_into(widened.data(), 30, wire, want.data());
      std::vector<std::byte> got(want.size(), std::byte{0x5a});
      store.read_wire(source, wire, got.data());
      CHECK(got == want);

      // Written into the transients (fp32 then bf16 runs), against decode + write().
      const View target = crossing(2, 3);
      store.write_wire(target, wire, got.data());
      std::vector<float> decoded(30), after(30);
      cpu::decode(got, wire, decoded.data(), 30);
      cpu::RankStore reference(p);
      reference.allocate(2);
      reference.allocate(3);
      reference.write(target, decoded.data());
      std::vector<float> expect(30);
      reference.read(target, expect.data());
      store.read(target, after.data());
      CHECK(bytes_of_floats(after) == bytes_of_floats(expect));
    }
  }
  CHECK_THROWS_AS(store.read_wire(crossing(0, 1), DType::fp16, nullptr), ExecutionError);
}

TEST_CASE("store: a released buffer's storage comes back NaN and counted as new", "[store]") {
  const RankProgram p = program();
  cpu::RankStore store(p);
  store.allocate(2);
  store.write(2, 0, 40, values(40, 0.3f).data());
  const std::int64_t peak = store.peak_transient_bytes();
  CHECK(peak == 160);
  store.release(2);
  CHECK(store.live_transient_bytes() == 0);
  store.allocate(2);  // reuses the released storage
  std::vector<float> back(40);
  store.read(2, 0, 40, back.data());
  int nan = 0;
  for (float f : back) nan += std::isnan(f) ? 1 : 0;
  CHECK(nan == 40);
  CHECK(store.live_transient_bytes() == 160);
  CHECK(store.peak_transient_bytes() == peak);
  store.allocate(3);  // a bf16 buffer never takes fp32 storage
  CHECK(store.live_transient_bytes() == 160 + 80);
}
