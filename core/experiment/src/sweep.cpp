// Experiment YAML, sweeps: the `sweep:` map's axes (one key, or a `zip` group of keys whose values
// vary together), the edits of the file's tree for each point, and parse_file, which parses every
// point of a file and checks that no two share a results folder.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/experiment/result_paths.hpp"
#include "core/experiment/src/experiment_parsing.hpp"

namespace muonbed::experiment_parsing {

namespace {

// One axis of the sweep's cartesian product: one swept key, or a `zip` group of keys whose lists
// vary together (the i-th value of every key in the same point).
struct SweepAxis {
  std::vector<std::string> keys;
  std::vector<YAML::Node> lists;                 // per key, its list of values (marks kept)
  std::vector<std::vector<std::string>> labels;  // per key, the text of each value
  std::size_t size() const { return labels.front().size(); }
};

// The key under `sweep:` that holds zipped groups.
constexpr const char* kZipKey = "zip";

}  // namespace

// The child `key` of a map node; an undefined node when `node` is no map or lacks the key
// (yaml-cpp throws on any use of a missing child other than IsDefined()).
YAML::Node child(const YAML::Node& node, const char* key) {
  if (!node.IsDefined() || !node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node found = node[key];
  return found.IsDefined() ? found : YAML::Node(YAML::NodeType::Undefined);
}

namespace {

std::vector<std::string> mesh_dim_names(const YAML::Node& root) {
  std::vector<std::string> names;
  const YAML::Node dims = child(child(root, "mesh"), "dims");
  if (dims.IsSequence()) {
    for (const auto& d : dims)
      if (child(d, "name").IsDefined() && child(d, "name").IsScalar())
        names.push_back(child(d, "name").Scalar());
  } else if (dims.IsMap()) {
    for (const auto& d : dims)
      if (d.first.IsScalar()) names.push_back(d.first.Scalar());
  }
  return names;
}

bool is_mesh_dim_key(const std::string& key, const std::vector<std::string>& dim_names) {
  const std::vector<std::string> parts = split(key, '.');
  return parts.size() == 2 && parts[0] == "mesh" &&
         std::find(kMeshKeys.begin(), kMeshKeys.end(), parts[1]) == kMeshKeys.end() &&
         std::find(dim_names.begin(), dim_names.end(), parts[1]) != dim_names.end();
}

// `sweep:` is a map of dotted keys to lists of values, whose cartesian product makes the points;
// its entry `zip:` holds keys whose lists vary together instead (one map, or a list of maps for
// several groups), each group one axis of the product.
std::vector<SweepAxis> read_sweep(const Context& ctx, const Field& sweep, const YAML::Node& root) {
  if (!sweep.value.IsMap() || sweep.value.size() == 0)
    fail(ctx, sweep,
         "'sweep' must be a non-empty map of key: [values], got " + kind_of(sweep.value) + " " +
             show(sweep.value),
         "write sweep: {strategy.name: [owner, all_to_all]}, and keys that vary together under "
         "zip: {mesh.dp_shard: [8, 16], cluster.nodes: [8, 16]}");
  const std::vector<std::string> schema = schema_paths();
  const std::vector<std::string> dims = mesh_dim_names(root);
  std::vector<std::string> candidates = schema;
  for (const std::string& d : dims) candidates.push_back("mesh." + d);
  std::vector<SweepAxis> axes;
  std::vector<std::string> keys;  // every swept key so far, cartesian and zipped
  std::size_t points = 1;

  // A swept key must be a key of the schema (or a mesh dim) and overlap no other swept key.
  const auto check_key = [&](const YAML::Node& key_node, const std::string& key) {
    const bool known = std::find(schema.begin(), schema.end(), key) != schema.end();
    // A key of an earlier muonbed version gets its new name, as it does outside the sweep.
    for (const auto& [old_key, now] : kRenamedOptimizerKeys)
      if (!known && key == "optimizer." + old_key)
        fail(ctx, key_node,
             "sweep key 'optimizer." + old_key +
                 "' was renamed (muonbed follows torch.optim.Muon's and AdamW's names)",
             "sweep optimizer." + now.substr(0, now.find(':')) + " instead (" + now + ")");
    if (!known && !is_mesh_dim_key(key, dims))
      fail(ctx, key_node, "unknown sweep key " + quote(key) + did_you_mean(key, candidates),
           "a sweep key is a dotted key of the experiment schema, e.g. strategy.name, "
           "model.preset, cluster.nodes, or mesh.<dim name> for a mesh dim's size (dims here: " +
               join(dims) + "); keys that vary together go under zip:");
    for (const std::string& other : keys) {
      const bool overlap =
          other == key || key.starts_with(other + ".") || other.starts_with(key + ".");
      if (overlap)
        fail(ctx, key_node, "sweep keys '" + other + "' and '" + key + "' overlap",
             "sweep each key once (in zip: groups too), and not a key together with one inside "
             "it");
    }
    keys.push_back(key);
  };
  // The values of one key: a non-empty list, within the point limit.
  const auto read_list = [&](const Field& field, const std::string& key, bool each_once) {
    if (!field.value.IsSequence())
      fail(ctx, field,
           "sweep '" + key + "' must be a list of values, got " + kind_of(field.value) + " " +
               show(field.value),
           "write " + key + ": [value1, value2]");
    if (field.value.size() == 0)
      fail(ctx, field, "sweep '" + key + "' has an empty list", "give at least one value");
    std::vector<std::string> labels;
    std::unordered_set<std::string> seen;
    for (const Field& item : list_items(ctx, field)) {
      std::string text = value_text(item.value);
      if (each_once && !seen.insert(text).second)
        fail(ctx, item, "sweep '" + key + "' lists the value " + quote(text) + " twice",
             "list each value once");
      labels.push_back(std::move(text));
    }
    return labels;
  };
  // The limit first, before any work per value (a huge list is refused in O(1)).
  const auto check_count = [&](const Field& field, std::size_t values, const std::string& what) {
    if (values > kMaxSweepPoints / points)
      fail(ctx, field,
           "the sweep has more than " + std::to_string(kMaxSweepPoints) + " points (" +
               std::to_string(points) + " x " + std::to_string(values) + " values of " + what + ")",
           "sweep fewer values, or split the study into several files");
    points *= values;
  };

  bool zip_seen = false;
  for (const auto& entry : sweep.value) {
    const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : show(entry.first);
    const Field field{entry.first, entry.second, "sweep." + key};
    if (key != kZipKey) {
      check_key(entry.first, key);
      if (entry.second.IsSequence()) check_count(field, entry.second.size(), "'" + key + "'");
      SweepAxis axis{{key}, {entry.second}, {read_list(field, key, true)}};
      axes.push_back(std::move(axis));
      continue;
    }
    if (zip_seen)
      fail(ctx, entry.first, "'sweep' has two zip: entries",
           "write several groups as one list: zip: [{a: [..], b: [..]}, {c: [..], d: [..]}]");
    zip_seen = true;
    std::vector<Field> groups;
    if (entry.second.IsSequence() && entry.second.size() > 0)
      groups = list_items(ctx, field);
    else
      groups.push_back(field);
    for (const Field& group : groups) {
      if (!group.value.IsMap() || group.value.size() == 0)
        fail(ctx, group,
             "'" + group.path + "' must be a non-empty map of keys whose lists vary together (or " +
                 "a list of such maps), got " + kind_of(group.value) + " " + show(group.value),
             "write zip: {mesh.dp_shard: [8, 16, 32], cluster.nodes: [8, 16, 32]}");
      SweepAxis axis;
      std::vector<Field> fields;  // per key, its list's field (for messages)
      for (const auto& zipped : group.value) {
        const std::string zkey =
            zipped.first.IsScalar() ? zipped.first.Scalar() : show(zipped.first);
        check_key(zipped.first, zkey);
        fields.push_back(Field{zipped.first, zipped.second, group.path + "." + zkey});
        const Field& zfield = fields.back();
        if (axis.keys.empty()) {
          if (zipped.second.IsSequence())
            check_count(zfield, zipped.second.size(), "zipped '" + zkey + "'");
        } else if (zipped.second.IsSequence() && zipped.second.size() != axis.size()) {
          fail(ctx, zfield,
               "zipped lists vary together and need equal lengths: '" + axis.keys.front() +
                   "' has " + std::to_string(axis.size()) + " values, '" + zkey + "' has " +
                   std::to_string(zipped.second.size()),
               "give every key of a zip group one value per point (" + std::to_string(axis.size()) +
                   " here), or sweep a key that does not vary with the others outside zip:");
        }
        axis.labels.push_back(read_list(zfield, zkey, false));
        axis.keys.push_back(zkey);
        axis.lists.push_back(zipped.second);
      }
      // Each point of a group once: values may repeat in one key, not as a whole combination.
      std::map<std::string, std::size_t> combinations;
      for (std::size_t i = 0; i < axis.size(); ++i) {
        std::string combination;
        for (std::size_t k = 0; k < axis.keys.size(); ++k)
          combination += (k ? ", " : "") + axis.keys[k] + "=" + axis.labels[k][i];
        const auto [it, added] = combinations.emplace(combination, i);
        if (!added)
          fail(ctx, list_items(ctx, fields.front())[i],
               "'" + group.path + "' lists the combination " + quote(combination) +
                   " twice (values " + std::to_string(it->second + 1) + " and " +
                   std::to_string(i + 1) + " of its lists)",
               "list each combination once");
      }
      axes.push_back(std::move(axis));
    }
  }
  return axes;
}

// Edits of the file's tree for one sweep point, undone before the next: the file is parsed once,
// not once per point (a 10,000-point sweep would parse a 10,000-value list 10,000 times). yaml-cpp
// assignment rebinds the map entry to the assigned node, so the original value is kept alive by a
// holder map and bound back on undo; keys keep their order and every node its mark, so errors
// about a swept value point at the value's line in `sweep:`.
class TreeEdits {
 public:
  TreeEdits() = default;
  TreeEdits(const TreeEdits&) = delete;
  TreeEdits& operator=(const TreeEdits&) = delete;
  ~TreeEdits() {
    try {
      undo();
    } catch (...) {
      // Unwinding from a point's error: the tree is not used again.
    }
  }

  // parent[key] = value (parent is a map).
  void set(YAML::Node parent, const std::string& key, const YAML::Node& value) {
    Edit edit{parent, key, YAML::Node(YAML::NodeType::Undefined)};
    if (child(parent, key.c_str()).IsDefined()) {
      edit.saved = YAML::Node(YAML::NodeType::Map);
      edit.saved["value"] = parent[key];
    }
    parent[key] = value;
    edits_.push_back(std::move(edit));
  }

  void undo() {
    for (auto it = edits_.rbegin(); it != edits_.rend(); ++it) {
      if (it->saved.IsDefined())
        it->parent[it->key] = it->saved["value"];
      else
        it->parent.remove(it->key);
    }
    edits_.clear();
  }

 private:
  struct Edit {
    YAML::Node parent;
    std::string key;
    YAML::Node saved;  // {value: original} when the key existed
  };
  std::vector<Edit> edits_;
};

// Writes `value` over the key `path` of `root` (creating maps on the way), recording in `edits`.
void apply_override(TreeEdits& edits, YAML::Node root, const std::string& path,
                    const YAML::Node& value) {
  const std::vector<std::string> parts = split(path, '.');
  if (parts.size() == 2 && parts[0] == "mesh" &&
      std::find(kMeshKeys.begin(), kMeshKeys.end(), parts[1]) == kMeshKeys.end()) {
    YAML::Node dims = child(child(root, "mesh"), "dims");
    if (dims.IsSequence()) {
      for (YAML::Node d : dims) {
        const YAML::Node name = child(d, "name");
        if (name.IsDefined() && name.IsScalar() && name.Scalar() == parts[1])
          edits.set(d, "size", value);
      }
    } else if (dims.IsMap()) {
      YAML::Node d = child(dims, parts[1].c_str());
      if (d.IsMap())
        edits.set(d, "size", value);
      else
        edits.set(dims, parts[1], value);
    }
    return;
  }
  if (parts[0] == "cluster" && parts.size() > 1) {
    // `cluster: NAME` (or no cluster) becomes {preset: NAME} so its fields can be overridden.
    const YAML::Node cluster = child(root, "cluster");
    if (!cluster.IsMap()) {
      YAML::Node map(YAML::NodeType::Map);
      if (cluster.IsDefined() && cluster.IsScalar())
        map["preset"] = cluster;
      else
        map["preset"] = kDefaultCluster;
      edits.set(root, "cluster", map);
    }
  }
  YAML::Node current = root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!child(current, parts[i].c_str()).IsMap())
      edits.set(current, parts[i], YAML::Node(YAML::NodeType::Map));
    YAML::Node next = child(current, parts[i].c_str());
    current.reset(next);
  }
  edits.set(current, parts.back(), value);
}

}  // namespace

