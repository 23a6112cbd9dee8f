// JSON form of step plans: plan_to_json writes every field of a StepPlan (the sharded model with
// its mesh and layouts, the assignment, settings, streams, buffers and ops) and plan_from_json
// reads it back exactly. Mesh dimension sets are lists of dimension names, rank boxes are
// {dim: coord} objects naming only the fixed dimensions, enums are their names, placements are
// the layout notation ("R", "S(0)", "SS(0,8)", "I(3)"). Ops omit every field equal to its
// default, because plans at 16k ranks hold thousands of ops. Reading is strict: a wrong type, an
// unknown key or an unknown name throws PlanError naming the JSON path ("ops[12].stream: expected
// integer, got string").
#include "core/plan/plan_json.hpp"

#include <charconv>
#include <climits>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/errors.hpp"

namespace muonbed {

namespace {

using nlohmann::json;

constexpr std::string_view kFormatName = "muonbed-plan";
// 2: settings.optimizer, ops' tensor. 3: pack/unpack name their staging buffer, all_to_all
// staging is allocated, owner_allgather's full-update buffers hold every matrix of a chunk.
constexpr int kFormatVersion = 3;

// ------------------------------------------------------------------------------------------------
// Paths for error messages. A Path is a chain of stack objects (key or index) rendered only when
// an error is thrown, so reading thousands of ops builds no strings.
class Path {
 public:
  Path() = default;
  Path key(std::string_view k) const { return Path(this, k, 0, true); }
  Path index(std::size_t i) const { return Path(this, {}, i, false); }

  std::string str() const {
    if (parent_ == nullptr) return {};
    std::string out = parent_->str();
    if (is_key_) {
      if (!out.empty()) out += '.';
      out += key_;
    } else {
      out += '[' + std::to_string(index_) + ']';
    }
    return out;
  }

 private:
  Path(const Path* parent, std::string_view key, std::size_t index, bool is_key)
      : parent_(parent), key_(key), index_(index), is_key_(is_key) {}
  const Path* parent_ = nullptr;
  std::string_view key_;
  std::size_t index_ = 0;
  bool is_key_ = false;
};

[[noreturn]] void fail(const Path& path, const std::string& what) {
  const std::string where = path.str();
  throw PlanError("plan JSON: " + (where.empty() ? std::string("(top level)") : where) + ": " +
                  what);
}

std::string type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    default:
      return "value";
  }
}

[[noreturn]] void expected(const Path& path, const char* what, const json& got) {
  fail(path, std::string("expected ") + what + ", got " + type_name(got));
}

// An object whose keys must all be known. get() returns nullptr for an absent key: every field
// is optional and defaults to the struct's default.
class ObjectReader {
 public:
  ObjectReader(const json& j, const Path& path, std::initializer_list<std::string_view> keys)
      : j_(j) {
    if (!j.is_object()) expected(path, "object", j);
    for (auto it = j.begin(); it != j.end(); ++it) {
      bool known = false;
      for (std::string_view k : keys) known = known || k == it.key();
      if (!known) {
        std::string list;
        for (std::string_view k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
        fail(path, "unknown key '" + it.key() + "' (known keys: " + list + ")");
      }
    }
  }
  const json* get(std::string_view key) const {
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }

 private:
  const json& j_;
};

std::int64_t read_int64(const json& j, const Path& path) {
  if (j.is_number_integer()) return j.get<std::int64_t>();
  if (j.is_number_unsigned()) {
    const auto v = j.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(path, "integer " + std::to_string(v) + " is too large");
    return static_cast<std::int64_t>(v);
  }
  expected(path, "integer", j);
}

int read_int(const json& j, const Path& path) {
  const std::int64_t v = read_int64(j, path);
  if (v < INT_MIN || v > INT_MAX) fail(path, "integer " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

// Doubles are written as JSON numbers (nlohmann prints the shortest text that reads back to the
// same double); infinities and NaN, which JSON cannot hold, as the strings "inf", "-inf", "nan".
json double_to_json(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double read_double(const json& j, const Path& path) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  expected(path, "number", j);
}

bool read_bool(const json& j, const Path& path) {
  if (!j.is_boolean()) expected(path, "boolean", j);
  return j.get<bool>();
}

const std::string& read_string(const json& j, const Path& path) {
  if (!j.is_string()) expected(path, "string", j);
  return j.get_ref<const std::string&>();
}

const json& read_array(const json& j, const Path& path) {
  if (!j.is_array()) expected(path, "array", j);
  return j;
}

std::vector<int> read_int_list(const json& j, const Path& path) {
  read_array(j, path);
  std::vector<int> out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) out.push_back(read_int(j[i], path.index(i)));
  return out;
}

std::vector<std::int64_t> read_int64_list(const json& j, const Path& path) {
  read_array(j, path);
  std::vector<std::int64_t> out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) out.push_back(read_int64(j[i], path.index(i)));
  return out;
}

std::vector<double> read_double_list(const json& j, const Path& path) {
  read_array(j, path);
  std::vector<double> out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) out.push_back(read_double(j[i], path.index(i)));
  return out;
}

