// Shard index sets: which elements of a tensor each rank holds under DTensor-style placements
// (Shard, StridedShard, Replicate, Independent), with torch.chunk's ceil splits. Each tensor dim's
// index list depends only on the coordinates of the mesh dims that shard it, so a rank's set is a
// cartesian product of per-dim lists, and a group's union is the product of per-dim unions. Sizes
// never need the lists: a (strided) chunk's size depends only on the size of the list it cuts, so
// shard_numel is O(mesh dims x tensor dims) arithmetic, fit for the planner's hot loops.
#include "core/model/layout.hpp"

#include <algorithm>
#include <array>
#include <iterator>

#include "core/base/errors.hpp"

namespace muonbed {

namespace {

// Positions [begin, end) of piece `c` when `m` items are cut into `k` pieces like torch.chunk
// (piece size ceil(m/k); trailing pieces smaller or empty).
IndexRange chunk_span(std::int64_t m, std::int64_t k, std::int64_t c) {
  if (m <= 0) return {0, 0};
  const std::int64_t q = (m + k - 1) / k;
  const std::int64_t b = std::min(c * q, m);
  return {b, std::min(b + q, m)};
}
std::int64_t chunk_size(std::int64_t m, std::int64_t k, std::int64_t c) {
  return chunk_span(m, k, c).size();
}

// The split factor a shard placement first views its list with (1 for a plain Shard).
std::int64_t split_of(const Placement& p) {
  return p.kind == PlacementKind::strided_shard ? p.split_factor : 1;
}

// Positions (into the current list of size s) that coordinate c of a k-way shard placement keeps:
// the list is viewed as `f` torch.chunk chunks and piece c of each is kept.
void kept_positions(const Placement& p, std::int64_t s, std::int64_t k, std::int64_t c,
                    std::vector<IndexRange>& out) {
  out.clear();
  if (s <= 0) return;
  const std::int64_t f = split_of(p);
  const std::int64_t oc = (s + f - 1) / f;
  for (std::int64_t start = 0; start < s; start += oc) {
    const std::int64_t m = std::min(oc, s - start);
    const IndexRange piece = chunk_span(m, k, c);
    if (piece.size() > 0) out.push_back({start + piece.begin, start + piece.end});
  }
}

// Number of positions kept_positions would return, in O(1).
std::int64_t kept_size(const Placement& p, std::int64_t s, std::int64_t k, std::int64_t c) {
  if (s <= 0) return 0;
  const std::int64_t f = split_of(p);
  const std::int64_t oc = (s + f - 1) / f;
  const std::int64_t full = s / oc, rem = s % oc;
  return full * chunk_size(oc, k, c) + (rem > 0 ? chunk_size(rem, k, c) : 0);
}

// The coordinates where kept_size(p, s, k, c) may change as c runs over 0..k-1, sorted, with 0
// and k among them: it is constant from each cut to the next. kept_size is piecewise constant in c
// because chunk_size(m, k, c) is q for c < m/q, m%q at c = m/q, then 0 (m = oc and m = rem).
std::array<std::int64_t, 6> kept_size_cuts(const Placement& p, std::int64_t s, std::int64_t k) {
  std::array<std::int64_t, 6> cuts{0, k, k, k, k, k};  // unused cuts sit at k
  if (s <= 0) return cuts;
  const std::int64_t f = split_of(p);
  const std::int64_t oc = (s + f - 1) / f;
  const std::int64_t rem = s % oc;
  for (int j = 0; j < 2; ++j) {
    const std::int64_t m = j == 0 ? oc : rem;
    if (m <= 0) continue;
    const std::int64_t q = (m + k - 1) / k;
    const std::int64_t t = m / q;
    cuts[2 + 2 * j] = std::min(t, k);
    cuts[3 + 2 * j] = std::min(t + 1, k);
  }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// The distinct values of kept_size over c = 0..k-1 with their multiplicities.
void kept_size_distribution(const Placement& p, std::int64_t s, std::int64_t k,
                            std::vector<std::pair<std::int64_t, std::int64_t>>& out) {
  out.clear();
  if (s <= 0) {
    out.push_back({0, k});
    return;
  }
  const std::array<std::int64_t, 6> cuts = kept_size_cuts(p, s, k);
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    if (cuts[i] == cuts[i + 1]) continue;
    out.push_back({kept_size(p, s, k, cuts[i]), cuts[i + 1] - cuts[i]});
  }
}

// The entries of `list` at the given sorted, disjoint positions, in one pass.
IndexList select_positions(const IndexList& list, const std::vector<IndexRange>& positions) {
  std::vector<IndexRange> out;
  const auto& ranges = list.ranges();
  std::size_t r = 0;
  std::int64_t r_first = 0;  // position of ranges[r].begin
  for (const IndexRange& pos : positions) {
    if (pos.size() <= 0) continue;
    while (r < ranges.size() && r_first + ranges[r].size() <= pos.begin) {
      r_first += ranges[r].size();
      ++r;
    }
    std::size_t rr = r;
    std::int64_t rr_first = r_first;
    while (rr < ranges.size() && rr_first < pos.end) {
      const std::int64_t lo = std::max(pos.begin, rr_first);
      const std::int64_t hi = std::min(pos.end, rr_first + ranges[rr].size());
      if (lo < hi)
        out.push_back({ranges[rr].begin + (lo - rr_first), ranges[rr].begin + (hi - rr_first)});
      if (rr_first + ranges[rr].size() > pos.end) break;
      rr_first += ranges[rr].size();
      ++rr;
    }
  }
  return IndexList::from_ranges(std::move(out));
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Placement

std::string Placement::to_string() const {
  switch (kind) {
    case PlacementKind::replicate:
      return "R";
    case PlacementKind::shard:
      return "S(" + std::to_string(tensor_dim) + ")";
    case PlacementKind::strided_shard:
      return "SS(" + std::to_string(tensor_dim) + "," + std::to_string(split_factor) + ")";
    case PlacementKind::independent:
      return "I(" + std::to_string(coord) + ")";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// IndexList

IndexList IndexList::range(std::int64_t begin, std::int64_t end) {
  IndexList list;
  if (begin < end) list.ranges_.push_back({begin, end});
  return list;
}

IndexList IndexList::from_ranges(std::vector<IndexRange> ranges) {
  std::erase_if(ranges, [](const IndexRange& r) { return r.end <= r.begin; });
  if (!std::is_sorted(ranges.begin(), ranges.end(),
                      [](const IndexRange& a, const IndexRange& b) { return a.begin < b.begin; }))
    std::sort(ranges.begin(), ranges.end(),
              [](const IndexRange& a, const IndexRange& b) { return a.begin < b.begin; });
  IndexList list;
  for (const IndexRange& r : ranges) {
    if (!list.ranges_.empty() && r.begin <= list.ranges_.back().end)
      list.ranges_.back().end = std::max(list.ranges_.back().end, r.end);
    else
      list.ranges_.push_back(r);
  }
  return list;
}

std::int64_t IndexList::size() const {
  std::int64_t n = 0;
  for (const IndexRange& r : ranges_) n += r.size();
  return n;
}

bool IndexList::contains(std::int64_t index) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), index,
                             [](std::int64_t v, const IndexRange& r) { return v < r.begin; });
  if (it == ranges_.begin()) return false;
  --it;
  return index < it->end;
}

std::int64_t IndexList::at(std::int64_t i) const {
  if (i >= 0) {
    for (const IndexRange& r : ranges_) {
      if (i < r.size()) return r.begin + i;
      i -= r.size();
    }
  }
  throw LayoutError("IndexList::at: position out of range (list of " + std::to_string(size()) +
                    " indices)");
}

IndexList IndexList::slice(std::int64_t begin, std::int64_t end) const {
  begin = std::max<std::int64_t>(begin, 0);
  if (end <= begin) return {};
  return select_positions(*this, {{begin, end}});
}

IndexList IndexList::unite(const IndexList& other) const {
  std::vector<IndexRange> all = ranges_;
  all.insert(all.end(), other.ranges_.begin(), other.ranges_.end());
  return from_ranges(std::move(all));
}

std::vector<std::int64_t> IndexList::to_vector() const {
  std::vector<std::int64_t> out;
  out.reserve(size());
  for (const IndexRange& r : ranges_)
    for (std::int64_t i = r.begin; i < r.end; ++i) out.push_back(i);
  return out;
}

// ---------------------------------------------------------------------------------------------
// ShardIndexSet

std::int64_t ShardIndexSet::numel() const {
  std::int64_t n = 1;
  for (const IndexList& d : dims) n *= d.size();
  return n;
}

std::string ShardIndexSet::to_string() const {
  std::string out;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i) out += " x ";
    out += "{";
    bool first = true;
    for (const IndexRange& r : dims[i].ranges()) {
      if (!first) out += ",";
      first = false;
      out += std::to_string(r.begin) + ":" + std::to_string(r.end);
    }
    out += "}";
  }
  return out;
}

