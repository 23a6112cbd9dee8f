// The training step's ops (core/plan/training.hpp): its shape, the forward and backward passes
// with the parallelism's communication, their FLOPs, and the activation memory.
#include "core/plan/training.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "core/base/errors.hpp"
#include "core/plan/schedule.hpp"

namespace muonbed {

namespace {

constexpr std::int64_t kActivationBytes = 2;  // bf16 activations

bool is_expert(ParamRole role) {
  return role == ParamRole::expert_up || role == ParamRole::expert_gate ||
         role == ParamRole::expert_down;
}

bool is_mlp(ParamRole role) {
  return role == ParamRole::mlp_up || role == ParamRole::mlp_gate || role == ParamRole::mlp_down ||
         role == ParamRole::router || is_expert(role);
}

// Query rows of an attention projection: what attention's score and value products scale with.
bool is_query(ParamRole role) {
  return role == ParamRole::attn_q || role == ParamRole::attn_q_up;
}

int mesh_dim_named(const DeviceMesh& mesh, const std::string& name) {
  return mesh.find(name);
}

// The sharding dims FSDP gathers before compute: every shard dim but TP's, and for routed
// experts but EP's too (each EP rank computes with the experts it holds; the tokens travel).
DimSet fsdp_dims(const DeviceMesh& mesh, const DistributedParam& param) {
  DimSet out;
  const bool expert = is_expert(param.role);
  for (int d = 0; d < mesh.ndims(); ++d) {
    const DimRole role = mesh.dim(d).role;
    if (!param.layout.shard_dims().contains(d) || role == DimRole::tp) continue;
    if (expert && role == DimRole::ep) continue;
    out = out.with(d);
  }
  return out;
}

DimSet tp_dims(const DeviceMesh& mesh) {
  DimSet out;
  for (int d : mesh.dims_with_role(DimRole::tp)) out = out.with(d);
  return out;
}

std::int64_t model_hidden(const ShardedModel& model) {
  for (const auto& dp : model.params)
    if (dp.role == ParamRole::embedding && dp.shape.size() == 2) return dp.cols();
  for (const auto& dp : model.params)
    if (dp.role == ParamRole::attn_o && dp.shape.size() == 2) return dp.rows();
  for (const auto& dp : model.params)
    if (dp.role == ParamRole::mlp_down && dp.shape.size() == 2) return dp.rows();
  return 0;
}

// One part of the model whose forward and backward are one op each: the embedding, a layer's
// attention, its MLP (or experts, per EP slice), the LM head.
struct Part {
  std::string name;
  int layer = -1;
  bool experts = false;
  bool mlp = false;
  std::vector<int> params;
  RankBox box;
};

}  // namespace

TrainingShape training_shape(const ShardedModel& model, const TrainingOptions& o) {
  TrainingShape s;
  const DeviceMesh& mesh = model.mesh;
  const auto fail = [](const std::string& what, const std::string& fix) {
    throw PlanError("training: " + what + "; fix: " + fix);
  };
  if (!(o.seq_len > 0)) fail("seq_len must be > 0", "set training.seq_len, e.g. 4096");
  if (!(o.micro_batch_size > 0))
    fail("micro_batch_size must be > 0", "set training.micro_batch_size, e.g. 1");
  for (int d = 0; d < mesh.ndims(); ++d) {
    const MeshDim& dim = mesh.dim(d);
    if (dim.name == "cp") {
      s.context_parallel *= dim.size;
      continue;
    }
    if (dim.role == DimRole::fsdp || dim.role == DimRole::replicate || dim.role == DimRole::ep)
      s.data_parallel *= dim.size;
  }
  if (o.seq_len % s.context_parallel != 0)
    fail("seq_len " + std::to_string(o.seq_len) + " does not split over context parallelism " +
             std::to_string(s.context_parallel),
         "use a seq_len divisible by the cp dim");
  const std::int64_t per_micro_batch = s.data_parallel * o.micro_batch_size * o.seq_len;
  if (!(o.tokens_per_step > 0) || o.tokens_per_step % per_micro_batch != 0)
    fail("tokens_per_step " + std::to_string(o.tokens_per_step) +
             " is not a positive multiple of data-parallel degree x micro_batch_size x seq_len = " +
             std::to_string(s.data_parallel) + " x " + std::to_string(o.micro_batch_size) + " x " +
             std::to_string(o.seq_len) + " = " + std::to_string(per_micro_batch),
         "use tokens_per_step = k x " + std::to_string(per_micro_batch) + " (k micro-batches)");
  s.micro_batches = o.tokens_per_step / per_micro_batch;
  s.groups = static_cast<int>(std::min<std::int64_t>(s.micro_batches, o.max_micro_batch_groups));
  while (s.micro_batches % s.groups != 0) --s.groups;  // groups of equal micro-batches
  s.hidden = model_hidden(model);
  if (!(s.hidden > 0))
    fail("the model's hidden size is not known (no embedding, attn.o or mlp.down matrix)",
         "describe the model with those roles (model: {dense: ...} or a preset)");
  std::set<int> layers;
  for (const auto& dp : model.params)
    if (dp.layer >= 0) layers.insert(dp.layer);
  s.layers = static_cast<std::int64_t>(layers.size());
  for (int d : mesh.dims_with_role(DimRole::pp)) s.stages *= mesh.size(d);
  s.tokens_per_micro_batch_rank = o.micro_batch_size * o.seq_len / s.context_parallel;
  bool experts = false;
  for (const auto& dp : model.params) experts = experts || is_expert(dp.role);
  if (experts && !(o.experts_per_token > 0))
    fail("the model has routed experts but training.experts_per_token is not set",
         "set training.experts_per_token to the model's top-k (e.g. 8 for DeepSeek-V3)");
  return s;
}

namespace {

// The rows an expert op's ranks compute with their experts: top-k copies of each of its tokens.
// An EP rank holds E / ep of the model's experts (an expert slice, core/model/parallelize.hpp) and
// receives, routed evenly, that share of its EP group's ep x tokens x top-k rows: tokens x top-k
// again; without EP the rank holds every expert and its own tokens' rows. One expert of the
// rank's `batch` takes 1 / batch of them.
double expert_rows(const StepPlan& plan, const Op& op) {
  return static_cast<double>(op.tokens) *
         static_cast<double>(plan.settings.training.experts_per_token);
}

}  // namespace

double training_op_flops(const StepPlan& plan, const Op& op, int rank) {
  if (op.kind != OpKind::forward && op.kind != OpKind::backward) return 0;
  const DeviceMesh& mesh = plan.mesh();
  const double t = static_cast<double>(op.tokens);
  const TrainingOptions& o = plan.settings.training;
  double forward = 0;
  for (int p : op.params) {
    const auto& dp = plan.model.params[p];
    if (dp.shape.size() < 2 || !dp.layout.holds(mesh, rank)) continue;
    if (dp.role == ParamRole::embedding) continue;  // a lookup, no GEMM
    const double local = static_cast<double>(dp.layout.shard_numel(mesh, rank, op.gathered));
    if (is_expert(dp.role)) {
      forward += 2.0 * expert_rows(plan, op) * local /
                 static_cast<double>(std::max<std::int64_t>(1, dp.batch()));
      continue;
    }
    forward += 2.0 * t * local;
    if (is_query(dp.role))  // scores (Q K^T) and values (P V): 2 x 2 x seq_len per query row
      forward +=
          4.0 * t * static_cast<double>(o.seq_len) * (local / static_cast<double>(dp.cols()));
  }
  return op.kind == OpKind::forward ? forward : 2.0 * forward;
}

double training_gemm_min_dim(const StepPlan& plan, const Op& op, int rank) {
  double smallest = static_cast<double>(op.tokens);
  for (int p : op.params) {
    const auto& dp = plan.model.params[p];
    if (dp.shape.size() < 2 || dp.role == ParamRole::embedding) continue;
    if (is_expert(dp.role))  // one expert's GEMM has its share of the routed tokens as rows
      smallest = std::min(smallest, expert_rows(plan, op) /
                                        static_cast<double>(std::max<std::int64_t>(1, dp.batch())));
    const ShardIndexSet set = dp.layout.index_set(plan.mesh(), rank, op.gathered);
    for (std::size_t i = set.dims.size() >= 2 ? set.dims.size() - 2 : 0; i < set.dims.size(); ++i)
      if (const auto n = set.dims[i].size(); n > 0)
        smallest = std::min(smallest, static_cast<double>(n));
  }
  return smallest;
}

TrainingCosts::TrainingCosts(const StepPlan& plan) : plan_(plan) {
  // What the two figures read of a param is its role, shape and layout: params equal in all
  // three (the same weight of different layers) are one class, named by its first param.
  const std::vector<DistributedParam>& params = plan.model.params;
  const std::vector<int> param_class = param_classes(plan.model, [&params](int p, int q) {
    return params[p].role == params[q].role && params[p].layout == params[q].layout;
  });
  std::map<std::tuple<int, std::int64_t, std::uint64_t, std::vector<int>>, int> signatures;
  signature_.assign(plan.ops.size(), -1);
  std::vector<int> op_classes;
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const Op& op = plan.ops[i];
    if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
    op_classes.clear();
    for (int p : op.params) op_classes.push_back(param_class[static_cast<std::size_t>(p)]);
    const auto key = std::make_tuple(static_cast<int>(op.kind), op.tokens,
                                     static_cast<std::uint64_t>(op.gathered.bits), op_classes);
    const auto [at, added] = signatures.try_emplace(key, static_cast<int>(signatures.size()));
    signature_[i] = at->second;
  }
  known_.resize(signatures.size());
}