json double_list_to_json(const std::vector<double>& values) {
  json out = json::array();
  for (double v : values) out.push_back(double_to_json(v));
  return out;
}

// Enum names: the library's own to_string/from_string where it has them; the parsers' Error
// (which lists the valid names) is re-thrown as a PlanError at the JSON path.
template <typename Parse>
auto read_enum(const json& j, const Path& path, Parse parse) {
  const std::string& text = read_string(j, path);
  try {
    return parse(text);
  } catch (const Error& e) {
    fail(path, e.what());
  }
}

std::string_view to_string(OptimizerKind kind) {
  return kind == OptimizerKind::muon ? "muon" : "adamw";
}
OptimizerKind optimizer_from_string(std::string_view text) {
  if (text == "muon") return OptimizerKind::muon;
  if (text == "adamw") return OptimizerKind::adamw;
  throw Error("unknown optimizer '" + std::string(text) + "' (valid: muon, adamw)");
}

std::string_view to_string(AllToAllDirection direction) {
  return direction == AllToAllDirection::to_owners ? "to_owners" : "from_owners";
}
AllToAllDirection direction_from_string(std::string_view text) {
  if (text == "to_owners") return AllToAllDirection::to_owners;
  if (text == "from_owners") return AllToAllDirection::from_owners;
  throw Error("unknown all-to-all direction '" + std::string(text) +
              "' (valid: to_owners, from_owners)");
}

// ------------------------------------------------------------------------------------------------
// Placements: the layout notation when the placement is canonical (fields the kind does not use
// at their defaults), otherwise an object with every field, so the round trip stays exact.
std::string_view placement_kind_name(PlacementKind kind) {
  switch (kind) {
    case PlacementKind::replicate:
      return "replicate";
    case PlacementKind::shard:
      return "shard";
    case PlacementKind::strided_shard:
      return "strided_shard";
    case PlacementKind::independent:
      return "independent";
  }
  return "replicate";
}

Placement canonical(const Placement& p) {
  switch (p.kind) {
    case PlacementKind::replicate:
      return Placement::replicate();
    case PlacementKind::shard:
      return Placement::shard(p.tensor_dim);
    case PlacementKind::strided_shard:
      return Placement::strided_shard(p.tensor_dim, p.split_factor);
    case PlacementKind::independent:
      return Placement::independent(p.coord);
  }
  return p;
}

json placement_to_json(const Placement& p) {
  if (p == canonical(p)) {
    switch (p.kind) {
      case PlacementKind::replicate:
        return "R";
      case PlacementKind::shard:
        return "S(" + std::to_string(p.tensor_dim) + ")";
      case PlacementKind::strided_shard:
        return "SS(" + std::to_string(p.tensor_dim) + "," + std::to_string(p.split_factor) + ")";
      case PlacementKind::independent:
        return "I(" + std::to_string(p.coord) + ")";
    }
  }
  return json{{"kind", placement_kind_name(p.kind)},
              {"tensor_dim", p.tensor_dim},
              {"split_factor", p.split_factor},
              {"coord", p.coord}};
}

// Parses "NAME(a)" or "NAME(a,b)"; returns false on any other text.
bool parse_call(std::string_view text, std::string_view name, int nargs, int* args) {
  if (text.size() < name.size() + 2 || text.substr(0, name.size()) != name) return false;
  text.remove_prefix(name.size());
  if (text.front() != '(' || text.back() != ')') return false;
  text = text.substr(1, text.size() - 2);
  for (int i = 0; i < nargs; ++i) {
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, args[i]);
    if (ec != std::errc() || ptr == text.data()) return false;
    text.remove_prefix(static_cast<std::size_t>(ptr - text.data()));
    if (i + 1 < nargs) {
      if (text.empty() || text.front() != ',') return false;
      text.remove_prefix(1);
    }
  }
  return text.empty();
}

