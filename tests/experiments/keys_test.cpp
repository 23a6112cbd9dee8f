// The key table (core/experiment/keys.hpp) held to the parser: every row's example parses and
// changes the point (so a key in the table that nothing reads fails), its default changes nothing,
// its numeric range is the one the parser enforces, each of its choices parses, and a misspelt key
// is refused naming it. A key read but missing from the table cannot parse at all (MapReader
// refuses the read, checked below). The strategy rows are the strategies' option table.
#include <catch2/catch.hpp>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/config/cluster.hpp"
#include "core/config/cluster_fields.hpp"
#include "core/config/src/yaml_util.hpp"
#include "core/experiment/experiment.hpp"
#include "core/experiment/keys.hpp"
#include "core/plan/strategy.hpp"

using namespace muonbed;

namespace {

// Two 64 x 64 Muon matrices (w in no layer, v in layer 1) on a 2 x 2 mesh: the experiment every
// row is set into, unless its section needs another model or mesh. (The examples of
// mesh.gpus_per_node and mesh.world_size, checks of what the rest implies, hold for it.)
constexpr const char* kBase =
    "name: keys\n"
    "mesh: {dims: {dp_shard: 2, tp: 2}}\n"
    "model:\n"
    "  params:\n"
    "    - {name: w, shape: [64, 64]}\n"
    "    - {name: v, shape: [64, 64], layer: 1}\n";
constexpr const char* kDense = "{dense: {hidden: 256, layers: 2, heads: 4, ffn: 512, vocab: 1024}}";
constexpr const char* kMoe =
    "{moe: {hidden: 256, layers: 2, heads: 4, ffn: 512, vocab: 1024, experts: 4, expert_ffn: "
    "128}}";
constexpr const char* kHf =
    "{hf_config: {model_type: qwen3_moe, hidden_size: 128, intermediate_size: 256, "
    "moe_intermediate_size: 64, num_hidden_layers: 2, num_attention_heads: 4, "
    "num_key_value_heads: 2, head_dim: 32, vocab_size: 1024, num_experts: 8, "
    "num_experts_per_tok: 2}}";

// The first registered strategy that reads `option` (by default options otherwise).
std::string first_reader(const std::string& option) {
  for (const std::string& name : strategy_names()) {
    StrategyOptions s;
    s.name = name;
    if (strategy_reads_option(s, option)) return name;
  }
  FAIL("no strategy reads strategy." << option);
  return "";
}

// The experiment a row is tested in.
YAML::Node base_for(const ExperimentKey& k) {
  YAML::Node root = YAML::Load(kBase);
  const std::string path = k.path();
  if (k.section == "model.dense" || path == "optimizer.qk_clip.enabled" ||
      path == "optimizer.qk_clip.tau")
    root["model"] = YAML::Load(kDense);
  if (k.section == "model.moe" || k.section == "mesh.dims[]" ||
      path == "training.experts_per_token")
    root["model"] = YAML::Load(kMoe);
  if (k.section == "training" && path != "training.experts_per_token")
    root["model"] = YAML::Load(kDense);
  if (k.section == "model" && k.key != "placements")
    root["model"] = YAML::Load("{preset: tiny-dense}");
  if (path == "model.experts") root["model"] = YAML::Load(kHf);
  if (k.section == "mesh.dims[]")
    root["mesh"]["dims"] = YAML::Load("[{name: dp_shard, size: 2}, {name: tp, size: 2}]");
  if (k.section == "training") {
    root["mesh"]["dims"] = YAML::Load("{dp_shard: 4}");
    root["training"] = YAML::Load("{tokens_per_step: 16384, seq_len: 1024}");
    if (path == "training.experts_per_token") root["training"]["experts_per_token"] = 1;
  }
  if (k.section == "strategy" || k.section.starts_with("strategy.")) {
    const std::string option = k.section == "strategy" ? k.key : k.section.substr(9);
    if (option != "name" && option != "preset" && option != "grad_sync")
      root["strategy"]["name"] = first_reader(option);
    // split_ns's keys in a map that enables it (their defaults are those of split Newton-Schulz).
    if (k.section == "strategy.split_ns")
      root["strategy"]["split_ns"] = YAML::Load("{enabled: true}");
  }
  return root;
}

// root's node for the map holding row k's key ("mesh.dims[]": the first dim).
YAML::Node holder(YAML::Node root, const std::string& section) {
  YAML::Node node = root;
  if (section.empty()) return node;
  std::size_t start = 0;
  while (start <= section.size()) {
    const std::size_t dot = section.find('.', start);
    std::string part = section.substr(start, dot == std::string::npos ? dot : dot - start);
    const bool list = part.ends_with("[]");
    if (list) part.resize(part.size() - 2);
    YAML::Node next = node[part];
    if (!next.IsDefined() || next.IsNull()) {
      node[part] = YAML::Node(YAML::NodeType::Map);
      next = node[part];
    }
    node.reset(list ? next[0] : next);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return node;
}

std::string with(const ExperimentKey& k, const std::string& value) {
  YAML::Node root = base_for(k);
  // assign: explicit reads the owners (every Muon matrix's).
  if (k.path() == "strategy.assign" && value == "explicit")
    root["strategy"]["explicit_owners"] = YAML::Load("{w: 1, v: 2}");
  if (k.path() == "strategy.explicit_owners") root["strategy"]["assign"] = "explicit";
  // model.preset / hf_config replace the model (one kind per model).
  if (k.section == "model" && (k.key == "preset" || k.key == "hf_config"))
    root["model"] = YAML::Node(YAML::NodeType::Map);
  holder(root, k.section)[k.key] = YAML::Load(value);
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

std::string resolved(const std::string& yaml) {
  const std::vector<Experiment> points = parse_experiment(yaml, "keys.yaml");
  REQUIRE(points.size() == 1);
  return points[0].resolved_yaml;
}

std::string base_resolved(const ExperimentKey& k) {
  YAML::Emitter out;
  out << base_for(k);
  return resolved(out.c_str());
}

// The parse's error text ("" when it parses).
std::string error_of(const std::string& yaml) {
  try {
    parse_experiment(yaml, "keys.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool is_yaml_default(const std::string& text) {
  return text != "-" && text.find("required") == std::string::npos &&
         text.find('(') == std::string::npos;
}

}  // namespace

TEST_CASE("key table: paths are unique and every section is a map key of its own",
          "[experiments][keys]") {
  std::set<std::string> paths;
  for (const ExperimentKey& k : experiment_keys()) {
    INFO(k.path());
    CHECK(paths.insert(k.path()).second);
    CHECK(!k.type.empty());
    CHECK(!k.meaning.empty());
    CHECK(!k.default_value.empty());
  }
  for (const ExperimentKey& k : experiment_keys()) {
    if (k.section.empty()) continue;
    std::string parent = k.section;
    if (parent.ends_with("[]")) parent.resize(parent.size() - 2);
    INFO(k.path() << " lies in " << parent);
    CHECK(paths.count(parent) == 1);
  }
}

TEST_CASE("key table: the strategy rows are the strategies' option table", "[experiments][keys]") {
  std::set<std::string> table, options;
  for (const std::string& k : experiment_keys_in("strategy")) table.insert(k);
  for (std::string_view k : strategy_option_keys()) options.emplace(k);
  CHECK(table == options);
  // What a strategy declares it reads is a key a file can set.
  for (const std::string& name : strategy_names())
    for (std::string_view option : find_strategy(name).options()) {
      INFO(name << " reads " << option);
      CHECK(table.count(std::string(option)) == 1);
    }
}

TEST_CASE("key table: every example parses, and a key with a value changes the point",
          "[experiments][keys]") {
  for (const ExperimentKey& k : experiment_keys()) {
    if (k.example.empty()) continue;
    INFO(k.path() << ": " << k.example);
    const std::string yaml = with(k, k.example);
    INFO(yaml);
    std::string point;
    REQUIRE_NOTHROW(point = resolved(yaml));
    if (k.sets_value) CHECK(point != base_resolved(k));
  }
}

TEST_CASE("key table: a default value is the same point as no value", "[experiments][keys]") {
  int checked = 0;
  for (const ExperimentKey& k : experiment_keys()) {
    if (!is_yaml_default(k.default_value)) continue;
    INFO(k.path() << ": " << k.default_value);
    const std::string yaml = with(k, k.default_value);
    INFO(yaml);
    CHECK(resolved(yaml) == base_resolved(k));
    ++checked;
  }
  CHECK(checked > 50);
}

TEST_CASE("key table: numeric ranges are the parser's", "[experiments][keys]") {
  // "MIN .. MAX" (both ends allowed), ">= MIN", "> MIN"; other ranges are notes.
  const std::regex closed(R"((-?[0-9.e+-]+) \.\. ([0-9.e+-]+))");
  const std::regex open(R"((>=?) (-?[0-9.]+))");
  int checked = 0;
  for (const ExperimentKey& k : experiment_keys()) {
    std::smatch m;
    const bool integer = k.type == "integer";
    std::string outside, fix;
    if (std::regex_match(k.range, m, closed)) {
      const long double min = std::stold(m[1]), max = std::stold(m[2]);
      outside = integer ? std::to_string(static_cast<long long>(max) + 1)
                        : yaml_util::format_number(static_cast<double>(max) * 2 + 1);
      fix = integer ? "use an integer in " + std::string(m[1]) + ".." + std::string(m[2])
                    : "use a number >= " + std::string(m[1]) + " and <= " + std::string(m[2]);
      (void)min;
    } else if (std::regex_match(k.range, m, open)) {
      outside = "-1";
      fix = (integer ? "use an integer " : "use a number ") + std::string(m[1]) + " " +
            std::string(m[2]);
    } else {
      continue;
    }
    INFO(k.path() << ": range " << k.range << ", value " << outside);
    const std::string error = error_of(with(k, outside));
    CHECK_THAT(error, Catch::Contains("'" + k.path()) || Catch::Contains(k.key + "'"));
    CHECK_THAT(error, Catch::Contains(fix));
    ++checked;
  }
  CHECK(checked > 40);
}

TEST_CASE("key table: each choice of a choice key parses, and no other word does",
          "[experiments][keys]") {
  const std::regex word("[a-z_0-9]+");
  int checked = 0;
  for (const ExperimentKey& k : experiment_keys()) {
    if (k.type.find(" | ") == std::string::npos) continue;
    const std::vector<std::string> parts = [&] {
      std::vector<std::string> out;
      std::size_t start = 0;
      while (true) {
        const std::size_t bar = k.type.find(" | ", start);
        out.push_back(k.type.substr(start, bar == std::string::npos ? bar : bar - start));
        if (bar == std::string::npos) break;
        start = bar + 3;
      }
      return out;
    }();
    const bool pure = std::all_of(parts.begin(), parts.end(),
                                  [&](const std::string& p) { return std::regex_match(p, word); });
    for (const std::string& choice : parts) {
      if (!std::regex_match(choice, word)) continue;
      INFO(k.path() << ": " << choice);
      CHECK(error_of(with(k, choice)) == "");
      ++checked;
    }
    if (pure && k.type != "true | false") {
      INFO(k.path() << ": no_such_choice");
      const std::string error = error_of(with(k, "no_such_choice"));
      for (const std::string& choice : parts) CHECK_THAT(error, Catch::Contains(choice));
    }
  }
  CHECK(checked > 40);
}

TEST_CASE("key table: a misspelt key is refused, naming the key meant", "[experiments][keys]") {
  for (const ExperimentKey& k : experiment_keys()) {
    ExperimentKey typo = k;
    typo.key += "x";
    INFO(k.path());
    const std::string error = error_of(with(typo, k.example.empty() ? "1" : k.example));
    CHECK_THAT(error, Catch::Contains("unknown key '" + typo.key + "'") &&
                          Catch::Contains("did you mean '" + k.key + "'"));
  }
}

TEST_CASE("key table: a key read but missing from its table is a programming error",
          "[experiments][keys]") {
  const yaml_util::Context ctx{"keys.yaml", ""};
  const yaml_util::MapReader m(ctx, YAML::Load("{a: 1}"), "section", {"a", "b"});
  int value = 0;
  CHECK(m.read("a", value, 0));
  CHECK(value == 1);
  CHECK_FALSE(m.read("b", value, 0));  // listed, absent
  CHECK_THROWS_AS(m.read("c", value, 0), std::logic_error);
}

TEST_CASE("key reference: every table row and every cluster key is printed",
          "[experiments][keys]") {
  const std::string markdown = key_reference("markdown");
  for (const ExperimentKey& k : experiment_keys())
    CHECK_THAT(markdown, Catch::Contains("| `" + k.path() + "` |"));
  for (const ClusterKeyDoc& d : cluster_key_reference())
    CHECK_THAT(markdown, Catch::Contains("| `cluster." + d.path + "` |"));
  // Strategy options name their readers: chunk_sizing is all_to_all's and owner_allgather's
  // (README "Every key is checked"), and not owner's.
  const std::vector<KeyReferenceRow> rows = key_reference_rows("strategy");
  const auto sizing = std::find_if(rows.begin(), rows.end(), [](const KeyReferenceRow& r) {
    return r.path == "strategy.chunk_sizing";
  });
  REQUIRE(sizing != rows.end());
  CHECK_THAT(sizing->applies_to, Catch::Contains("all_to_all") &&
                                     Catch::Contains("owner_allgather") &&
                                     !Catch::Contains("owner,"));
  CHECK_THROWS_AS(key_reference("html"), Error);
  CHECK_THROWS_AS(key_reference("text", "no_such_section"), Error);
  CHECK(key_reference("text", "training").find("training.seq_len") != std::string::npos);
}
