// Strict YAML accessors for experiment and cluster files: type, range and key checks that throw
// ConfigError at the offending node (1-based file:line:column from yaml-cpp's Mark), with the
// value and the fix. See yaml_util.hpp.
#include "core/config/src/yaml_util.hpp"

#include "core/base/output_files.hpp"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <unordered_map>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace muonbed::yaml_util {

namespace fs = std::filesystem;

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

std::string format_number(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<long long>(value));
  }
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

namespace {

std::string hex_byte(char c) {
  static const char* digits = "0123456789ABCDEF";
  const auto b = static_cast<unsigned char>(c);
  return {digits[b >> 4], digits[b & 15]};
}

// The 1-based line and column of byte `offset` of `text`.
SourceLocation location_in_text(const std::string& text, std::size_t offset,
                                const std::string& file) {
  SourceLocation where{file, 1, 1};
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++where.line;
      where.column = 1;
    } else {
      ++where.column;
    }
  }
  return where;
}

[[noreturn]] void syntax_error(const std::string& text, const std::string& file,
                               const YAML::Mark& mark, const std::string& message) {
  SourceLocation where{file, mark.line + 1, mark.column + 1};
  if (mark.is_null()) where = SourceLocation{file, 0, 0};
  // YAML forbids tabs in indentation, and yaml-cpp's message does not say so.
  std::string hint;
  int line = 1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      continue;
    }
    const bool line_start = i == 0 || text[i - 1] == '\n';
    if (!line_start) continue;
    std::size_t j = i;
    while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) ++j;
    if (std::find(text.begin() + static_cast<std::ptrdiff_t>(i),
                  text.begin() + static_cast<std::ptrdiff_t>(j),
                  '\t') != text.begin() + static_cast<std::ptrdiff_t>(j)) {
      hint = " (line " + std::to_string(line) + " is indented with a tab; use spaces)";
      break;
    }
  }
  throw ConfigError(where, "YAML syntax error: " + message + hint,
                    "fix the YAML at this line: check indentation (spaces, not tabs), "
                    "matching brackets and quotes, and a ': ' after each key");
}

}  // namespace

namespace {

// The documents of a YAML text as the parser's events show them: where each starts and whether it
// holds anything but an empty (null) node. yaml-cpp's LoadAll loops forever on text it cannot
// start a document with (", b"): the parser then reports empty documents at the same mark
// without consuming anything, which the caller detects here.
class DocumentScan : public YAML::EventHandler {
 public:
  struct Document {
    YAML::Mark start;
    bool empty = true;  // only a null node
    bool started = false;
  };
  std::vector<Document> documents;

  void OnDocumentStart(const YAML::Mark& mark) override { documents.push_back({mark}); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override { content(true); }
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override { content(false); }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {
    content(false);
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    content(false);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    content(false);
  }
  void OnMapEnd() override {}

 private:
  void content(bool null) {
    if (documents.empty()) return;
    Document& d = documents.back();
    if (!d.started || !null) d.empty = d.empty && null;
    d.started = true;
  }
};

bool same_place(const YAML::Mark& a, const YAML::Mark& b) {
  return a.pos == b.pos && a.line == b.line && a.column == b.column;
}

}  // namespace

YAML::Node load_yaml(const std::string& text, const std::string& file) {
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos)
    throw ConfigError(location_in_text(text, nul, file),
                      "the file contains a NUL byte: it is binary data, not YAML text",
                      "pass a YAML text file (experiments/*.yaml shows the format)");
  if (const std::size_t bad = invalid_utf8_at(text); bad != std::string::npos)
    throw ConfigError(location_in_text(text, bad, file),
                      "the file is not UTF-8 text (byte 0x" + hex_byte(text[bad]) + " here)",
                      "save the file as UTF-8 (iconv -f LATIN1 -t UTF-8 FILE, or your editor's "
                      "encoding setting); YAML files must be UTF-8");
  // First the document structure: nothing after the first document may be ignored.
  try {
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    DocumentScan scan;
    while (parser.HandleNextDocument(scan)) {
      const auto& docs = scan.documents;
      const std::size_t n = docs.size();
      if (n >= 2 && same_place(docs[n - 1].start, docs[n - 2].start)) {
        // The parser stopped consuming text: it cannot start a document with what is there.
        const YAML::Mark& at = docs[n - 1].start;
        const std::size_t pos = static_cast<std::size_t>(std::max(at.pos, 0));
        std::string shown = text.substr(std::min(pos, text.size()), 20);
        if (const std::size_t cut = shown.find('\n'); cut != std::string::npos) shown.resize(cut);
        syntax_error(
            text, file, at,
            "unexpected " + quote(shown) +
                (n > 2 ? " after the end of the document" : " at the start of a document"));
      }
      if (n >= 2 && !docs.back().empty) {
        SourceLocation where{file, docs.back().start.line + 1, docs.back().start.column + 1};
        throw ConfigError(where,
                          "a second YAML document starts here; muonbed reads one document per "
                          "file and would ignore it",
                          "remove the '---' line and merge the keys into one document, or put "
                          "the second experiment into a file of its own");
      }
    }
  } catch (const YAML::ParserException& e) {
    syntax_error(text, file, e.mark, e.msg);
  } catch (const YAML::Exception& e) {
    // Anything else yaml-cpp refuses (e.g. nesting too deep) is a syntax problem of the file.
    syntax_error(text, file, e.mark, e.msg);
  }
  try {
    return YAML::Load(text);  // the first (and only non-empty) document
  } catch (const YAML::Exception& e) {
    syntax_error(text, file, e.mark, e.msg);
  }
}

