// The one table of cluster-profile fields (core/config/src/cluster.cpp cluster_fields()), as the
// rest of muonbed sees it. Every key of a profile is one row there: its dotted path, type, unit,
// range, default (the ClusterSpec member's initializer), meaning, what `muonbed calibrate` writes
// there, and its place in a ClusterSpec. The parser, its range checks, the emitter, the sweep-key
// schema, the key reference below and calibrate's writes all read that row, so a new scalar
// field is one row (and its ClusterSpec member).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/cluster.hpp"

namespace muonbed {

// One key of a cluster profile for the key reference (`muonbed keys`, docs/KEYS.md): a key cannot
// be read without being documented.
struct ClusterKeyDoc {
  std::string path;       // "gpu.peak_tflops"
  std::string type;       // "number", "integer", "text", "true | false", "map", a choice or a list
  std::string range;      // "0.001 .. 100000 TFLOP/s" for numbers; "" otherwise
  bool required = false;  // in a complete profile (a file or an inline cluster)
  std::string default_value;  // what an absent optional key means ("" : nothing, off)
  std::string doc;
  std::string calibrated;  // what `muonbed calibrate` writes there ("" : nothing)
};
std::vector<ClusterKeyDoc> cluster_key_reference();

// A number field of the table, for code that sets profile fields by name (`muonbed calibrate`):
// the loader's range, the unit, and where the number lives in a ClusterSpec. A writer that goes
// through it cannot write a value the loader would refuse when it reads the profile back.
struct ClusterNumber {
  std::string path;  // "gpu.hbm_GBps"
  std::string unit;  // "GB/s"; "" for fractions
  double min = 0;
  double max = 0;
  std::function<double&(ClusterSpec&)> ref;
  // Finite and within [min, max], as the parser checks it.
  bool allows(double value) const;
  // "0.1 .. 1000000 GB/s"
  std::string range_text() const;
};
// The number field at `path`; a path the table has no number at is a programming error
// (std::logic_error naming it).
const ClusterNumber& cluster_number(std::string_view path);

}  // namespace muonbed