Placement read_placement(const json& j, const Path& path) {
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    int a[2] = {0, 0};
    if (s == "R") return Placement::replicate();
    if (parse_call(s, "SS", 2, a)) return Placement::strided_shard(a[0], a[1]);
    if (parse_call(s, "S", 1, a)) return Placement::shard(a[0]);
    if (parse_call(s, "I", 1, a)) return Placement::independent(a[0]);
    fail(path, "'" + s + "' is not a placement (expected R, S(d), SS(d,f) or I(c))");
  }
  if (!j.is_object()) expected(path, "placement (string or object)", j);
  ObjectReader r(j, path, {"kind", "tensor_dim", "split_factor", "coord"});
  Placement p;
  if (const json* v = r.get("kind")) {
    p.kind = read_enum(*v, path.key("kind"), [](std::string_view text) {
      for (auto k : {PlacementKind::replicate, PlacementKind::shard, PlacementKind::strided_shard,
                     PlacementKind::independent})
        if (placement_kind_name(k) == text) return k;
      throw Error("unknown placement kind '" + std::string(text) +
                  "' (valid: replicate, shard, strided_shard, independent)");
    });
  }
  if (const json* v = r.get("tensor_dim")) p.tensor_dim = read_int(*v, path.key("tensor_dim"));
  if (const json* v = r.get("split_factor"))
    p.split_factor = read_int(*v, path.key("split_factor"));
  if (const json* v = r.get("coord")) p.coord = read_int(*v, path.key("coord"));
  return p;
}

// ------------------------------------------------------------------------------------------------
// Mesh-relative values.
json dims_to_json(DimSet dims, const DeviceMesh& mesh, const std::string& what) {
  json out = json::array();
  for (int d = 0; d < 32; ++d) {
    if (!dims.contains(d)) continue;
    if (d >= mesh.ndims())
      throw PlanError("plan_to_json: " + what + " names mesh dimension " + std::to_string(d) +
                      ", but the mesh " + mesh.describe() + " has " + std::to_string(mesh.ndims()) +
                      "; fix the plan (validate_plan finds it)");
    out.push_back(mesh.dim(d).name);
  }
  return out;
}

DimSet read_dims(const json& j, const Path& path, const DeviceMesh& mesh) {
  read_array(j, path);
  DimSet out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string& name = read_string(j[i], path.index(i));
    const int d = mesh.find(name);
    if (d < 0) fail(path.index(i), "no mesh dimension '" + name + "' in " + mesh.describe());
    out = out.with(d);
  }
  return out;
}

bool is_everyone(const RankBox& box, const DeviceMesh& mesh) {
  if (static_cast<int>(box.coord.size()) != mesh.ndims()) return false;
  for (int c : box.coord)
    if (c != RankBox::kAll) return false;
  return true;
}

// A box is {dim name: coord} for its fixed dims. The default, empty box of a mesh with dims
// (not a valid box, but a field value all the same) is written as null.
json box_to_json(const RankBox& box, const DeviceMesh& mesh, const std::string& what) {
  if (box.coord.empty() && mesh.ndims() > 0) return nullptr;
  if (static_cast<int>(box.coord.size()) != mesh.ndims())
    throw PlanError("plan_to_json: " + what + " has " + std::to_string(box.coord.size()) +
                    " coordinates for the mesh " + mesh.describe() +
                    "; fix the plan (validate_plan finds it)");
  json out = json::object();
  for (int d = 0; d < mesh.ndims(); ++d)
    if (box.coord[d] != RankBox::kAll) out[mesh.dim(d).name] = box.coord[d];
  return out;
}

RankBox read_box(const json& j, const Path& path, const DeviceMesh& mesh) {
  RankBox box;
  if (j.is_null()) return box;
  if (!j.is_object()) expected(path, "object of {mesh dim: coordinate}", j);
  box.coord.assign(mesh.ndims(), RankBox::kAll);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const Path p = path.key(it.key());
    const int d = mesh.find(it.key());
    if (d < 0) fail(p, "no mesh dimension '" + it.key() + "' in " + mesh.describe());
    const int c = read_int(it.value(), p);
    if (c != RankBox::kAll && (c < 0 || c >= mesh.size(d)))
      fail(p, "coordinate " + std::to_string(c) + " is outside 0.." +
                  std::to_string(mesh.size(d) - 1));
    box.coord[d] = c;
  }
  return box;
}

// ------------------------------------------------------------------------------------------------
// Model.
json mesh_to_json(const DeviceMesh& mesh) {
  json dims = json::array();
  for (const MeshDim& d : mesh.dims())
    dims.push_back({{"name", d.name}, {"size", d.size}, {"role", to_string(d.role)}});
  return {{"gpus_per_node", mesh.gpus_per_node()}, {"dims", std::move(dims)}};
}

