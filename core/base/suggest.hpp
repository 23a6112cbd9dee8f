// "Did you mean" suggestions for mistyped names (YAML keys and values, CLI commands): the
// Levenshtein distance and the closest plausible candidate. One implementation for the whole
// project, so every message suggests by the same rule.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace muonbed {

// Levenshtein distance (insertions, deletions and substitutions of one byte each).
std::size_t edit_distance(std::string_view a, std::string_view b);
// The closest candidate if it is plausibly a typo of `word` (a small edit distance, or `word` a
// prefix of it of 3+ bytes), else "". Words longer than 100 bytes get no suggestion (no name is
// that long, and the distance costs |word| x |candidate|).
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);
// "; did you mean 'x'?" or "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace muonbed
