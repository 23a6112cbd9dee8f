// Strict YAML accessors for experiment and cluster files: type, range and key checks that throw
// ConfigError at the offending node (1-based file:line:column from yaml-cpp's Mark), with the
// value and the fix. See yaml_util.hpp.
#include "core/src/yaml_util.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>
#include <system_error>

namespace muonbed::yaml_util {

namespace {

std::string last_key(const std::string& path) {
  const std::size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

bool is_null(const YAML::Node& node) {
  return !node.IsDefined() || node.IsNull();
}

void require_scalar(const Context& ctx, const Field& field, const std::string& expected,
                    const std::string& example) {
  if (is_null(field.value))
    fail(ctx, field, "'" + field.path + "' has no value",
         "give it " + expected + ", e.g. " + example);
  if (!field.value.IsScalar())
    fail(ctx, field,
         "'" + field.path + "' must be " + expected + ", got " + kind_of(field.value) + " " +
             show(field.value),
         "write " + expected + ", e.g. " + example);
}

std::string range_text(std::int64_t min, std::int64_t max) {
  if (max == std::numeric_limits<std::int64_t>::max() || max == std::numeric_limits<int>::max())
    return ">= " + std::to_string(min);
  return "in " + std::to_string(min) + ".." + std::to_string(max);
}

}  // namespace

SourceLocation location_of(const YAML::Node& node, const std::string& file) {
  SourceLocation where;
  where.file = file;
  if (node.IsDefined()) {
    const YAML::Mark mark = node.Mark();
    if (!mark.is_null() && mark.line >= 0) {
      where.line = mark.line + 1;
      where.column = mark.column + 1;
    }
  }
  return where;
}

SourceLocation location_of(const Field& field, const std::string& file) {
  if (!is_null(field.value)) {
    SourceLocation where = location_of(field.value, file);
    if (where.line > 0) return where;
  }
  // yaml-cpp marks a null value at the start of the next token, often the next line: the key
  // is where the user looks.
  if (field.key.IsDefined()) {
    SourceLocation where = location_of(field.key, file);
    if (where.line > 0) return where;
  }
  return location_of(field.value, file);
}

void fail(const Context& ctx, const SourceLocation& where, const std::string& what,
          const std::string& fix) {
  std::string message = what;
  if (!ctx.point.empty()) message += " (in sweep point " + ctx.point + ")";
  throw ConfigError(where, message, fix);
}

void fail(const Context& ctx, const YAML::Node& at, const std::string& what,
          const std::string& fix) {
  fail(ctx, location_of(at, ctx.file), what, fix);
}

void fail(const Context& ctx, const Field& at, const std::string& what, const std::string& fix) {
  fail(ctx, location_of(at, ctx.file), what, fix);
}

std::string show(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "null";
  std::string text;
  if (node.IsScalar()) {
    text = "'" + node.Scalar() + "'";
  } else {
    YAML::Emitter out;
    out.SetMapFormat(YAML::Flow);
    out.SetSeqFormat(YAML::Flow);
    out << node;
    text = out.c_str();
  }
  constexpr std::size_t kMax = 80;
  if (text.size() > kMax) text = text.substr(0, kMax - 3) + "...";
  return text;
}

std::string kind_of(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "empty (null)";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  return "a scalar";
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Levenshtein distance, two rows.
  std::vector<std::size_t> previous(b.size() + 1), current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const std::string& candidate : candidates) {
    std::size_t distance = edit_distance(word, candidate);
    // A shortened key ("prefetch" for "prefetch_count") is a likely intent even when far in
    // edits; the reverse ("strategy" for "strategy.nme") is not.
    const bool prefix = word.size() >= 3 && candidate.starts_with(word);
    if (prefix) distance = std::min<std::size_t>(distance, 1);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  return best_distance <= limit ? best : std::string();
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string match = closest_match(word, candidates);
  return match.empty() ? std::string() : "; did you mean '" + match + "'?";
}

std::string format_number(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<long long>(value));
  }
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

YAML::Node load_yaml(const std::string& text, const std::string& file) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    SourceLocation where{file, e.mark.line + 1, e.mark.column + 1};
    if (e.mark.is_null()) where = SourceLocation{file, 0, 0};
    // YAML forbids tabs in indentation, and yaml-cpp's message does not say so.
    std::string hint;
    int line = 1;
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\n') ++line;
      const bool line_start = i == 0 || text[i - 1] == '\n';
      if (line_start) {
        std::size_t j = i;
        while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) ++j;
        if (text.find('\t', i) < j) {
          hint = " (line " + std::to_string(line) + " is indented with a tab; use spaces)";
          break;
        }
      }
    }
    throw ConfigError(where, "YAML syntax error: " + e.msg + hint,
                      "fix the YAML at this line: check indentation (spaces, not tabs), "
                      "matching brackets and quotes, and a ': ' after each key");
  }
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(SourceLocation{path, 0, 0}, "cannot open " + what + " '" + path + "'",
                      "check the path (relative paths start at the current directory)");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// --- MapReader --------------------------------------------------------------------------------