TrainingCosts::Known* TrainingCosts::known(const Op& op) {
  const auto id = static_cast<std::size_t>(op.id);
  if (id >= signature_.size() || &plan_.ops[id] != &op || signature_[id] < 0) return nullptr;
  Known& k = known_[static_cast<std::size_t>(signature_[id])];
  if (k.flops.empty()) {
    const auto world = static_cast<std::size_t>(plan_.mesh().world_size());
    k.flops.assign(world, std::numeric_limits<double>::quiet_NaN());
    k.min_dim.assign(world, std::numeric_limits<double>::quiet_NaN());
  }
  return &k;
}

double TrainingCosts::remember(const Op& op, int rank, std::vector<double> Known::*table,
                               double (*compute)(const StepPlan&, const Op&, int)) {
  Known* k = known(op);
  if (k == nullptr) return compute(plan_, op, rank);
  double& slot = (k->*table)[static_cast<std::size_t>(rank)];
  if (std::isnan(slot)) slot = compute(plan_, op, rank);
  return slot;
}

double TrainingCosts::flops(const Op& op, int rank) {
  return remember(op, rank, &Known::flops, &training_op_flops);
}

double TrainingCosts::gemm_min_dim(const Op& op, int rank) {
  return remember(op, rank, &Known::min_dim, &training_gemm_min_dim);
}

