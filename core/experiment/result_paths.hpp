// Where a sweep point's results go: one folder per point under the experiment's output
// directory, named by a slug of the point's label, one JSON file per backend. The experiment room
// owns the names because parsing refuses two points that would share a folder; the results room
// (core/results/results.hpp) writes and reads the files there.
#pragma once

#include <string>

namespace muonbed {

struct Experiment;

// Where a point's results go: <output_dir>/<point slug>/<backend>.json. The slug is the point
// label with every byte outside [A-Za-z0-9._=,-] percent-encoded ("a/b" -> "a%2Fb"), so distinct
// labels never share a folder; "default" without a sweep; labels longer than 200 bytes keep a
// prefix and a 64-bit hash of the whole label.
std::string result_path(const Experiment& experiment, const std::string& backend);
std::string point_slug(const std::string& point_label);

}  // namespace muonbed
