// Plan builders. Each built-in strategy is a composition of an assign policy, a gather policy,
// an NS placement and a redistribute policy, driven by one pipelined schedule:
//
//   units   what moves and is orthogonalized together: one matrix (sequential, replicated, owner)
//           or a chunk of matrices with the same group (all_to_all, owner_allgather);
//   lanes   units that share one owner (or one group) form a lane, processed in order; round j
//           holds the j-th unit of every lane, so lanes run side by side (async_gpu_parallelism);
//   depth   gathers run `prefetch_count` rounds ahead of NS, on their own stream; a lane's
//           gather j waits for the release of its unit j-prefetch-1, which bounds the transient
//           memory by prefetch_count+1 full updates per owner (seed 000).
//
// Streams: "compute" (momentum, AdamW, NS, apply), "comm" (gathers and, without prefetch, every
// collective) and "comm_scatter" (redistribution, overlapping the next gathers, when
// prefetch_count > 0).
#include "core/plan/strategy.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/base/errors.hpp"
#include "core/plan/assignment.hpp"
#include "core/plan/split_ns.hpp"

namespace muonbed {

// ---------------------------------------------------------------------------------------------
// PlanBuilder

PlanBuilder::PlanBuilder(ShardedModel model, Assignment assignment, PlanSettings settings) {
  plan_.model = std::move(model);
  plan_.assignment = std::move(assignment);
  plan_.settings = settings;
}

int PlanBuilder::stream(const std::string& name) {
  const auto it = std::find(plan_.streams.begin(), plan_.streams.end(), name);
  if (it != plan_.streams.end()) return static_cast<int>(it - plan_.streams.begin());
  plan_.streams.push_back(name);
  return static_cast<int>(plan_.streams.size()) - 1;
}

int PlanBuilder::add_buffer(std::string name, std::vector<int> params, DimSet gathered,
                            bool owned_only) {
  Buffer b;
  b.id = static_cast<int>(plan_.buffers.size());
  b.name = std::move(name);
  b.params = std::move(params);
  b.gathered = gathered;
  b.owned_only = owned_only;
  plan_.buffers.push_back(std::move(b));
  return plan_.buffers.back().id;
}

int PlanBuilder::emit(Op op) {
  op.id = static_cast<int>(plan_.ops.size());
  std::sort(op.deps.begin(), op.deps.end());
  op.deps.erase(std::unique(op.deps.begin(), op.deps.end()), op.deps.end());
  for (int dep : op.deps)
    if (dep < 0 || dep >= op.id) throw PlanError("internal: op depends on a later op");
  if (op.ranks.coord.empty()) op.ranks = RankBox::everyone(mesh());
  if (op.tensor == TensorRole::none) op.tensor = default_tensor(op);
  plan_.ops.push_back(std::move(op));
  return plan_.ops.back().id;
}

RankBox PlanBuilder::holders_box(int p) const {
  RankBox box = RankBox::everyone(mesh());
  const auto& layout = param(p).layout;
  for (int d = 0; d < mesh().ndims(); ++d)
    if (layout.independent_dims().contains(d)) box.coord[d] = layout.placements()[d].coord;
  return box;
}

RankBox PlanBuilder::box_through(int p, int rank, DimSet fixed) const {
  RankBox box = holders_box(p);
  for (int d = 0; d < mesh().ndims(); ++d)
    if (fixed.contains(d)) box.coord[d] = mesh().coord(rank, d);
  return box;
}

StepPlan PlanBuilder::finish(std::string strategy_name, std::string options_json) {
  plan_.strategy = std::move(strategy_name);
  plan_.strategy_options = std::move(options_json);
  validate_plan(plan_);
  return std::move(plan_);
}

// ---------------------------------------------------------------------------------------------
// Policies

namespace {

std::string param_label(const PlanBuilder& b, std::span<const int> params) {
  if (params.size() == 1) return b.param(params[0]).name;
  return std::to_string(params.size()) + " matrices from " + b.param(params[0]).name;
}

// Sharding mesh dims of a layout, innermost (fastest-varying, e.g. tp) first.
std::vector<int> shard_dims_inner_first(const DeviceMesh& mesh, const TensorLayout& layout) {
  std::vector<int> dims;
  for (int d = mesh.ndims() - 1; d >= 0; --d)
    if (layout.shard_dims().contains(d)) dims.push_back(d);
  return dims;
}

// The order of a staged gather's stages: one sharding mesh dim per stage, innermost (TP) first
// (seed 004, "hierarchical": the pieces of a node are joined over NVLink, then one transfer per
// node crosses the network to the owner's rail), outermost first ("rails": the cross-node stage
// runs on every rail at once, each into the GPU of the owner's node on that rail, so the owner's
// node takes the matrix through all of its NICs; then the pieces are joined over NVLink), or
// all at once ("flat"). Redistribution runs the stages in reverse.
enum class StageOrder { inner_first, outer_first, flat };

DimSet minus(DimSet a, DimSet b) {
  return DimSet{a.bits & ~b.bits};
}

// `split`: the dims of a split Newton-Schulz group, which are not gathered (their members keep
// their slices; SplitNsOptions).
std::vector<DimSet> gather_stages(const PlanBuilder& b, int p, StageOrder order,
                                  DimSet split = {}) {
  const auto& layout = b.param(p).layout;
  const DimSet shard = minus(layout.shard_dims(), split);
  std::vector<DimSet> stages;
  if (order == StageOrder::flat) {
    if (!shard.empty()) stages.push_back(shard);
    return stages;
  }
  std::vector<int> dims;
  for (int d : shard_dims_inner_first(b.mesh(), layout))
    if (shard.contains(d)) dims.push_back(d);
  if (order == StageOrder::outer_first) std::reverse(dims.begin(), dims.end());
  for (int d : dims) stages.push_back(DimSet::of({d}));
  return stages;
}

// One op per stage moves every matrix of the unit whose op box and root agree at that stage: a
// unit of one matrix per owner of a node (batch_gathers) crosses the network in one gather per
// rail, then splits into one NVLink gather per owner. A unit of one matrix emits exactly the ops
// of a per-matrix staged gather.
struct StagePart {
  RankBox box, roots;
  int root = -1;
  std::vector<int> params;
};

std::vector<StagePart> stage_parts(const PlanBuilder& b, std::span<const int> params,
                                   const std::map<int, DimSet>& gathered, DimSet group,
                                   bool gathering) {
  std::vector<StagePart> parts;
  for (int p : params) {
    const int owner = b.owner(p);
    const DimSet replicate = b.param(p).layout.replicate_dims();
    const DimSet g = gathered.at(p);
    StagePart part;
    if (gathering) {
      part.box = b.box_through(p, owner, replicate | g);
      part.roots = b.box_through(p, owner, replicate | g | group);
    } else {
      part.box = b.box_through(p, owner, replicate | g);  // g: the pieces after this stage
      part.roots = part.box;
    }
    part.root = b.mesh().group_index(owner, group);
    auto it = std::find_if(parts.begin(), parts.end(), [&](const StagePart& x) {
      return x.box == part.box && x.roots == part.roots && x.root == part.root;
    });
    if (it == parts.end()) {
      part.params = {p};
      parts.push_back(std::move(part));
    } else {
      it->params.push_back(p);
    }
  }
  return parts;
}

std::string stage_label(const PlanBuilder& b, const std::vector<int>& params) {
  if (params.size() == 1) return b.param(params[0]).name;
  return std::to_string(params.size()) + " matrices from " + b.param(params[0]).name;
}

// Allocates `buffer` on `box` after `deps`; labelled "alloc <buffer name>" unless `label` says.
int emit_staging_alloc(PlanBuilder& b, int buffer, const RankBox& box, int stream,
                       std::vector<int> deps, std::string label = "") {
  Op alloc;
  alloc.kind = OpKind::alloc;
  alloc.stream = stream;
  alloc.ranks = box;
  alloc.buffer = buffer;
  alloc.deps = std::move(deps);
  alloc.label = label.empty() ? "alloc " + b.buffer_name(buffer) : std::move(label);
  return b.emit(std::move(alloc));
}

// The stage buffers of a staged gather or scatter, written once for both: each stage's collective
// reads the buffers the stage before wrote (each released once every matrix it holds has moved
// on) and, except the last stage, writes a new buffer for the next.
class StageChain {
 public:
  StageChain(PlanBuilder& b, int stream) : b_(b), stream_(stream) {}

