// bfloat16 rounding emulation on the CPU: round-to-nearest-even from fp32 to bf16 and back, as
// the GPU's __float2bfloat16_rn does, so a CPU reference can store exactly what a bf16 kernel
// stores and the two compare like for like.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.hpp"

namespace muonbed {

// The 16 high bits of the fp32 pattern after round-to-nearest-even on the 16 dropped bits.
// NaN stays NaN (quieted, sign kept); infinities and overflow to infinity behave as in IEEE.
MUONBED_HD inline std::uint16_t float_to_bf16_bits(float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  }
  // Adding 0x7fff plus the lowest kept bit rounds halves to the even neighbour.
  const std::uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;
  return static_cast<std::uint16_t>(bits >> 16);
}

MUONBED_HD inline float bf16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value = 0.0f;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// fp32 -> bf16 -> fp32: the value a bf16 buffer would hold.
MUONBED_HD inline float round_to_bf16(float value) {
  return bf16_bits_to_float(float_to_bf16_bits(value));
}

inline void round_to_bf16(float* values, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) values[i] = round_to_bf16(values[i]);
}

// Bulk conversions for CPU storage in bf16 (backends/cpu's RankStore, message encoding): the same
// bits as float_to_bf16_bits / bf16_bits_to_float, written without branches so that the compiler
// vectorizes them (NaN chosen by a select, not a jump).
inline void floats_to_bf16_bits(const float* in, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, in + i, sizeof bits);
    const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (bits >> 16) | 0x0040u;
    out[i] = static_cast<std::uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

inline void bf16_bits_to_floats(const std::uint16_t* in, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t wide = static_cast<std::uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &wide, sizeof wide);
  }
}

}  // namespace muonbed
