// Text reports of result records: one summary line per record and seed 000's claims table
// (declared in core/results.hpp). Backend-neutral: `muonbed run` prints them for any backend.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/results.hpp"

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

std::string summary_line(const ResultRecord& r) {
  std::ostringstream out;
  out << (r.provenance.point.empty() ? r.provenance.experiment : r.provenance.point) << " ["
      << r.backend << (r.backend == "sim" ? "/" + r.fidelity : "") << "] " << r.setup.world_size
      << " GPUs: step avg " << duration(r.step.average_s) << ", worst " << duration(r.step.worst_s)
      << "; per GPU " << format("%.3g", r.throughput.params_per_s_per_gpu.average)
      << " params/s avg, " << format("%.3g", r.throughput.params_per_s_per_gpu.worst)
      << " worst; compute " << duration(r.throughput.compute_time_s.average) << ", comm "
      << duration(r.throughput.comm_time_s.average) << " (exposed "
      << duration(r.throughput.comm_exposed_time_s.average) << ")";
  return out.str();
}

std::string seed_claims_table(const std::vector<ResultRecord>& records) {
  // Which configuration each record is: strategy name and prefetch count from its resolved
  // configuration (the point label's spelling is up to the experiment file).
  std::map<std::string, std::map<std::string, double>> time;  // backend -> variant -> avg step
  std::map<std::string, int> gpus;
  std::vector<std::string> backends;
  for (const ResultRecord& r : records) {
    std::string name = r.setup.strategy;
    int prefetch = -1;
    if (!r.provenance.resolved_config.empty()) {
      try {
        const YAML::Node root = YAML::Load(r.provenance.resolved_config);
        if (root["strategy"] && root["strategy"]["prefetch_count"])
          prefetch = root["strategy"]["prefetch_count"].as<int>();
        if (root["strategy"] && root["strategy"]["name"])
          name = root["strategy"]["name"].as<std::string>();
      } catch (const YAML::Exception&) {
        // an unreadable configuration leaves the record unclassified
      }
    }
    std::string variant;
    if (name == "sequential")
      variant = "sequential";
    else if (name == "owner" && prefetch == 0)
      variant = "parallel";
    else if (name == "owner" && prefetch >= 2)
      variant = "prefetch";
    if (variant.empty()) continue;
    const std::string backend = r.backend == "sim" ? "sim/" + r.fidelity : r.backend;
    if (!time.count(backend)) backends.push_back(backend);
    time[backend][variant] = r.step.average_s;
    gpus[backend] = r.setup.world_size;
  }
  // Only a sweep holding at least two of the claims' configurations on one backend says anything.
  const bool comparable = std::any_of(time.begin(), time.end(),
                                      [](const auto& entry) { return entry.second.size() >= 2; });
  if (!comparable) return "";
  const auto ratio = [&](const std::string& b, const char* num, const char* den) -> std::string {
    const auto& t = time[b];
    const auto a = t.find(num), d = t.find(den);
    if (a == t.end() || d == t.end() || !(d->second > 0)) return "-";
    return format("%.2fx", a->second / d->second);
  };
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
  const struct {
    const char* what;
    const char* claimed;
    const char* faster;
    const char* slower;
  } rows[] = {
      {"parallel owner vs sequential", "~N x", "sequential", "parallel"},
      {"prefetch 2 vs parallel (on top)", "2-3x", "parallel", "prefetch"},
      {"prefetch 2 vs sequential (total)", "16-24x", "sequential", "prefetch"},
  };
  for (const auto& row : rows) {
    std::snprintf(line, sizeof line, "%-44s %-10s", row.what, row.claimed);
    out << line;
    for (const auto& b : backends) {
      std::snprintf(line, sizeof line, " %-14s", ratio(b, row.faster, row.slower).c_str());
      out << line;
    }
    out << "\n";
  }
  for (const auto& b : backends)
    out << "  " << b << ": " << gpus[b] << " GPUs (N), step times: sequential "
        << (time[b].count("sequential") ? duration(time[b]["sequential"]) : "-") << ", parallel "
        << (time[b].count("parallel") ? duration(time[b]["parallel"]) : "-") << ", prefetch "
        << (time[b].count("prefetch") ? duration(time[b]["prefetch"]) : "-") << "\n";
  return out.str();
}

}  // namespace muonbed
