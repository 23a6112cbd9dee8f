// Message formatting of muonbed's typed errors: a ConfigError reads like a compiler diagnostic
// ("file:line:col: error: what" and an indented "fix:" line) so editors and terminals can jump to
// the offending YAML line.
#include "core/errors.hpp"

#include <utility>

namespace muonbed {

std::string SourceLocation::to_string() const {
  if (file.empty() && line <= 0) return {};
  std::string out = file.empty() ? std::string("<input>") : file;
  if (line > 0) {
    out.append(":").append(std::to_string(line));
    if (column > 0) out.append(":").append(std::to_string(column));
  }
  return out;
}

namespace {

std::string format_config_error(const SourceLocation& where, const std::string& what,
                                const std::string& fix) {
  std::string message;
  const std::string place = where.to_string();
  if (!place.empty()) message += place + ": ";
  message += "error: " + what;
  if (!fix.empty()) message += "\n  fix: " + fix;
  return message;
}

}  // namespace

ConfigError::ConfigError(SourceLocation where, std::string what, std::string fix)
    : Error(format_config_error(where, what, fix)),
      where_(std::move(where)),
      fix_(std::move(fix)) {}

}  // namespace muonbed