DeviceMesh read_mesh(const json& j, const Path& path) {
  ObjectReader r(j, path, {"gpus_per_node", "dims"});
  int gpus_per_node = 1;
  std::vector<MeshDim> dims;
  if (const json* v = r.get("gpus_per_node"))
    gpus_per_node = read_int(*v, path.key("gpus_per_node"));
  if (const json* v = r.get("dims")) {
    const Path pd = path.key("dims");
    read_array(*v, pd);
    for (std::size_t i = 0; i < v->size(); ++i) {
      const Path p = pd.index(i);
      ObjectReader dr((*v)[i], p, {"name", "size", "role"});
      MeshDim dim;
      if (const json* x = dr.get("name")) dim.name = read_string(*x, p.key("name"));
      if (const json* x = dr.get("size")) dim.size = read_int(*x, p.key("size"));
      if (const json* x = dr.get("role"))
        dim.role = read_enum(*x, p.key("role"), dim_role_from_string);
      dims.push_back(std::move(dim));
    }
  }
  try {
    return DeviceMesh(std::move(dims), gpus_per_node);
  } catch (const Error& e) {
    fail(path, e.what());
  }
}

json param_to_json(const DistributedParam& p, const DeviceMesh& mesh) {
  json out = {{"index", p.index},
              {"source", p.source},
              {"name", p.name},
              {"shape", p.shape},
              {"dtype", to_string(p.dtype)},
              {"role", to_string(p.role)},
              {"layer", p.layer},
              {"optimizer", to_string(p.optimizer)}};
  const TensorLayout& layout = p.layout;
  // A default-constructed layout (no shape, no placements) is written as an absent "layout".
  if (!(layout.shape().empty() && layout.placements().empty() && mesh.ndims() > 0)) {
    json placements = json::array();
    for (const Placement& pl : layout.placements()) placements.push_back(placement_to_json(pl));
    json lj = {{"placements", std::move(placements)}};
    if (layout.shape() != p.shape) lj["shape"] = layout.shape();  // else it is the param's shape
    out["layout"] = std::move(lj);
  }
  return out;
}

DistributedParam read_param(const json& j, const Path& path, const DeviceMesh& mesh) {
  ObjectReader r(
      j, path,
      {"index", "source", "name", "shape", "dtype", "role", "layer", "optimizer", "layout"});
  DistributedParam p;
  if (const json* v = r.get("index")) p.index = read_int(*v, path.key("index"));
  if (const json* v = r.get("source")) p.source = read_int(*v, path.key("source"));
  if (const json* v = r.get("name")) p.name = read_string(*v, path.key("name"));
  if (const json* v = r.get("shape")) p.shape = read_int64_list(*v, path.key("shape"));
  if (const json* v = r.get("dtype")) p.dtype = read_enum(*v, path.key("dtype"), dtype_from_string);
  if (const json* v = r.get("role"))
    p.role = read_enum(*v, path.key("role"), param_role_from_string);
  if (const json* v = r.get("layer")) p.layer = read_int(*v, path.key("layer"));
  if (const json* v = r.get("optimizer"))
    p.optimizer = read_enum(*v, path.key("optimizer"), optimizer_from_string);
  if (const json* v = r.get("layout")) {
    const Path pl = path.key("layout");
    ObjectReader lr(*v, pl, {"shape", "placements"});
    std::vector<std::int64_t> shape = p.shape;
    std::vector<Placement> placements;
    if (const json* x = lr.get("shape")) shape = read_int64_list(*x, pl.key("shape"));
    if (const json* x = lr.get("placements")) {
      const Path pp = pl.key("placements");
      read_array(*x, pp);
      for (std::size_t i = 0; i < x->size(); ++i)
        placements.push_back(read_placement((*x)[i], pp.index(i)));
    }
    try {
      p.layout = TensorLayout(mesh, std::move(shape), std::move(placements));
    } catch (const Error& e) {
      fail(pl, e.what());
    }
  }
  return p;
}

json model_to_json(const ShardedModel& model) {
  json params = json::array();
  for (const DistributedParam& p : model.params) params.push_back(param_to_json(p, model.mesh));
  return {{"name", model.model_name},
          {"mesh", mesh_to_json(model.mesh)},
          {"params", std::move(params)}};
}

ShardedModel read_model(const json& j, const Path& path) {
  ObjectReader r(j, path, {"name", "mesh", "params"});
  ShardedModel model;
  if (const json* v = r.get("name")) model.model_name = read_string(*v, path.key("name"));
  if (const json* v = r.get("mesh")) model.mesh = read_mesh(*v, path.key("mesh"));
  if (const json* v = r.get("params")) {
    const Path pp = path.key("params");
    read_array(*v, pp);
    model.params.reserve(v->size());
    for (std::size_t i = 0; i < v->size(); ++i)
      model.params.push_back(read_param((*v)[i], pp.index(i), model.mesh));
  }
  return model;
}