  // One stage's `kind` collective of `part` over `group` (pieces gathered over `gathered`) after
  // `deps`; unless `last`, into a new stage buffer over `buffer_dims` held by `buffer_box`.
  // Returns the collective's op id.
  int emit(const StagePart& part, OpKind kind, DimSet group, DimSet gathered, std::vector<int> deps,
           bool last, const RankBox& buffer_box, DimSet buffer_dims) {
    const std::string what = stage_label(b_, part.params);
    int buffer = -1;
    if (!last) {
      buffer = b_.add_buffer("stage " + what, part.params, buffer_dims, false);
      deps.push_back(
          emit_staging_alloc(b_, buffer, buffer_box, stream_, deps, "alloc stage of " + what));
    }
    Op op;
    op.kind = kind;
    op.stream = stream_;
    op.ranks = part.box;
    op.group = group;
    op.root = part.root;
    op.params = part.params;
    op.gathered = gathered;
    op.deps = std::move(deps);
    op.label = std::string(kind == OpKind::gather ? "gather " : "scatter ") + what;
    const int id = b_.emit(std::move(op));
    std::vector<int> read;
    for (int p : part.params)
      if (holder_.count(p)) read.push_back(holder_[p]);
    std::sort(read.begin(), read.end());
    read.erase(std::unique(read.begin(), read.end()), read.end());
    for (int r : read) {
      Live& l = live_.at(r);
      l.users.push_back(id);
      for (int p : part.params)
        if (holder_.count(p) && holder_[p] == r) --l.left;
      if (l.left == 0) {
        Op release;
        release.kind = OpKind::release;
        release.stream = stream_;
        release.ranks = l.box;
        release.buffer = r;
        release.deps = l.users;
        release.label = "release stage of " + stage_label(b_, l.params);
        b_.emit(std::move(release));
        live_.erase(r);
      }
    }
    for (int p : part.params) holder_.erase(p);
    if (buffer >= 0) {
      live_[buffer] = {buffer_box, part.params, {}, static_cast<int>(part.params.size())};
      for (int p : part.params) holder_[p] = buffer;
    }
    return id;
  }

 private:
  struct Live {
    RankBox box;
    std::vector<int> params;
    std::vector<int> users;  // ops that read it; it goes after they complete
    int left = 0;
  };
  PlanBuilder& b_;
  int stream_;
  std::map<int, Live> live_;   // buffer -> what releases it
  std::map<int, int> holder_;  // param -> live stage buffer holding its piece
};

// With `split` dims (split Newton-Schulz), the stages over them are left out: the gather ends with
// every member of the split group holding its slice, gathered over the other sharding dims.
class StagedGather final : public GatherPolicy {
 public:
  StagedGather(std::string name, StageOrder order, DimSet split = {})
      : name_(std::move(name)), order_(order), split_(split) {}
  std::string name() const override { return name_; }

  std::vector<int> emit(PlanBuilder& b, std::span<const int> params, int stream,
                        std::vector<int> deps) const override {
    // The units of one schedule share their layouts' sharding dims, so every matrix has the same
    // stages; a matrix without them (nothing sharded) is already whole at its owner.
    std::vector<int> staged;
    for (int p : params)
      if (!gather_stages(b, p, order_, split_).empty()) staged.push_back(p);
    if (staged.empty()) return deps;
    const std::vector<DimSet> stages = gather_stages(b, staged[0], order_, split_);
    for (int p : staged)
      if (gather_stages(b, p, order_, split_) != stages)
        throw PlanError("internal: one gather of matrices with different sharding dims");
    std::map<int, DimSet> gathered;
    std::map<int, std::vector<int>> after;  // param -> ops whose completion it waits for
    for (int p : staged) {
      gathered[p] = DimSet{};
      after[p] = deps;
    }
    StageChain chain(b, stream);
    std::vector<int> done;
    for (std::size_t s = 0; s < stages.size(); ++s) {
      const DimSet group = stages[s];
      const bool last = s + 1 == stages.size();
      for (const StagePart& part : stage_parts(b, staged, gathered, group, true)) {
        std::vector<int> stage_deps;
        for (int p : part.params)
          stage_deps.insert(stage_deps.end(), after[p].begin(), after[p].end());
        // The final stage lands in the owners' full-update buffer.
        const DimSet from = gathered[part.params[0]];
        const int gather_id = chain.emit(part, OpKind::gather, group, from, std::move(stage_deps),
                                         last, part.roots, from | group);
        for (int p : part.params) {
          gathered[p] = gathered[p] | group;
          after[p] = {gather_id};
        }
        if (last) done.push_back(gather_id);
      }
    }
    return done;
  }

 private:
  std::string name_;
  StageOrder order_;
  DimSet split_;
};

// The reverse of StagedGather, then one broadcast of each piece along the replicate dims from the
// owner's replica.
class StagedRedistribute final : public RedistributePolicy {
 public:
  StagedRedistribute(std::string name, StageOrder order, DimSet split = {})
      : name_(std::move(name)), order_(order), split_(split) {}
  std::string name() const override { return name_; }

  std::vector<int> emit(PlanBuilder& b, std::span<const int> params, int stream,
                        std::vector<int> deps) const override {
    std::vector<int> done;
    std::vector<int> staged;
    for (int p : params)
      if (!gather_stages(b, p, order_, split_).empty()) staged.push_back(p);
    std::map<int, std::vector<int>> after;  // param -> its latest op
    for (int p : params) after[p] = deps;
    if (!staged.empty()) {
      std::vector<DimSet> stages = gather_stages(b, staged[0], order_, split_);
      std::reverse(stages.begin(), stages.end());
      std::map<int, DimSet> remaining;  // param -> dims its pieces are still gathered over
      for (int p : staged) remaining[p] = minus(b.param(p).layout.shard_dims(), split_);
      StageChain chain(b, stream);
      for (std::size_t s = 0; s < stages.size(); ++s) {
        const DimSet group = stages[s];
        const bool last = s + 1 == stages.size();
        std::map<int, DimSet> pieces;  // after this stage
        for (int p : staged) pieces[p] = DimSet{remaining[p].bits & ~group.bits};
        for (const StagePart& part : stage_parts(b, staged, pieces, group, false)) {
          std::vector<int> stage_deps;
          for (int p : part.params)
            stage_deps.insert(stage_deps.end(), after[p].begin(), after[p].end());
          // Intermediate roots hold the pieces still to be split further.
          const DimSet to = pieces[part.params[0]];
          const int scatter_id = chain.emit(part, OpKind::scatter, group, to, std::move(stage_deps),
                                            last, part.box, to);
          for (int p : part.params) {
            remaining[p] = pieces[p];
            after[p] = {scatter_id};
          }
        }
      }
    }
    // Broadcasts to the other replicas, one per group of matrices with the same box and root.
    std::vector<StagePart> casts;
    for (int p : params) {
      const DimSet replicate = b.param(p).layout.replicate_dims();
      if (replicate.empty()) {
        done.insert(done.end(), after[p].begin(), after[p].end());
        continue;
      }
      StagePart part;
      part.box = b.holders_box(p);
      part.root = b.mesh().group_index(b.owner(p), replicate);
      part.roots.coord.assign(1, static_cast<int>(replicate.bits));
      auto it = std::find_if(casts.begin(), casts.end(), [&](const StagePart& x) {
        return x.box == part.box && x.root == part.root && x.roots == part.roots;
      });
      if (it == casts.end()) {
        part.params = {p};
        casts.push_back(std::move(part));
      } else {
        it->params.push_back(p);
      }
    }
    for (const StagePart& part : casts) {
      Op op;
      op.kind = OpKind::broadcast;
      op.stream = stream;
      op.ranks = part.box;
      op.group = DimSet{static_cast<std::uint32_t>(part.roots.coord[0])};
      op.root = part.root;
      op.params = part.params;
      // The owner's replica: after the scatters; the others: after their own momentum (the
      // input deps), whose update the broadcast overwrites.
      for (int p : part.params) op.deps.insert(op.deps.end(), after[p].begin(), after[p].end());
      op.deps.insert(op.deps.end(), deps.begin(), deps.end());
      op.label = "broadcast " + stage_label(b, part.params);
      done.push_back(b.emit(std::move(op)));
    }
    std::sort(done.begin(), done.end());
    done.erase(std::unique(done.begin(), done.end()), done.end());
    return done;
  }

