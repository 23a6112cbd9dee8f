// Parallelization rules: turn a Model and a DeviceMesh with dimension roles into a ShardedModel,
// one TensorLayout per parameter (or per EP slice of an expert stack), the way FSDP2,
// Megatron-style TP, EP and PP place parameters. Choices beyond parallelize.hpp's rules, all
// deliberate:
//   * 1-D parameters (norms, all biases) replicate over TP and are Shard(0) under FSDP; biases of
//     column-parallel layers are not TP-sharded (simpler, and they are AdamW's anyway).
//   * Routers and other_matrix weights replicate over TP; embeddings/lm_head shard the vocab
//     (dim 0) when tp_shard_embeddings.
//   * 3-D expert stacks [E, rows, cols]: tensor dims shift by one (dim 0 is the expert batch).
//     FSDP shards fsdp_tensor_dim + 1 (rows by default). With an ep dimension the experts are
//     not TP-sharded (each EP rank owns whole experts; tp replicates them); without one, TP
//     shards them like dense layers (up/gate dim 1, down dim 2).
//   * An fsdp dim shards its tensor dim d with StridedShard(d, f), f the product of the sizes of
//     the TP dims inner to it that shard d (FSDP2 on top of TP); otherwise plain Shard(d). With
//     DenseOverEp::shard the ep dim follows the same rule for every parameter that is not an
//     expert stack, so each rank of an fsdp x ep group holds a disjoint piece of the TP-local
//     shard (its index sets cover the tensor exactly once; tests/core/parallelize_test.cpp).
//   * MLA (model.hpp): q_b and kv_b are column-parallel by heads; the down-projections q_a and
//     kv_a, whose rows are the latent dims every head reads, replicate over TP; all are Muon's
//     matrices and FSDP shards their rows like any other.
//   * PP splits num_layers like torch.chunk (stage = layer / ceil(layers / stages)), so trailing
//     stages may own no block; embeddings (also pos_embed, and a tied embedding) live on stage 0,
//     every other non-block parameter (final norm, lm_head) on the last stage.
//   * At most one ep and one pp dimension; any number of replicate, fsdp and tp dimensions.
#include "core/model/parallelize.hpp"

#include <set>

#include "core/base/errors.hpp"