MapReader::MapReader(const Context& ctx, const YAML::Node& node, std::string path,
                     std::vector<std::string> allowed)
    : ctx_(ctx), node_(node), path_(std::move(path)) {
  const std::string name = path_.empty() ? "the file" : "'" + path_ + "'";
  if (!node.IsDefined() || node.IsNull())
    fail(ctx_, node, name + " is empty", "write a map of keys: " + join(allowed));
  if (!node.IsMap())
    fail(ctx_, node, name + " must be a map, got " + kind_of(node) + " " + show(node),
         "write it as 'key: value' lines; valid keys: " + join(allowed));
  for (const auto& entry : node) {
    const YAML::Node& key = entry.first;
    if (!key.IsScalar())
      fail(ctx_, key, "a key in " + name + " is " + kind_of(key) + " " + show(key),
           "keys must be plain names; valid keys: " + join(allowed));
    const std::string& text = key.Scalar();
    const std::string sub = path_.empty() ? text : path_ + "." + text;
    if (std::find(allowed.begin(), allowed.end(), text) == allowed.end()) {
      const std::string where = path_.empty() ? "at the top level" : "in " + path_;
      fail(ctx_, key, "unknown key '" + text + "' " + where + did_you_mean(text, allowed),
           "valid keys " + where + ": " + join(allowed));
    }
    for (const Field& seen : fields_)
      if (seen.key.Scalar() == text) {
        const SourceLocation first = location_of(seen.key, ctx_.file);
        fail(ctx_, key,
             "key '" + text + "' appears twice in " + name + " (first at line " +
                 std::to_string(first.line) + ")",
             "keep one '" + text + "' entry");
      }
    fields_.push_back(Field{key, entry.second, sub});
  }
}

MapReader::MapReader(const Context& ctx, const Field& field, std::vector<std::string> allowed)
    : ctx_(ctx), path_(field.path) {
  if (is_null(field.value))
    fail(ctx, field, "'" + field.path + "' is empty",
         "write a map of keys under it: " + join(allowed));
  *this = MapReader(ctx, field.value, field.path, std::move(allowed));
}

const Field* MapReader::find(std::string_view key) const {
  for (const Field& field : fields_)
    if (field.key.Scalar() == key) return &field;
  return nullptr;
}

const Field& MapReader::require(std::string_view key, const std::string& example) const {
  if (const Field* field = find(key)) return *field;
  const std::string name = path_.empty() ? "the file" : "'" + path_ + "'";
  fail(ctx_, node_, name + " is missing the required key '" + std::string(key) + "'",
       "add '" + example + "'" + (path_.empty() ? "" : " under " + path_));
}

bool MapReader::read(std::string_view key, std::string& out) const {
  const Field* field = find(key);
  if (!field) return false;
  out = to_string_value(ctx_, *field);
  return true;
}

bool MapReader::read(std::string_view key, bool& out) const {
  const Field* field = find(key);
  if (!field) return false;
  out = to_bool(ctx_, *field);
  return true;
}

bool MapReader::read(std::string_view key, int& out, std::int64_t min, std::int64_t max) const {
  const Field* field = find(key);
  if (!field) return false;
  out = static_cast<int>(
      to_int(ctx_, *field, min, std::min<std::int64_t>(max, std::numeric_limits<int>::max())));
  return true;
}

bool MapReader::read(std::string_view key, std::int64_t& out, std::int64_t min,
                     std::int64_t max) const {
  const Field* field = find(key);
  if (!field) return false;
  out = to_int(ctx_, *field, min, max);
  return true;
}

bool MapReader::read(std::string_view key, double& out, double min, double max,
                     bool min_exclusive) const {
  const Field* field = find(key);
  if (!field) return false;
  out = to_double(ctx_, *field, min, max, min_exclusive);
  return true;
}

bool MapReader::read_choice(std::string_view key, std::string& out,
                            const std::vector<std::string>& choices) const {
  const Field* field = find(key);
  if (!field) return false;
  out = to_choice(ctx_, *field, choices);
  return true;
}

// --- field conversions ------------------------------------------------------------------------