 private:
  std::string name_;
  StageOrder order_;
  DimSet split_;
};

// The stage order of a staged gather policy's name; false for other policies.
bool staged_order(const std::string& name, StageOrder& order) {
  if (name == "hierarchical")
    order = StageOrder::inner_first;
  else if (name == "rails")
    order = StageOrder::outer_first;
  else if (name == "flat")
    order = StageOrder::flat;
  else
    return false;
  return true;
}

// Alloc and release of an all_to_all staging buffer, emitted right next to their first and last
// user, on its stream and with its deps: zero-time ops that delay nothing, so timing is unchanged
// and rank_memory counts the staging.
void emit_staging_release(PlanBuilder& b, int buffer, const RankBox& box, int stream, int after) {
  Op release;
  release.kind = OpKind::release;
  release.stream = stream;
  release.ranks = box;
  release.buffer = buffer;
  release.deps = {after};
  release.label = "release " + b.buffer_name(buffer);
  b.emit(std::move(release));
}

// Motif/dion: the shards of a chunk of matrices travel to their owners in one all-to-all over
// the chunk's shard group (inside the owners' replica), packed into one send buffer; the owners
// unpack the received pieces into their full updates. Both staging buffers are plan buffers.
class AllToAllGather final : public GatherPolicy {
 public:
  std::string name() const override { return "all_to_all"; }
  std::vector<int> emit(PlanBuilder& b, std::span<const int> params, int stream,
                        std::vector<int> deps) const override {
    const int p0 = params[0];
    const auto& layout = b.param(p0).layout;
    if (layout.shard_dims().empty()) return deps;
    const RankBox box = b.box_through(p0, b.owner(p0), layout.replicate_dims());
    const int compute = b.stream("compute");
    const std::vector<int> ps(params.begin(), params.end());
    const std::string what = param_label(b, params);
    const int send = b.add_buffer("all_to_all send " + what, ps, DimSet{}, false);
    const int recv = b.add_buffer("all_to_all receive " + what, ps, layout.shard_dims(), true);
    std::vector<int> pack_deps = deps;
    pack_deps.push_back(emit_staging_alloc(b, send, box, compute, deps));
    Op pack;
    pack.kind = OpKind::pack;
    pack.stream = compute;
    pack.ranks = box;
    pack.params = ps;
    pack.buffer = send;
    pack.deps = pack_deps;
    pack.label = "pack " + what;
    const int pack_id = b.emit(std::move(pack));
    const int alloc_recv = emit_staging_alloc(b, recv, box, stream, {pack_id});
    Op a2a;
    a2a.kind = OpKind::all_to_all;
    a2a.stream = stream;
    a2a.ranks = box;
    a2a.group = layout.shard_dims();
    a2a.direction = AllToAllDirection::to_owners;
    a2a.params = ps;
    a2a.deps = {pack_id, alloc_recv};
    a2a.label = "all_to_all to owners: " + what;
    const int a2a_id = b.emit(std::move(a2a));
    emit_staging_release(b, send, box, stream, a2a_id);
    Op unpack;
    unpack.kind = OpKind::unpack;
    unpack.stream = compute;
    unpack.ranks = box;
    unpack.params = ps;
    unpack.gathered = layout.shard_dims();
    unpack.owned_only = true;
    unpack.buffer = recv;
    unpack.deps = {a2a_id};
    unpack.label = "unpack " + what;
    const int unpack_id = b.emit(std::move(unpack));
    emit_staging_release(b, recv, box, compute, unpack_id);
    return {unpack_id};
  }
};

class AllToAllRedistribute final : public RedistributePolicy {
 public:
  std::string name() const override { return "all_to_all"; }
  std::vector<int> emit(PlanBuilder& b, std::span<const int> params, int stream,
                        std::vector<int> deps) const override {
    const int p0 = params[0];
    const auto& layout = b.param(p0).layout;
    const int owner = b.owner(p0);
    const std::vector<int> ps(params.begin(), params.end());
    std::vector<int> last = deps;
    if (!layout.shard_dims().empty()) {
      const RankBox box = b.box_through(p0, owner, layout.replicate_dims());
      const int compute = b.stream("compute");
      const int send = b.add_buffer("all_to_all send results " + param_label(b, params), ps,
                                    layout.shard_dims(), true);
      std::vector<int> pack_deps = deps;
      pack_deps.push_back(emit_staging_alloc(b, send, box, compute, deps));
      Op pack;
      pack.kind = OpKind::pack;
      pack.stream = compute;
      pack.ranks = box;
      pack.params = ps;
      pack.gathered = layout.shard_dims();
      pack.owned_only = true;
      pack.buffer = send;
      pack.deps = pack_deps;
      pack.label = "pack results " + param_label(b, params);
      const int pack_id = b.emit(std::move(pack));
      Op a2a;
      a2a.kind = OpKind::all_to_all;
      a2a.stream = stream;
      a2a.ranks = box;
      a2a.group = layout.shard_dims();
      a2a.direction = AllToAllDirection::from_owners;
      a2a.params = ps;
      a2a.deps = {pack_id};
      a2a.label = "all_to_all from owners: " + param_label(b, params);
      last = {b.emit(std::move(a2a))};
      emit_staging_release(b, send, box, stream, last[0]);
    }
    if (!layout.replicate_dims().empty()) {
      Op op;
      op.kind = OpKind::broadcast;
      op.stream = stream;
      op.ranks = b.holders_box(p0);
      op.group = layout.replicate_dims();
      op.root = b.mesh().group_index(owner, layout.replicate_dims());
      op.params = ps;
      op.deps = last;  // as in StagedRedistribute: receivers after their own momentum too
      for (int d : deps)
        if (std::find(op.deps.begin(), op.deps.end(), d) == op.deps.end()) op.deps.push_back(d);
      op.label = "broadcast " + param_label(b, params);
      last = {b.emit(std::move(op))};
    }
    return last;
  }
};

// PyTorch full_tensor(): every holder all-gathers the whole update (over the shard dims).
class AllGatherEverywhere final : public GatherPolicy {
 public:
  std::string name() const override { return "all_gather"; }
  std::vector<int> emit(PlanBuilder& b, std::span<const int> params, int stream,
                        std::vector<int> deps) const override {
    std::vector<int> done;
    for (int p : params) {
      const auto& layout = b.param(p).layout;
      if (layout.shard_dims().empty()) continue;
      Op op;
      op.kind = OpKind::all_gather;
      op.stream = stream;
      op.ranks = b.holders_box(p);
      op.group = layout.shard_dims();
      op.params = {p};
      op.deps = deps;
      op.label = "all_gather " + b.param(p).name;
      done.push_back(b.emit(std::move(op)));
    }
    return done.empty() ? deps : done;
  }
};

// Nothing to gather: the owner holds the full momentum (DDP / ZeRO-1 layouts of owner_allgather).
class NoGather final : public GatherPolicy {
 public:
  std::string name() const override { return "none"; }
  std::vector<int> emit(PlanBuilder&, std::span<const int>, int,
                        std::vector<int> deps) const override {
    return deps;
  }
};

class NoRedistribute final : public RedistributePolicy {
 public:
  std::string name() const override { return "none"; }
  std::vector<int> emit(PlanBuilder&, std::span<const int>, int,
                        std::vector<int> deps) const override {
    return deps;
  }
};

// KellerJordan/Megatron: each owner contributes the full updates it computed; everyone ends
// with all of them.
class OwnedAllGather final : public RedistributePolicy {
 public:
  std::string name() const override { return "all_gather_owned"; }
  std::vector<int> emit(PlanBuilder& b, std::span<const int> params, int stream,
                        std::vector<int> deps) const override {
    const int p0 = params[0];
    const RankBox box = b.holders_box(p0);
    if (box.free_dims().empty()) return deps;
    Op op;
    op.kind = OpKind::all_gather;
    op.stream = stream;
    op.ranks = box;
    op.group = box.free_dims();
    op.owned_only = true;
    op.params.assign(params.begin(), params.end());
    op.deps = deps;
    op.label = "all_gather results " + param_label(b, params);
    return {b.emit(std::move(op))};
  }
};

std::map<std::string, GatherPolicyFactory>& gather_registry() {
  static std::map<std::string, GatherPolicyFactory> r = {
      {"hierarchical",
       [] {
         return std::unique_ptr<GatherPolicy>(
             new StagedGather("hierarchical", StageOrder::inner_first));
       }},
      {"rails",
       [] {
         return std::unique_ptr<GatherPolicy>(new StagedGather("rails", StageOrder::outer_first));
       }},
      {"flat",
       [] { return std::unique_ptr<GatherPolicy>(new StagedGather("flat", StageOrder::flat)); }},
      {"all_to_all", [] { return std::unique_ptr<GatherPolicy>(new AllToAllGather()); }},
      {"all_gather", [] { return std::unique_ptr<GatherPolicy>(new AllGatherEverywhere()); }},
      {"none", [] { return std::unique_ptr<GatherPolicy>(new NoGather()); }},
  };
  return r;
}

std::map<std::string, RedistributePolicyFactory>& redistribute_registry() {
  static std::map<std::string, RedistributePolicyFactory> r = {
      {"hierarchical",
       [] {
         return std::unique_ptr<RedistributePolicy>(
             new StagedRedistribute("hierarchical", StageOrder::inner_first));
       }},
      {"rails",
       [] {
         return std::unique_ptr<RedistributePolicy>(
             new StagedRedistribute("rails", StageOrder::outer_first));
       }},
      {"flat",
       [] {
         return std::unique_ptr<RedistributePolicy>(
             new StagedRedistribute("flat", StageOrder::flat));
       }},
      {"all_to_all",
       [] { return std::unique_ptr<RedistributePolicy>(new AllToAllRedistribute()); }},
      {"all_gather_owned",
       [] { return std::unique_ptr<RedistributePolicy>(new OwnedAllGather()); }},
      {"none", [] { return std::unique_ptr<RedistributePolicy>(new NoRedistribute()); }},
  };
  return r;
}

template <typename Map>
std::string known_names(const Map& map) {
  std::string s;
  for (const auto& [name, f] : map) s += (s.empty() ? "" : ", ") + name;
  return s;
}

}  // namespace

std::unique_ptr<GatherPolicy> make_gather_policy(const std::string& name) {
  const auto it = gather_registry().find(name);
  if (it == gather_registry().end())
    throw PlanError("unknown gather policy '" + name +
                    "'; known: " + known_names(gather_registry()));
  return it->second();
}

std::unique_ptr<RedistributePolicy> make_redistribute_policy(const std::string& name) {
  const auto it = redistribute_registry().find(name);
  if (it == redistribute_registry().end())
    throw PlanError("unknown redistribute policy '" + name +
                    "'; known: " + known_names(redistribute_registry()));
  return it->second();
}

void register_gather_policy(const std::string& name, GatherPolicyFactory factory) {
  gather_registry()[name] = factory;
}
void register_redistribute_policy(const std::string& name, RedistributePolicyFactory factory) {
  redistribute_registry()[name] = factory;
}

std::vector<std::string> strategy_names() {
  return {"sequential", "replicated", "owner", "all_to_all", "owner_allgather"};
}

namespace {

// Option -> the strategies that read it (see strategy_reads_option; traced through build_plan,
// compose, make_units and the Scheduler, and checked plan by plan).
const std::vector<std::pair<std::string_view, std::vector<std::string_view>>>& option_readers() {
  static const std::vector<std::pair<std::string_view, std::vector<std::string_view>>> table = {
      {"name", {"sequential", "replicated", "owner", "all_to_all", "owner_allgather"}},
      {"preset", {"sequential", "replicated", "owner", "all_to_all", "owner_allgather"}},
      {"grad_sync", {"sequential", "replicated", "owner", "all_to_all", "owner_allgather"}},
      {"assign", {"sequential", "owner", "all_to_all", "owner_allgather"}},
      {"explicit_owners", {"sequential", "owner", "all_to_all", "owner_allgather"}},
      {"small_param_threshold", {"sequential", "owner", "all_to_all", "owner_allgather"}},
      {"async_gpu_parallelism", {"owner"}},
      {"prefetch_count", {"replicated", "owner", "owner_allgather"}},
      {"gather", {"sequential", "owner"}},
      {"split_ns", {"sequential", "owner"}},
      {"comm_lanes", {"replicated", "owner", "all_to_all", "owner_allgather"}},
      {"order", {"sequential", "owner", "all_to_all", "owner_allgather"}},
      {"chunk_size", {"all_to_all", "owner_allgather"}},
      {"chunk_by_shape", {"all_to_all", "owner_allgather"}},
      {"chunk_sizing", {"all_to_all", "owner_allgather"}},
      {"max_chunks_in_flight", {"all_to_all"}},
  };
  return table;
}

}  // namespace

bool strategy_reads_option(const StrategyOptions& s, std::string_view option) {
  if (option == "chunk_size" && s.chunk_sizing == "ns_cost") return false;
  // The small matrices' replicated pipeline reads these whatever the strategy.
  if (s.small_param_threshold > 0 &&
      (option == "prefetch_count" || option == "comm_lanes" || option == "order"))
    return true;
  for (const auto& [key, readers] : option_readers())
    if (key == option) return std::find(readers.begin(), readers.end(), s.name) != readers.end();
  return true;  // an option this table does not know is not refused here
}

std::string strategies_reading_option(std::string_view option) {
  for (const auto& [key, readers] : option_readers())
    if (key == option) {
      std::string out;
      for (const std::string_view r : readers) out += (out.empty() ? "" : ", ") + std::string(r);
      return out;
    }
  return "every strategy";
}

bool strategy_option_is_default(const StrategyOptions& s, std::string_view option) {
  const StrategyOptions d;
  if (option == "assign") return s.assign == d.assign;
  if (option == "explicit_owners") return s.explicit_owners.empty();
  if (option == "async_gpu_parallelism") return s.async_gpu_parallelism == d.async_gpu_parallelism;
  if (option == "prefetch_count") return s.prefetch_count == d.prefetch_count;
  if (option == "gather") return s.gather == d.gather;
  if (option == "chunk_size") return s.chunk_size == d.chunk_size;
  if (option == "max_chunks_in_flight") return s.max_chunks_in_flight == d.max_chunks_in_flight;
  if (option == "small_param_threshold") return s.small_param_threshold == d.small_param_threshold;
  if (option == "comm_lanes") return s.comm_lanes == d.comm_lanes;
  if (option == "order") return s.order == d.order;
  if (option == "chunk_by_shape") return s.chunk_by_shape == d.chunk_by_shape;
  if (option == "chunk_sizing") return s.chunk_sizing == d.chunk_sizing;
  if (option == "split_ns") return !s.split_ns.enabled;
  if (option == "grad_sync") return !s.grad_sync.enabled;
  return false;  // name, preset: always a setting
}

void reset_unread_options(StrategyOptions& s) {
  std::vector<std::string_view> unread;
  for (const auto& [key, readers] : option_readers())
    if (!strategy_reads_option(s, key)) unread.push_back(key);
  const StrategyOptions d;
  for (const std::string_view key : unread) {
    if (key == "assign") s.assign = d.assign;
    if (key == "explicit_owners") s.explicit_owners.clear();
    if (key == "async_gpu_parallelism") s.async_gpu_parallelism = d.async_gpu_parallelism;
    if (key == "prefetch_count") s.prefetch_count = d.prefetch_count;
    if (key == "gather") s.gather = d.gather;
    if (key == "chunk_size") s.chunk_size = d.chunk_size;
    if (key == "max_chunks_in_flight") s.max_chunks_in_flight = d.max_chunks_in_flight;
    if (key == "small_param_threshold") s.small_param_threshold = d.small_param_threshold;
    if (key == "comm_lanes") s.comm_lanes = d.comm_lanes;
    if (key == "order") s.order = d.order;
    if (key == "chunk_by_shape") s.chunk_by_shape = d.chunk_by_shape;
    if (key == "chunk_sizing") s.chunk_sizing = d.chunk_sizing;
    if (key == "split_ns") s.split_ns = d.split_ns;
  }
}

std::string StrategyOptions::to_json_text() const {
  nlohmann::ordered_json j;
  j["name"] = name;
  j["assign"] = assign;
  if (!explicit_owners.empty()) j["explicit_owners"] = explicit_owners;
  j["async_gpu_parallelism"] = async_gpu_parallelism;
  j["prefetch_count"] = prefetch_count;
  j["gather"] = gather;
  j["chunk_size"] = chunk_size;
  j["max_chunks_in_flight"] = max_chunks_in_flight;
  j["small_param_threshold"] = small_param_threshold;
  // Written only when set, so plans of earlier versions keep their text.
  if (comm_lanes != 1) j["comm_lanes"] = comm_lanes;
  if (order != "plan") j["order"] = order;
  if (chunk_by_shape) j["chunk_by_shape"] = true;
  if (chunk_sizing != "count") j["chunk_sizing"] = chunk_sizing;
  if (split_ns.enabled)
    j["split_ns"] = {{"max_members", split_ns.max_members}, {"threshold", split_ns.threshold}};
  if (!preset.empty()) j["preset"] = preset;
  j["grad_sync"] = {{"enabled", grad_sync.enabled}, {"level_periods", grad_sync.level_periods}};
  return j.dump();
}

// ---------------------------------------------------------------------------------------------
// The schedule

namespace {

enum class NsPlacement { owner, owners_of_chunk, every_holder };

struct Composition {
  std::unique_ptr<GatherPolicy> gather;
  std::unique_ptr<RedistributePolicy> redistribute;
  NsPlacement ns = NsPlacement::owner;
  bool chunked = false;                        // units are chunks of same-group matrices
  bool lane_per_owner = true;                  // otherwise one lane per group
  bool barrier_per_unit = false;               // sequential
  bool barrier_per_lane = false;               // owner without async_gpu_parallelism
  int depth = 0;                               // rounds of lookahead (prefetch)
  int lanes = 1;                               // communication lanes (StrategyOptions::comm_lanes)
  StageOrder order = StageOrder::inner_first;  // of split units' gathers (a staged gather)
};

struct Unit {
  std::vector<int> params;
  std::vector<int> lane_key;
  DimSet split;  // non-empty: one matrix whose NS is split over these dims (SplitNsOptions)
};

class Scheduler {
 public:
  Scheduler(PlanBuilder& b, const Composition& c, int ns_steps)
      : b_(b), c_(c), ns_steps_(ns_steps) {
    compute_ = b_.stream("compute");
    // Lane 0 keeps the seeds' stream names; lane k > 0 adds "comm.k" and "comm_scatter.k".
    for (int k = 0; k < std::max(1, c_.lanes); ++k) {
      const std::string suffix = k == 0 ? "" : "." + std::to_string(k);
      gather_streams_.push_back(b_.stream("comm" + suffix));
      scatter_streams_.push_back(c_.depth > 0 ? b_.stream("comm_scatter" + suffix)
                                              : gather_streams_.back());
    }
    gather_stream_ = gather_streams_[0];
  }

