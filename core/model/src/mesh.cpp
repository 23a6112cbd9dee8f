// Device meshes: rank <-> coordinate arithmetic (innermost dimension fastest) and the groups of
// ranks that differ only along a set of dimensions. Group queries cost O(group size) or
// O(ndims): the planner calls them for every rank of meshes with tens of thousands of ranks.
#include "core/model/mesh.hpp"

#include <array>
#include <climits>
#include <cstdint>
#include <utility>

#include "core/base/errors.hpp"

namespace muonbed {

namespace {

constexpr std::array<std::pair<DimRole, std::string_view>, 5> kRoleNames{{
    {DimRole::replicate, "replicate"},
    {DimRole::fsdp, "fsdp"},
    {DimRole::tp, "tp"},
    {DimRole::ep, "ep"},
    {DimRole::pp, "pp"},
}};

}  // namespace

std::string_view to_string(DimRole role) {
  for (const auto& [r, name] : kRoleNames)
    if (r == role) return name;
  return "unknown";
}

DimRole dim_role_from_string(std::string_view text) {
  for (const auto& [r, name] : kRoleNames)
    if (name == text) return r;
  std::string valid;
  for (const auto& [r, name] : kRoleNames) valid += (valid.empty() ? "" : ", ") + std::string(name);
  throw Error("unknown mesh dimension role '" + std::string(text) + "' (valid roles: " + valid +
              ")");
}

bool default_role_for_name(std::string_view name, DimRole& role) {
  if (name == "dp_shard") {
    role = DimRole::fsdp;
  } else if (name == "dp_replicate" || name == "dp" || name == "cp") {
    role = DimRole::replicate;
  } else if (name == "tp") {
    role = DimRole::tp;
  } else if (name == "ep") {
    role = DimRole::ep;
  } else if (name == "pp") {
    role = DimRole::pp;
  } else {
    return false;
  }
  return true;
}

DimSet DimSet::of(std::initializer_list<int> dims) {
  DimSet set;
  for (int d : dims) {
    if (d < 0 || d >= 32)
      throw LayoutError("DimSet: mesh dimension " + std::to_string(d) + " is outside 0..31");
    set = set.with(d);
  }
  return set;
}

int DimSet::count() const {
  int n = 0;
  for (std::uint32_t b = bits; b != 0; b &= b - 1) ++n;
  return n;
}

DeviceMesh::DeviceMesh(std::vector<MeshDim> dims, int gpus_per_node)
    : dims_(std::move(dims)), gpus_per_node_(gpus_per_node) {
  if (dims_.size() > 32)
    throw LayoutError("device mesh has " + std::to_string(dims_.size()) +
                      " dimensions; at most 32 are supported (fix: merge dimensions)");
  if (gpus_per_node < 1)
    throw LayoutError("device mesh: gpus_per_node is " + std::to_string(gpus_per_node) +
                      "; fix: give a positive number of GPUs per node");
  std::int64_t world = 1;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    const MeshDim& d = dims_[i];
    if (d.name.empty())
      throw LayoutError("device mesh: dimension " + std::to_string(i) +
                        " has an empty name; fix: name every dimension (e.g. dp_shard, tp)");
    for (std::size_t j = 0; j < i; ++j)
      if (dims_[j].name == d.name)
        throw LayoutError("device mesh: dimension name '" + d.name +
                          "' appears twice; fix: give every dimension a distinct name");
    if (d.size < 1)
      throw LayoutError("device mesh: dimension '" + d.name + "' has size " +
                        std::to_string(d.size) + "; fix: sizes must be >= 1");
    world *= d.size;
    if (world > INT_MAX)
      throw LayoutError("device mesh: world size overflows int; fix: use a smaller mesh");
  }
  world_size_ = static_cast<int>(world);
  if (world_size_ % gpus_per_node_ != 0 && world_size_ > gpus_per_node_)
    throw LayoutError("device mesh " + describe() + ": " + std::to_string(world_size_) +
                      " ranks do not fill whole nodes of " + std::to_string(gpus_per_node_) +
                      " GPUs; fix: make the product of the mesh sizes a multiple of "
                      "gpus_per_node (or smaller than one node)");
  strides_.assign(dims_.size(), 1);
  int stride = 1;
  for (int i = ndims() - 1; i >= 0; --i) {
    strides_[i] = stride;
    stride *= dims_[i].size;
  }
}