// ------------------------------------------------------------------------------------------------
// Assignment, settings, buffers.
json assignment_to_json(const Assignment& a) {
  return {{"owner", a.owner},
          {"ns_flops_per_rank", double_list_to_json(a.ns_flops_per_rank)},
          {"imbalance", double_to_json(a.imbalance)}};
}

Assignment read_assignment(const json& j, const Path& path) {
  ObjectReader r(j, path, {"owner", "ns_flops_per_rank", "imbalance"});
  Assignment a;
  if (const json* v = r.get("owner")) a.owner = read_int_list(*v, path.key("owner"));
  if (const json* v = r.get("ns_flops_per_rank"))
    a.ns_flops_per_rank = read_double_list(*v, path.key("ns_flops_per_rank"));
  if (const json* v = r.get("imbalance")) a.imbalance = read_double(*v, path.key("imbalance"));
  return a;
}

// The optimizer in the experiment YAML's vocabulary (core/model/optimizer.hpp), every field
// written.
json optimizer_to_json(const OptimizerConfig& o) {
  json coefficients = json::array();
  for (const NsStepCoefficients& c : o.muon.custom_coefficients)
    coefficients.push_back(double_list_to_json({c.a, c.b, c.c}));
  return {{"lr", double_to_json(o.muon.lr)},
          {"weight_decay", double_to_json(o.muon.weight_decay)},
          {"momentum", double_to_json(o.muon.momentum)},
          {"nesterov", o.muon.nesterov},
          {"momentum_form", to_string(o.muon.momentum_form)},
          {"ns_coefficients", o.muon.ns_coefficients},
          {"custom_coefficients", std::move(coefficients)},
          {"eps", double_to_json(o.muon.eps)},
          {"ns_steps", o.muon.ns_steps},
          {"adjust_lr_fn", to_string(o.muon.adjust_lr_fn)},
          {"adamw",
           {{"lr", double_to_json(o.adamw.lr)},
            {"beta1", double_to_json(o.adamw.beta1)},
            {"beta2", double_to_json(o.adamw.beta2)},
            {"eps", double_to_json(o.adamw.eps)},
            {"weight_decay", double_to_json(o.adamw.weight_decay)}}},
          {"qk_clip",
           {{"enabled", o.qk_clip.enabled},
            {"tau", double_to_json(o.qk_clip.tau)},
            {"head_dim", o.qk_clip.head_dim}}},
          {"comm_dtype", to_string(o.comm_dtype)}};
}

OptimizerConfig read_optimizer(const json& j, const Path& path) {
  ObjectReader r(
      j, path,
      {"lr", "weight_decay", "momentum", "nesterov", "momentum_form", "ns_coefficients",
       "custom_coefficients", "eps", "ns_steps", "adjust_lr_fn", "adamw", "qk_clip", "comm_dtype"});
  OptimizerConfig o;
  MuonConfig& m = o.muon;
  if (const json* v = r.get("lr")) m.lr = read_double(*v, path.key("lr"));
  if (const json* v = r.get("weight_decay"))
    m.weight_decay = read_double(*v, path.key("weight_decay"));
  if (const json* v = r.get("momentum")) m.momentum = read_double(*v, path.key("momentum"));
  if (const json* v = r.get("nesterov")) m.nesterov = read_bool(*v, path.key("nesterov"));
  if (const json* v = r.get("momentum_form"))
    m.momentum_form = read_enum(*v, path.key("momentum_form"), momentum_form_from_string);
  if (const json* v = r.get("ns_coefficients"))
    m.ns_coefficients = read_string(*v, path.key("ns_coefficients"));
  if (const json* v = r.get("custom_coefficients")) {
    const Path pc = path.key("custom_coefficients");
    read_array(*v, pc);
    for (std::size_t i = 0; i < v->size(); ++i) {
      const std::vector<double> abc = read_double_list((*v)[i], pc.index(i));
      if (abc.size() != 3) fail(pc.index(i), "expected [a, b, c]");
      m.custom_coefficients.push_back({abc[0], abc[1], abc[2]});
    }
  }
  if (const json* v = r.get("eps")) m.eps = read_double(*v, path.key("eps"));
  if (const json* v = r.get("ns_steps")) m.ns_steps = read_int(*v, path.key("ns_steps"));
  if (const json* v = r.get("adjust_lr_fn"))
    m.adjust_lr_fn = read_enum(*v, path.key("adjust_lr_fn"), lr_scale_rule_from_string);
  if (const json* v = r.get("adamw")) {
    const Path pa = path.key("adamw");
    ObjectReader a(*v, pa, {"lr", "beta1", "beta2", "eps", "weight_decay"});
    if (const json* x = a.get("lr")) o.adamw.lr = read_double(*x, pa.key("lr"));
    if (const json* x = a.get("beta1")) o.adamw.beta1 = read_double(*x, pa.key("beta1"));
    if (const json* x = a.get("beta2")) o.adamw.beta2 = read_double(*x, pa.key("beta2"));
    if (const json* x = a.get("eps")) o.adamw.eps = read_double(*x, pa.key("eps"));
    if (const json* x = a.get("weight_decay"))
      o.adamw.weight_decay = read_double(*x, pa.key("weight_decay"));
  }
  if (const json* v = r.get("qk_clip")) {
    const Path pq = path.key("qk_clip");
    ObjectReader q(*v, pq, {"enabled", "tau", "head_dim"});
    if (const json* x = q.get("enabled")) o.qk_clip.enabled = read_bool(*x, pq.key("enabled"));
    if (const json* x = q.get("tau")) o.qk_clip.tau = read_double(*x, pq.key("tau"));
    if (const json* x = q.get("head_dim")) o.qk_clip.head_dim = read_int(*x, pq.key("head_dim"));
  }
  if (const json* v = r.get("comm_dtype"))
    o.comm_dtype = read_enum(*v, path.key("comm_dtype"), dtype_from_string);
  try {
    validate(o);
  } catch (const Error& e) {
    fail(path, e.what());
  }
  return o;
}