std::vector<TrainingMatrix> training_matrices(const StepPlan& plan, const Op& op, int rank) {
  std::vector<TrainingMatrix> out;
  if (op.kind != OpKind::forward && op.kind != OpKind::backward) return out;
  const DeviceMesh& mesh = plan.mesh();
  const TrainingOptions& o = plan.settings.training;
  for (int p : op.params) {
    const auto& dp = plan.model.params[p];
    if (dp.shape.size() < 2 || dp.role == ParamRole::embedding || !dp.layout.holds(mesh, rank))
      continue;
    TrainingMatrix m;
    m.param = p;
    m.set = dp.layout.index_set(mesh, rank, op.gathered);
    const std::size_t nd = m.set.dims.size();
    m.rows = m.set.dims[nd - 2].size();
    m.cols = m.set.dims[nd - 1].size();
    for (std::size_t d = 0; d + 2 < nd; ++d) m.matrices *= m.set.dims[d].size();
    if (m.set.numel() == 0) continue;
    if (is_expert(dp.role)) {
      // The rank's experts take their share of the routed rows, split as evenly as whole rows go.
      const std::int64_t routed = static_cast<std::int64_t>(
          std::llround(expert_rows(plan, op) * static_cast<double>(m.matrices) /
                       static_cast<double>(std::max<std::int64_t>(1, dp.batch()))));
      for (std::int64_t e = 0; e < m.matrices; ++e)
        m.token_rows.push_back(routed / m.matrices + (e < routed % m.matrices ? 1 : 0));
    } else {
      m.token_rows.assign(static_cast<std::size_t>(m.matrices), op.tokens);
    }
    if (is_query(dp.role) && o.seq_len > 0) {
      const TrainingShape shape = training_shape(plan.model, o);
      m.chunk_rows = o.seq_len / shape.context_parallel;
      m.attention_chunks = m.chunk_rows > 0 ? op.tokens / m.chunk_rows : 0;
      m.keys = o.seq_len;
      m.width = m.set.numel() / dp.cols();  // training_op_flops' query rows of the rank
    }
    out.push_back(std::move(m));
  }
  return out;
}