  // Runs the pipeline over `units` (grouped into lanes by lane_key, in first-seen order).
  // Returns the op ids after which every update of these units is in place.
  std::vector<int> run(const std::vector<Unit>& units, const std::vector<int>& start_deps) {
    start_deps_ = start_deps;
    classify_ranks(units);
    std::vector<std::vector<int>> lanes_order;
    std::map<std::vector<int>, std::vector<const Unit*>> lanes;
    for (const auto& u : units) {
      if (!lanes.count(u.lane_key)) {
        // Lanes (owners) take the communication lanes in turn, in the order they first appear.
        lane_stream_[u.lane_key] = static_cast<int>(lanes_order.size()) % gather_streams_.size();
        lanes_order.push_back(u.lane_key);
      }
      lanes[u.lane_key].push_back(&u);
    }
    std::vector<int> finished;
    std::vector<int> deps = start_deps;
    if (c_.barrier_per_lane || c_.barrier_per_unit) {
      // One block at a time, each closed by a barrier; prefetch stays inside a block.
      for (const auto& key : lanes_order) {
        if (c_.barrier_per_unit) {
          for (const Unit* u : lanes[key]) {
            auto done = pipeline({{u}}, deps);
            deps = {barrier(done)};
            finished.push_back(deps.back());
          }
        } else {
          std::vector<std::vector<const Unit*>> rounds;
          for (const Unit* u : lanes[key]) rounds.push_back({u});
          auto done = pipeline(rounds, deps);
          deps = {barrier(done)};
          finished.push_back(deps.back());
        }
      }
      return finished;
    }
    std::vector<std::vector<const Unit*>> rounds;
    for (const auto& key : lanes_order) {
      const auto& lane = lanes[key];
      for (std::size_t j = 0; j < lane.size(); ++j) {
        if (rounds.size() <= j) rounds.emplace_back();
        rounds[j].push_back(lane[j]);
      }
    }
    return pipeline(rounds, deps);
  }