std::vector<Experiment> parse_file(const std::string& yaml_text, const std::string& file,
                                   const ExperimentOverrides& command_line) {
  const Context ctx{file, ""};
  const YAML::Node root = load_yaml(yaml_text, file);
  const MapReader top(ctx, root, "", kTopKeys);
  const Field* sweep = top.find("sweep");
  ParseCache cache;
  if (!sweep) {
    std::vector<Experiment> one = {parse_point(ctx, root, &cache, command_line)};
    check_strategy_options(cache.options);
    return one;
  }

  const std::vector<SweepAxis> axes = read_sweep(ctx, *sweep, root);
  std::size_t count = 1;
  for (const SweepAxis& a : axes) count *= a.size();
  YAML::Node tree = root;  // edited in place per point, then restored
  tree.remove("sweep");
  std::vector<Experiment> points;
  points.reserve(count);
  std::int64_t work = 0;
  for (std::size_t index = 0; index < count; ++index) {
    // The last axis varies fastest; a zip group's keys take their values together.
    std::vector<std::size_t> choice(axes.size());
    std::size_t rest = index;
    for (std::size_t a = axes.size(); a-- > 0;) {
      choice[a] = rest % axes[a].size();
      rest /= axes[a].size();
    }
    std::string label;
    std::map<std::string, std::string> overrides;
    TreeEdits edits;
    for (std::size_t a = 0; a < axes.size(); ++a) {
      for (std::size_t k = 0; k < axes[a].keys.size(); ++k) {
        const std::string& key = axes[a].keys[k];
        const std::string& text = axes[a].labels[k][choice[a]];
        label += (label.empty() ? "" : ",") + key + "=" + text;
        overrides[key] = text;
        apply_override(edits, tree, key, axes[a].lists[k][choice[a]]);
      }
    }
    Experiment e = parse_point(Context{file, label}, tree, &cache, command_line);
    e.overrides = std::move(overrides);
    const std::int64_t tensors = static_cast<std::int64_t>(e.model.params.size());
    points.push_back(std::move(e));
    // Every point builds and checks its model: bound the sweep's work (estimated from its first
    // point before going on, then counted, as swept models may grow).
    work += tensors;
    if (work > kMaxSweepTensorPoints)
      fail(ctx, *sweep,
           "the sweep's points hold more than " + std::to_string(kMaxSweepTensorPoints) +
               " tensors in all (reached at point " + std::to_string(index + 1) + " of " +
               std::to_string(count) + ")",
           "sweep fewer values or smaller models, or split the study into several files");
    if (index == 0) {
      if (tensors * static_cast<std::int64_t>(count) > kMaxSweepTensorPoints)
        fail(ctx, *sweep,
             "the sweep has " + std::to_string(count) + " points of a model with " +
                 std::to_string(tensors) + " tensors: checking them all (" +
                 std::to_string(tensors * static_cast<std::int64_t>(count)) +
                 " tensor layouts) exceeds the limit of " + std::to_string(kMaxSweepTensorPoints),
             "sweep fewer values, or split the study into several files");
    }
  }
  // Each point's results live in a folder named after its label: two points in one folder would
  // overwrite each other's results and rerun forever. point_slug is injective, so this can only
  // fire on a hash collision of very long labels or a case-insensitive file system's view.
  std::map<std::string, const Experiment*> folders;
  for (const Experiment& e : points) {
    std::string folder = point_slug(e.point_label);
    for (char& c : folder) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const auto [it, added] = folders.emplace(folder, &e);
    if (!added)
      fail(ctx, *sweep,
           "sweep points '" + it->second->point_label + "' and '" + e.point_label +
               "' would share the results folder '" + point_slug(e.point_label) +
               "' (names that differ only in upper/lower case collide on some file systems)",
           "make the swept values differ in more than letter case");
  }
  check_strategy_options(cache.options);
  return points;
}

}  // namespace muonbed::experiment_parsing
