// take_equal_rounds (sim/src/equal_rounds.hpp): a run of identical rounds taken by a window of
// slots in closed form must give the same slot times, to the bit, and the same number of rounds
// as taking them one at a time (pop the earliest due slot, push fl(t + latency)). Checked over
// random windows, spreads, latencies, runs and bounds, near binade edges and on halfway latencies,
// where the closed form must either agree or decline.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "sim/src/equal_rounds.hpp"

using muonbed::sim::take_equal_rounds;

namespace {

constexpr double kNoBound = std::numeric_limits<double>::infinity();

// The definition: one round at a time.
long one_at_a_time(std::vector<double>& heap, double latency, long run, double until) {
  long rounds = 0;
  while (rounds < run && !heap.empty() && heap.front() <= until) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    heap.back() += latency;
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
    ++rounds;
  }
  return rounds;
}

std::vector<std::uint64_t> sorted_bits(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  std::vector<std::uint64_t> bits;
  for (double t : times) bits.push_back(std::bit_cast<std::uint64_t>(t));
  return bits;
}

struct Tally {
  long cases = 0, declined = 0, bounded = 0, spread = 0;
};

// One case: the closed form agrees with the loop or declines and leaves the slots as they were.
void check(std::vector<double> times, double latency, long run, double until, Tally& tally) {
  std::make_heap(times.begin(), times.end(), std::greater<>());
  std::vector<double> expected = times, got = times;
  const long want = one_at_a_time(expected, latency, run, until);
  const long rounds = take_equal_rounds(got, latency, run, until);
  ++tally.cases;
  if (rounds < 0) {
    ++tally.declined;
    REQUIRE(sorted_bits(got) == sorted_bits(times));
    // Only where it must: the slots' times leave the binade they started in, or the latency is
    // halfway between two units of it, or below one.
    const double first = *std::min_element(times.begin(), times.end());
    const double last = *std::max_element(expected.begin(), expected.end());
    const double steps = latency / std::ldexp(1.0, std::ilogb(first) - 52);
    INFO("declined: slots " << times.size() << ", latency " << latency << ", run " << run
                            << ", from " << first << " to " << last);
    CHECK((std::ilogb(first) != std::ilogb(last) || steps < 1 || steps - std::floor(steps) == 0.5));
    return;
  }
  INFO("slots " << times.size() << ", latency " << latency << ", run " << run << ", until " << until
                << ", earliest " << times.front());
  REQUIRE(rounds == want);
  REQUIRE(sorted_bits(got) == sorted_bits(expected));
  REQUIRE(std::is_heap(got.begin(), got.end(), std::greater<>()));
  if (want < run) ++tally.bounded;
}

}  // namespace

TEST_CASE("equal rounds in closed form match one round at a time, to the bit", "[sim][rounds]") {
  std::mt19937_64 rng(20261129);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  // Step times of a simulation (seconds), binade edges among them, and latencies of NVLink,
  // NICs and switch hops, plus arbitrary ones.
  const std::vector<double> bases = {3.7e-4, 0.013, 0.7,   1.0,    1.9999,   2.0,
                                     5.3,    14.15, 63.99, 1000.0, 3.9999999};
  const std::vector<double> latencies = {0.6e-6, 4.5e-6, 5.5e-6, 5e-6, 1e-5, 2.5e-7, 3e-3};
  Tally tally;
  for (int c = 0; c < 20000; ++c) {
    const double base = bases[rng() % bases.size()];
    const double latency =
        c % 3 == 0 ? latencies[rng() % latencies.size()] : std::ldexp(unit(rng) + 0.5, -18);
    const std::size_t slots = 1 + rng() % 12;
    // Slots within one latency of each other half of the time, up to six latencies apart else.
    const double spread = latency * (c % 2 == 0 ? unit(rng) : 6 * unit(rng));
    if (c % 2 == 1) ++tally.spread;
    std::vector<double> times;
    for (std::size_t i = 0; i < slots; ++i) {
      double t = base + spread * unit(rng);
      if (i > 0 && rng() % 4 == 0) t = times[rng() % times.size()];  // equal times
      times.push_back(t);
    }
    const long run = 1 + static_cast<long>(rng() % 3000);
    const double earliest = *std::min_element(times.begin(), times.end());
    double until = kNoBound;
    switch (c % 4) {
      case 1:  // cuts the run short
        until = earliest + latency * run / slots * unit(rng);
        break;
      case 2:  // exactly at a slot's time
        until = times[rng() % times.size()];
        break;
      case 3:  // past the run's end
        until = earliest + latency * (run + 1);
        break;
      default:
        break;
    }
    check(times, latency, run, until, tally);
  }
  // Halfway latencies (L / u = k + 1/2 in the slots' binade): t's last bit breaks the tie, so
  // the closed form declines; and a latency below a unit leaves t unchanged.
  for (int k = 0; k < 200; ++k) {
    const double t = 1.5 + k * 0x1p-40;
    check({t, t + 0x1p-30}, (1000 + k + 0.5) * 0x1p-52, 500, kNoBound, tally);
    check({t}, 0x1p-54, 10, kNoBound, tally);
  }
  // A run that climbs past 2.0, where the spacing of doubles doubles.
  check({1.999, 1.9995, 1.9999}, 1e-4, 100, kNoBound, tally);
  // Nothing due: no round.
  {
    std::vector<double> times = {5.0, 6.0};
    std::make_heap(times.begin(), times.end(), std::greater<>());
    CHECK(take_equal_rounds(times, 1e-6, 10, 4.0) == 0);
  }
  // The closed form must carry most cases (a form that always declines would pass the above).
  INFO(tally.cases << " cases, " << tally.declined << " declined, " << tally.bounded
                   << " cut by their bound");
  CHECK(tally.declined * 4 < tally.cases);
  CHECK(tally.bounded * 10 > tally.cases);
}