 private:
  struct InFlight {
    const Unit* unit = nullptr;
    int buffer = -1;
    RankBox buffer_box;
    std::vector<int> gathered;  // completion of the gather
  };

  int barrier(const std::vector<int>& deps) {
    Op op;
    op.kind = OpKind::barrier;
    op.stream = gather_stream_;
    op.ranks = RankBox::everyone(b_.mesh());
    op.group = DimSet::all(b_.mesh().ndims());
    op.deps = deps;
    op.label = "barrier";
    return b_.emit(std::move(op));
  }

  // Where a unit's full updates live while it is processed.
  RankBox result_box(const Unit& u) const {
    const int p0 = u.params[0];
    if (!u.split.empty())  // the split group of the owner: its slices gathered over the rest
      return b_.box_through(p0, b_.owner(p0),
                            b_.param(p0).layout.replicate_dims() | split_gathered(u));
    switch (c_.ns) {
      case NsPlacement::owner:
        return RankBox::single(b_.mesh(), b_.owner(p0));
      case NsPlacement::owners_of_chunk:
        return c_.gather->name() == "none"
                   ? b_.holders_box(p0)
                   : b_.box_through(p0, b_.owner(p0), b_.param(p0).layout.replicate_dims());
      case NsPlacement::every_holder:
        return b_.holders_box(p0);
    }
    return b_.holders_box(p0);
  }

  InFlight start_gather(const Unit& u, std::vector<int> deps) {
    InFlight f;
    f.unit = &u;
    f.buffer_box = result_box(u);
    // The buffer holds what the ranks of the box end up with: the full updates of the matrices
    // they orthogonalize, or every matrix of the unit when every holder gets them all (replicated
    // NS, or results all-gathered from their owners).
    const bool owned_only =
        c_.ns != NsPlacement::every_holder && c_.redistribute->name() != "all_gather_owned";
    if (u.split.empty())
      f.buffer = b_.add_buffer("full updates " + param_label(b_, u.params), u.params,
                               DimSet::all(b_.mesh().ndims()), owned_only);
    else  // every member holds its slice
      f.buffer = b_.add_buffer("split slices " + param_label(b_, u.params), u.params,
                               split_gathered(u), false);
    // Each class of ranks inside the box waits for the release of its own unit `depth`+1 back:
    // the unit at position k of the class (in the order its units start, which is the order they
    // finish) waits for the release of unit k - depth - 1, so at most depth + 1 units of a class
    // are ever live at once, whenever the engine runs the gathers. (Gating on the class's latest
    // releases instead lets unit k start after unit k - depth - 2 only: depth + 2 live units.)
    // pipeline() starts a unit only when its classes have at most `depth` units in flight, so
    // that release has already been emitted.
    for (int cls : classes_in(f.buffer_box)) {
      const int position = started_[cls]++;
      if (position > c_.depth) deps.push_back(releases_.at(cls).at(position - c_.depth - 1));
    }
    Op alloc;
    alloc.kind = OpKind::alloc;
    alloc.stream = gather_streams_[lane_stream_.at(u.lane_key)];
    alloc.ranks = f.buffer_box;
    alloc.buffer = f.buffer;
    alloc.deps = deps;
    alloc.label = "alloc full updates " + param_label(b_, u.params);
    const int alloc_id = b_.emit(std::move(alloc));
    deps.push_back(alloc_id);
    const int stream = gather_streams_[lane_stream_.at(u.lane_key)];
    if (u.split.empty())
      f.gathered = c_.gather->emit(b_, u.params, stream, deps);
    else
      f.gathered =
          StagedGather(c_.gather->name(), c_.order, u.split).emit(b_, u.params, stream, deps);
    return f;
  }

  // The dims a split unit's slices are gathered over: its sharding dims outside the split group.
  DimSet split_gathered(const Unit& u) const {
    return minus(b_.param(u.params[0]).layout.shard_dims(), u.split);
  }

  std::vector<int> orthogonalize(const InFlight& f) {
    const Unit& u = *f.unit;
    std::vector<int> ids;
    if (!u.split.empty()) {
      Op op;
      op.kind = OpKind::split_newton_schulz;
      op.stream = compute_;
      op.ranks = result_box(u);
      op.group = u.split;
      op.params = u.params;
      op.gathered = split_gathered(u);
      op.ns_steps = ns_steps_;
      op.deps = f.gathered;
      op.label = "split NS " + b_.param(u.params[0]).name;
      return {b_.emit(std::move(op))};
    }
    if (c_.ns == NsPlacement::owner) {
      for (int p : u.params) {
        Op op;
        op.kind = OpKind::newton_schulz;
        op.stream = compute_;
        op.ranks = RankBox::single(b_.mesh(), b_.owner(p));
        op.params = {p};
        op.ns_steps = ns_steps_;
        op.deps = f.gathered;
        op.label = "NS " + b_.param(p).name;
        ids.push_back(b_.emit(std::move(op)));
      }
      return ids;
    }
    Op op;
    op.kind = OpKind::newton_schulz;
    op.stream = compute_;
    op.ranks = result_box(u);
    op.params = u.params;
    op.owned_only = c_.ns == NsPlacement::owners_of_chunk;
    op.ns_steps = ns_steps_;
    op.deps = f.gathered;
    op.label = "NS " + param_label(b_, u.params);
    return {b_.emit(std::move(op))};
  }