json settings_to_json(const PlanSettings& s) {
  json j = {{"optimizer", optimizer_to_json(s.optimizer)},
            {"state_dtype", to_string(s.state_dtype)}};
  // Absent when it is the default, so plans written before it read back the same.
  const TrainingMemoryOptions& m = s.training_memory;
  if (!(m == TrainingMemoryOptions{}))
    j["training_memory"] = {{"master_weights", to_string(m.master_weights)},
                            {"activations_bytes", m.activations_bytes},
                            {"reserved_bytes", m.reserved_bytes}};
  if (const TrainingOptions& t = s.training; t.enabled)
    j["training"] = {{"tokens_per_step", t.tokens_per_step},
                     {"seq_len", t.seq_len},
                     {"micro_batch_size", t.micro_batch_size},
                     {"overlap", t.overlap},
                     {"experts_per_token", t.experts_per_token},
                     {"max_micro_batch_groups", t.max_micro_batch_groups},
                     {"flash_attention", t.flash_attention}};
  return j;
}

TrainingOptions read_training(const json& j, const Path& path) {
  ObjectReader r(j, path,
                 {"tokens_per_step", "seq_len", "micro_batch_size", "overlap", "experts_per_token",
                  "max_micro_batch_groups", "flash_attention"});
  TrainingOptions t;
  t.enabled = true;
  if (const json* v = r.get("tokens_per_step"))
    t.tokens_per_step = read_int64(*v, path.key("tokens_per_step"));
  if (const json* v = r.get("seq_len")) t.seq_len = read_int64(*v, path.key("seq_len"));
  if (const json* v = r.get("micro_batch_size"))
    t.micro_batch_size = read_int64(*v, path.key("micro_batch_size"));
  if (const json* v = r.get("overlap")) {
    if (!v->is_string() || (*v != "none" && *v != "backward"))
      fail(path.key("overlap"), "must be \"none\" or \"backward\"");
    t.overlap = v->get<std::string>();
  }
  if (const json* v = r.get("experts_per_token"))
    t.experts_per_token = read_int64(*v, path.key("experts_per_token"));
  if (const json* v = r.get("max_micro_batch_groups"))
    t.max_micro_batch_groups = read_int(*v, path.key("max_micro_batch_groups"));
  if (const json* v = r.get("flash_attention"))
    t.flash_attention = read_bool(*v, path.key("flash_attention"));
  if (t.tokens_per_step < 1 || t.seq_len < 1 || t.micro_batch_size < 1 ||
      t.max_micro_batch_groups < 1 || t.experts_per_token < 0)
    fail(path, "training sizes must be positive");
  return t;
}

TrainingMemoryOptions read_training_memory(const json& j, const Path& path) {
  ObjectReader r(j, path, {"master_weights", "activations_bytes", "reserved_bytes"});
  TrainingMemoryOptions m;
  if (const json* v = r.get("master_weights"))
    m.master_weights = read_enum(*v, path.key("master_weights"), master_weights_from_string);
  if (const json* v = r.get("activations_bytes"))
    m.activations_bytes = read_int64(*v, path.key("activations_bytes"));
  if (const json* v = r.get("reserved_bytes"))
    m.reserved_bytes = read_int64(*v, path.key("reserved_bytes"));
  if (m.activations_bytes < 0 || m.reserved_bytes < 0)
    fail(path, "memory sizes must not be negative");
  return m;
}