std::string to_string_value(const Context& ctx, const Field& field) {
  require_scalar(ctx, field, "a string", last_key(field.path) + ": some-name");
  return field.value.Scalar();
}

bool to_bool(const Context& ctx, const Field& field) {
  const std::string example = last_key(field.path) + ": true";
  require_scalar(ctx, field, "true or false", example);
  const std::string& text = field.value.Scalar();
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  fail(ctx, field, "'" + field.path + "' must be true or false, got " + show(field.value),
       "write " + example + " (or false)");
}

std::int64_t to_int(const Context& ctx, const Field& field, std::int64_t min, std::int64_t max) {
  const std::string example =
      last_key(field.path) + ": " + std::to_string(std::max<std::int64_t>(min, 1));
  require_scalar(ctx, field, "an integer", example);
  const std::string& text = field.value.Scalar();
  std::int64_t value = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') ++begin;
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec == std::errc::result_out_of_range)
    fail(ctx, field, "'" + field.path + "' = " + text + " is too large",
         "use an integer " + range_text(min, max));
  if (ec != std::errc() || ptr != end) {
    // Integral values in exponent form (1e6) are accepted; fractions and words are not.
    double number = 0;
    auto [dptr, dec] = std::from_chars(begin, end, number);
    if (dec == std::errc() && dptr == end && std::isfinite(number) &&
        number == std::floor(number) && std::fabs(number) < 9.0e18) {
      value = static_cast<std::int64_t>(number);
    } else {
      fail(ctx, field, "'" + field.path + "' must be an integer, got " + show(field.value),
           "write a whole number " + range_text(min, max) + ", e.g. " + example);
    }
  }
  if (value < min || value > max) {
    std::string what = "'" + field.path + "' = " + text + " is out of range";
    if (min == 1 && value <= 0) what = "'" + field.path + "' = " + text + " must be positive";
    if (min == 0 && value < 0) what = "'" + field.path + "' = " + text + " must not be negative";
    fail(ctx, field, what, "use an integer " + range_text(min, max));
  }
  return value;
}

double to_double(const Context& ctx, const Field& field, double min, double max,
                 bool min_exclusive) {
  const double sample = min < -1e300 ? 1.0 : (min_exclusive ? min + 1 : min);
  const std::string example = last_key(field.path) + ": " + format_number(sample);
  require_scalar(ctx, field, "a number", example);
  const std::string& text = field.value.Scalar();
  double value = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') ++begin;
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value))
    fail(ctx, field, "'" + field.path + "' must be a number, got " + show(field.value),
         "write a finite number such as 0.5, 3 or 1e-8");
  const bool too_low = min_exclusive ? value <= min : value < min;
  if (too_low || value > max) {
    std::string range = (min_exclusive ? "> " : ">= ") + format_number(min);
    if (max < std::numeric_limits<double>::max()) range += " and <= " + format_number(max);
    std::string what = "'" + field.path + "' = " + text + " is out of range";
    if (min == 0 && min_exclusive && value <= 0)
      what = "'" + field.path + "' = " + text + " must be positive";
    else if (min == 0 && value < 0)
      what = "'" + field.path + "' = " + text + " must not be negative";
    fail(ctx, field, what, "use a number " + range);
  }
  return value;
}

std::string to_choice(const Context& ctx, const Field& field,
                      const std::vector<std::string>& choices) {
  require_scalar(ctx, field, "one of " + join(choices),
                 last_key(field.path) + ": " + (choices.empty() ? "" : choices.front()));
  const std::string& text = field.value.Scalar();
  if (std::find(choices.begin(), choices.end(), text) == choices.end())
    fail(ctx, field,
         "unknown value '" + text + "' for '" + field.path + "'" + did_you_mean(text, choices),
         "use one of: " + join(choices));
  return text;
}

std::vector<Field> list_items(const Context& ctx, const Field& field) {
  if (is_null(field.value))
    fail(ctx, field, "'" + field.path + "' is empty", "write a list, e.g. [a, b] or '- a' lines");
  if (!field.value.IsSequence())
    fail(ctx, field,
         "'" + field.path + "' must be a list, got " + kind_of(field.value) + " " +
             show(field.value),
         "write a list, e.g. [a, b] or '- a' lines");
  std::vector<Field> items;
  std::size_t i = 0;
  for (const auto& element : field.value) {
    // List elements have no key: an undefined node stands in for it.
    items.push_back(Field{YAML::Node(YAML::NodeType::Undefined), element,
                          field.path + "[" + std::to_string(i) + "]"});
    ++i;
  }
  return items;
}

}  // namespace muonbed::yaml_util
