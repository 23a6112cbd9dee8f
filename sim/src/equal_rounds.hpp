// A run of identical zero-byte rounds taken by a window of slots, in closed form, to the bit.
//
// An all-to-all member's slots take its rounds in time order: the earliest slot free at or before
// `until` takes the next round and frees again `latency` later (fl(t + latency), one floating-point
// addition per round). Muon's skewed exchanges are mostly such rounds: a 1,024-member exchange has
// ~10^6 of them, a 1,024-GPU megatron step ~3 x 10^8, and taking them one addition at a time was a
// sixth of that step's simulation.
//
// Why a closed form can be exact: inside one binade [2^e, 2^(e+1)) doubles are the multiples of
// u = 2^(e-52), so for t there fl(t + L) = t + m u with m the integer nearest to L / u (when L / u
// is not halfway between two integers: then the tie breaks by t's last bit). A slot's times after
// j rounds are t + j m u while they stay below 2^(e+1): integers in units of u. Which rounds the
// slots take depends only on those times (slots with equal times are interchangeable), so the
// state after k rounds is each slot advanced by the number of its times among the k earliest.
// Where the closed form does not apply (slots in different binades, a time reaching 2^(e+1), a
// halfway L / u, L below half a unit) it says so and the caller takes one round the plain way.
// tests/sim/equal_rounds_test.cpp checks it against the one-at-a-time loop.
#pragma once

#include <vector>

namespace muonbed::sim {

// Takes up to `run` rounds of `latency` from `times`, a min-heap (std::greater) of the slots'
// free times, while its earliest is at or before `until` (+infinity: no bound): the same times, to
// the bit, as popping the earliest and pushing fl(earliest + latency) once per round. Returns the
// rounds taken (>= 1 when the earliest is due), or -1 when the closed form does not apply here
// (`times` is then unchanged). `times` is left a min-heap.
long take_equal_rounds(std::vector<double>& times, double latency, long run, double until);

}  // namespace muonbed::sim
