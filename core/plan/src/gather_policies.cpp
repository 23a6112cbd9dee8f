// The gather and redistribute policies of the building blocks (core/plan/schedule.hpp): staged
// gathers and their reverse (hierarchical, rails, flat), the all-to-all exchange, the all-gather
// everywhere, owned all-gathers of results, and none; and their registries.
#include <algorithm>
#include <map>

#include "core/base/errors.hpp"
#include "core/plan/src/policy_blocks.hpp"

namespace muonbed {

namespace plan_detail {

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

DimSet minus(DimSet a, DimSet b) {
  return DimSet{a.bits & ~b.bits};
}

}  // namespace plan_detail

using plan_detail::minus;
using plan_detail::param_label;
using plan_detail::shard_dims_inner_first;

namespace {

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

namespace plan_detail {

std::unique_ptr<GatherPolicy> make_staged_gather(const std::string& name, StageOrder order,
                                                 DimSet split) {
  return std::make_unique<StagedGather>(name, order, split);
}

std::unique_ptr<RedistributePolicy> make_staged_redistribute(const std::string& name,
                                                             StageOrder order, DimSet split) {
  return std::make_unique<StagedRedistribute>(name, order, split);
}

}  // namespace plan_detail

}  // namespace muonbed
