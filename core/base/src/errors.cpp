// Message formatting of muonbed's typed errors: a ConfigError reads like a compiler diagnostic
// ("file:line:col: error: what" and an indented "fix:" line) so editors and terminals can jump to
// the offending YAML line.
#include "core/base/errors.hpp"

#include <cerrno>
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

std::string path_error_fix(int error_number, bool writing) {
  switch (error_number) {
    case ENOENT:
      return "check the path (relative paths start at the current directory)";
    case EACCES:
    case EPERM:
      return writing ? "check the permissions, or choose a folder you can write (e.g. --output DIR)"
                     : "make the file readable (chmod u+r FILE) or copy it somewhere readable";
    case EROFS:
      return "the file system is read-only: choose another folder (e.g. --output DIR)";
    case ENOSPC:
    case EDQUOT:
      return "free disk space (or raise the quota), then run again: finished results are kept";
    case ENAMETOOLONG:
      return "use shorter file and folder names";
    case ELOOP:
      return "fix the symbolic link loop in the path, or choose another folder";
    case ENOTDIR:
    case EEXIST:
      return "a part of the path is a file, not a folder: remove or rename it, or choose another "
             "folder";
    case EISDIR:
      return "a folder stands where the file should go: remove or rename it, or choose another "
             "folder";
    default:
      return "check the path, its permissions and the free disk space";
  }
}

std::size_t invalid_utf8_at(std::string_view text) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const auto continuation = [&](std::size_t i) {
    return i < text.size() && (byte(i) & 0xC0) == 0x80;
  };
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char b = byte(i);
    if (b < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) low = 0xA0;   // no overlong forms
      if (b == 0xED) high = 0x9F;  // no UTF-16 surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) low = 0x90;
      if (b == 0xF4) high = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (i + 1 >= text.size() || byte(i + 1) < low || byte(i + 1) > high) return i;
    for (std::size_t k = 2; k < length; ++k)
      if (!continuation(i + k)) return i;
    i += length;
  }
  return std::string::npos;
}

}  // namespace muonbed
