// Cluster profiles' YAML side that the experiment parser and calibrate share with cluster.cpp
// (which implements all of it): reading a cluster map (whole, or overriding a preset) through the
// field table, writing one back, the sweep-key paths, and the search for a profile by name.
#pragma once

#include <string>
#include <vector>

#include "core/config/cluster.hpp"
#include "core/config/cluster_fields.hpp"
#include "core/config/src/yaml_util.hpp"

namespace muonbed {

// Reads the keys of a cluster map into `spec`. With `complete`, every required key must be
// present (a cluster file or an inline cluster); otherwise the map overrides some fields of a
// preset (and may contain the key "preset", which the caller handles).
void read_cluster_map(const yaml_util::Context& ctx, const YAML::Node& node,
                      const std::string& path, bool complete, ClusterSpec& spec);
// Emits `spec` as a complete inline cluster map that read_cluster_map(complete) reads back.
void emit_cluster(YAML::Emitter& out, const ClusterSpec& spec);
// Dotted paths of every cluster key ("gpu", "gpu.peak_tflops", ...), for sweep-key checks.
std::vector<std::string> cluster_schema_paths();

// The cluster file a name or path resolves to, or "" if none exists.
std::string resolve_cluster_file(const std::string& name_or_path, const std::string& relative_to);
// The folder `name_or_path` names (beside `relative_to`, or from the current directory), or ""
// when it names none: a cluster given as a folder is refused saying so.
std::string cluster_folder_at(const std::string& name_or_path, const std::string& relative_to);
// Names of the cluster files reachable by name from `relative_to` (sorted, unique).
std::vector<std::string> cluster_names(const std::string& relative_to);

}  // namespace muonbed
