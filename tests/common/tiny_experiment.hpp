// The one-point experiment several C++ tests run (tests/core/run_point_test.cpp,
// tests/core/measured_results_test.cpp, tests/backends/launch_test.cpp): the tiny-dense model on a
// 1-D FSDP mesh, parsed from YAML the way an experiment file is, so that the point carries every
// default the parser fills in.
#pragma once

#include <stdexcept>
#include <string>

#include "muonbed/config.hpp"

namespace muonbed::testing {

// `name` on `cluster` (a shipped profile), dp_shard = `ranks`, run on `backends` ("analytic",
// "mpi"); `extra` lines (YAML, one key a line) are added as they are. Throws unless the text
// is one point.
inline Experiment tiny_point(const std::string& name, const std::string& cluster, int ranks,
                             const std::string& backends, const std::string& extra = "") {
  const std::string text = "name: " + name + "\ncluster: " + cluster +
                           "\nmesh: {dims: {dp_shard: " + std::to_string(ranks) +
                           "}}\nmodel: {preset: tiny-dense}\nbackend: [" + backends + "]\n" + extra;
  const auto points =
      parse_experiment(text, std::string(MUONBED_SOURCE_DIR) + "/experiments/" + name + ".yaml");
  if (points.size() != 1) throw std::logic_error("tiny_point: a sweep, not one point");
  return points[0];
}

}  // namespace muonbed::testing
