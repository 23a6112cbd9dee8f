// Provenance of a result: this build's version and git state, the host, and the experiment point
// it ran (core/results/results.hpp's provenance block), and the record's UTC timestamp.
#include "core/results/results.hpp"

#include <unistd.h>

#include <ctime>

#include "core/experiment/experiment.hpp"
#include "muonbed/config.hpp"

namespace muonbed {

// Generated at build time by cmake/build_info.cmake.
const char* build_git_hash();

namespace {

std::string host_name() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof buffer - 1) != 0) return "unknown";
  return buffer;
}

}  // namespace

Provenance make_provenance(const Experiment* experiment, const std::string& simgrid_version) {
  Provenance p;
  p.muonbed_version = MUONBED_VERSION;
  p.git_hash = build_git_hash();
  p.simgrid_version = simgrid_version;
  p.host_name = host_name();
  if (experiment != nullptr) {
    p.experiment = experiment->name;
    p.experiment_file = experiment->file;
    p.point = experiment->point_label;
    p.resolved_config = experiment->resolved_yaml;
  }
  return p;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

}  // namespace muonbed