  // Redistribution also waits for what the step started after (the momentum op): a replica that
  // receives the result by broadcast gathered nothing, so nothing else orders its momentum (which
  // wrote the update where the result lands) before the broadcast writes there.
  std::vector<int> finish_unit(const InFlight& f, const std::vector<int>& ns_ids) {
    const int scatter_stream = scatter_streams_[lane_stream_.at(f.unit->lane_key)];
    std::vector<int> deps = ns_ids;
    deps.insert(deps.end(), start_deps_.begin(), start_deps_.end());
    auto done = f.unit->split.empty()
                    ? c_.redistribute->emit(b_, f.unit->params, scatter_stream, deps)
                    : StagedRedistribute(c_.redistribute->name(), c_.order, f.unit->split)
                          .emit(b_, f.unit->params, scatter_stream, deps);
    Op release;
    release.kind = OpKind::release;
    release.stream = scatter_stream;
    release.ranks = f.buffer_box;
    release.buffer = f.buffer;
    release.deps = done;
    release.label = "release full updates " + param_label(b_, f.unit->params);
    const int release_id = b_.emit(std::move(release));
    for (int cls : classes_in(f.buffer_box)) releases_[cls].push_back(release_id);
    done.push_back(release_id);
    return done;
  }

  // Emits units in round order. A unit's gathers are emitted as early as its classes allow
  // (at most depth+1 units of a class in flight), so prefetching is counted per rank class,
  // and every gate it waits for has already been emitted.
  std::vector<int> pipeline(const std::vector<std::vector<const Unit*>>& rounds,
                            const std::vector<int>& deps) {
    std::vector<const Unit*> order;
    for (const auto& round : rounds) order.insert(order.end(), round.begin(), round.end());
    std::vector<InFlight> started;
    started.reserve(order.size());
    std::map<int, int> in_flight;  // class -> units started and not yet released
    auto can_start = [&](const Unit& u) {
      for (int cls : classes_in(result_box(u)))
        if (in_flight[cls] > c_.depth) return false;
      return true;
    };
    auto start_more = [&] {
      while (started.size() < order.size() && can_start(*order[started.size()])) {
        const Unit& u = *order[started.size()];
        for (int cls : classes_in(result_box(u))) ++in_flight[cls];
        started.push_back(start_gather(u, deps));
      }
    };
    std::vector<int> finished;
    for (std::size_t i = 0; i < order.size(); ++i) {
      start_more();
      if (i >= started.size()) throw PlanError("internal: pipeline cannot start a unit");
      const auto ns = orthogonalize(started[i]);
      auto done = finish_unit(started[i], ns);
      for (int cls : classes_in(started[i].buffer_box)) --in_flight[cls];
      finished.insert(finished.end(), done.begin(), done.end());
    }
    return finished;
  }

  // Ranks that lie in exactly the same result boxes form a class; a deps list can then gate
  // every class separately (deps apply only on ranks that take part in them), which bounds the
  // transient memory of each rank even when it holds matrices of several lanes (EP: dense and
  // expert matrices).
  void classify_ranks(const std::vector<Unit>& units) {
    boxes_.clear();
    for (const auto& u : units) {
      const RankBox box = result_box(u);
      if (std::find(boxes_.begin(), boxes_.end(), box) == boxes_.end()) boxes_.push_back(box);
    }
    std::vector<std::vector<int>> signature(b_.mesh().world_size());
    for (int i = 0; i < static_cast<int>(boxes_.size()); ++i)
      for (int r : boxes_[i].ranks(b_.mesh())) signature[r].push_back(i);
    std::map<std::vector<int>, int> ids;
    class_of_rank_.assign(signature.size(), -1);
    classes_of_box_.assign(boxes_.size(), {});
    for (int r = 0; r < static_cast<int>(signature.size()); ++r) {
      if (signature[r].empty()) continue;
      const auto [it, added] = ids.emplace(signature[r], static_cast<int>(ids.size()));
      class_of_rank_[r] = it->second;
      if (added)
        for (int box : signature[r]) classes_of_box_[box].push_back(it->second);
    }
  }

  const std::vector<int>& classes_in(const RankBox& box) const {
    const auto it = std::find(boxes_.begin(), boxes_.end(), box);
    return classes_of_box_.at(it - boxes_.begin());
  }

