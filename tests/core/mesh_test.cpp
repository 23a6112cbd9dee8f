// Property tests of DeviceMesh: rank <-> coordinate round trips, group membership, group
// partitions of the world and index/member consistency, over many seeded random meshes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "core/base/errors.hpp"
#include "core/model/mesh.hpp"

using namespace muonbed;

namespace {

// A random mesh of 1..4 dims with sizes 1..5; gpus_per_node divides the world size.
DeviceMesh random_mesh(std::mt19937& rng) {
  const int nd = std::uniform_int_distribution<int>(1, 4)(rng);
  std::vector<MeshDim> dims;
  int world = 1;
  for (int i = 0; i < nd; ++i) {
    const int size = std::uniform_int_distribution<int>(1, 5)(rng);
    dims.push_back({std::string("d").append(std::to_string(i)), size, DimRole::replicate});
    world *= size;
  }
  std::vector<int> divisors;
  for (int g = 1; g <= world; ++g)
    if (world % g == 0) divisors.push_back(g);
  const int gpn = divisors[std::uniform_int_distribution<std::size_t>(0, divisors.size() - 1)(rng)];
  return DeviceMesh(dims, gpn);
}

DimSet random_dimset(std::mt19937& rng, int ndims) {
  return DimSet{std::uniform_int_distribution<std::uint32_t>(0, (1u << ndims) - 1)(rng)};
}

}  // namespace

TEST_CASE("error messages carry place and fix", "[mesh][errors]") {
  const ConfigError e(SourceLocation{"exp.yaml", 12, 5}, "unknown key 'tpp'", "did you mean 'tp'?");
  CHECK(std::string(e.what()) ==
        "exp.yaml:12:5: error: unknown key 'tpp'\n  fix: did you mean 'tp'?");
  CHECK(e.fix() == "did you mean 'tp'?");
  CHECK(e.where().line == 12);
  CHECK(SourceLocation{"a.yaml", 3, 0}.to_string() == "a.yaml:3");
  CHECK(SourceLocation{"a.yaml", 0, 0}.to_string() == "a.yaml");
  CHECK(SourceLocation{}.to_string().empty());
  const ConfigError nowhere(SourceLocation{}, "bad", "");
  CHECK(std::string(nowhere.what()) == "error: bad");
  const Error& base = e;  // every muonbed error is an Error
  CHECK(std::string(base.what()).find("fix:") != std::string::npos);
}

TEST_CASE("dim roles: names and defaults", "[mesh]") {
  for (DimRole r : {DimRole::replicate, DimRole::fsdp, DimRole::tp, DimRole::ep, DimRole::pp})
    CHECK(dim_role_from_string(to_string(r)) == r);
  CHECK(to_string(DimRole::fsdp) == "fsdp");
  REQUIRE_THROWS_WITH(dim_role_from_string("shard"),
                      Catch::Contains("shard") && Catch::Contains("replicate, fsdp, tp, ep, pp"));
  DimRole role{};
  CHECK((default_role_for_name("dp_shard", role) && role == DimRole::fsdp));
  CHECK((default_role_for_name("dp_replicate", role) && role == DimRole::replicate));
  CHECK((default_role_for_name("dp", role) && role == DimRole::replicate));
  CHECK((default_role_for_name("cp", role) && role == DimRole::replicate));
  CHECK((default_role_for_name("tp", role) && role == DimRole::tp));
  CHECK((default_role_for_name("ep", role) && role == DimRole::ep));
  CHECK((default_role_for_name("pp", role) && role == DimRole::pp));
  CHECK_FALSE(default_role_for_name("mystery", role));
}

TEST_CASE("DimSet basics", "[mesh]") {
  const DimSet s = DimSet::of({0, 2, 5});
  CHECK(s.count() == 3);
  CHECK(s.contains(2));
  CHECK_FALSE(s.contains(1));
  CHECK(s.without(2) == DimSet::of({0, 5}));
  CHECK(s.with(1).count() == 4);
  CHECK((s & DimSet::of({2, 3})) == DimSet::of({2}));
  CHECK((s | DimSet::of({3})).count() == 4);
  CHECK(DimSet::all(3).bits == 7u);
  CHECK(DimSet::all(32).count() == 32);
  CHECK(DimSet{}.empty());
}