namespace muonbed {

namespace {

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

bool is_expert_stack(const Parameter& p) {
  return p.shape.size() == 3 &&
         (p.role == ParamRole::expert_up || p.role == ParamRole::expert_gate ||
          p.role == ParamRole::expert_down);
}

// The tensor dim TP shards by role, or -1 to replicate over TP.
int tp_dim_by_role(const Parameter& p, bool has_ep, const ParallelRules& rules) {
  const std::size_t nd = p.shape.size();
  if (nd == 2) {
    switch (p.role) {
      case ParamRole::attn_q:
      case ParamRole::attn_k:
      case ParamRole::attn_v:
      case ParamRole::attn_q_up:
      case ParamRole::attn_kv_up:
      case ParamRole::mlp_up:
      case ParamRole::mlp_gate:
      case ParamRole::expert_up:
      case ParamRole::expert_gate:
        return 0;  // column-parallel: output features
      case ParamRole::attn_o:
      case ParamRole::mlp_down:
      case ParamRole::expert_down:
        return 1;  // row-parallel: input features
      case ParamRole::embedding:
      case ParamRole::lm_head:
        return rules.tp_shard_embeddings ? 0 : -1;  // vocab-parallel
      default:
        return -1;
    }
  }
  if (nd == 3 && is_expert_stack(p) && !has_ep) return p.role == ParamRole::expert_down ? 2 : 1;
  return -1;
}

std::string list_dims(const DeviceMesh& mesh, const std::vector<int>& dims) {
  std::string out;
  for (int d : dims) out += (out.empty() ? "'" : ", '") + mesh.dim(d).name + "'";
  return out;
}

}  // namespace

std::string_view to_string(DenseOverEp value) {
  return value == DenseOverEp::shard ? "shard" : "replicate";
}

std::int64_t DistributedParam::numel() const {
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  return n;
}

std::vector<int> ShardedModel::muon_params() const {
  std::vector<int> out;
  for (const DistributedParam& p : params)
    if (p.optimizer == OptimizerKind::muon) out.push_back(p.index);
  return out;
}

std::vector<int> ShardedModel::adamw_params() const {
  std::vector<int> out;
  for (const DistributedParam& p : params)
    if (p.optimizer == OptimizerKind::adamw) out.push_back(p.index);
  return out;
}

std::int64_t ShardedModel::shard_bytes(int rank) const {
  std::int64_t bytes = 0;
  for (const DistributedParam& p : params)
    bytes += p.layout.shard_numel(mesh, rank) * bytes_of(p.dtype);
  return bytes;
}

ShardedModel parallelize(const Model& model, const DeviceMesh& mesh, const ParallelRules& rules) {
  const std::vector<int> fsdp = mesh.dims_with_role(DimRole::fsdp);
  const std::vector<int> tp = mesh.dims_with_role(DimRole::tp);
  const std::vector<int> ep = mesh.dims_with_role(DimRole::ep);
  const std::vector<int> pp = mesh.dims_with_role(DimRole::pp);
  const std::string where = "parallelize '" + model.name + "' on " + mesh.describe() + ": ";
  if (ep.size() > 1)
    throw LayoutError(where + "the mesh has " + std::to_string(ep.size()) + " ep dimensions (" +
                      list_dims(mesh, ep) + "); fix: use at most one ep dimension");
  if (pp.size() > 1)
    throw LayoutError(where + "the mesh has " + std::to_string(pp.size()) + " pp dimensions (" +
                      list_dims(mesh, pp) + "); fix: use at most one pp dimension");
  if (rules.fsdp_tensor_dim < 0 || rules.fsdp_tensor_dim > 1)
    throw LayoutError(where + "fsdp_tensor_dim is " + std::to_string(rules.fsdp_tensor_dim) +
                      "; fix: use 0 (rows, as FSDP2) or 1 (columns) of each matrix");

  // tp_dim_per_param: every name must be a parameter, every dim inside its shape.
  for (const auto& [name, dim] : rules.tp_dim_per_param) {
    const Parameter* found = nullptr;
    for (const Parameter& p : model.params)
      if (p.name == name) found = &p;
    if (!found)
      throw LayoutError(
          where + "tp_dim_per_param names '" + name +
          "', which is not a parameter of the model; fix: use a parameter name "
          "such as '" +
          (model.params.empty() ? std::string("layers.0.attn.q") : model.params.front().name) +
          "'");
    const int nd = static_cast<int>(found->shape.size());
    if (dim < 0 || dim >= nd)
      throw LayoutError(where + "tp_dim_per_param['" + name + "'] = " + std::to_string(dim) +
                        " is out of range for parameter '" + name + "' of shape " +
                        shape_string(found->shape) + "; fix: use a tensor dim in 0.." +
                        std::to_string(nd - 1));
  }

  // Pipeline stages: torch.chunk of the blocks.
  const int stages = pp.empty() ? 1 : mesh.size(pp[0]);
  if (!pp.empty() && stages > model.num_layers)
    throw LayoutError(where + "pp dimension '" + mesh.dim(pp[0]).name + "' has " +
                      std::to_string(stages) + " stages but the model has only " +
                      std::to_string(model.num_layers) + " layers; fix: use at most " +
                      std::to_string(model.num_layers) + " pipeline stages");
  const int layers_per_stage = model.num_layers > 0 ? (model.num_layers + stages - 1) / stages : 1;

  ShardedModel out;
  out.mesh = mesh;
  out.model_name = model.name;
  for (std::size_t source = 0; source < model.params.size(); ++source) {
    const Parameter& p = model.params[source];
    const int nd = static_cast<int>(p.shape.size());
    if (nd < 1 || nd > 3)
      throw LayoutError(where + "parameter '" + p.name + "' has shape " + shape_string(p.shape) +
                        "; fix: parameters must be 1-D, 2-D or 3-D");
    std::vector<Placement> placements(mesh.ndims(), Placement::replicate());

    if (!pp.empty()) {
      int stage;
      if (p.layer >= 0) {
        if (p.layer >= model.num_layers)
          throw LayoutError(where + "parameter '" + p.name + "' is in layer " +
                            std::to_string(p.layer) + " but the model has " +
                            std::to_string(model.num_layers) +
                            " layers; fix: set Model::num_layers to cover every block");
        stage = p.layer / layers_per_stage;
      } else {
        stage = p.role == ParamRole::embedding ? 0 : stages - 1;
      }
      placements[pp[0]] = Placement::independent(stage);
    }

    int tp_dim = tp_dim_by_role(p, !ep.empty(), rules);
    if (auto it = rules.tp_dim_per_param.find(p.name); it != rules.tp_dim_per_param.end())
      tp_dim = it->second;
    if (tp_dim >= 0)
      for (int t : tp) placements[t] = Placement::shard(tp_dim);

    const int fsdp_dim = nd == 1 ? 0 : nd == 3 ? rules.fsdp_tensor_dim + 1 : rules.fsdp_tensor_dim;
    std::vector<int> shard_dims = fsdp;  // the fsdp dims, and ep for dense params when asked
    if (!ep.empty() && rules.dense_over_ep == DenseOverEp::shard && !is_expert_stack(p))
      shard_dims.push_back(ep[0]);
    for (int f : shard_dims) {
      int split = 1;  // TP shards of the same tensor dim inner to this fsdp dim
      if (tp_dim == fsdp_dim)
        for (int t : tp)
          if (t > f) split *= mesh.size(t);
      placements[f] =
          split > 1 ? Placement::strided_shard(fsdp_dim, split) : Placement::shard(fsdp_dim);
    }

    DistributedParam d;
    d.source = static_cast<int>(source);
    d.name = p.name;
    d.shape = p.shape;
    d.dtype = p.dtype;
    d.role = p.role;
    d.layer = p.layer;
    d.optimizer = route(p, rules.routing);

    if (!ep.empty() && is_expert_stack(p)) {
      const int e = ep[0];
      const std::int64_t experts = p.shape[0];
      const int slices = mesh.size(e);
      if (experts % slices != 0) {
        std::string divisors;
        for (std::int64_t k = 1; k <= experts; ++k)
          if (experts % k == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(k);
        throw LayoutError(where + "expert stack '" + p.name + "' has " + std::to_string(experts) +
                          " experts, not divisible by ep dimension '" + mesh.dim(e).name +
                          "' of size " + std::to_string(slices) +
                          "; fix: choose an ep size that divides " + std::to_string(experts) +
                          " (" + divisors + ")");
      }
      for (int c = 0; c < slices; ++c) {
        DistributedParam slice = d;
        slice.name = p.name + "[ep=" + std::to_string(c) + "]";
        slice.shape[0] = experts / slices;
        placements[e] = Placement::independent(c);
        slice.layout = TensorLayout(mesh, slice.shape, placements);
        slice.index = static_cast<int>(out.params.size());
        out.params.push_back(std::move(slice));
      }
      continue;
    }
    d.layout = TensorLayout(mesh, d.shape, placements);
    d.index = static_cast<int>(out.params.size());
    out.params.push_back(std::move(d));
  }
  return out;
}

ShardedModel shard_explicitly(const DeviceMesh& mesh, const std::string& model_name,
                              std::vector<DistributedParam> params) {
  ShardedModel out;
  out.mesh = mesh;
  out.model_name = model_name;
  std::set<std::string> names;
  for (std::size_t i = 0; i < params.size(); ++i) {
    DistributedParam& p = params[i];
    const std::string what =
        "model '" + model_name + "', parameter " + std::to_string(i) + " '" + p.name + "': ";
    if (p.name.empty()) throw LayoutError(what + "empty name; fix: name every parameter");
    if (!names.insert(p.name).second)
      throw LayoutError(what + "the name appears twice; fix: give every parameter a distinct name");
    if (p.shape.empty()) p.shape = p.layout.shape();
    if (!p.layout.shape().empty() && p.layout.shape() != p.shape)
      throw LayoutError(what + "shape " + shape_string(p.shape) + " differs from its layout's " +
                        shape_string(p.layout.shape()) + "; fix: make them equal");
    try {
      p.layout = TensorLayout(mesh, p.shape, p.layout.placements());
    } catch (const LayoutError& e) {
      throw LayoutError(what + e.what());
    }
    p.index = static_cast<int>(i);
  }
  out.params = std::move(params);
  return out;
}

}  // namespace muonbed