std::string read_text_file(const std::string& path, const std::string& what) {
  const SourceLocation at{path, 0, 0};
  if (path.empty())
    throw ConfigError(at, "the " + what + " path is empty", "give the path of a YAML file");
  if (invalid_utf8_at(path) != std::string::npos)
    throw ConfigError(at,
                      "the " + what +
                          " path is not UTF-8 text (muonbed writes it into its "
                          "JSON results, which must be UTF-8)",
                      "rename the file or folder with UTF-8 characters only");
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    throw ConfigError(at, "cannot open " + what + " '" + path + "': " + std::strerror(error),
                      path_error_fix(error));
  }
  if (S_ISDIR(info.st_mode))
    throw ConfigError(at, "'" + path + "' is a folder, not an " + what,
                      "pass a YAML file, e.g. " + (fs::path(path) / "NAME.yaml").string());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    throw ConfigError(at, "cannot open " + what + " '" + path + "': " + std::strerror(error),
                      path_error_fix(error));
  }
  note_input_file(fd,
                  path);  // no output of this command may replace it (core/base/output_files.hpp)
  // Read at most kMaxInputBytes + 1 bytes: a device or pipe that never ends (/dev/zero) or a huge
  // file is refused without reading it whole.
  std::string text;
  char buffer[1 << 16];
  while (text.size() <= kMaxInputBytes) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      throw ConfigError(at, "cannot read " + what + " '" + path + "': " + std::strerror(error),
                        "check the file (a folder, a device or an unreadable file cannot be read)");
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (text.size() > kMaxInputBytes)
    throw ConfigError(at,
                      "the " + what + " '" + path + "' is larger than " +
                          std::to_string(kMaxInputBytes / (1024 * 1024)) +
                          " MiB; muonbed's YAML files are small (a sweep of 10,000 values fits "
                          "in 100 KiB)",
                      "pass the experiment's YAML file; describe big models with model.dense or "
                      "model.moe instead of listing every parameter");
  // A byte-order mark of UTF-16 or UTF-32 (editors on Windows save so): the text is not UTF-8,
  // and yaml-cpp would report a syntax error somewhere else.
  const auto starts = [&](std::initializer_list<unsigned char> bom) {
    if (text.size() < bom.size()) return false;
    std::size_t i = 0;
    for (const unsigned char b : bom)
      if (static_cast<unsigned char>(text[i++]) != b) return false;
    return true;
  };
  const char* encoding = starts({0xFF, 0xFE, 0x00, 0x00}) || starts({0x00, 0x00, 0xFE, 0xFF})
                             ? "UTF-32"
                         : starts({0xFF, 0xFE}) || starts({0xFE, 0xFF}) ? "UTF-16"
                                                                        : nullptr;
  if (encoding != nullptr)
    throw ConfigError(at,
                      "the " + what + " '" + path + "' is " + encoding +
                          " text (it starts with a " + encoding + " byte-order mark)",
                      std::string(encoding) + ": save it as UTF-8 (e.g. iconv -f " + encoding +
                          " -t UTF-8 FILE > NEW.yaml)");
  return text;
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
      fail(ctx_, key, "unknown key " + quote(text) + " " + where + did_you_mean(text, allowed),
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
  allowed_ = std::move(allowed);
}

MapReader::MapReader(const Context& ctx, const Field& field, std::vector<std::string> allowed)
    : ctx_(ctx), path_(field.path) {
  if (is_null(field.value))
    fail(ctx, field, "'" + field.path + "' is empty",
         "write a map of keys under it: " + join(allowed));
  *this = MapReader(ctx, field.value, field.path, std::move(allowed));
}

const Field* MapReader::find(std::string_view key) const {
  if (std::find(allowed_.begin(), allowed_.end(), key) == allowed_.end())
    throw std::logic_error("MapReader of '" + path_ + "' asked for key '" + std::string(key) +
                           "', which its table of keys does not list (valid: " + join(allowed_) +
                           ")");
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
    if ((min == 0 && min_exclusive && value <= 0) || (min > 0 && value <= 0))
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

std::vector<Field> map_entries(const Context& ctx, const Field& field, const std::string& example) {
  if (is_null(field.value) || !field.value.IsMap() || field.value.size() == 0)
    fail(ctx, field,
         "'" + field.path + "' must be a non-empty map, got " + kind_of(field.value) + " " +
             show(field.value),
         "write " + example);
  std::vector<Field> entries;
  std::unordered_map<std::string, std::size_t> seen;
  for (const auto& entry : field.value) {
    const YAML::Node& key = entry.first;
    if (!key.IsScalar())
      fail(ctx, key, "a key in '" + field.path + "' is " + kind_of(key) + " " + show(key),
           "keys must be plain names: write " + example);
    const auto [it, added] = seen.emplace(key.Scalar(), entries.size());
    if (!added)
      fail(ctx, key,
           "key " + quote(key.Scalar()) + " appears twice in '" + field.path + "' (first at line " +
               std::to_string(location_of(entries[it->second].key, ctx.file).line) +
               "); YAML would silently keep only the last value",
           "keep one entry per key");
    entries.push_back(Field{key, entry.second, field.path + "." + key.Scalar()});
  }
  return entries;
}

std::string quote(std::string_view text) {
  constexpr std::size_t kMax = 80;
  if (text.size() <= kMax) return "'" + std::string(text) + "'";
  return "'" + std::string(text.substr(0, kMax - 3)) + "...'";
}

}  // namespace muonbed::yaml_util