TrainingEmission emit_training(PlanBuilder& b, const TrainingOptions& o) {
  const ShardedModel& model = b.model();
  const DeviceMesh& mesh = b.mesh();
  const TrainingShape shape = training_shape(model, o);
  TrainingEmission out;
  const int train = b.stream("train");
  const int gathers = b.stream("fsdp");
  const DimSet tp = tp_dims(mesh);
  const int tp_size = mesh.group_size(tp);
  const int cp_dim = mesh_dim_named(mesh, "cp");
  std::vector<int> ep_dims = mesh.dims_with_role(DimRole::ep);
  DimSet ep;
  for (int d : ep_dims) ep = ep.with(d);
  const std::int64_t group_tokens =
      shape.tokens_per_micro_batch_rank * (shape.micro_batches / shape.groups);
  const std::int64_t hidden_bytes = shape.hidden * kActivationBytes;

  // Parts in forward order, per stage (the pp coordinate of their params' box).
  std::vector<Part> parts;
  const auto add_to_part = [&](const std::string& name, int layer, bool experts, bool mlp, int p) {
    // A layer's experts are one part over its whole EP group (each rank computes the slices it
    // holds, and the tokens cross the group); their gathers stay per slice.
    RankBox box = b.holders_box(p);
    if (experts)
      for (int d : ep_dims) box.coord[d] = RankBox::kAll;
    for (Part& part : parts)
      if (part.layer == layer && part.experts == experts && part.mlp == mlp && part.box == box &&
          part.name == name) {
        part.params.push_back(p);
        return;
      }
    parts.push_back({name, layer, experts, mlp, {p}, box});
  };
  for (const auto& dp : model.params) {
    if (dp.layer < 0) {
      // The final norm and the LM head run last; the embedding (and position embedding) first.
      const bool head = dp.role == ParamRole::lm_head || dp.role == ParamRole::norm;
      add_to_part(head ? "head" : "embedding", head ? 1 << 30 : -1, false, false, dp.index);
      continue;
    }
    const bool experts = is_expert(dp.role);
    const bool mlp =
        is_mlp(dp.role) || (dp.role == ParamRole::bias && dp.name.find("mlp") != std::string::npos);
    add_to_part(experts ? "experts" : (mlp ? "mlp" : "attention"), dp.layer, experts,
                mlp && !experts, dp.index);
  }
  // Forward order: by layer (embedding first, head last), attention before the MLP and experts.
  std::stable_sort(parts.begin(), parts.end(), [](const Part& x, const Part& y) {
    if (x.layer != y.layer) return x.layer < y.layer;
    const auto rank = [](const Part& p) { return p.experts ? 2 : (p.mlp ? 1 : 0); };
    return rank(x) < rank(y);
  });
  // Stage of a part: its box's pp coordinate (every stage when the mesh has no pp dim).
  const std::vector<int> pp_dims = mesh.dims_with_role(DimRole::pp);
  const int pp = pp_dims.empty() ? -1 : pp_dims.front();
  const auto stage_of = [&](const Part& part) {
    return pp < 0 ? 0 : std::max(0, part.box.coord[pp]);
  };
  // The box of a whole stage: every rank with its pp coordinate.
  const auto stage_box = [&](int stage) {
    RankBox box = RankBox::everyone(mesh);
    if (pp >= 0) box.coord[pp] = stage;
    return box;
  };
  std::set<int> layer_has_dense_mlp;
  for (const Part& part : parts)
    if (part.mlp) layer_has_dense_mlp.insert(part.layer);

  std::vector<int> last_backward(static_cast<std::size_t>(shape.stages), -1);
  std::vector<int> release_before;  // per pass: the release ops of the gathered parts, in order
  // Emits the FSDP gather of a part (tensor parameter) into a transient buffer, at most one part
  // ahead of the compute; returns {the gathers to wait for (none without FSDP), the buffer (or
  // -1)}.
  const auto gather_part = [&](const Part& part,
                               std::vector<int> deps) -> std::pair<std::vector<int>, int> {
    DimSet dims;
    for (int p : part.params) dims = dims | fsdp_dims(mesh, b.param(p));
    if (dims.empty()) return {{}, -1};
    if (release_before.size() >= 2) deps.push_back(release_before[release_before.size() - 2]);
    const int buffer = b.add_buffer("params " + part.name + " " + std::to_string(part.layer),
                                    part.params, dims, false);
    Op alloc;
    alloc.kind = OpKind::alloc;
    alloc.stream = gathers;
    alloc.ranks = part.box;
    alloc.buffer = buffer;
    alloc.deps = deps;
    alloc.label = "alloc gathered params of " + part.name;
    const int alloc_id = b.emit(std::move(alloc));
    // One all-gather per sharding and holders of the part's params (an expert part: per slice).
    std::map<std::pair<std::uint32_t, std::vector<int>>, std::vector<int>> by_dims;
    for (int p : part.params) {
      const DimSet d = fsdp_dims(mesh, b.param(p));
      if (!d.empty()) by_dims[{d.bits, b.holders_box(p).coord}].push_back(p);
    }
    int last = alloc_id;
    std::vector<int> gathered_ops;
    for (const auto& [key, params] : by_dims) {
      Op g;
      g.kind = OpKind::all_gather;
      g.stream = gathers;
      g.ranks = RankBox{key.second};
      g.group = DimSet{key.first};
      g.params = params;
      g.tensor = TensorRole::parameter;
      g.deps = {alloc_id};
      g.label = "FSDP all_gather params of " + part.name + " layer " + std::to_string(part.layer);
      gathered_ops.push_back(b.emit(std::move(g)));
    }
    // A rank waits only for the gathers it takes part in (deps on others' are ignored there).
    if (gathered_ops.empty()) gathered_ops.push_back(last);
    return {gathered_ops, buffer};
  };
  const auto release = [&](const Part& part, int buffer, int after) {
    Op r;
    r.kind = OpKind::release;
    r.stream = train;
    r.ranks = part.box;
    r.buffer = buffer;
    r.deps = {after};
    r.label = "release gathered params of " + part.name;
    release_before.push_back(b.emit(std::move(r)));
  };
  const auto activation_op = [&](OpKind kind, const RankBox& box, DimSet group, std::int64_t bytes,
                                 std::vector<int> deps, std::string label) {
    Op op;
    op.kind = kind;
    op.stream = train;
    op.ranks = box;
    op.group = group;
    op.tensor = TensorRole::activation;
    op.bytes = bytes;
    op.deps = std::move(deps);
    op.label = std::move(label);
    return b.emit(std::move(op));
  };
  // One pass (forward or backward) of one part over one group's tokens; returns the op whose
  // completion means the part's pass is done.
  const auto pass = [&](const Part& part, bool forward, std::vector<int> deps, int group) {
    const std::string what =
        std::string(forward ? "forward " : "backward ") + part.name +
        (part.layer >= 0 && part.layer < (1 << 30) ? " layer " + std::to_string(part.layer) : "") +
        ", micro-batch group " + std::to_string(group);
    const auto [gathered, buffer] = gather_part(part, {});
    deps.insert(deps.end(), gathered.begin(), gathered.end());
    const std::int64_t tokens_bytes = group_tokens * hidden_bytes;
    const bool tp_part = tp_size > 1 && part.layer >= 0 && part.layer < (1 << 30);
    // Experts: tokens to their experts and back (top-k copies of each token's hidden state).
    const bool ep_exchange = part.experts && !ep.empty() && mesh.group_size(ep) > 1;
    const std::int64_t a2a_bytes = group_tokens * o.experts_per_token * hidden_bytes;
    if (ep_exchange)
      deps = {activation_op(OpKind::all_to_all, part.box, ep & part.box.free_dims(), a2a_bytes,
                            deps, "EP all_to_all to experts, " + what)};
    // CP: attention needs every chunk's keys and values.
    if (!part.mlp && !part.experts && cp_dim >= 0 && mesh.size(cp_dim) > 1 && part.layer >= 0 &&
        part.layer < (1 << 30)) {
      std::int64_t kv_rows = 0;
      for (int p : part.params) {
        const auto& dp = b.param(p);
        if (dp.role == ParamRole::attn_k || dp.role == ParamRole::attn_v ||
            dp.role == ParamRole::attn_kv_down)
          kv_rows += dp.rows() / std::max(1, tp_size);
      }
      if (kv_rows > 0)
        deps = {activation_op(OpKind::all_gather, part.box, DimSet::of({cp_dim}),
                              group_tokens * kv_rows * kActivationBytes, deps,
                              "CP all_gather keys and values, " + what)};
    }
    Op op;
    op.kind = forward ? OpKind::forward : OpKind::backward;
    op.stream = train;
    op.ranks = part.box;
    op.params = part.params;
    op.tokens = group_tokens;
    DimSet dims;
    for (int p : part.params) dims = dims | fsdp_dims(mesh, b.param(p));
    op.gathered = dims;
    op.deps = deps;
    op.label = what;
    int done = b.emit(std::move(op));
    if (buffer >= 0) release(part, buffer, done);
    if (ep_exchange)
      done = activation_op(OpKind::all_to_all, part.box, ep & part.box.free_dims(), a2a_bytes,
                           {done}, "EP all_to_all from experts, " + what);
    // TP: the partial sums of a row-parallel output all-reduced, after attention and after the
    // MLP block (its dense part, or its experts when it has no dense part).
    const bool ends_block = !part.experts || !layer_has_dense_mlp.count(part.layer);
    if (tp_part && ends_block)
      done = activation_op(OpKind::all_reduce, part.box, tp & part.box.free_dims(), tokens_bytes,
                           {done}, "TP all_reduce, " + what);
    return done;
  };

  // The pipeline's point-to-point message of one micro-batch group from stage `from` to the
  // next (activations, forward) or the previous one (their gradients, backward), on its own
  // stream per stage and direction.
  const auto pp_send = [&](int from, int to, int group, int after) {
    const bool forward = to > from;
    RankBox box = stage_box(from);
    box.coord[pp] = RankBox::kAll;
    Op send;
    send.kind = OpKind::send;
    send.stream =
        b.stream(std::string(forward ? "pp.forward." : "pp.backward.") + std::to_string(from));
    send.ranks = box;
    send.group = DimSet::of({pp});
    send.root = from;
    send.peer = to;
    send.tensor = TensorRole::activation;
    send.bytes = group_tokens * hidden_bytes;
    send.deps = {after};
    send.label = std::string(forward ? "PP send activations" : "PP send gradients") + ", stage " +
                 std::to_string(from) + " to " + std::to_string(to) + ", group " +
                 std::to_string(group);
    return b.emit(std::move(send));
  };

  // Forward: stage by stage, group by group; a stage's first part waits for the activations the
  // stage before sent.
  const int stages = shape.stages;
  std::vector<std::vector<int>> arrived(stages, std::vector<int>(shape.groups, -1));
  for (int s = 0; s < stages; ++s) {
    release_before.clear();
    for (int g = 0; g < shape.groups; ++g) {
      std::vector<int> deps;
      if (arrived[s][g] >= 0) deps.push_back(arrived[s][g]);
      int last = -1;
      for (const Part& part : parts) {
        if (stage_of(part) != s) continue;
        last = pass(part, true, deps, g);
        deps = {last};
      }
      if (s + 1 < stages && last >= 0) arrived[s + 1][g] = pp_send(s, s + 1, g, last);
    }
  }
  // Backward: the last stage first, groups in reverse; a stage waits for the gradients the stage
  // after sent.
  std::vector<std::vector<int>> returned(stages, std::vector<int>(shape.groups, -1));
  for (int s = stages - 1; s >= 0; --s) {
    release_before.clear();
    for (int g = shape.groups - 1; g >= 0; --g) {
      std::vector<int> deps;
      if (returned[s][g] >= 0) deps.push_back(returned[s][g]);
      int last = -1;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        const Part& part = *it;
        if (stage_of(part) != s) continue;
        last = pass(part, false, deps, g);
        deps = {last};
        if (g == 0)  // the last group: the part's gradients are complete
          for (int p : part.params) out.gradient_ready[p].push_back(last);
      }
      if (s > 0 && last >= 0) returned[s - 1][g] = pp_send(s, s - 1, g, last);
      if (g == 0 && last >= 0) last_backward[s] = last;
    }
  }
  for (int id : last_backward)
    if (id >= 0) out.last_ops.push_back(id);
  return out;
}

