// Experiment YAML, the cluster and the mesh: the `cluster:` key (a profile's name, a file, or a
// preset with overrides), the `mesh:` map and its dims, and the check that the model fits the mesh
// (core/experiment/src/experiment.cpp assembles a point from these).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/config/cluster.hpp"
#include "core/experiment/src/experiment_parsing.hpp"

namespace muonbed::experiment_parsing {

namespace fs = std::filesystem;

namespace {

ClusterSpec load_named_cluster(const Context& ctx, const Field& at, const std::string& name,
                               ClusterCache& clusters) {
  const std::string path = resolve_cluster_file(name, ctx.file);
  if (path.empty()) {
    if (const std::string folder = cluster_folder_at(name, ctx.file); !folder.empty())
      fail(ctx, at,
           "cluster '" + name + "' is a folder ('" + folder + "'), not a cluster YAML file",
           "give the profile's file, e.g. cluster: " + (fs::path(name) / "NAME.yaml").string());
    const std::vector<std::string> names = cluster_names(ctx.file);
    fail(ctx, at, "cluster '" + name + "' not found" + did_you_mean(name, names),
         "use one of: " + join(names) + ", or a path to a cluster YAML file");
  }
  const auto found = clusters.find(path);
  if (found != clusters.end()) return found->second;
  return clusters.emplace(path, load_cluster_file(path)).first->second;
}

}  // namespace

ClusterSpec read_cluster(const Context& ctx, const MapReader& top, ClusterCache& clusters) {
  const Field* field = top.find("cluster");
  if (!field)
    return load_named_cluster(ctx, missing_field(top.node(), "cluster"), kDefaultCluster, clusters);
  if (field->value.IsScalar())
    return load_named_cluster(ctx, *field, field->value.Scalar(), clusters);
  if (!field->value.IsMap())
    fail(ctx, *field,
         "'cluster' must be a cluster name, a path or a map, got " + kind_of(field->value),
         "write cluster: dgx-h100, or cluster: {preset: dgx-h100, nodes: 4}");
  ClusterSpec spec;
  const YAML::Node& node = field->value;
  const YAML::Node preset = node["preset"];
  if (preset.IsDefined()) {
    const Field preset_field{YAML::Node(YAML::NodeType::Undefined), preset, "cluster.preset"};
    spec = load_named_cluster(ctx, preset_field, to_string_value(ctx, preset_field), clusters);
    read_cluster_map(ctx, node, "cluster", false, spec);
  } else {
    read_cluster_map(ctx, node, "cluster", true, spec);
    spec.origin = location_of(node, ctx.file);
  }
  return spec;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Mesh

DimRole role_from_name(const std::string& text) {
  for (DimRole role : {DimRole::replicate, DimRole::fsdp, DimRole::tp, DimRole::ep, DimRole::pp})
    if (to_string(role) == text) return role;
  return DimRole::replicate;
}

}  // namespace

MeshSection read_mesh(const Context& ctx, const Field& field, const ClusterSpec& cluster) {
  MeshSection out;
  out.field = field;
  const MapReader mesh(ctx, field, kMeshKeys);
  const Field& dims = mesh.require("dims", "dims: [{name: dp_shard, size: 8}]");

  std::vector<MeshDim> parsed;
  auto add_dim = [&](const Field& name_field, const std::string& name, const Field& size_field,
                     const Field* role_field) {
    if (!is_identifier(name))
      fail(ctx, name_field, "mesh dim name '" + name + "' is not a plain name",
           "use letters, digits, '_' or '-' (e.g. dp_shard, tp, data)");
    if (std::find(kMeshKeys.begin(), kMeshKeys.end(), name) != kMeshKeys.end())
      fail(ctx, name_field, "mesh dim name '" + name + "' is reserved (it is a mesh key)",
           "choose another name");
    for (std::size_t i = 0; i < parsed.size(); ++i)
      if (parsed[i].name == name)
        fail(ctx, name_field,
             "mesh dim '" + name + "' appears twice (first at line " +
                 std::to_string(location_of(out.name_fields[i], ctx.file).line) + ")",
             "give every mesh dim a distinct name");
    MeshDim dim;
    dim.name = name;
    dim.size = static_cast<int>(to_int(ctx, size_field, 1, kMaxWorld));
    if (role_field) {
      dim.role = role_from_name(to_choice(ctx, *role_field, kRoleNames));
    } else if (!default_role_for_name(name, dim.role)) {
      fail(ctx, name_field,
           "mesh dim '" + name + "' has no role" + did_you_mean(name, kKnownDimNames),
           "add role: one of " + join(kRoleNames) + " (the names " + join(kKnownDimNames) +
               " imply a role)");
    }
    parsed.push_back(dim);
    out.name_fields.push_back(name_field);
    out.size_fields.push_back(size_field);
  };

  if (dims.value.IsSequence()) {
    for (const Field& item : list_items(ctx, dims)) {
      const MapReader d(ctx, item, kDimKeys);
      const Field& name = d.require("name", "name: dp_shard");
      const Field& size = d.require("size", "size: 8");
      add_dim(name, to_string_value(ctx, name), size, d.find("role"));
    }
  } else if (dims.value.IsMap()) {
    for (const auto& entry : dims.value) {
      const std::string name = entry.first.IsScalar() ? entry.first.Scalar() : show(entry.first);
      const Field item{entry.first, entry.second, dims.path + "." + name};
      const Field name_field{entry.first, entry.first, item.path};
      if (entry.second.IsMap()) {
        const MapReader d(ctx, item, kDimValueKeys);
        add_dim(name_field, name, d.require("size", "size: 8"), d.find("role"));
      } else {
        add_dim(name_field, name, item, nullptr);
      }
    }
  } else {
    fail(ctx, dims, "'mesh.dims' must be a list or a map, got " + kind_of(dims.value),
         "write dims: [{name: dp_shard, size: 8}] or dims: {dp_shard: 8}");
  }
  if (parsed.empty())
    fail(ctx, dims, "'mesh.dims' is empty", "list at least one dim, e.g. dims: {dp_shard: 8}");

  std::int64_t world = 1;
  std::string product;
  for (const MeshDim& d : parsed) {
    world *= d.size;
    product += (product.empty() ? "" : " x ") + d.name + "=" + std::to_string(d.size);
    if (world > kMaxWorld)
      fail(ctx, dims,
           "the mesh has more than " + std::to_string(kMaxWorld) + " ranks (" + product + " x ...)",
           "use smaller dim sizes");
  }

  int gpus_per_node = cluster.gpus_per_node;
  if (const Field* g = mesh.find("gpus_per_node")) {
    const int given = static_cast<int>(to_int(ctx, *g, 1, 1024));
    if (given != cluster.gpus_per_node)
      fail(ctx, *g,
           "mesh.gpus_per_node is " + std::to_string(given) + " but cluster '" + cluster.name +
               "' has " + std::to_string(cluster.gpus_per_node) + " GPUs per node",
           "remove mesh.gpus_per_node (it comes from the cluster), or override the cluster: "
           "cluster: {preset: " +
               cluster.name + ", gpus_per_node: " + std::to_string(given) + "}");
    out.gpus_per_node_given = true;
  }
  if (const Field* w = mesh.find("world_size")) {
    const std::int64_t given = to_int(ctx, *w, 1, kMaxWorld);
    if (given != world)
      fail(ctx, *w,
           "the mesh has " + std::to_string(world) + " ranks (" + product +
               ") but mesh.world_size is " + std::to_string(given),
           "make the dim sizes multiply to " + std::to_string(given) +
               ", or set world_size: " + std::to_string(world));
    out.world_size = static_cast<int>(given);
  }
  if (cluster.nodes > 0 &&
      world > static_cast<std::int64_t>(cluster.nodes) * cluster.gpus_per_node) {
    const std::int64_t needed = (world + cluster.gpus_per_node - 1) / cluster.gpus_per_node;
    fail(ctx, dims,
         "the mesh needs " + std::to_string(world) + " GPUs (" + product + ") but cluster '" +
             cluster.name + "' has " + std::to_string(cluster.nodes) + " nodes x " +
             std::to_string(cluster.gpus_per_node) + " GPUs",
         "shrink the mesh, or give the cluster more nodes: cluster: {preset: " + cluster.name +
             ", nodes: " + std::to_string(needed) + "}");
  }
  try {
    out.mesh = DeviceMesh(parsed, gpus_per_node);
  } catch (const Error& e) {
    fail(ctx, dims, std::string("invalid mesh: ") + e.what(), "fix the mesh dims");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Checks across sections: model shapes against mesh sizes.

void check_model_on_mesh(const Context& ctx, const MeshSection& ms, const ModelSection& model) {
  const DeviceMesh& mesh = ms.mesh;
  for (DimRole role : {DimRole::ep, DimRole::pp}) {
    const std::vector<int> dims = mesh.dims_with_role(role);
    if (dims.size() > 1)
      fail(ctx, ms.name_fields[dims[1]],
           "the mesh has " + std::to_string(dims.size()) + " " + std::string(to_string(role)) +
               " dims ('" + mesh.dim(dims[0]).name + "' and '" + mesh.dim(dims[1]).name + "')",
           "use at most one " + std::string(to_string(role)) + " dim");
  }
  if (model.explicit_layouts) return;  // placements given: the layout rules do not apply

  for (int d : mesh.dims_with_role(DimRole::ep)) {
    const int ep = mesh.size(d);
    std::set<std::int64_t> expert_counts;
    for (const Parameter& p : model.model.params)
      if (p.shape.size() == 3 &&
          (p.role == ParamRole::expert_up || p.role == ParamRole::expert_gate ||
           p.role == ParamRole::expert_down))
        expert_counts.insert(p.shape[0]);
    if (expert_counts.empty() && ep > 1)
      fail(ctx, ms.size_fields[d],
           "mesh dim '" + mesh.dim(d).name + "' (ep, size " + std::to_string(ep) +
               ") splits experts, but model '" + model.model.name + "' has no expert stacks",
           "use a MoE model, or name the dim dp_replicate for plain data parallelism");
    for (std::int64_t experts : expert_counts)
      if (experts % ep != 0)
        fail(ctx, ms.size_fields[d],
             "ep = " + std::to_string(ep) + " does not divide the " + std::to_string(experts) +
                 " experts of model '" + model.model.name + "'",
             "choose an ep size that divides " + std::to_string(experts) + ": " +
                 divisors_text(experts, kMaxWorld));
  }
  for (int d : mesh.dims_with_role(DimRole::pp)) {
    const int pp = mesh.size(d);
    if (pp > model.model.num_layers)
      fail(ctx, ms.size_fields[d],
           "pp = " + std::to_string(pp) + " pipeline stages but model '" + model.model.name +
               "' has only " + std::to_string(model.model.num_layers) + " layers",
           "use at most " + std::to_string(model.model.num_layers) + " stages");
  }
  // TP splits attention by whole heads (as Megatron does): tp must divide heads and kv_heads.
  // Checked where the head counts are known (model.dense / moe / hf_config); presets and params
  // lists rely on the layout, whose torch.chunk shards may be uneven.
  if (model.kind == ModelKind::dense || model.kind == ModelKind::moe ||
      model.kind == ModelKind::hf) {
    const DenseSpec& s = model.kind == ModelKind::dense ? model.dense : model.moe.base;
    const std::int64_t heads = model.kind == ModelKind::hf ? model.hf_heads : s.heads;
    const std::int64_t kv = model.kind == ModelKind::hf ? model.hf_kv_heads
                            : s.kv_heads > 0            ? s.kv_heads
                                                        : s.heads;
    std::int64_t tp = 1;
    int tp_dim = -1;
    for (int d : mesh.dims_with_role(DimRole::tp)) {
      tp *= mesh.size(d);
      tp_dim = d;
    }
    if (tp_dim >= 0 && (heads % tp != 0 || kv % tp != 0))
      fail(ctx, ms.size_fields[tp_dim],
           "tp = " + std::to_string(tp) + " does not divide heads = " + std::to_string(heads) +
               " and kv_heads = " + std::to_string(kv) + " (TP splits attention by whole heads)",
           "use a tp size dividing " + std::to_string(std::gcd(heads, kv)) + ": " +
               divisors_text(std::gcd(heads, kv), 1 << 20));
  }
}

}  // namespace muonbed::experiment_parsing
