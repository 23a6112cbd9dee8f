// Result folder and file names of sweep points (see core/experiment/result_paths.hpp).
#include "core/experiment/result_paths.hpp"

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <filesystem>

#include "core/experiment/experiment.hpp"

namespace muonbed {

// Percent-encoding of every byte outside a small safe set ('%' itself included) is injective:
// distinct labels give distinct folder names, whatever characters sweep values hold. Names too
// long for a file system (255 bytes) keep a readable prefix and a hash of the whole label.
std::string point_slug(const std::string& point_label) {
  if (point_label.empty()) return "default";
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : point_label) {
    const auto u = static_cast<unsigned char>(c);
    const bool safe = std::isalnum(u) || c == '.' || c == '_' || c == '=' || c == '-' || c == ',';
    if (safe) {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  constexpr std::size_t kMaxSlug = 200;
  if (out.size() > kMaxSlug) {
    std::uint64_t hash = 1469598103934665603ull;  // FNV-1a 64 of the label
    for (const char c : point_label) {
      hash ^= static_cast<unsigned char>(c);
      hash *= 1099511628211ull;
    }
    std::size_t cut = 150;
    while (cut > 0 && out[cut - 1] == '%') --cut;  // never split an escape
    if (cut >= 2 && out[cut - 2] == '%') cut -= 2;
    char tail[24];
    std::snprintf(tail, sizeof tail, "~%016llx", static_cast<unsigned long long>(hash));
    out = out.substr(0, cut) + tail;
  }
  return out;
}

std::string result_path(const Experiment& experiment, const std::string& backend) {
  return (std::filesystem::path(experiment.output_dir) / point_slug(experiment.point_label) /
          (backend + ".json"))
      .string();
}

}  // namespace muonbed