PlanSettings read_settings(const json& j, const Path& path) {
  ObjectReader r(j, path, {"optimizer", "state_dtype", "training_memory", "training"});
  PlanSettings s;
  if (const json* v = r.get("optimizer")) s.optimizer = read_optimizer(*v, path.key("optimizer"));
  if (const json* v = r.get("state_dtype"))
    s.state_dtype = read_enum(*v, path.key("state_dtype"), dtype_from_string);
  if (const json* v = r.get("training")) s.training = read_training(*v, path.key("training"));
  if (const json* v = r.get("training_memory"))
    s.training_memory = read_training_memory(*v, path.key("training_memory"));
  return s;
}

json buffer_to_json(const Buffer& b, const DeviceMesh& mesh) {
  return {{"id", b.id},
          {"name", b.name},
          {"params", b.params},
          {"gathered", dims_to_json(b.gathered, mesh, "buffer '" + b.name + "' gathered")},
          {"owned_only", b.owned_only}};
}

Buffer read_buffer(const json& j, const Path& path, const DeviceMesh& mesh) {
  ObjectReader r(j, path, {"id", "name", "params", "gathered", "owned_only"});
  Buffer b;
  if (const json* v = r.get("id")) b.id = read_int(*v, path.key("id"));
  if (const json* v = r.get("name")) b.name = read_string(*v, path.key("name"));
  if (const json* v = r.get("params")) b.params = read_int_list(*v, path.key("params"));
  if (const json* v = r.get("gathered")) b.gathered = read_dims(*v, path.key("gathered"), mesh);
  if (const json* v = r.get("owned_only")) b.owned_only = read_bool(*v, path.key("owned_only"));
  return b;
}

// ------------------------------------------------------------------------------------------------
// Ops: only "kind" always; every other field only when it differs from Op's default ("id" when
// it differs from the op's position, "ranks" when the box is not everyone).
json op_to_json(const Op& op, std::size_t position, const DeviceMesh& mesh) {
  const Op d;  // the defaults
  const std::string what = "op " + std::to_string(position);
  json out = json::object();
  if (op.id != static_cast<int>(position)) out["id"] = op.id;
  out["kind"] = to_string(op.kind);
  if (op.stream != d.stream) out["stream"] = op.stream;
  const bool everyone =
      is_everyone(op.ranks, mesh) || (op.ranks.coord.empty() && mesh.ndims() == 0);
  if (!everyone) out["ranks"] = box_to_json(op.ranks, mesh, what + " ranks");
  if (op.group != d.group) out["group"] = dims_to_json(op.group, mesh, what + " group");
  if (op.root != d.root) out["root"] = op.root;
  if (op.peer != d.peer) out["peer"] = op.peer;
  if (op.params != d.params) out["params"] = op.params;
  if (op.gathered != d.gathered)
    out["gathered"] = dims_to_json(op.gathered, mesh, what + " gathered");
  if (op.owned_only != d.owned_only) out["owned_only"] = op.owned_only;
  if (op.direction != d.direction) out["direction"] = to_string(op.direction);
  if (op.tensor != default_tensor(op)) out["tensor"] = to_string(op.tensor);
  if (op.buffer != d.buffer) out["buffer"] = op.buffer;
  if (op.ns_steps != d.ns_steps) out["ns_steps"] = op.ns_steps;
  if (op.period != d.period) out["period"] = op.period;
  if (op.tokens != d.tokens) out["tokens"] = op.tokens;
  if (op.bytes != d.bytes) out["bytes"] = op.bytes;
  if (op.deps != d.deps) out["deps"] = op.deps;
  if (op.label != d.label) out["label"] = op.label;
  return out;
}

