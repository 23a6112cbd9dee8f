// Text reports of result records: backend labels and seed 000's claims table
// (declared in core/results/results.hpp). Backend-neutral: `muonbed run` prints them for any
// backend.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

#include "core/plan/strategy.hpp"
#include "core/results/results.hpp"

namespace muonbed {

namespace {

std::string format(const char* fmt, double v) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, fmt, v);
  return buffer;
}

std::string duration(double s) {
  if (s >= 1) return format("%.3f s", s);
  if (s >= 1e-3) return format("%.3f ms", s * 1e3);
  return format("%.3f us", s * 1e6);
}

}  // namespace

std::string backend_label(const std::string& backend, const std::string& fidelity) {
  return backend == "sim" && !fidelity.empty() ? "sim/" + fidelity : backend;
}

double SeedClaimRow::predicted() const {
  if (!baseline_record || !target_record || !(target_record->step.average_s > 0))
    return std::numeric_limits<double>::quiet_NaN();
  return baseline_record->step.average_s / target_record->step.average_s;
}

namespace {

// "sequential", "parallel", "prefetch" or "" for a record, from its resolved configuration (the
// point label's spelling is up to the experiment file).
std::string seed_variant(const ResultRecord& r) {
  std::string name = r.setup.strategy;
  int prefetch = -1;
  if (!r.provenance.resolved_config.empty()) {
    try {
      const YAML::Node root = YAML::Load(r.provenance.resolved_config);
      if (root.IsMap() && root["strategy"] && root["strategy"].IsMap()) {
        if (root["strategy"]["prefetch_count"])
          prefetch = root["strategy"]["prefetch_count"].as<int>();
        if (root["strategy"]["name"]) name = root["strategy"]["name"].as<std::string>();
      }
    } catch (const YAML::Exception&) {
      // an unreadable configuration leaves the record unclassified
    }
  }
  // The strategy says which of seed 000's configurations its options are.
  const Strategy* strategy = find_strategy_or_null(name);
  if (!strategy) return "";
  StrategyOptions options;
  options.name = name;
  if (prefetch >= 0) options.prefetch_count = prefetch;
  return strategy->seed_configuration(options);
}

std::string backend_name(const ResultRecord& r) {
  return backend_label(r.backend, r.fidelity);
}

}  // namespace

std::vector<SeedClaimRow> seed_claims(const std::vector<ResultRecord>& records) {
  // Per backend (and fidelity), the first record of each configuration.
  std::vector<std::string> backends;
  std::map<std::string, std::map<std::string, const ResultRecord*>> found;
  for (const ResultRecord& r : records) {
    const std::string variant = seed_variant(r);
    if (variant.empty()) continue;
    const std::string b = backend_name(r);
    if (!found.count(b)) backends.push_back(b);
    found[b].try_emplace(variant, &r);
  }
  std::vector<SeedClaimRow> rows;
  for (const std::string& b : backends) {
    const auto& configs = found[b];
    if (configs.size() < 2) continue;  // one configuration says nothing
    const ResultRecord& any = *configs.begin()->second;
    const double n = any.setup.world_size;
    const struct {
      std::string what, claimed;
      double low, high;
      const char* baseline;
      const char* target;
    } claims[] = {
        {"parallel owner vs sequential", "~N x (N = " + std::to_string(any.setup.world_size) + ")",
         n / 1.2, n * 1.2, "sequential", "parallel"},
        {"prefetch 2 vs parallel (on top)", "2-3x", 2, 3, "parallel", "prefetch"},
        {"prefetch 2 vs sequential (total)", "16-24x", 16, 24, "sequential", "prefetch"},
    };
    for (const auto& c : claims) {
      SeedClaimRow row;
      row.claim = c.what;
      row.claimed = c.claimed;
      row.low = c.low;
      row.high = c.high;
      row.backend = any.backend;
      row.fidelity = any.fidelity;
      row.baseline = c.baseline;
      row.target = c.target;
      if (const auto it = configs.find(c.baseline); it != configs.end())
        row.baseline_record = it->second;
      if (const auto it = configs.find(c.target); it != configs.end())
        row.target_record = it->second;
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

std::string seed_claims_table(const std::vector<ResultRecord>& records) {
  const std::vector<SeedClaimRow> rows = seed_claims(records);
  if (rows.empty()) return "";
  std::vector<std::string> backends;
  for (const SeedClaimRow& row : rows) {
    const std::string b = backend_label(row.backend, row.fidelity);
    if (std::find(backends.begin(), backends.end(), b) == backends.end()) backends.push_back(b);
  }
  std::ostringstream out;
  out << "Seed 000's claims vs predictions (speedup = step time ratio, average step)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-44s %-10s", "claim (seed 000, 8 GPUs)", "claimed");
  out << line;
  for (const auto& b : backends) {
    std::snprintf(line, sizeof line, " %-14s", b.c_str());
    out << line;
  }
  out << "\n";
  for (std::size_t c = 0; c < rows.size() / backends.size(); ++c) {
    const SeedClaimRow& first = rows[c];
    const std::string claimed = c == 0 ? "~N x" : first.claimed;
    std::snprintf(line, sizeof line, "%-44s %-10s", first.claim.c_str(), claimed.c_str());
    out << line;
    for (std::size_t b = 0; b < backends.size(); ++b) {
      const double ratio = rows[b * 3 + c].predicted();
      const std::string text = std::isfinite(ratio) ? format("%.2fx", ratio) : "-";
      std::snprintf(line, sizeof line, " %-14s", text.c_str());
      out << line;
    }
    out << "\n";
  }
  for (std::size_t b = 0; b < backends.size(); ++b) {
    const SeedClaimRow& row = rows[b * 3];
    const ResultRecord* any = row.baseline_record ? row.baseline_record : row.target_record;
    const auto time_of = [&](const std::string& variant) -> std::string {
      for (std::size_t c = 0; c < 3; ++c) {
        const SeedClaimRow& r = rows[b * 3 + c];
        if (r.baseline == variant && r.baseline_record)
          return duration(r.baseline_record->step.average_s);
        if (r.target == variant && r.target_record)
          return duration(r.target_record->step.average_s);
      }
      return "-";
    };
    out << "  " << backends[b] << ": " << (any ? any->setup.world_size : 0)
        << (any && any->setup.rank_kind == "cpu" ? " ranks" : " GPUs")
        << " (N), step times: sequential " << time_of("sequential") << ", parallel "
        << time_of("parallel") << ", prefetch " << time_of("prefetch") << "\n";
  }
  return out.str();
}

}  // namespace muonbed
