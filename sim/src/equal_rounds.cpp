// Identical rounds taken by a window of slots in closed form (see equal_rounds.hpp).
#include "sim/src/equal_rounds.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>

namespace muonbed::sim {

namespace {

// 2^(e+1) in units of u = 2^(e-52): the first time past the binade.
constexpr std::int64_t kBinadeEnd = std::int64_t{1} << 53;
// A window wider than this takes its rounds one at a time (the caller's way).
constexpr std::size_t kMaxSlots = 64;

// 2^k for a normal k (-1022 <= k <= 1023), exactly.
double power_of_two(int k) {
  return std::bit_cast<double>(static_cast<std::uint64_t>(k + 1023) << 52);
}

int biased_exponent(double x) {
  return static_cast<int>((std::bit_cast<std::uint64_t>(x) >> 52) & 0x7ff);
}

}  // namespace

long take_equal_rounds(std::vector<double>& times, double latency, long run, double until) {
  const std::size_t slots = times.size();
  if (slots == 0 || run <= 0 || !(times.front() <= until)) return 0;
  if (slots > kMaxSlots || !(latency > 0)) return -1;
  const auto [earliest, latest] = std::minmax_element(times.begin(), times.end());
  // Every slot positive, normal and in one binade, with units that are normal doubles too.
  const int exponent = biased_exponent(*earliest);
  if (!(*earliest > 0) || exponent < 53 || exponent == 0x7ff ||
      biased_exponent(*latest) != exponent)
    return -1;
  const double unit = power_of_two(exponent - 1075);  // u, the spacing of doubles in the binade
  const double per_unit = power_of_two(1075 - exponent);
  // L / u (exact: a power-of-two scaling) rounds to m units per round, unless it is below one
  // unit or halfway between two (then t's last bit decides).
  const double steps = latency * per_unit;
  if (!(steps >= 1) || !(steps < 0x1p52)) return -1;
  const double whole = std::floor(steps);
  if (steps - whole == 0.5) return -1;
  const auto m = static_cast<std::int64_t>(steps - whole > 0.5 ? whole + 1 : whole);

  // The slots' times in units (integers in [2^52, 2^53)), and the last unit due by `until`.
  std::array<std::int64_t, kMaxSlots> base, taken;  // slots 0 .. slots-1 used
  for (std::size_t i = 0; i < slots; ++i) base[i] = static_cast<std::int64_t>(times[i] * per_unit);
  std::int64_t bound = std::numeric_limits<std::int64_t>::max();
  if (const double scaled = until * per_unit; scaled < 0x1p62)
    bound = static_cast<std::int64_t>(std::floor(scaled));
  // How many of slot i's times (base, base + m, ...) are at or before unit x (capped past the
  // run, so that sums cannot overflow), and over every slot.
  const auto times_by = [&](std::size_t i, std::int64_t x) -> std::int64_t {
    if (base[i] > x) return 0;
    return std::min<std::int64_t>((x - base[i]) / m + 1, run + 1);
  };
  const auto all_by = [&](std::int64_t x) {
    std::int64_t sum = 0;
    for (std::size_t i = 0; i < slots; ++i) sum += times_by(i, x);
    return sum;
  };

  std::int64_t rounds;
  std::int64_t due = run + 1;  // rounds due by `until` (more than the run: the run ends first)
  if (bound != std::numeric_limits<std::int64_t>::max()) {
    due = 0;
    for (std::size_t i = 0; i < slots; ++i) due += taken[i] = times_by(i, bound);
  }
  if (due <= run) {
    // `until` stops the slots before the run ends: each takes its times up to it (taken[]).
    rounds = due;
  } else {
    // The run ends first: its rounds go to the `run` earliest times.
    rounds = run;
    const std::int64_t lowest = base[earliest - times.begin()];
    if (base[latest - times.begin()] - lowest <= m) {
      // Slots within one round of each other take one round each per period, in the order of
      // their times: whole periods, then the earliest of the last.
      const auto periods = static_cast<std::int64_t>(run / static_cast<long>(slots));
      auto extra = static_cast<std::size_t>(run % static_cast<long>(slots));
      std::array<std::size_t, kMaxSlots> order;
      for (std::size_t i = 0; i < slots; ++i) order[i] = i;
      std::partial_sort(order.begin(), order.begin() + extra, order.begin() + slots,
                        [&](std::size_t a, std::size_t b) { return base[a] < base[b]; });
      for (std::size_t i = 0; i < slots; ++i) taken[i] = periods;
      for (std::size_t k = 0; k < extra; ++k) ++taken[order[k]];
    } else {
      // Spread slots: the last unit x the run reaches (the least with `run` times at or before
      // it), inside the binade; its times at x go to as many slots as the run still has.
      if (all_by(kBinadeEnd - 1) < run) return -1;
      std::int64_t below = lowest - 1, at = kBinadeEnd - 1;
      while (at - below > 1) {
        const std::int64_t mid = below + (at - below) / 2;
        (all_by(mid) >= run ? at : below) = mid;
      }
      std::int64_t left = run - all_by(at - 1);
      for (std::size_t i = 0; i < slots; ++i) {
        taken[i] = times_by(i, at - 1);
        if (left > 0 && base[i] <= at && (at - base[i]) % m == 0) {
          ++taken[i];
          --left;
        }
      }
    }
  }
  // Each slot's next free time must stay in the binade for the units to hold.
  for (std::size_t i = 0; i < slots; ++i)
    if (taken[i] > (kBinadeEnd - 1 - base[i]) / m) return -1;
  for (std::size_t i = 0; i < slots; ++i)
    times[i] = static_cast<double>(base[i] + taken[i] * m) * unit;
  std::make_heap(times.begin(), times.end(), std::greater<>());
  return static_cast<long>(rounds);
}

}  // namespace muonbed::sim