std::int64_t training_activation_bytes(const ShardedModel& model, const TrainingOptions& o) {
  const TrainingShape shape = training_shape(model, o);
  const DeviceMesh& mesh = model.mesh;
  const double t = std::max(1, mesh.group_size(tp_dims(mesh)));
  const double h = static_cast<double>(shape.hidden);
  double q_rows = 0;
  for (const auto& dp : model.params)
    if (dp.layer >= 0 && is_query(dp.role)) {
      q_rows = static_cast<double>(dp.rows());
      break;
    }
  const double heads = std::max(1.0, q_rows / 128.0);  // head_dim 128 when unknown
  const double s = static_cast<double>(o.seq_len) / static_cast<double>(shape.context_parallel);
  const double b = static_cast<double>(o.micro_batch_size);
  const double scores = o.flash_attention ? 0.0 : 5 * heads * s / (h * t);
  const double per_layer = s * b * h * (10 + 24 / t + scores);
  const double layers_per_stage =
      static_cast<double>(shape.layers) / static_cast<double>(std::max(1, shape.stages));
  const double in_flight =
      static_cast<double>(std::min<std::int64_t>(shape.micro_batches, shape.stages));
  return static_cast<std::int64_t>(per_layer * layers_per_stage * in_flight);
}

StepPhase step_phase(const Op& op) {
  switch (op.kind) {
    case OpKind::forward:
      return StepPhase::forward;
    case OpKind::backward:
      return StepPhase::backward;
    default:
      break;
  }
  if (op.tensor == TensorRole::parameter) return StepPhase::parameter_gather;
  if (op.tensor == TensorRole::activation) return StepPhase::activation_comm;
  if ((op.kind == OpKind::reduce_scatter || op.kind == OpKind::all_reduce ||
       op.kind == OpKind::all_gather) &&
      op.tensor == TensorRole::gradient)
    return StepPhase::gradient_sync;
  return StepPhase::optimizer;
}

std::string_view to_string(StepPhase phase) {
  switch (phase) {
    case StepPhase::forward:
      return "forward";
    case StepPhase::backward:
      return "backward";
    case StepPhase::parameter_gather:
      return "parameter_gather";
    case StepPhase::activation_comm:
      return "activation_comm";
    case StepPhase::gradient_sync:
      return "gradient_sync";
    case StepPhase::optimizer:
      return "optimizer";
  }
  return "?";
}

bool has_training_ops(const StepPlan& plan) {
  return std::any_of(plan.ops.begin(), plan.ops.end(), [](const Op& op) {
    return op.kind == OpKind::forward || op.kind == OpKind::backward;
  });
}

}  // namespace muonbed