int DeviceMesh::find(std::string_view name) const {
  for (int i = 0; i < ndims(); ++i)
    if (dims_[i].name == name) return i;
  return -1;
}

std::vector<int> DeviceMesh::dims_with_role(DimRole role) const {
  std::vector<int> out;
  for (int i = 0; i < ndims(); ++i)
    if (dims_[i].role == role) out.push_back(i);
  return out;
}

DimSet DeviceMesh::dims_with_roles(std::initializer_list<DimRole> roles) const {
  DimSet set;
  for (int i = 0; i < ndims(); ++i)
    for (DimRole r : roles)
      if (dims_[i].role == r) set = set.with(i);
  return set;
}

std::vector<int> DeviceMesh::coords(int rank) const {
  std::vector<int> out(dims_.size());
  for (int i = 0; i < ndims(); ++i) out[i] = coord(rank, i);
  return out;
}

int DeviceMesh::rank_of(std::span<const int> coords) const {
  if (static_cast<int>(coords.size()) != ndims())
    throw LayoutError("rank_of: got " + std::to_string(coords.size()) +
                      " coordinates for a mesh of " + std::to_string(ndims()) + " dimensions");
  int rank = 0;
  for (int i = 0; i < ndims(); ++i) {
    if (coords[i] < 0 || coords[i] >= dims_[i].size)
      throw LayoutError("rank_of: coordinate " + std::to_string(coords[i]) + " of dimension '" +
                        dims_[i].name + "' is outside 0.." + std::to_string(dims_[i].size - 1));
    rank += coords[i] * strides_[i];
  }
  return rank;
}

int DeviceMesh::with_coord(int rank, int dim, int value) const {
  return rank + (value - coord(rank, dim)) * strides_[dim];
}

int DeviceMesh::group_size(DimSet dims) const {
  int n = 1;
  for (int i = 0; i < ndims(); ++i)
    if (dims.contains(i)) n *= dims_[i].size;
  return n;
}

int DeviceMesh::group_leader(int rank, DimSet dims) const {
  int leader = rank;
  for (int i = 0; i < ndims(); ++i)
    if (dims.contains(i)) leader -= coord(rank, i) * strides_[i];
  return leader;
}

std::vector<int> DeviceMesh::group_members(int rank, DimSet dims) const {
  // An odometer over the group's dimensions, innermost fastest, so members come out ascending.
  std::vector<int> gdims;
  for (int i = ndims() - 1; i >= 0; --i)
    if (dims.contains(i) && dims_[i].size > 1) gdims.push_back(i);  // innermost first
  std::vector<int> out;
  out.reserve(group_size(dims));
  std::vector<int> digit(gdims.size(), 0);
  int current = group_leader(rank, dims);
  while (true) {
    out.push_back(current);
    std::size_t k = 0;
    for (; k < gdims.size(); ++k) {
      const int d = gdims[k];
      if (++digit[k] < dims_[d].size) {
        current += strides_[d];
        break;
      }
      current -= (dims_[d].size - 1) * strides_[d];
      digit[k] = 0;
    }
    if (k == gdims.size()) break;
  }
  return out;
}

int DeviceMesh::group_index(int rank, DimSet dims) const {
  int index = 0;
  for (int i = 0; i < ndims(); ++i)
    if (dims.contains(i)) index = index * dims_[i].size + coord(rank, i);
  return index;
}

int DeviceMesh::group_member(int rank, DimSet dims, int index) const {
  if (index < 0 || index >= group_size(dims))
    throw LayoutError("group_member: index " + std::to_string(index) + " is outside a group of " +
                      std::to_string(group_size(dims)) + " ranks");
  int member = group_leader(rank, dims);
  for (int i = ndims() - 1; i >= 0; --i) {
    if (!dims.contains(i)) continue;
    member += (index % dims_[i].size) * strides_[i];
    index /= dims_[i].size;
  }
  return member;
}

std::string DeviceMesh::describe() const {
  std::string out;
  for (const MeshDim& d : dims_) {
    if (!out.empty()) out += " x ";
    out += d.name + "=" + std::to_string(d.size);
  }
  if (out.empty()) out = "(no dims)";
  out += " (" + std::to_string(world_size_) + (world_size_ == 1 ? " rank, " : " ranks, ") +
         std::to_string(gpus_per_node_) + " per node)";
  return out;
}

}  // namespace muonbed
