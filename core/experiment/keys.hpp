// The table of every experiment key: one row per key of an experiment file (its map, name,
// type, range, default and meaning). The parser's unknown-key checks take their key lists from
// this table (experiment_keys_in), sweeps take their dotted keys from it, and `muonbed keys`
// prints it as the key reference (docs/KEYS.md), together with the cluster table
// (core/config/cluster_fields.hpp cluster_key_reference) and what the registries know (strategies
// and the options each reads, presets, assign policies, backends), so the reference cannot drift
// from what is parsed. tests/experiments/keys_test.cpp parses every row's example, default and
// range ends to hold the table to the parser.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace muonbed {

struct ExperimentKey {
  // The map holding the key, dotted: "" (top level), "training", "model.dense",
  // "mesh.dims[]" (each item of the list form of mesh.dims), "model.params[]".
  std::string section;
  std::string key;
  // "integer", "number", "text", "true | false", a choice "a | b | c", "map" (of the keys of the
  // section named after it), or a description ("list of integers", "map NAME: RANK").
  std::string type;
  // Numbers: "MIN .. MAX", both ends allowed (the tests parse both ends and refuse the values
  // beyond); any other text is a note ("> 0", "0 .. the preset's layers"); "" when not a number.
  std::string range;
  // A YAML value equal to leaving the key out; "required"; "-" (no value: the feature is off);
  // or a description in parentheses, "(the file's name)".
  std::string default_value;
  std::string meaning;
  // A valid value, YAML flow text, that makes a point differ from the default (so a test can see
  // that the parser reads the key); "" for a map whose keys have rows of their own.
  std::string example;
  // Whether the key sets something of the point (its resolved configuration shows it); false for
  // consistency checks, such as mesh.world_size, which only assert what the rest implies.
  bool sets_value = true;

  std::string path() const { return section.empty() ? key : section + "." + key; }
};

// Every row, sections in file order. Strategy options (section "strategy") are exactly the keys
// the strategies' option table knows (core/plan/strategy.hpp strategy_option_keys).
const std::vector<ExperimentKey>& experiment_keys();
// The key names of one section, in table order: what MapReader allows there.
std::vector<std::string> experiment_keys_in(std::string_view section);

// One row of the printed reference: an experiment key, or a cluster key under "cluster.".
struct KeyReferenceRow {
  std::string path;  // "training.seq_len", "cluster.gpu.peak_tflops"
  std::string type;
  std::string range;
  std::string default_value;
  std::string meaning;
  std::string applies_to;  // strategy options: the strategies that read it; "" otherwise
};

// The reference's groups: "experiment" (top-level keys), "cluster", "mesh", "model", "parallel",
// "optimizer", "strategy", "memory", "training", "sim", "sweep", then the lists "strategies",
// "presets", "backends".
std::vector<std::string> key_reference_sections();
// The whole reference as Markdown (docs/KEYS.md) or plain text, or one group of it; throws
// muonbed::Error naming the groups when `format` or `section` is unknown.
std::string key_reference(std::string_view format, std::string_view section = "");
// The rows of one group (the table groups only).
std::vector<KeyReferenceRow> key_reference_rows(std::string_view section);

}  // namespace muonbed
