// bf16 round-to-nearest-even cases worked out by hand, and pinned values of the counter-based
// generator (checked against an independent SplitMix64 implementation).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/random.hpp"

using namespace muonbed;

namespace {
float from_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
}  // namespace

TEST_CASE("bf16 rounds to nearest, ties to even", "[bf16]") {
  // bf16 keeps 7 fraction bits: next to 1 the spacing is 2^-7.
  CHECK(round_to_bf16(1.0f) == 1.0f);
  CHECK(round_to_bf16(1.0f + 0x1p-7f) == 1.0f + 0x1p-7f);  // representable
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: the tie goes to the even mantissa, 1.
  CHECK(round_to_bf16(1.0f + 0x1p-8f) == 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes up.
  CHECK(round_to_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
  // Just above the halfway point rounds up; just below rounds down.
  CHECK(round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
  CHECK(round_to_bf16(1.0f + 0x1p-8f - 0x1p-20f) == 1.0f);
  // Sign is symmetric.
  CHECK(round_to_bf16(-(1.0f + 3 * 0x1p-8f)) == -(1.0f + 0x1p-6f));
  // Bit patterns: 1.0f = 0x3f800000 -> 0x3f80; pi = 0x40490fdb -> 0x4049 (dropped 0x0fdb < half).
  CHECK(float_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(float_to_bf16_bits(from_bits(0x40490fdbu)) == 0x4049);
  CHECK(float_to_bf16_bits(from_bits(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(float_to_bf16_bits(from_bits(0x3f818000u)) == 0x3f82);  // tie, odd rounds up
  CHECK(bf16_bits_to_float(0x3f80) == 1.0f);
  // The largest finite float rounds to infinity (it is above bf16's max + half an ulp).
  CHECK(std::isinf(round_to_bf16(std::numeric_limits<float>::max())));
  CHECK(std::isinf(round_to_bf16(std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in the low bits must not become infinity.
  CHECK(std::isnan(round_to_bf16(from_bits(0x7f800001u))));
  // Subnormals round like any other value: 2^-133 is a bf16 subnormal.
  CHECK(round_to_bf16(0x1p-133f) == 0x1p-133f);
}

TEST_CASE("counter-based generator: pinned values and range", "[random]") {
  // SplitMix64 seeded with 0 first returns 0xe220a8397b1dcdaf (Vigna's reference output).
  CHECK(splitmix64(0) == 0xe220a8397b1dcdafull);
  CHECK(splitmix64(1) == 0x910a2dec89025cc1ull);
  // Pinned from an independent Python implementation of the definition in random.hpp.
  CHECK(counter_uniform(0, 0, 0) == -0.7225811797088915);
  CHECK(counter_uniform(1, 0, 0) == -0.46173936081909184);
  CHECK(counter_uniform(1, 2, 3) == -0.7623400053679592);
  CHECK(counter_uniform(42, 7, 1000000) == 0.8412518590407361);

  double sum = 0, lo = 1, hi = -1;
  std::set<double> distinct;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = counter_uniform(5, 9, i);
    REQUIRE(u >= -1.0);
    REQUIRE(u < 1.0);
    sum += u;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    distinct.insert(u);
  }
  CHECK(std::abs(sum / n) < 0.01);  // mean 0, standard error 0.0018
  CHECK(lo < -0.999);
  CHECK(hi > 0.999);
  CHECK(distinct.size() == static_cast<std::size_t>(n));
  // Streams and seeds are independent sequences.
  CHECK(counter_uniform(5, 9, 0) != counter_uniform(5, 10, 0));
  CHECK(counter_uniform(5, 9, 0) != counter_uniform(6, 9, 0));

  // fill_uniform is the same function with a scale and an index offset.
  std::vector<float> v(4);
  fill_uniform(v.data(), 4, 1, 2, 0.5, 1);
  CHECK(v[2] == static_cast<float>(0.5 * counter_uniform(1, 2, 3)));
}

TEST_CASE("bulk bf16 conversions give the scalar conversions' bits", "[bf16]") {
  // Every bf16 pattern (high half) with dropped halves that round down, tie, round up and carry,
  // so NaNs (quieted, sign kept), infinities, overflow to infinity, zeros and subnormals are all
  // in.
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};
  std::vector<float> values;
  for (std::uint32_t high = 0; high < 0x10000; ++high)
    for (std::uint32_t low : lows) values.push_back(from_bits(high << 16 | low));
  const auto n = static_cast<std::int64_t>(values.size());
  std::vector<std::uint16_t> bulk(values.size());
  floats_to_bf16_bits(values.data(), bulk.data(), n);
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < n; ++i) differ += bulk[i] != float_to_bf16_bits(values[i]) ? 1 : 0;
  CHECK(differ == 0);
  std::vector<float> back(values.size());
  bf16_bits_to_floats(bulk.data(), back.data(), n);
  for (std::int64_t i = 0; i < n; ++i) {
    const float scalar = bf16_bits_to_float(bulk[i]);
    differ += std::memcmp(&back[i], &scalar, sizeof scalar) != 0 ? 1 : 0;
  }
  CHECK(differ == 0);
}
