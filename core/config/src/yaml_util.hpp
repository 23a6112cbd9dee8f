// Private helpers for strict YAML reading (experiment and cluster files). Every accessor checks
// the node's type and range and throws ConfigError at the node's file:line:column with the value
// and the fix, so the parsers in experiment.cpp and cluster.cpp stay a flat list of fields.
// Also: shortest round-trip number formatting for resolved YAML. "Did you mean" comes from
// core/base/suggest.hpp. Cluster profiles' own YAML functions are cluster.cpp's
// (src/cluster_yaml.hpp); this file knows nothing of clusters.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/base/errors.hpp"
#include "core/base/suggest.hpp"

namespace muonbed::yaml_util {

// Where messages point: the file name, and the sweep point being parsed (appended to messages).
struct Context {
  std::string file;
  std::string point;
};

// One map entry or list element. `key` is undefined for list elements; `path` is the dotted
// schema path used in messages ("strategy.prefetch_count", "mesh.dims[1].size").
struct Field {
  YAML::Node key;
  YAML::Node value;
  std::string path;
};

// 1-based location of a node (line/column 0 when the node has no mark).
SourceLocation location_of(const YAML::Node& node, const std::string& file);
// The value's location, or the key's when the value is null or has no mark.
SourceLocation location_of(const Field& field, const std::string& file);

[[noreturn]] void fail(const Context& ctx, const SourceLocation& where, const std::string& what,
                       const std::string& fix);
[[noreturn]] void fail(const Context& ctx, const YAML::Node& at, const std::string& what,
                       const std::string& fix);
[[noreturn]] void fail(const Context& ctx, const Field& at, const std::string& what,
                       const std::string& fix);

// A value as it appears in messages: 'text' for scalars, flow YAML for maps and lists.
std::string show(const YAML::Node& node);
// "a map", "a list", "a scalar", "empty (null)".
std::string kind_of(const YAML::Node& node);

std::string join(const std::vector<std::string>& items, const std::string& separator = ", ");
// Shortest text that reads back to the same double ("0.95", "1e-08", "989").
std::string format_number(double value);

// The largest experiment or cluster file read (yaml-cpp needs ~1 KB of memory and a few
// microseconds per value, so this bounds a load to well under a second and a few hundred MB).
inline constexpr std::size_t kMaxInputBytes = std::size_t{1} << 20;

// Parses YAML text; a syntax error becomes ConfigError at its line and column. Binary data (a NUL
// byte) and a second non-empty document ('---') are errors too: nothing in the text is ignored.
YAML::Node load_yaml(const std::string& text, const std::string& file);
// Reads a whole file of at most kMaxInputBytes; a missing or unreadable path, a folder or a
// bigger file is a ConfigError naming `what` it should be, the system's reason and the fix.
std::string read_text_file(const std::string& path, const std::string& what);

// A map checked strictly on construction: it is a map, its keys are scalars, no key repeats and
// every key is in `allowed` (an unknown key names the closest valid one).
class MapReader {
 public:
  MapReader(const Context& ctx, const YAML::Node& node, std::string path,
            std::vector<std::string> allowed);
  // A reader over the value of `field` (which must be a map).
  MapReader(const Context& ctx, const Field& field, std::vector<std::string> allowed);

  const YAML::Node& node() const { return node_; }
  const std::string& path() const { return path_; }
  const Context& context() const { return ctx_; }
  const std::vector<Field>& fields() const { return fields_; }

  bool has(std::string_view key) const { return find(key) != nullptr; }
  const Field* find(std::string_view key) const;
  // The field, or a ConfigError at the map saying the key is missing and what to put there.
  const Field& require(std::string_view key, const std::string& example) const;

  // Typed reads of optional keys: if present, convert (strictly) into `out` and return true.
  bool read(std::string_view key, std::string& out) const;
  bool read(std::string_view key, bool& out) const;
  bool read(std::string_view key, int& out, std::int64_t min,
            std::int64_t max = std::numeric_limits<int>::max()) const;
  bool read(std::string_view key, std::int64_t& out, std::int64_t min,
            std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;
  // Range [min, max]; with min_exclusive the value must be > min.
  bool read(std::string_view key, double& out, double min, double max,
            bool min_exclusive = false) const;
  bool read_choice(std::string_view key, std::string& out,
                   const std::vector<std::string>& choices) const;

 private:
  Context ctx_;
  YAML::Node node_;
  std::string path_;
  std::vector<Field> fields_;
  // The keys this map allows: find() of any other key is a programming error (a key read but
  // missing from its table, so no file could ever set it), thrown as std::logic_error.
  std::vector<std::string> allowed_;
};

// Strict conversions of one field.
std::string to_string_value(const Context& ctx, const Field& field);
bool to_bool(const Context& ctx, const Field& field);
std::int64_t to_int(const Context& ctx, const Field& field, std::int64_t min,
                    std::int64_t max = std::numeric_limits<std::int64_t>::max());
double to_double(const Context& ctx, const Field& field, double min, double max,
                 bool min_exclusive = false);
std::string to_choice(const Context& ctx, const Field& field,
                      const std::vector<std::string>& choices);
// The elements of a list field (a ConfigError if it is not a list); paths are "path[i]".
std::vector<Field> list_items(const Context& ctx, const Field& field);
// The entries of a map from names to values (tp_dim_per_param, explicit_owners): a ConfigError if
// the field is not a non-empty map, a key is not a plain scalar, or a key repeats (YAML would
// otherwise let the last one win silently). Paths are "path.key"; `example` shows the form.
std::vector<Field> map_entries(const Context& ctx, const Field& field, const std::string& example);
// `text` for a message: quoted, and cut to 80 bytes with "..." when longer.
std::string quote(std::string_view text);

}  // namespace muonbed::yaml_util