TEST_CASE("mesh construction, describe and errors", "[mesh]") {
  DeviceMesh m({{"pp", 2, DimRole::pp}, {"dp_shard", 4, DimRole::fsdp}, {"tp", 8, DimRole::tp}}, 8);
  CHECK(m.world_size() == 64);
  CHECK(m.num_nodes() == 8);
  CHECK(m.describe() == "pp=2 x dp_shard=4 x tp=8 (64 ranks, 8 per node)");
  CHECK(m.find("tp") == 2);
  CHECK(m.find("ep") == -1);
  CHECK(m.stride(0) == 32);
  CHECK(m.stride(1) == 8);
  CHECK(m.stride(2) == 1);
  CHECK(m.dims_with_role(DimRole::tp) == std::vector<int>{2});
  CHECK(m.dims_with_roles({DimRole::fsdp, DimRole::pp}) == DimSet::of({0, 1}));
  // A tp group is 8 consecutive ranks: one node.
  for (int r = 0; r < 64; ++r)
    for (int member : m.group_members(r, DimSet::of({2}))) CHECK(m.node_of(member) == m.node_of(r));

  DeviceMesh two_replicate({{"dp_replicate", 2, DimRole::replicate},
                            {"cp", 2, DimRole::replicate},
                            {"dp_shard", 2, DimRole::fsdp}},
                           8);
  CHECK(two_replicate.dims_with_role(DimRole::replicate) == std::vector<int>{0, 1});
  CHECK(two_replicate.num_nodes() == 1);
  DeviceMesh partial({{"tp", 4, DimRole::tp}}, 8);
  CHECK(partial.num_nodes() == 1);
  CHECK(partial.describe() == "tp=4 (4 ranks, 8 per node)");

  REQUIRE_THROWS_AS(DeviceMesh({{"", 2, DimRole::tp}}, 1), LayoutError);
  REQUIRE_THROWS_WITH(DeviceMesh({{"tp", 2, DimRole::tp}, {"tp", 2, DimRole::tp}}, 1),
                      Catch::Contains("twice"));
  REQUIRE_THROWS_WITH(DeviceMesh({{"tp", 0, DimRole::tp}}, 1), Catch::Contains("size 0"));
  REQUIRE_THROWS_WITH(DeviceMesh({{"tp", 2, DimRole::tp}}, 0), Catch::Contains("gpus_per_node"));
  REQUIRE_THROWS_WITH(DeviceMesh({{"dp", 3, DimRole::replicate}, {"tp", 4, DimRole::tp}}, 8),
                      Catch::Contains("multiple of gpus_per_node") && Catch::Contains("12 ranks"));
  REQUIRE_THROWS_AS(m.rank_of(std::vector<int>{0, 4, 0}), LayoutError);
  REQUIRE_THROWS_AS(m.rank_of(std::vector<int>{0, 0}), LayoutError);

  DeviceMesh empty;
  CHECK(empty.world_size() == 1);
  CHECK(empty.group_members(0, DimSet{}) == std::vector<int>{0});
}

TEST_CASE("mesh properties over random meshes", "[mesh][property]") {
  std::mt19937 rng(20240611);
  for (int trial = 0; trial < 300; ++trial) {
    const DeviceMesh m = random_mesh(rng);
    const int world = m.world_size();
    const int nd = m.ndims();
    INFO("mesh " << m.describe());
    REQUIRE(m.num_nodes() * m.gpus_per_node() == world);

    // coords <-> rank round trip, innermost fastest.
    for (int r = 0; r < world; ++r) {
      const std::vector<int> c = m.coords(r);
      REQUIRE(m.rank_of(c) == r);
      int expect = 0;
      for (int i = 0; i < nd; ++i) expect = expect * m.size(i) + c[i];
      REQUIRE(expect == r);
      REQUIRE(m.node_of(r) == r / m.gpus_per_node());
      for (int i = 0; i < nd; ++i) {
        const int v = std::uniform_int_distribution<int>(0, m.size(i) - 1)(rng);
        std::vector<int> c2 = c;
        c2[i] = v;
        REQUIRE(m.with_coord(r, i, v) == m.rank_of(c2));
      }
    }

    for (int s = 0; s < 4; ++s) {
      const DimSet dims = random_dimset(rng, nd);
      INFO("dims bits " << dims.bits);
      std::vector<int> seen(world, 0);
      for (int r = 0; r < world; ++r) {
        const std::vector<int> members = m.group_members(r, dims);
        REQUIRE(static_cast<int>(members.size()) == m.group_size(dims));
        REQUIRE(std::is_sorted(members.begin(), members.end()));
        REQUIRE(m.group_leader(r, dims) == members.front());
        // Exactly the ranks that differ from r only in `dims` (brute force).
        std::vector<int> expect;
        for (int q = 0; q < world; ++q) {
          bool same = true;
          for (int i = 0; i < nd && same; ++i)
            same = dims.contains(i) || m.coord(q, i) == m.coord(r, i);
          if (same) expect.push_back(q);
        }
        REQUIRE(members == expect);
        const int idx = m.group_index(r, dims);
        REQUIRE(members[idx] == r);
        for (int j = 0; j < static_cast<int>(members.size()); ++j) {
          REQUIRE(m.group_member(r, dims, j) == members[j]);
          REQUIRE(m.group_index(members[j], dims) == j);
        }
        if (m.group_leader(r, dims) == r)
          for (int q : members) ++seen[q];
      }
      // Leaders' groups partition the world.
      for (int r = 0; r < world; ++r) REQUIRE(seen[r] == 1);
    }
  }
}

TEST_CASE("group_members on a 16,384-rank mesh is cheap", "[mesh]") {
  DeviceMesh m({{"pp", 8, DimRole::pp},
                {"dp_replicate", 4, DimRole::replicate},
                {"dp_shard", 64, DimRole::fsdp},
                {"tp", 8, DimRole::tp}},
               8);
  REQUIRE(m.world_size() == 16384);
  long total = 0;
  for (int r = 0; r < m.world_size(); ++r) total += m.group_members(r, DimSet::of({3}))[7] - r;
  CHECK(total > 0);
  const std::vector<int> g = m.group_members(12345, DimSet::of({1, 2}));
  CHECK(g.size() == 256u);
  std::set<int> tp_coords;
  for (int q : g) tp_coords.insert(m.coord(q, 3));
  CHECK(tp_coords.size() == 1u);
}
