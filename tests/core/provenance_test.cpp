// Provenance names the sources the binary was built from: HEAD's hash, marked "-dirty-<diff
// SHA-1 prefix>" when tracked files had uncommitted changes (cmake/build_info.cmake).
#include <catch2/catch.hpp>

#include <cstdio>
#include <regex>
#include <string>

#include "core/results.hpp"
#include "muonbed/config.hpp"

using namespace muonbed;

namespace {
std::string checkout_head() {
  const std::string command =
      "git -C \"" + std::string(MUONBED_SOURCE_DIR) + "\" rev-parse HEAD 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  char buffer[128] = {};
  std::string out;
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
  pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}
}  // namespace

TEST_CASE("provenance carries the build's git state", "[results][provenance]") {
  const Provenance p = make_provenance(nullptr, "");
  INFO("git_hash " << p.git_hash);
  const std::regex form("unknown|[0-9a-f]{40}(-dirty-([0-9a-f]{12}|unknown))?");
  CHECK(std::regex_match(p.git_hash, form));
  const std::string head = checkout_head();
  if (p.git_hash != "unknown" && head.size() == 40) CHECK(p.git_hash.substr(0, 40) == head);
}
