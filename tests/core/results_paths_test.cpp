// Where results go on disk: point folders are injective in the point label (no two sweep points
// can overwrite each other's results), fit a file system's name limit, and temporary files carry a
// name that only muonbed writes, so cleanup never mistakes a user's file for one.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "core/results/results.hpp"

using namespace muonbed;

TEST_CASE("point folders are distinct for distinct labels", "[results][paths]") {
  // Values that a replace-by-underscore scheme maps to one folder.
  const std::vector<std::string> labels = {"k=a/b",  "k=a b", "k=a_b", "k=a%2Fb", "k=a:b", "k=a\\b",
                                           "k=a\nb", "k=..",  "k=a,b", "k=a%b",   "k=é",   "k=e",
                                           "k=",     "k=A",   "k=a",   "k=a_",    "k=a%5F"};
  std::set<std::string> slugs;
  for (const auto& label : labels) {
    const std::string slug = point_slug(label);
    INFO(label << " -> " << slug);
    CHECK(slug.find('/') == std::string::npos);
    CHECK(slug.find('\0') == std::string::npos);
    CHECK(slug != ".");
    CHECK(slug != "..");
    CHECK(slugs.insert(slug).second);
  }
  CHECK(point_slug("") == "default");
  // Readable where nothing needs escaping.
  CHECK(point_slug("strategy.name=owner,mesh.dp_shard=8") == "strategy.name=owner,mesh.dp_shard=8");
}

TEST_CASE("long labels fit a file name and stay distinct", "[results][paths]") {
  std::set<std::string> slugs;
  for (int i = 0; i < 200; ++i) {
    // Differ only at the end, far past any prefix that is kept.
    const std::string label = "model.params=" + std::string(5000, '/') + std::to_string(i);
    const std::string slug = point_slug(label);
    INFO(slug);
    CHECK(slug.size() <= 200);
    CHECK(slugs.insert(slug).second);
  }
}

TEST_CASE("temporary file names round-trip and nothing else parses as one", "[results][paths]") {
  std::string target;
  long pid = 0;
  REQUIRE(parse_temp_file_name(temp_file_name("sim.json", 4242), target, pid));
  CHECK(target == "sim.json");
  CHECK(pid == 4242);
  for (const std::string name :
       {"thesis.tmp.4000000", "sim.json.tmp.12", "sim.json", ".muonbed-tmp-12",
        "sim.json.muonbed-tmp-", "a.muonbed-tmp-1x", "a.muonbed-tmp-1234567890"}) {
    INFO(name);
    CHECK_FALSE(parse_temp_file_name(name, target, pid));
  }
}
