// Golden-file comparison of result records, shared by the analytic (tests/core) and simulated
// (tests/sim) golden tests: a record's JSON without the fields that depend on the machine or the
// checkout, compared field by field with numbers to a relative tolerance, reporting the first
// difference. MUONBED_UPDATE_GOLDEN=1 in the environment rewrites the golden files instead.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/results/results.hpp"

namespace muonbed::testing {

// Compares two JSON values; numbers to `tolerance` (relative); sets `why` to the first difference.
inline bool same_json(const nlohmann::json& a, const nlohmann::json& b, double tolerance,
                      const std::string& path, std::string& why) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    if (std::fabs(x - y) <= tolerance * std::max(std::fabs(x), std::fabs(y))) return true;
    why = path + ": " + a.dump() + " vs " + b.dump();
    return false;
  }
  if (a.type() != b.type()) {
    why = path + ": type differs";
    return false;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) {
      why = path + ": keys differ";
      return false;
    }
    for (auto it = a.begin(); it != a.end(); ++it) {
      if (!b.contains(it.key())) {
        why = path + "." + it.key() + ": missing";
        return false;
      }
      if (!same_json(it.value(), b.at(it.key()), tolerance, path + "." + it.key(), why))
        return false;
    }
    return true;
  }
  if (a.is_array()) {
    if (a.size() != b.size()) {
      why = path + ": " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " items";
      return false;
    }
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!same_json(a[i], b[i], tolerance, path + "[" + std::to_string(i) + "]", why))
        return false;
    return true;
  }
  if (a != b) {
    why = path + ": " + a.dump() + " vs " + b.dump();
    return false;
  }
  return true;
}

// A record's JSON without the timestamp and the provenance fields that depend on the machine or
// checkout (git_hash, host_name, muonbed_version, experiment_file, and the resolved
// configuration's header line naming the file).
inline nlohmann::json comparable_record(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text);
  j.erase("timestamp");
  j.erase("checksum");  // covers the timestamp
  for (const char* key : {"git_hash", "host_name", "muonbed_version", "experiment_file"})
    j["provenance"].erase(key);
  std::string config = j["provenance"]["resolved_config"].get<std::string>();
  if (config.rfind("# resolved configuration of", 0) == 0)
    config = config.substr(config.find('\n') + 1);
  j["provenance"]["resolved_config"] = config;
  return j;
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return in.good() || in.eof() ? text.str() : std::string();
}

// Checks `record` against the golden file `path`, numbers to a relative `tolerance`. With
// MUONBED_UPDATE_GOLDEN set it rewrites the file from `record` and fails: a new golden is accepted
// only by a later run that compares against it, after `git diff` was reviewed.
inline void check_golden_record(const ResultRecord& record, const std::string& path,
                                double tolerance) {
  const std::string fresh = result_to_json(record);
  const std::string text = read_text_file(path);
  std::string why;
  const bool equal = !text.empty() && same_json(comparable_record(text), comparable_record(fresh),
                                                tolerance, "", why);
  if (std::getenv("MUONBED_UPDATE_GOLDEN") != nullptr) {
    ResultRecord pinned = record;
    pinned.timestamp = "";
    pinned.provenance.git_hash = "";
    pinned.provenance.host_name = "";
    pinned.provenance.experiment_file = "";
    // The header line names the checkout's absolute path: keep the part below the checkout.
    std::string& config = pinned.provenance.resolved_config;
    const std::string source = std::string(MUONBED_SOURCE_DIR) + "/";
    if (const std::size_t at = config.find(source);
        at != std::string::npos && at < config.find('\n'))
      config.erase(at, source.size());
    write_file_atomically(path, result_to_json(pinned));
    FAIL_CHECK("rewrote " << path << (equal ? " (no change)" : " (first change: " + why + ")")
                          << "; review `git diff`, then run again without MUONBED_UPDATE_GOLDEN");
    return;
  }
  REQUIRE(!text.empty());
  // The golden is muonbed's own output, not an edited file.
  CHECK(verify_checksum(text));
  INFO("first difference from " << path << ": " << why);
  CHECK(equal);
  // The comparison sees the numbers: a changed step time must fail it.
  nlohmann::json changed = nlohmann::json::parse(fresh);
  changed["step"]["average_s"] = changed["step"]["average_s"].get<double>() * (1 + 10 * tolerance);
  std::string ignored;
  CHECK_FALSE(same_json(comparable_record(text), comparable_record(changed.dump()), tolerance, "",
                        ignored));
}

}  // namespace muonbed::testing
