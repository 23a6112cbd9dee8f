// Deterministic, counter-based random numbers for initial weights and gradients. Element i of
// stream s under seed k is a pure function of (k, s, i): any rank can generate exactly its own
// shard of a tensor, CPU and GPU produce identical values, and results do not depend on the
// platform's <random> (std::uniform_real_distribution is implementation-defined).
//
// Definition (frozen: golden outputs depend on it):
//   splitmix64(x): x += 0x9e3779b97f4a7c15; z = x;
//                  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9; z = (z ^ (z >> 27)) *
//                  0x94d049bb133111eb; return z ^ (z >> 31)                       (Steele, Lea,
//                  Flood 2014)
//   key  = splitmix64(seed ^ splitmix64(stream))
//   bits = splitmix64(key + index * 0x9e3779b97f4a7c15)
//   u    = (bits >> 11) * 2^-53                               uniform on [0, 1), exact in fp64
//   counter_uniform(seed, stream, index) = 2u - 1              uniform on [-1, 1)
#pragma once

#include <cstdint>

#include "kernels/host_device.hpp"

namespace muonbed {

MUONBED_HD inline std::uint64_t splitmix64(std::uint64_t x) {
  std::uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

MUONBED_HD inline std::uint64_t counter_key(std::uint64_t seed, std::uint64_t stream) {
  return splitmix64(seed ^ splitmix64(stream));
}

// Uniform on [-1, 1) from a key made by counter_key().
MUONBED_HD inline double keyed_uniform(std::uint64_t key, std::uint64_t index) {
  const std::uint64_t bits = splitmix64(key + index * 0x9e3779b97f4a7c15ull);
  const double u = static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
  return 2.0 * u - 1.0;
}

MUONBED_HD inline double counter_uniform(std::uint64_t seed, std::uint64_t stream,
                                         std::uint64_t index) {
  return keyed_uniform(counter_key(seed, stream), index);
}

// out[i] = T(scale * counter_uniform(seed, stream, first_index + i)).
template <typename T>
void fill_uniform(T* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream, double scale,
                  std::int64_t first_index = 0) {
  const std::uint64_t key = counter_key(seed, stream);
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] =
        static_cast<T>(scale * keyed_uniform(key, static_cast<std::uint64_t>(first_index + i)));
  }
}

}  // namespace muonbed
