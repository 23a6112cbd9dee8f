// Typed errors of muonbed. Every error says where it happened and what to change, so a user
// reading one line on the terminal knows the fix without reading the source.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace muonbed {

// Base of all muonbed errors; what() is the complete message a user sees.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where in an input file a value came from. line/column are 1-based; 0 means unknown.
struct SourceLocation {
  std::string file;
  int line = 0;
  int column = 0;
  std::string to_string() const;  // "file:line:column" (or as much of it as is known)
};

// Bad user input (experiment, cluster or model YAML). Message format:
//   FILE:LINE:COL: error: WHAT
//     fix: FIX
class ConfigError : public Error {
 public:
  ConfigError(SourceLocation where, std::string what, std::string fix);
  const SourceLocation& where() const { return where_; }
  const std::string& fix() const { return fix_; }

 private:
  SourceLocation where_;
  std::string fix_;
};

// A layout, mesh, assignment or plan that violates an invariant (shapes, ranks, coverage).
class LayoutError : public Error {
 public:
  using Error::Error;
};

class PlanError : public Error {
 public:
  using Error::Error;
};

// The usual fix for a system error (an errno value) on a path, for messages that already give
// the system's reason: "free disk space", "use shorter names", "choose a writable folder", ...
// `writing`: the path was to be written (created, renamed), not read.
std::string path_error_fix(int error_number, bool writing = false);

// The offset of the first byte of `text` that is not well-formed UTF-8 (overlong forms,
// surrogates and code points above U+10FFFF included), or std::string::npos. Every name, label
// and path muonbed reads ends up in JSON results, which must be UTF-8, so input is checked for
// it where it enters.
std::size_t invalid_utf8_at(std::string_view text);

// An executor could not run a plan's program (a read of a released buffer, a message of the wrong
// size, an unsupported dtype): names the op, rank and tensor.
class ExecutionError : public Error {
 public:
  using Error::Error;
};

}  // namespace muonbed
