// "Did you mean" suggestions (see core/base/suggest.hpp).
#include "core/base/suggest.hpp"

#include <algorithm>
#include <limits>

namespace muonbed {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Two rows of the dynamic programme.
  std::vector<std::size_t> previous(b.size() + 1), current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  constexpr std::size_t kMaxWord = 100;
  if (word.empty() || word.size() > kMaxWord) return {};
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  std::string best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const std::string& candidate : candidates) {
    std::size_t distance = 0;
    // A shortened key ("prefetch" for "prefetch_count") is a likely intent even when far in
    // edits; the reverse ("strategy" for "strategy.nme") is not.
    if (word.size() >= 3 && std::string_view(candidate).starts_with(word)) {
      distance = candidate.size() == word.size() ? 0 : 1;
    } else {
      // The distance is at least the difference in length: skip what cannot be within limit.
      const std::size_t gap = candidate.size() > word.size() ? candidate.size() - word.size()
                                                             : word.size() - candidate.size();
      if (gap > limit) continue;
      distance = edit_distance(word, candidate);
    }
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best_distance <= limit ? best : std::string();
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string match = closest_match(word, candidates);
  return match.empty() ? std::string() : "; did you mean '" + match + "'?";
}

}  // namespace muonbed