  std::vector<int> start_deps_;  // what run() started after (the momentum op)
  PlanBuilder& b_;
  const Composition& c_;
  int ns_steps_;
  int compute_ = 0, gather_stream_ = 0;
  std::vector<int> gather_streams_, scatter_streams_;  // per communication lane
  std::map<std::vector<int>, int> lane_stream_;        // lane key -> communication lane
  std::vector<RankBox> boxes_;
  std::vector<int> class_of_rank_;
  std::vector<std::vector<int>> classes_of_box_;
  std::map<int, std::vector<int>> releases_;  // class -> release ops of its units, in order
  std::map<int, int> started_;                // class -> units started so far
};

// The group a matrix's collectives run in: independent coords, shard and replicate dims.
std::vector<int> group_key(const PlanBuilder& b, int p) {
  const auto& layout = b.param(p).layout;
  std::vector<int> key = b.holders_box(p).coord;
  key.push_back(static_cast<int>(layout.shard_dims().bits));
  key.push_back(static_cast<int>(layout.replicate_dims().bits));
  return key;
}

std::vector<Unit> make_units(const PlanBuilder& b, std::vector<int> params, const Composition& c,
                             int chunk_size, bool lpt, bool chunk_by_shape, bool ns_cost_chunks,
                             const std::map<int, DimSet>& split = {}) {
  std::vector<Unit> units;
  const auto flops = [&](int p) {
    const auto& dp = b.param(p);
    return newton_schulz_flops(dp.rows(), dp.cols(), 1, dp.batch());
  };
  if (lpt) {  // largest Newton-Schulz first (stable: equal matrices keep parameter order)
    std::stable_sort(params.begin(), params.end(),
                     [&](int x, int y) { return flops(x) > flops(y); });
  }
  if (!c.chunked) {
    for (int p : params) {
      Unit u;
      u.params = {p};
      if (const auto it = split.find(p); it != split.end()) u.split = it->second;
      if (c.barrier_per_unit) {
        u.lane_key = {0};
      } else if (c.ns == NsPlacement::every_holder) {
        u.lane_key = group_key(b, p);
      } else {
        u.lane_key = {b.owner(p)};
      }
      units.push_back(std::move(u));
    }
    return units;
  }
  // Chunks: same group, and for all_to_all the owners in the same replica.
  std::map<std::vector<int>, std::vector<int>> groups;
  std::vector<std::vector<int>> order;
  for (int p : params) {
    auto key = group_key(b, p);
    if (chunk_by_shape) key.insert(key.end(), b.param(p).shape.begin(), b.param(p).shape.end());
    if (c.gather->name() != "none") {
      const auto& layout = b.param(p).layout;
      for (int d = 0; d < b.mesh().ndims(); ++d)
        if (layout.replicate_dims().contains(d)) key.push_back(b.mesh().coord(b.owner(p), d));
    }
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(p);
  }
  for (const auto& key : order) {
    const auto& ps = groups[key];
    if (!ns_cost_chunks) {
      for (std::size_t i = 0; i < ps.size(); i += chunk_size) {
        Unit u;
        u.params.assign(ps.begin() + i, ps.begin() + std::min(ps.size(), i + chunk_size));
        u.lane_key = key;
        units.push_back(std::move(u));
      }
      continue;
    }
    // Rounds: chunk k holds every owner's k-th largest matrix, so each chunk keeps every owner
    // of the group computing and lasts about as long as its largest NS (with order lpt the
    // rounds shrink: the next, smaller exchange hides behind the current round's NS).
    std::map<int, std::vector<int>> by_owner;
    std::vector<int> owners;
    for (int p : ps) {
      if (!by_owner.count(b.owner(p))) owners.push_back(b.owner(p));
      by_owner[b.owner(p)].push_back(p);
    }
    for (auto& [owner, mine] : by_owner)
      std::stable_sort(mine.begin(), mine.end(), [&](int x, int y) { return flops(x) > flops(y); });
    for (std::size_t round = 0;; ++round) {
      Unit u;
      for (int owner : owners)
        if (round < by_owner[owner].size()) u.params.push_back(by_owner[owner][round]);
      if (u.params.empty()) break;
      u.lane_key = key;
      units.push_back(std::move(u));
    }
  }
  return units;
}

Composition compose(const StrategyOptions& o) {
  Composition c;
  c.depth = o.prefetch_count;
  c.lanes = o.comm_lanes;
  if (o.name == "sequential") {
    c.gather = make_gather_policy(o.gather);
    c.redistribute = make_redistribute_policy(o.gather);
    c.barrier_per_unit = true;
    c.depth = 0;
    staged_order(o.gather, c.order);
  } else if (o.name == "replicated") {
    c.gather = make_gather_policy("all_gather");
    c.redistribute = make_redistribute_policy("none");
    c.ns = NsPlacement::every_holder;
  } else if (o.name == "owner") {
    c.gather = make_gather_policy(o.gather);
    c.redistribute = make_redistribute_policy(o.gather);
    c.barrier_per_lane = !o.async_gpu_parallelism;
    staged_order(o.gather, c.order);
  } else if (o.name == "all_to_all") {
    c.gather = make_gather_policy("all_to_all");
    c.redistribute = make_redistribute_policy("all_to_all");
    c.ns = NsPlacement::owners_of_chunk;
    c.chunked = true;
    c.depth = o.max_chunks_in_flight - 1;
  } else if (o.name == "owner_allgather") {
    c.gather = make_gather_policy("none");
    c.redistribute = make_redistribute_policy("all_gather_owned");
    c.ns = NsPlacement::owners_of_chunk;
    c.chunked = true;
  } else {
    std::string known;
    for (const auto& n : strategy_names()) known += (known.empty() ? "" : ", ") + n;
    throw PlanError("unknown strategy '" + o.name + "'; known strategies: " + known);
  }
  return c;
}

void check_options(const StrategyOptions& o) {
  if (o.prefetch_count < 0)
    throw PlanError("strategy.prefetch_count must be >= 0 (0 disables prefetching)");
  if (o.chunk_size < 1) throw PlanError("strategy.chunk_size must be >= 1");
  if (o.max_chunks_in_flight < 1) throw PlanError("strategy.max_chunks_in_flight must be >= 1");
  if (o.chunk_sizing != "count" && o.chunk_sizing != "ns_cost")
    throw PlanError("strategy.chunk_sizing '" + o.chunk_sizing + "': use count or ns_cost");
  if (o.small_param_threshold < 0) throw PlanError("strategy.small_param_threshold must be >= 0");
  if (o.comm_lanes < 1) throw PlanError("strategy.comm_lanes must be >= 1 (1: one comm stream)");
  if (o.order != "plan" && o.order != "lpt")
    throw PlanError("unknown strategy.order '" + o.order + "'; use plan or lpt");
  if (o.split_ns.enabled) {
    StageOrder order;
    if (o.name != "owner" && o.name != "sequential")
      throw PlanError(
          "strategy.split_ns needs a strategy whose owners gather matrices in stages "
          "(owner or sequential), not '" +
          o.name + "'; fix: set strategy.name: owner, or remove split_ns");
    if (!staged_order(o.gather, order))
      throw PlanError(
          "strategy.split_ns needs a staged gather (hierarchical, rails or flat), not '" +
          o.gather + "'; fix: set strategy.gather, or remove split_ns");
    if (o.split_ns.max_members < 2)
      throw PlanError("strategy.split_ns.max_members must be >= 2 (a group splits a matrix)");
    if (!(o.split_ns.threshold >= 0))
      throw PlanError("strategy.split_ns.threshold must be >= 0 (0: split every matrix it can)");
  }
  if (o.grad_sync.level_periods.empty())
    throw PlanError("strategy.grad_sync.level_periods needs at least one period (e.g. [1])");
  for (int period : o.grad_sync.level_periods)
    if (period < 1) throw PlanError("strategy.grad_sync.level_periods must all be >= 1");
}

// Seed 002's level-scheduled synchronization, bucketed per level and group. FSDP-style layouts
// reduce-scatter over their shard dims, then all-reduce over replicate dims; owner_allgather
// keeps full gradients (ZeRO-1), so it all-reduces over every dim.
std::vector<int> emit_grad_sync(PlanBuilder& b, const StrategyOptions& o) {
  const auto& periods = o.grad_sync.level_periods;
  const int levels = static_cast<int>(periods.size());
  int num_layers = 0;
  for (const auto& dp : b.model().params) num_layers = std::max(num_layers, dp.layer + 1);
  const int stream = b.stream("comm");
  const bool full_gradients = o.name == "owner_allgather";
  std::map<std::pair<int, std::vector<int>>, std::vector<int>> buckets;
  std::vector<std::pair<int, std::vector<int>>> order;
  for (const auto& dp : b.model().params) {
    const int level =
        dp.layer < 0 || num_layers == 0 ? 0 : static_cast<int>((dp.layer * levels) / num_layers);
    auto key = std::make_pair(level, group_key(b, dp.index));
    if (!buckets.count(key)) order.push_back(key);
    buckets[key].push_back(dp.index);
  }
  std::vector<int> done;
  for (const auto& key : order) {
    const auto& ps = buckets[key];
    const auto& layout = b.param(ps[0]).layout;
    const int period = periods[key.first];
    const std::string what = "level " + std::to_string(key.first) + " gradients (" +
                             std::to_string(ps.size()) + " params from " + b.param(ps[0]).name +
                             ")";
    std::vector<int> last;
    if (full_gradients || layout.shard_dims().empty()) {
      const DimSet group = layout.shard_dims() | layout.replicate_dims();
      if (group.empty()) continue;
      Op op;
      op.kind = OpKind::all_reduce;
      op.stream = stream;
      op.ranks = b.holders_box(ps[0]);
      op.group = group;
      op.params = ps;
      op.gathered = layout.shard_dims();
      op.period = period;
      op.label = "all_reduce " + what;
      done.push_back(b.emit(std::move(op)));
      continue;
    }
    Op rs;
    rs.kind = OpKind::reduce_scatter;
    rs.stream = stream;
    rs.ranks = b.holders_box(ps[0]);
    rs.group = layout.shard_dims();
    rs.params = ps;
    rs.period = period;
    rs.label = "reduce_scatter " + what;
    int id = b.emit(std::move(rs));
    if (!layout.replicate_dims().empty()) {
      Op ar;
      ar.kind = OpKind::all_reduce;
      ar.stream = stream;
      ar.ranks = b.holders_box(ps[0]);
      ar.group = layout.replicate_dims();
      ar.params = ps;
      ar.period = period;
      ar.deps = {id};
      ar.label = "all_reduce " + what;
      id = b.emit(std::move(ar));
    }
    done.push_back(id);
  }
  return done;
}

// SplitNsOptions: the split group of each matrix that splits. The per-rank share is the NS work
// of every Muon matrix on one GPU over the ranks that hold Muon matrices (what a perfect balance
// gives each); a matrix above threshold x share splits over the smallest candidate group whose
// member's part (core/plan/split_ns.hpp's FLOPs: 4 g^2 |S_r| + 2 g^3 per step, the largest
// member's) is within the share, else over the candidate with the smallest part. Candidates: the
// inner-first prefixes of the matrix's sharding dims, of 2 .. max_members ranks, that
// split_ns_problem accepts at the owner.
//
// A split matrix occupies every member of its group, which the assign policy (one matrix, one
// owner) did not plan for, so unless the owners are explicit its group is placed again: largest
// member part first, on the group instance (the owner's choice of coordinates outside the split
// dims) whose busiest member has the least NS work so far, counting the other matrices at their
// assigned owners (LPT over groups). The owner becomes that instance's first member holding a
// piece.
std::map<int, DimSet> choose_split_groups(const ShardedModel& model, Assignment& assignment,
                                          const std::vector<int>& params, const SplitNsOptions& o,
                                          int steps, bool place) {
  std::map<int, DimSet> groups;
  if (!o.enabled || params.empty()) return groups;
  const DeviceMesh& mesh = model.mesh;
  auto work = [&](int p) {
    const auto& dp = model.params.at(p);
    return newton_schulz_flops(dp.rows(), dp.cols(), steps, dp.batch());
  };
  auto holders = [&](int p) {
    RankBox box = RankBox::everyone(mesh);
    const auto& layout = model.params.at(p).layout;
    for (int d = 0; d < mesh.ndims(); ++d)
      if (layout.independent_dims().contains(d)) box.coord[d] = layout.placements()[d].coord;
    return box.ranks(mesh);
  };
  double total = 0;
  std::vector<char> holds(static_cast<std::size_t>(mesh.world_size()), 0);
  for (int p : model.muon_params()) {
    total += work(p);
    for (int r : holders(p)) holds[r] = 1;
  }
  const double share =
      total / std::max<double>(1, static_cast<double>(std::count(holds.begin(), holds.end(), 1)));
  std::map<int, double> part_of;  // split param -> its largest member's FLOPs
  for (int p : params) {
    const auto& dp = model.params.at(p);
    if (dp.shape.size() != 2 || !(work(p) > o.threshold * share)) continue;
    const int owner = assignment.owner.at(p);
    const DimSet shard = dp.layout.shard_dims();
    DimSet group, best;
    double best_part = work(p);
    for (int d : shard_dims_inner_first(mesh, dp.layout)) {
      group = group.with(d);
      const int k = mesh.group_size(group);
      if (k > o.max_members) break;
      if (k < 2 || !split_ns_problem(model, p, owner, minus(shard, group), group).empty()) continue;
      const SplitNsSlice slice = split_ns_slice(model, p, owner, minus(shard, group));
      const double g = static_cast<double>(slice.gram);
      const double part = static_cast<double>((slice.split + k - 1) / k);  // torch.chunk's first
      const double member = steps * (4.0 * g * g * part + 2.0 * g * g * g);
      if (member < best_part) {
        best = group;
        best_part = member;
      }
      if (member <= share) break;
    }
    if (!best.empty()) {
      groups[p] = best;
      part_of[p] = best_part;
    }
  }
  if (!place || groups.empty()) return groups;
  std::vector<double> load(static_cast<std::size_t>(mesh.world_size()), 0.0);
  for (int p : model.muon_params())
    if (!groups.count(p) && assignment.owner.at(p) >= 0) load[assignment.owner.at(p)] += work(p);
  std::vector<int> order;
  for (const auto& [p, g] : groups) order.push_back(p);
  std::stable_sort(order.begin(), order.end(),
                   [&](int x, int y) { return part_of[x] > part_of[y]; });
  for (int p : order) {
    const DimSet g = groups[p];
    const DimSet gathered = minus(model.params.at(p).layout.shard_dims(), g);
    std::vector<std::pair<double, int>> options;  // (busiest member's load, leader)
    for (int h : holders(p)) {
      if (mesh.group_index(h, g) != 0) continue;
      double busiest = 0;
      for (int m : mesh.group_members(h, g)) busiest = std::max(busiest, load[m]);
      options.emplace_back(busiest, h);
    }
    std::stable_sort(options.begin(), options.end());
    for (const auto& [busiest, leader] : options) {
      int owner = -1;
      for (int m : mesh.group_members(leader, g))
        if (owner < 0 && model.params.at(p).layout.shard_numel(mesh, m) > 0) owner = m;
      if (owner < 0 || !split_ns_problem(model, p, owner, gathered, g).empty()) continue;
      assignment.owner[p] = owner;
      for (int m : mesh.group_members(leader, g)) load[m] += part_of[p];
      break;
    }
  }
  return groups;
}

}  // namespace

std::vector<std::string> strategy_preset_names() {
  return {"keller_jordan", "dion", "megatron", "seeds", "muonbed"};
}

StrategyOptions strategy_preset(const std::string& name, int world_size) {
  StrategyOptions o;
  o.preset = name;
  if (name == "keller_jordan") {
    // Keller Jordan's Muon (github.com/KellerJordan/Muon, muon.py, Muon.step): the matrices are
    // taken in groups of world_size, rank r orthogonalizes the r-th of each group (round-robin
    // owners) on its replicated update, then one all_gather per group gives every rank the
    // results.
    o.name = "owner_allgather";
    o.assign = "round_robin";
    o.chunk_size = world_size;
  } else if (name == "dion") {
    // Microsoft's Dion repository (github.com/microsoft/dion, its distributed Muon): matrices of
    // one shape are batched world_size at a time, padded with zero matrices to a full batch, and
    // one all_to_all brings each rank its matrix of the batch, NS, one all_to_all back. The
    // padding is not modelled: it adds zero matrices that move and are orthogonalized in
    // parallel with the real ones (bytes of a full batch on the short batches only).
    o.name = "all_to_all";
    o.assign = "round_robin";
    o.chunk_size = world_size;
    o.chunk_by_shape = true;
    o.max_chunks_in_flight = 1;
  } else if (name == "megatron") {
    // NVIDIA Megatron-LM's layer-wise distributed optimizer for Muon (with NVIDIA's
    // Emerging-Optimizers): whole matrices are assigned to ranks by a longest-processing-time
    // balance, and uneven all-to-alls bring each rank the matrices it owns and send the results
    // back, about a layer's matrices at a time (chunks of 8) with the next exchange overlapping.
    o.name = "all_to_all";
    o.assign = "flop_balanced";
    o.chunk_size = 8;
    o.max_chunks_in_flight = 2;
  } else if (name == "seeds") {
    // The seeds' owner strategy (seeds 000/003/004): flop-balanced owners, TP-then-FSDP gathers,
    // one unit prefetched, one communication stream.
    o.name = "owner";
    o.assign = "flop_balanced";
    o.gather = "hierarchical";
    o.prefetch_count = 1;
  } else if (name == "muonbed") {
    // muonbed's best (issue 13, experiments/scale_strategies.yaml): owners spread over nodes and
    // rails, cross-node stage on every rail at once, 128 communication lanes (at 1,024 GPUs and
    // up the 240 largest gathers then queue at most 2 deep), largest NS first, and split
    // Newton-Schulz of the matrices whose NS exceeds 3x the balanced per-rank share (llama-70B:
    // the MLP matrices from 1,024 GPUs, the attention projections too from 4,096, over their
    // node's TP group). Threshold 3, not 1: a TP-8 group repeats the g^3 product A.A on every
    // member, so a matrix just above the share packs better whole (1,024 GPUs, analytic: 79.8 ms
    // splitting the attention projections too, 62.0 ms with 3, 65.5 ms without split NS).
    o.name = "owner";
    o.assign = "topology";
    o.gather = "rails";
    o.prefetch_count = 1;
    o.comm_lanes = 128;
    o.order = "lpt";
    o.split_ns.enabled = true;
    o.split_ns.threshold = 3;
  } else {
    std::string known;
    for (const auto& n : strategy_preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw PlanError("unknown strategy preset '" + name + "'; known presets: " + known);
  }
  return o;
}

StepPlan build_plan(const ShardedModel& model, const StrategyOptions& options,
                    const PlanSettings& settings) {
  check_options(options);
  Composition main = compose(options);

  Assignment assignment;
  if (options.name == "replicated") {
    assignment.owner.assign(model.params.size(), Assignment::kNoOwner);
  } else {
    auto policy = options.assign == "explicit"
                      ? make_explicit_assign_policy(options.explicit_owners)
                      : make_assign_policy(options.assign);
    assignment = policy->assign(model, settings.ns_steps());
    validate_assignment(model, assignment);
  }
  // Split Newton-Schulz of the large matrices (the others take the small-matrix path below);
  // their groups may move the owners (choose_split_groups).
  std::map<int, DimSet> split;
  if (options.split_ns.enabled) {
    std::vector<int> large;
    for (int p : model.muon_params())
      if (!(options.small_param_threshold > 0 &&
            model.params[p].numel() < options.small_param_threshold))
        large.push_back(p);
    split = choose_split_groups(model, assignment, large, options.split_ns, settings.ns_steps(),
                                options.assign != "explicit");
    validate_assignment(model, assignment);
  }
  summarize(model, settings.ns_steps(), assignment);

  PlanBuilder b(model, assignment, settings);
  const int compute = b.stream("compute");
  b.stream("comm");

  std::vector<int> start;
  if (options.grad_sync.enabled) start = emit_grad_sync(b, options);

  // Momentum on the pieces each rank holds (owner_allgather: the owner's full matrices).
  const auto muon = b.model().muon_params();
  if (!muon.empty()) {
    Op op;
    op.kind = OpKind::momentum;
    op.stream = compute;
    op.params = muon;
    if (options.name == "owner_allgather") {
      op.owned_only = true;
      op.gathered = DimSet::all(b.mesh().ndims());
    }
    op.deps = start;
    op.label = "momentum";
    start = {b.emit(std::move(op))};
  }
  const auto adamw = b.model().adamw_params();
  if (!adamw.empty()) {
    Op op;
    op.kind = OpKind::adamw;
    op.stream = compute;
    op.params = adamw;
    op.deps = start;
    op.label = "adamw";
    b.emit(std::move(op));
  }

  std::vector<int> small, large;
  for (int p : muon) {
    const bool is_small = options.small_param_threshold > 0 &&
                          b.param(p).numel() < options.small_param_threshold &&
                          options.name != "replicated";
    (is_small ? small : large).push_back(p);
  }
  std::vector<int> finished;
  if (!small.empty()) {
    StrategyOptions r = options;
    r.name = "replicated";
    Composition small_path = compose(r);
    Scheduler scheduler(b, small_path, settings.ns_steps());
    auto done =
        scheduler.run(make_units(b, small, small_path, options.chunk_size, options.order == "lpt",
                                 options.chunk_by_shape, options.chunk_sizing == "ns_cost"),
                      start);
    finished.insert(finished.end(), done.begin(), done.end());
  }
  if (!large.empty()) {
    Scheduler scheduler(b, main, settings.ns_steps());
    auto done =
        scheduler.run(make_units(b, large, main, options.chunk_size, options.order == "lpt",
                                 options.chunk_by_shape, options.chunk_sizing == "ns_cost", split),
                      start);
    finished.insert(finished.end(), done.begin(), done.end());
  }
  if (!muon.empty()) {
    Op op;
    op.kind = OpKind::apply_update;
    op.stream = compute;
    op.params = muon;
    op.deps = finished;
    op.label = "apply Muon updates";
    b.emit(std::move(op));
  }
  return b.finish(options.name, options.to_json_text());
}

}  // namespace muonbed