Op read_op(const json& j, const Path& path, std::size_t position, const DeviceMesh& mesh) {
  ObjectReader r(
      j, path,
      {"id", "kind", "stream", "ranks", "group", "root", "peer", "params", "gathered", "owned_only",
       "direction", "tensor", "buffer", "ns_steps", "period", "tokens", "bytes", "deps", "label"});
  Op op;
  op.id = static_cast<int>(position);
  op.ranks = RankBox::everyone(mesh);
  if (const json* v = r.get("id")) op.id = read_int(*v, path.key("id"));
  if (const json* v = r.get("kind")) op.kind = read_enum(*v, path.key("kind"), op_kind_from_string);
  if (const json* v = r.get("stream")) op.stream = read_int(*v, path.key("stream"));
  if (const json* v = r.get("ranks")) op.ranks = read_box(*v, path.key("ranks"), mesh);
  if (const json* v = r.get("group")) op.group = read_dims(*v, path.key("group"), mesh);
  if (const json* v = r.get("root")) op.root = read_int(*v, path.key("root"));
  if (const json* v = r.get("peer")) op.peer = read_int(*v, path.key("peer"));
  if (const json* v = r.get("params")) op.params = read_int_list(*v, path.key("params"));
  if (const json* v = r.get("gathered")) op.gathered = read_dims(*v, path.key("gathered"), mesh);
  if (const json* v = r.get("owned_only")) op.owned_only = read_bool(*v, path.key("owned_only"));
  if (const json* v = r.get("direction"))
    op.direction = read_enum(*v, path.key("direction"), direction_from_string);
  op.tensor = default_tensor(op);  // after kind, owned_only and direction
  if (const json* v = r.get("tensor"))
    op.tensor = read_enum(*v, path.key("tensor"), tensor_role_from_string);
  if (const json* v = r.get("buffer")) op.buffer = read_int(*v, path.key("buffer"));
  if (const json* v = r.get("ns_steps")) op.ns_steps = read_int(*v, path.key("ns_steps"));
  if (const json* v = r.get("period")) op.period = read_int(*v, path.key("period"));
  if (const json* v = r.get("tokens")) op.tokens = read_int64(*v, path.key("tokens"));
  if (const json* v = r.get("bytes")) op.bytes = read_int64(*v, path.key("bytes"));
  if (const json* v = r.get("deps")) op.deps = read_int_list(*v, path.key("deps"));
  if (const json* v = r.get("label")) op.label = read_string(*v, path.key("label"));
  return op;
}

}  // namespace

nlohmann::json plan_to_json(const StepPlan& plan) {
  const DeviceMesh& mesh = plan.model.mesh;
  json buffers = json::array();
  for (const Buffer& b : plan.buffers) buffers.push_back(buffer_to_json(b, mesh));
  json ops = json::array();
  for (std::size_t i = 0; i < plan.ops.size(); ++i) ops.push_back(op_to_json(plan.ops[i], i, mesh));
  return {{"format", kFormatName},
          {"version", kFormatVersion},
          {"strategy", plan.strategy},
          {"strategy_options", plan.strategy_options},
          {"model", model_to_json(plan.model)},
          {"assignment", assignment_to_json(plan.assignment)},
          {"settings", settings_to_json(plan.settings)},
          {"streams", plan.streams},
          {"buffers", std::move(buffers)},
          {"ops", std::move(ops)}};
}

StepPlan plan_from_json(const nlohmann::json& j) {
  const Path root;
  ObjectReader r(j, root,
                 {"format", "version", "strategy", "strategy_options", "model", "assignment",
                  "settings", "streams", "buffers", "ops"});
  if (const json* v = r.get("format")) {
    if (read_string(*v, root.key("format")) != kFormatName)
      fail(root.key("format"), "expected \"" + std::string(kFormatName) + "\", got \"" +
                                   v->get<std::string>() + "\" (this is not a muonbed plan)");
  }
  if (const json* v = r.get("version")) {
    const int version = read_int(*v, root.key("version"));
    if (version != kFormatVersion)
      fail(root.key("version"), "plan format version " + std::to_string(version) +
                                    " is not supported (this build reads version " +
                                    std::to_string(kFormatVersion) + ")");
  }
  StepPlan plan;
  if (const json* v = r.get("strategy")) plan.strategy = read_string(*v, root.key("strategy"));
  if (const json* v = r.get("strategy_options"))
    plan.strategy_options = read_string(*v, root.key("strategy_options"));
  // The model first: the mesh names the dims that boxes, groups and layouts refer to.
  if (const json* v = r.get("model")) plan.model = read_model(*v, root.key("model"));
  const DeviceMesh& mesh = plan.model.mesh;
  if (const json* v = r.get("assignment"))
    plan.assignment = read_assignment(*v, root.key("assignment"));
  if (const json* v = r.get("settings")) plan.settings = read_settings(*v, root.key("settings"));
  if (const json* v = r.get("streams")) {
    const Path ps = root.key("streams");
    read_array(*v, ps);
    for (std::size_t i = 0; i < v->size(); ++i)
      plan.streams.push_back(read_string((*v)[i], ps.index(i)));
  }
  if (const json* v = r.get("buffers")) {
    const Path pb = root.key("buffers");
    read_array(*v, pb);
    for (std::size_t i = 0; i < v->size(); ++i)
      plan.buffers.push_back(read_buffer((*v)[i], pb.index(i), mesh));
  }
  if (const json* v = r.get("ops")) {
    const Path po = root.key("ops");
    read_array(*v, po);
    plan.ops.reserve(v->size());
    for (std::size_t i = 0; i < v->size(); ++i)
      plan.ops.push_back(read_op((*v)[i], po.index(i), i, mesh));
  }
  return plan;
}

}  // namespace muonbed
