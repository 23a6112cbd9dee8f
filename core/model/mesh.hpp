// Abstract device meshes: named dimensions, rank <-> coordinate mapping, groups along dimensions.
//
// Ranks are numbered row-major over the mesh dimensions in the order they are listed: the LAST
// (innermost) dimension varies fastest. With dims [pp, dp_shard, tp] the tp ranks of a group are
// consecutive, so with tp <= gpus_per_node a tensor-parallel group never leaves a node. This is
// the order torchtitan and Megatron use, and the simulator numbers its GPUs the same way.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace muonbed {

// What a mesh dimension does to the parameters. Known names imply a role (dp_shard -> fsdp,
// dp_replicate/cp/dp -> replicate, tp -> tp, ep -> ep, pp -> pp); user names must give one.
enum class DimRole { replicate, fsdp, tp, ep, pp };
std::string_view to_string(DimRole role);
DimRole dim_role_from_string(std::string_view text);  // throws Error listing the valid names
// The role a well-known dimension name implies; false if the name is not a known one.
bool default_role_for_name(std::string_view name, DimRole& role);

struct MeshDim {
  std::string name;
  int size = 1;
  DimRole role = DimRole::replicate;
};

// A set of mesh dimensions as a bitmask (at most 32 dimensions).
struct DimSet {
  std::uint32_t bits = 0;

  static DimSet of(std::initializer_list<int> dims);
  static DimSet all(int ndims) { return DimSet{ndims >= 32 ? ~0u : ((1u << ndims) - 1u)}; }
  bool contains(int dim) const { return (bits >> dim) & 1u; }
  DimSet with(int dim) const { return DimSet{bits | (1u << dim)}; }
  DimSet without(int dim) const { return DimSet{bits & ~(1u << dim)}; }
  DimSet operator|(DimSet o) const { return DimSet{bits | o.bits}; }
  DimSet operator&(DimSet o) const { return DimSet{bits & o.bits}; }
  bool empty() const { return bits == 0; }
  int count() const;
  bool operator==(const DimSet&) const = default;
};

class DeviceMesh {
 public:
  DeviceMesh() = default;
  // Throws LayoutError on an empty name, a duplicate name, a size < 1 or gpus_per_node < 1.
  DeviceMesh(std::vector<MeshDim> dims, int gpus_per_node);

  int ndims() const { return static_cast<int>(dims_.size()); }
  const std::vector<MeshDim>& dims() const { return dims_; }
  const MeshDim& dim(int index) const { return dims_.at(index); }
  int size(int dim) const { return dims_.at(dim).size; }
  // Index of the dimension with this name, -1 if none.
  int find(std::string_view name) const;
  // Indices of all dimensions with this role, outermost first.
  std::vector<int> dims_with_role(DimRole role) const;
  DimSet dims_with_roles(std::initializer_list<DimRole> roles) const;

  int world_size() const { return world_size_; }
  int gpus_per_node() const { return gpus_per_node_; }
  int num_nodes() const { return (world_size_ + gpus_per_node_ - 1) / gpus_per_node_; }
  int node_of(int rank) const { return rank / gpus_per_node_; }

  int stride(int dim) const { return strides_.at(dim); }
  int coord(int rank, int dim) const { return (rank / strides_[dim]) % dims_[dim].size; }
  std::vector<int> coords(int rank) const;
  int rank_of(std::span<const int> coords) const;
  // The rank whose coordinates equal `rank`'s except coordinate `dim`, which is `value`.
  int with_coord(int rank, int dim, int value) const;

  // Groups: all ranks that differ from `rank` only in the coordinates of `dims`. Members are
  // ordered like world ranks (innermost dimension fastest); group_index is the position in it.
  int group_size(DimSet dims) const;
  std::vector<int> group_members(int rank, DimSet dims) const;
  int group_index(int rank, DimSet dims) const;
  // The member at position `index` of `rank`'s group along `dims`.
  int group_member(int rank, DimSet dims, int index) const;
  // The lowest rank of `rank`'s group: a canonical name for that group instance.
  int group_leader(int rank, DimSet dims) const;

  std::string describe() const;  // "pp=2 x dp_shard=4 x tp=8 (64 ranks, 8 per node)"

 private:
  std::vector<MeshDim> dims_;
  std::vector<int> strides_;
  int world_size_ = 1;
  int gpus_per_node_ = 1;
};

}  // namespace muonbed