void for_each_element(const ShardIndexSet& set, const std::vector<std::int64_t>& shape,
                      const std::function<void(std::int64_t, std::int64_t)>& fn) {
  const std::size_t nd = shape.size();
  if (set.dims.size() != nd)
    throw LayoutError("for_each_element: index set has " + std::to_string(set.dims.size()) +
                      " dims but the shape " + shape_string(shape) + " has " + std::to_string(nd));
  if (nd == 0) {
    fn(0, 0);
    return;
  }
  if (set.numel() == 0) return;
  std::vector<std::int64_t> stride(nd, 1);
  for (std::size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  for (std::size_t d = 0; d < nd; ++d) {
    const auto& rs = set.dims[d].ranges();
    if (rs.front().begin < 0 || rs.back().end > shape[d])
      throw LayoutError("for_each_element: index set " + set.to_string() +
                        " lies outside the shape " + shape_string(shape));
  }
  std::int64_t packed = 0;
  // Outer dims walk their index lists; the innermost dim walks whole ranges.
  auto walk = [&](auto& self, std::size_t d, std::int64_t base) -> void {
    const auto& ranges = set.dims[d].ranges();
    if (d + 1 == nd) {
      for (const IndexRange& r : ranges)
        for (std::int64_t i = r.begin; i < r.end; ++i) fn(base + i, packed++);
      return;
    }
    for (const IndexRange& r : ranges)
      for (std::int64_t i = r.begin; i < r.end; ++i) self(self, d + 1, base + i * stride[d]);
  };
  walk(walk, 0, 0);
}

// ---------------------------------------------------------------------------------------------
// TensorLayout

TensorLayout::TensorLayout(const DeviceMesh& mesh, std::vector<std::int64_t> shape,
                           std::vector<Placement> placements)
    : shape_(std::move(shape)), placements_(std::move(placements)) {
  const int nd = static_cast<int>(shape_.size());
  if (nd == 0)
    throw LayoutError("tensor layout: a scalar (shape []) has no layout; fix: use shape [1]");
  for (std::int64_t s : shape_)
    if (s < 0)
      throw LayoutError("tensor layout: shape " + shape_string(shape_) +
                        " has a negative size; fix: sizes must be >= 0");
  if (static_cast<int>(placements_.size()) != mesh.ndims())
    throw LayoutError("tensor layout " + shape_string(shape_) + ": " +
                      std::to_string(placements_.size()) + " placements for a mesh of " +
                      std::to_string(mesh.ndims()) + " dimensions (" + mesh.describe() +
                      "); fix: give one placement per mesh dimension");
  mesh_sizes_.resize(mesh.ndims());
  for (int i = 0; i < mesh.ndims(); ++i) {
    mesh_sizes_[i] = mesh.size(i);
    const Placement& p = placements_[i];
    // Built only for a message: this constructor runs for every tensor of every sweep point.
    const auto where = [&] {
      return "tensor layout " + shape_string(shape_) + ", mesh dim '" + mesh.dim(i).name + "' (" +
             p.to_string() + "): ";
    };
    if (p.is_shard() && (p.tensor_dim < 0 || p.tensor_dim >= nd))
      throw LayoutError(where() + "tensor dim " + std::to_string(p.tensor_dim) +
                        " is out of range; fix: shard a dim in 0.." + std::to_string(nd - 1));
    if (p.kind == PlacementKind::strided_shard && p.split_factor < 1)
      throw LayoutError(where() + "split factor " + std::to_string(p.split_factor) +
                        " < 1; fix: use a split factor >= 1");
    if (p.kind == PlacementKind::independent && (p.coord < 0 || p.coord >= mesh.size(i)))
      throw LayoutError(where() + "independent coordinate " + std::to_string(p.coord) +
                        " is outside 0.." + std::to_string(mesh.size(i) - 1) +
                        "; fix: pick a coordinate of that mesh dimension");
  }
}

std::int64_t TensorLayout::numel() const {
  std::int64_t n = 1;
  for (std::int64_t s : shape_) n *= s;
  return n;
}

DimSet TensorLayout::shard_dims() const {
  DimSet set;
  for (std::size_t i = 0; i < placements_.size(); ++i)
    if (placements_[i].is_shard()) set = set.with(static_cast<int>(i));
  return set;
}

DimSet TensorLayout::replicate_dims() const {
  DimSet set;
  for (std::size_t i = 0; i < placements_.size(); ++i)
    if (placements_[i].kind == PlacementKind::replicate) set = set.with(static_cast<int>(i));
  return set;
}

DimSet TensorLayout::independent_dims() const {
  DimSet set;
  for (std::size_t i = 0; i < placements_.size(); ++i)
    if (placements_[i].kind == PlacementKind::independent) set = set.with(static_cast<int>(i));
  return set;
}

void TensorLayout::check_mesh(const DeviceMesh& mesh, int rank) const {
  bool same = mesh.ndims() == static_cast<int>(mesh_sizes_.size());
  for (int i = 0; same && i < mesh.ndims(); ++i) same = mesh.size(i) == mesh_sizes_[i];
  if (!same)
    throw LayoutError("tensor layout " + shape_string(shape_) +
                      " was built for another mesh than " + mesh.describe());
  if (rank < 0 || rank >= mesh.world_size())
    throw LayoutError("rank " + std::to_string(rank) + " is outside the mesh " + mesh.describe());
}

bool TensorLayout::holds(const DeviceMesh& mesh, int rank) const {
  for (std::size_t i = 0; i < placements_.size(); ++i) {
    const Placement& p = placements_[i];
    if (p.kind == PlacementKind::independent && mesh.coord(rank, static_cast<int>(i)) != p.coord)
      return false;
  }
  return true;
}

ShardIndexSet TensorLayout::index_set(const DeviceMesh& mesh, int rank) const {
  return index_set(mesh, rank, DimSet{});
}

ShardIndexSet TensorLayout::index_set(const DeviceMesh& mesh, int rank, DimSet gathered) const {
  check_mesh(mesh, rank);
  const int nd = static_cast<int>(shape_.size());
  ShardIndexSet set;
  set.dims.resize(nd);
  if (!holds(mesh, rank)) return set;
  const int mnd = mesh.ndims();
  std::vector<int> ops;  // mesh dims sharding tensor dim d, outermost first
  std::vector<IndexRange> acc;
  for (int d = 0; d < nd; ++d) {
    ops.clear();
    int last_fixed = -1;  // position in ops of the innermost non-gathered shard
    for (int i = 0; i < mnd; ++i) {
      if (placements_[i].is_shard() && placements_[i].tensor_dim == d) {
        if (!gathered.contains(i)) last_fixed = static_cast<int>(ops.size());
        ops.push_back(i);
      }
    }
    // Appends to `out` what the shards from ops[at] on leave of `list`. Shards after the last
    // non-gathered one are all gathered: their union is the list they cut.
    auto descend = [&](auto& self, int at, const IndexList& list,
                       std::vector<IndexRange>& out) -> void {
      if (at > last_fixed) {
        out.insert(out.end(), list.ranges().begin(), list.ranges().end());
        return;
      }
      const int i = ops[at];
      const Placement& p = placements_[i];
      const std::int64_t k = mesh_sizes_[i];
      std::vector<IndexRange> positions;
      if (!gathered.contains(i)) {
        kept_positions(p, list.size(), k, mesh.coord(rank, i), positions);
        self(self, at + 1, select_positions(list, positions), out);
        return;
      }
      if (list.ranges().size() != 1) {
        for (std::int64_t c = 0; c < k; ++c) {
          kept_positions(p, list.size(), k, c, positions);
          self(self, at + 1, select_positions(list, positions), out);
        }
        return;
      }
      // A gathered shard of one contiguous range: the coordinates whose kept positions have the
      // same pattern up to a shift keep the same ranges shifted by as much (what follows depends
      // on positions only), so each pattern is descended once (a few per dim, not k: k is 2,048
      // for dp_shard at 16,384 GPUs).
      const std::int64_t begin = list.ranges().front().begin;
      struct Pattern {
        std::vector<IndexRange> positions;  // kept positions, shifted to start at 0
        std::vector<IndexRange> result;     // what descending from them leaves, for that shift
      };
      std::vector<Pattern> seen;
      for (std::int64_t c = 0; c < k; ++c) {
        kept_positions(p, list.size(), k, c, positions);
        if (positions.empty()) continue;
        const std::int64_t shift = positions.front().begin;
        for (IndexRange& r : positions) r = {r.begin - shift, r.end - shift};
        auto known = std::find_if(seen.begin(), seen.end(),
                                  [&](const Pattern& q) { return q.positions == positions; });
        if (known == seen.end()) {
          seen.push_back({positions, {}});
          known = std::prev(seen.end());
          std::vector<IndexRange> at_zero;
          for (const IndexRange& r : positions) at_zero.push_back({begin + r.begin, begin + r.end});
          self(self, at + 1, IndexList::from_ranges(std::move(at_zero)), known->result);
        }
        for (const IndexRange& r : known->result) out.push_back({r.begin + shift, r.end + shift});
      }
    };
    acc.clear();
    descend(descend, 0, IndexList::range(0, shape_[d]), acc);
    set.dims[d] = IndexList::from_ranges(std::move(acc));
    acc = {};
  }
  return set;
}

std::int64_t TensorLayout::shard_numel(const DeviceMesh& mesh, int rank) const {
  check_mesh(mesh, rank);
  if (!holds(mesh, rank)) return 0;
  const int nd = static_cast<int>(shape_.size());
  const int mnd = static_cast<int>(placements_.size());
  std::int64_t n = 1;
  for (int d = 0; d < nd && n > 0; ++d) {
    std::int64_t s = shape_[d];
    for (int i = 0; i < mnd; ++i) {
      const Placement& p = placements_[i];
      if (p.is_shard() && p.tensor_dim == d)
        s = kept_size(p, s, mesh_sizes_[i], mesh.coord(rank, i));
    }
    n *= s;
  }
  return n;
}

std::int64_t TensorLayout::shard_numel(const DeviceMesh& mesh, int rank, DimSet gathered) const {
  check_mesh(mesh, rank);
  if (!holds(mesh, rank)) return 0;
  const int nd = static_cast<int>(shape_.size());
  SizeScratch scratch;
  std::int64_t n = 1;
  for (int d = 0; d < nd && n > 0; ++d) n *= extent(mesh, rank, gathered, d, scratch);
  return n;
}

std::vector<std::int64_t> TensorLayout::shard_shape(const DeviceMesh& mesh, int rank,
                                                    DimSet gathered) const {
  check_mesh(mesh, rank);
  const int nd = static_cast<int>(shape_.size());
  std::vector<std::int64_t> shape(nd, 0);
  if (!holds(mesh, rank)) return shape;
  SizeScratch scratch;
  for (int d = 0; d < nd; ++d) shape[d] = extent(mesh, rank, gathered, d, scratch);
  return shape;
}

std::int64_t TensorLayout::extent(const DeviceMesh& mesh, int rank, DimSet gathered, int d,
                                  SizeScratch& scratch) const {
  const int mnd = static_cast<int>(placements_.size());
  // The distribution (size -> how many coordinate tuples) of the list sizes over the gathered
  // coordinates. The lists of distinct tuples are disjoint, so the union's size is the sum of
  // sizes. kept_size depends only on the size it cuts, so sizes suffice.
  auto& [dist, next, values] = scratch;
  int last_fixed = -1;
  bool any_gathered = false;
  for (int i = 0; i < mnd; ++i) {
    const Placement& p = placements_[i];
    if (!p.is_shard() || p.tensor_dim != d) continue;
    if (gathered.contains(i))
      any_gathered = true;
    else
      last_fixed = i;
  }
  if (last_fixed < 0) return shape_[d];  // every shard of this dim is gathered (or there is none)
  if (!any_gathered) {
    std::int64_t s = shape_[d];
    for (int i = 0; i <= last_fixed; ++i) {
      const Placement& p = placements_[i];
      if (p.is_shard() && p.tensor_dim == d)
        s = kept_size(p, s, mesh_sizes_[i], mesh.coord(rank, i));
    }
    return s;
  }
  dist.assign(1, {shape_[d], 1});
  for (int i = 0; i <= last_fixed; ++i) {
    const Placement& p = placements_[i];
    if (!p.is_shard() || p.tensor_dim != d) continue;
    const std::int64_t k = mesh_sizes_[i];
    next.clear();
    for (const auto& [s, count] : dist) {
      if (!gathered.contains(i)) {
        next.push_back({kept_size(p, s, k, mesh.coord(rank, i)), count});
        continue;
      }
      kept_size_distribution(p, s, k, values);
      for (const auto& [v, mult] : values) next.push_back({v, count * mult});
    }
    std::sort(next.begin(), next.end());
    dist.clear();
    for (const auto& e : next) {
      if (!dist.empty() && dist.back().first == e.first)
        dist.back().second += e.second;
      else
        dist.push_back(e);
    }
  }
  std::int64_t total = 0;
  for (const auto& [s, count] : dist) total += s * count;
  return total;
}

void TensorLayout::size_breaks(int dim, std::vector<int>& out) const {
  const Placement& p = placements_.at(dim);
  if (p.kind == PlacementKind::independent) {  // held at p.coord only
    out.push_back(p.coord);
    out.push_back(p.coord + 1);
    return;
  }
  if (!p.is_shard()) return;
  // The sizes the list of tensor dim d can have when this placement cuts it: the outer shards of
  // d cut it first, at any of their coordinates (gathered ones too: a gathered union's size is a
  // sum of such sizes, shard_numel(gathered)).
  const int d = p.tensor_dim;
  std::vector<std::int64_t> sizes{shape_[d]}, next;
  std::vector<std::pair<std::int64_t, std::int64_t>> values;
  for (int i = 0; i < dim; ++i) {
    const Placement& outer = placements_[i];
    if (!outer.is_shard() || outer.tensor_dim != d) continue;
    next.clear();
    for (std::int64_t s : sizes) {
      kept_size_distribution(outer, s, mesh_sizes_[i], values);
      for (const auto& [v, count] : values) next.push_back(v);
    }
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    sizes.swap(next);
  }
  const std::int64_t k = mesh_sizes_[dim];
  for (std::int64_t s : sizes)
    for (std::int64_t c : kept_size_cuts(p, s, k))
      if (c > 0 && c < k) out.push_back(static_cast<int>(c));
}

std::string TensorLayout::describe(const DeviceMesh& mesh) const {
  std::string out = shape_string(shape_);
  for (std::size_t i = 0; i < placements_.size(); ++i) {
    const std::string name = static_cast<int>(i) < mesh.ndims() ? mesh.dim(static_cast<int>(i)).name
                                                                : "dim" + std::to_string(i);
    out += " " + name + ":" + placements_[i].to_string();
  }
  return out;
}

}  // namespace muonbed
