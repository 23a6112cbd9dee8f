// Parallelization rules: from parameter roles and mesh dimension roles to placements.
//
// The result is a ShardedModel: every parameter (or, under EP, every per-rank slice of an
// expert stack) with its TensorLayout on the mesh. Rules, per mesh dimension role:
//   fsdp       Shard(fsdp_tensor_dim) (FSDP2 shards dim 0); StridedShard when TP already shards
//              the same tensor dim (FSDP2 on top of TP);
//   tp         column-parallel (q, k, v, up, gate, expert up/gate, MLA's q_b and kv_b): Shard(0);
//              row-parallel (o, down, expert down): Shard(1); per-parameter override by name
//              (seed 004's tp_dim_per_param); embeddings shard the vocab (dim 0); norms and MLA's
//              down-projections q_a and kv_a replicate (as DeepSeek's and Megatron's MLA do);
//   ep         expert stacks are split into `ep` slices, slice c Independent(c); other (dense)
//              parameters replicate over ep, or with DenseOverEp::shard are cut over the fsdp
//              dims and ep together, as torchtitan's FSDP over dp_shard x ep and Megatron's
//              distributed optimizer over the data-parallel group (which holds the EP ranks) do;
//   pp         layers are split into contiguous stages; a block's parameters are
//              Independent(stage); the embedding lives on the first stage, final norm and head
//              on the last;
//   replicate  Replicate (DDP, CP, HSDP's replicate dimension).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/layout.hpp"
#include "core/model/mesh.hpp"
#include "core/model/model.hpp"

namespace muonbed {

// How dense (non-expert) parameters lie over an ep mesh dim.
//   replicate  every EP rank holds them whole (as far as other dims leave them): the EP ranks are
//              a data-parallel group of their own, like a replicate dim (muonbed's default).
//   shard      the ep dim shards them like one more fsdp dim: Shard(fsdp_tensor_dim), or
//              StridedShard under TP of the same tensor dim (the fsdp rule). With the fsdp dims
//              the cut is nested in mesh order, outermost first (DTensor's rule for a tensor
//              sharded over several mesh dims): when the tensor dim divides by the product of the
//              sizes it equals torchtitan's one flat chunk over its dp_shard_cp mesh
//              (dp_shard_mod_ep x dp_shard_in_ep, ep innermost); otherwise trailing pieces differ.
//              Megatron cuts one flat buffer of all dense parameters instead of each tensor: the
//              same bytes per rank, split elsewhere. Expert stacks are unchanged (ep slices,
//              fsdp dims shard inside a slice: torchtitan's dp_shard_mod_ep).
enum class DenseOverEp { replicate, shard };
std::string_view to_string(DenseOverEp value);

struct ParallelRules {
  int fsdp_tensor_dim = 0;
  std::map<std::string, int> tp_dim_per_param;  // parameter name -> tensor dim sharded by TP
  bool tp_shard_embeddings = true;
  DenseOverEp dense_over_ep = DenseOverEp::replicate;
  RoutingRules routing;
};

// One unit the optimizer treats on its own: a whole parameter, or one EP slice of an expert
// stack. `index` is its position in ShardedModel::params.
struct DistributedParam {
  int index = 0;
  int source = 0;  // index into Model::params
  std::string name;
  std::vector<std::int64_t> shape;  // may be a slice of the source's stack under EP
  DType dtype = DType::bf16;
  ParamRole role = ParamRole::other_matrix;
  int layer = -1;
  OptimizerKind optimizer = OptimizerKind::muon;
  TensorLayout layout;

  std::int64_t numel() const;
  std::int64_t bytes() const { return numel() * bytes_of(dtype); }
  std::int64_t batch() const { return shape.size() == 3 ? shape[0] : 1; }
  std::int64_t rows() const { return shape[shape.size() - 2]; }
  std::int64_t cols() const { return shape.back(); }
};

struct ShardedModel {
  DeviceMesh mesh;
  std::string model_name;
  std::vector<DistributedParam> params;

  std::vector<int> muon_params() const;  // indices with optimizer == muon
  std::vector<int> adamw_params() const;
  // Bytes of all parameter shards `rank` holds (one copy, the parameters' dtype).
  std::int64_t shard_bytes(int rank) const;
};

// Throws LayoutError naming the parameter and the fix when a rule cannot apply (e.g. more PP
// stages than layers, experts not divisible by ep, a TP dim out of range).
ShardedModel parallelize(const Model& model, const DeviceMesh& mesh, const ParallelRules& rules);

// A model given directly with per-parameter placements (explicit YAML lists, tests).
ShardedModel shard_explicitly(const DeviceMesh& mesh, const std::string& model_name,
                              std::vector<DistributedParam> params);

}  // namespace muonbed
