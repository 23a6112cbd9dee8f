// Provenance names the sources the binary was built from: HEAD's hash, marked "-dirty-<diff
// SHA-1 prefix>" when tracked files had uncommitted changes (cmake/build_info.cmake). The script
// is run here on throwaway folders, so its rules are checked on every machine: "unknown" outside
// a repository, HEAD in a clean one, a dirty mark that tells two edits apart. The binary's own
// hash is checked against this checkout when both are known.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "core/experiment/experiment.hpp"
#include "core/results/results.hpp"
#include "muonbed/config.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;

namespace {

std::string run(const std::string& command) {
  FILE* pipe = popen((command + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return "";
  char buffer[256] = {};
  std::string out;
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
  pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// The hash cmake/build_info.cmake writes for the sources in `dir`.
std::string script_hash(const testing::TempDir& scratch, const std::string& dir) {
  const std::string out = scratch / "build_info.cpp";
  run(std::string("\"") + MUONBED_CMAKE_COMMAND + "\" -DSOURCE_DIR=\"" + dir + "\" -DOUTPUT=\"" +
      out + "\" -P \"" + MUONBED_SOURCE_DIR + "/cmake/build_info.cmake\"");
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  std::smatch m;
  const std::string s = text.str();
  return std::regex_search(s, m, std::regex("return \"([^\"]*)\"")) ? m[1].str() : "(no file)";
}

bool have_git() {
  return !run("git --version").empty();
}

}  // namespace

TEST_CASE("the build's git state: unknown outside a repository", "[results][provenance]") {
  testing::TempDir scratch("provenance");
  std::filesystem::create_directories(scratch.path() / "plain");
  CHECK(script_hash(scratch, scratch / "plain") == "unknown");
}

TEST_CASE("the build's git state: HEAD, and a dirty mark per edit", "[results][provenance]") {
  // git is a build dependency (scripts/install-deps installs it): without it this rule is
  // unchecked, which is a failure, not a pass.
  REQUIRE(have_git());
  testing::TempDir scratch("provenance");
  const std::string repo = scratch / "repo";
  const std::string git = "git -C \"" + repo + "\" -c user.name=t -c user.email=t@t ";
  run("git init -q \"" + repo + "\"");
  { std::ofstream(scratch / "repo/a.txt") << "one\n"; }
  run(git + "add a.txt");
  run(git + "commit -q -m one");
  const std::string head = run(git + "rev-parse HEAD");
  REQUIRE(head.size() == 40);
  CHECK(script_hash(scratch, repo) == head);
  { std::ofstream(scratch / "repo/a.txt") << "two\n"; }
  const std::string first_edit = script_hash(scratch, repo);
  CHECK(std::regex_match(first_edit, std::regex(head + "-dirty-[0-9a-f]{12}")));
  { std::ofstream(scratch / "repo/a.txt") << "three\n"; }
  const std::string second_edit = script_hash(scratch, repo);
  CHECK(std::regex_match(second_edit, std::regex(head + "-dirty-[0-9a-f]{12}")));
  CHECK(second_edit != first_edit);
}

TEST_CASE("provenance carries the build and the point", "[results][provenance]") {
  const Provenance p = make_provenance(nullptr, "3.32");
  INFO("git_hash " << p.git_hash);
  CHECK(std::regex_match(p.git_hash,
                         std::regex("unknown|[0-9a-f]{40}(-dirty-([0-9a-f]{12}|unknown))?")));
  CHECK(p.muonbed_version == MUONBED_VERSION);
  CHECK(p.simgrid_version == "3.32");
  CHECK_FALSE(p.host_name.empty());
  CHECK(p.point.empty());
  // The binary's hash names this checkout's HEAD. git is a build dependency (see above); only a
  // source tree that is no checkout (an unpacked archive) has no HEAD, and then the build could
  // not know one either.
  REQUIRE(have_git());
  const std::string head = run(std::string("git -C \"") + MUONBED_SOURCE_DIR + "\" rev-parse HEAD");
  if (head.size() == 40) {
    INFO("a mismatch after a commit means the test binary is stale: cmake --build BUILD first");
    CHECK(p.git_hash.substr(0, 40) == head);
  } else {
    CHECK(p.git_hash == "unknown");
  }

  const auto points = parse_experiment(
      "name: prov\nmesh: {dims: {dp_shard: 2}}\nmodel: {preset: tiny-dense}\n"
      "sweep: {strategy.name: [owner, sequential]}\n",
      "prov.yaml");
  const Provenance q = make_provenance(&points.at(1), "");
  CHECK(q.experiment == "prov");
  CHECK(q.experiment_file == "prov.yaml");
  CHECK(q.point == "strategy.name=sequential");
  CHECK(q.resolved_config == points.at(1).resolved_yaml);
}
