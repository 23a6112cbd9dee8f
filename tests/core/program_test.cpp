// Host tests of the lowering of plans to rank programs (core/plan/program.hpp): element maps
// against a brute-force walk of index sets, per-peer counts against plan.hpp's byte counts for
// every op, rank and peer, memory against rank_memory, identical programs from a plan read back
// from JSON, and the errors a broken plan gets.
#include <catch2/catch.hpp>

#include <map>
#include <random>

#include "core/base/errors.hpp"
#include "core/plan/plan_json.hpp"
#include "core/plan/program.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

namespace {

IndexList random_list(std::mt19937& rng, std::int64_t n) {
  std::vector<IndexRange> ranges;
  std::int64_t i = 0;
  while (i < n) {
    const std::int64_t len = std::uniform_int_distribution<std::int64_t>(1, 3)(rng);
    if (rng() % 2) ranges.push_back({i, std::min(n, i + len)});
    i += len + static_cast<std::int64_t>(rng() % 2);
  }
  return IndexList::from_ranges(std::move(ranges));
}

// The sub-list keeping each index of `list` with probability 1/2.
IndexList random_subset(std::mt19937& rng, const IndexList& list) {
  std::vector<IndexRange> ranges;
  for (std::int64_t i : list.to_vector())
    if (rng() % 2) ranges.push_back({i, i + 1});
  return IndexList::from_ranges(std::move(ranges));
}

// Per peer, elements moved by all phases of a lowered collective, in bytes.
// Bytes of the program's messages per peer. A split Newton-Schulz runs its phases 0-1 (the norms,
// fp32) once and 2-3 (the Grams, comm dtype) once per NS step (`steps`).
std::vector<std::int64_t> moved(const RankOp& op, int n, bool sends, std::int64_t width,
                                int steps = 1) {
  std::vector<std::int64_t> bytes(n, 0);
  const bool split = op.kind == OpKind::split_newton_schulz;
  for (std::size_t ph = 0; ph < op.phases.size(); ++ph) {
    const std::int64_t w = split && ph < 2 ? bytes_of(DType::fp32) : width;
    const int times = split && ph >= 2 ? steps : 1;
    for (const auto& t : sends ? op.phases[ph].sends : op.phases[ph].recvs)
      bytes.at(t.peer) += times * t.count * w;
  }
  return bytes;
}

}  // namespace

TEST_CASE("element maps place every element where its index set says", "[program]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int nd = 1 + static_cast<int>(rng() % 3);
    std::vector<std::int64_t> shape(nd);
    ShardIndexSet outer, inner;
    for (int d = 0; d < nd; ++d) {
      shape[d] = 1 + static_cast<std::int64_t>(rng() % 9);
      outer.dims.push_back(trial % 5 == 0 ? IndexList::range(0, shape[d])
                                          : random_list(rng, shape[d]));
      inner.dims.push_back(random_subset(rng, outer.dims[d]));
    }
    INFO("inner " << inner.to_string() << " outer " << outer.to_string());
    REQUIRE(contains(outer, inner));
    // Brute force: the packed position of every full index in outer.
    std::map<std::int64_t, std::int64_t> outer_position;
    for_each_element(outer, shape, [&](std::int64_t f, std::int64_t p) { outer_position[f] = p; });
    std::vector<std::int64_t> expected(static_cast<std::size_t>(inner.numel()));
    for_each_element(inner, shape,
                     [&](std::int64_t f, std::int64_t p) { expected[p] = outer_position.at(f); });
    const auto runs = runs_between(inner, outer);
    std::vector<std::int64_t> got(expected.size(), -1);
    std::int64_t next = 0;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i];
      CHECK(r.sequence == next);  // runs cover inner's order exactly once, in order
      for (std::int64_t k = 0; k < r.length; ++k) got.at(r.sequence + k) = r.tensor + k;
      next += r.length;
      if (i > 0)  // adjacent runs are merged
        CHECK_FALSE(runs[i - 1].tensor + runs[i - 1].length == r.tensor);
    }
    CHECK(next == inner.numel());
    CHECK(got == expected);
    if (inner.numel() > 0 && !(inner == outer)) {
      // A set with an index outside is not contained and has no map.
      ShardIndexSet bigger = outer;
      bigger.dims[0] = IndexList::range(0, shape[0] + 1);
      CHECK_FALSE(contains(outer, bigger));
      CHECK_THROWS_AS(runs_between(bigger, outer), LayoutError);
    }
  }
  // A whole row-major block is one run.
  ShardIndexSet rows{{IndexList::range(2, 5), IndexList::range(0, 8)}};
  ShardIndexSet all{{IndexList::range(0, 8), IndexList::range(0, 8)}};
  CHECK(runs_between(rows, all) == std::vector<Run>{{0, 16, 24}});
}

TEST_CASE("views slice across segments", "[program]") {
  View v;
  v.count = 10;
  v.segments = {{0, {{0, 100, 4}}}, {1, {{4, 0, 2}, {6, 10, 4}}}};
  const View s = slice(v, 3, 8);
  CHECK(s.count == 5);
  REQUIRE(s.segments.size() == 2);
  CHECK(s.segments[0].runs == std::vector<Run>{{0, 103, 1}});
  CHECK(s.segments[1].runs == std::vector<Run>{{1, 0, 2}, {3, 10, 2}});
  CHECK(slice(v, 8, 3).count == 0);
}

TEST_CASE("programs move what plan.hpp counts and use what rank_memory counts", "[program]") {
  for (const auto& topology : testing::topologies()) {
    const ShardedModel model = testing::make_model(topology);
    for (const auto& options : testing::strategies()) {
      for (DType comm : {DType::bf16, DType::fp32}) {
        PlanSettings settings;
        settings.optimizer.comm_dtype = comm;
        const StepPlan plan = build_plan(model, options, settings);
        INFO("topology " << topology.name << ", comm " << to_string(comm) << ", strategy "
                         << options.to_json_text());
        const std::int64_t width = bytes_of(comm);
        for (int r = 0; r < model.mesh.world_size(); ++r) {
          INFO("rank " << r);
          const RankProgram program = lower_rank_program(plan, r);
          const RankMemory expected = rank_memory(plan, r);
          CHECK(program.memory().static_bytes == expected.static_bytes);
          CHECK(program.memory().peak_transient_bytes == expected.peak_transient_bytes);
          for (const Op& op : plan.ops) {
            const RankOp* rop = program.find(op.id);
            CHECK((rop != nullptr) == op.ranks.contains(model.mesh, r));
            if (rop == nullptr || !is_collective(op.kind)) continue;
            INFO("op " << op.id << " " << op.label);
            const int n = model.mesh.group_size(op.group);
            CHECK(rop->group_index == model.mesh.group_index(r, op.group));
            const auto& comm_members = program.communicators.at(rop->communicator).members;
            CHECK(comm_members == model.mesh.group_members(r, op.group));
            CHECK(program.communicators.at(rop->communicator).stream == op.stream);
            CHECK(moved(*rop, n, true, width, op.ns_steps) == bytes_sent(plan, op, r));
            CHECK(moved(*rop, n, false, width, op.ns_steps) == bytes_received(plan, op, r));
            for (const auto& phase : rop->phases) {
              std::int64_t d = 0;
              for (const auto& t : phase.sends) {
                CHECK(t.displacement == d);
                CHECK(t.data.count == t.count);
                CHECK(t.peer_rank == comm_members.at(t.peer));
                d += t.count;
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("a plan read back from JSON lowers to identical programs", "[program]") {
  for (const auto& topology : testing::topologies()) {
    const ShardedModel model = testing::make_model(topology);
    for (const auto& options : testing::strategies()) {
      const StepPlan plan = build_plan(model, options, PlanSettings{});
      const StepPlan back = plan_from_json(nlohmann::json::parse(plan_to_json(plan).dump()));
      INFO("topology " << topology.name << ", strategy " << options.to_json_text());
      for (int r = 0; r < model.mesh.world_size(); ++r) {
        INFO("rank " << r);
        CHECK(lower_rank_program(back, r) == lower_rank_program(plan, r));
      }
    }
  }
}

TEST_CASE("staging buffers are allocated next to their all_to_all and delay nothing", "[program]") {
  const ShardedModel model = testing::make_model(testing::topologies()[1]);  // FSDP over 4 ranks
  StrategyOptions options;
  options.name = "all_to_all";
  options.chunk_size = 3;
  const StepPlan plan = build_plan(model, options, PlanSettings{});
  int packs = 0;
  for (const Op& op : plan.ops) {
    if (op.kind != OpKind::pack && op.kind != OpKind::unpack) continue;
    ++packs;
    INFO("op " << op.id << " " << op.label);
    REQUIRE(op.buffer >= 0);
    // The alloc of its buffer has the deps of its first user, nothing more.
    const Op* alloc = nullptr;
    for (const Op& other : plan.ops)
      if (other.kind == OpKind::alloc && other.buffer == op.buffer) alloc = &other;
    REQUIRE(alloc != nullptr);
    CHECK(alloc->ranks == op.ranks);
    if (op.kind == OpKind::pack) {
      CHECK(alloc->stream == op.stream);
      std::vector<int> without_alloc = op.deps;
      std::erase(without_alloc, alloc->id);
      CHECK(alloc->deps == without_alloc);
    }
  }
  CHECK(packs > 0);
  // Views describe themselves by tensor name and element range, for error messages.
  const RankProgram program0 = lower_rank_program(plan, 0);
  const RankOp* momentum = nullptr;
  for (const RankOp& op : program0.ops)
    if (op.kind == OpKind::momentum) momentum = &op;
  REQUIRE(momentum != nullptr);
  CHECK_THAT(describe(program0, momentum->momentum.front().update),
             Catch::StartsWith("gradient slot of '" +
                               plan.model.params[momentum->momentum.front().param].name + "'[0:"));
  // The program's staging is exactly the plan's buffer on every rank.
  for (int r = 0; r < model.mesh.world_size(); ++r) {
    const RankProgram program = lower_rank_program(plan, r);
    for (const auto& t : program.tensors) {
      if (t.role != PieceRole::staging) continue;
      INFO("rank " << r << " " << t.name);
      CHECK(t.bytes == buffer_bytes(plan, plan.buffers.at(t.buffer), r));
    }
  }
}

TEST_CASE("broken plans are named at lowering", "[program]") {
  const ShardedModel model = testing::make_model(testing::topologies()[1]);  // FSDP over 4 ranks
  SECTION("a dropped scatter leaves a read of nothing") {
    StrategyOptions options;
    options.gather = "flat";
    StepPlan plan = build_plan(model, options, PlanSettings{});
    int dropped = -1;
    for (const Op& op : plan.ops)
      if (op.kind == OpKind::scatter) dropped = op.id;
    REQUIRE(dropped >= 0);
    const std::string name = plan.model.params.at(plan.ops[dropped].params[0]).name;
    // Replace it by a barrier of nothing: same ids and deps, no data.
    plan.ops[dropped].kind = OpKind::barrier;
    plan.ops[dropped].params.clear();
    plan.ops[dropped].tensor = TensorRole::none;
    bool threw = false;
    for (int r = 0; r < model.mesh.world_size() && !threw; ++r) {
      try {
        lower_rank_program(plan, r);
      } catch (const PlanError& e) {
        threw = true;
        CHECK_THAT(e.what(), Catch::Contains("apply_update") &&
                                 Catch::Contains("reads the result of '" + name + "'") &&
                                 Catch::Contains("which no earlier op produced on this rank"));
      }
    }
    CHECK(threw);
    LowerOptions lenient;
    lenient.allow_stale_reads = true;
    for (int r = 0; r < model.mesh.world_size(); ++r)
      CHECK_NOTHROW(lower_rank_program(plan, r, lenient));
  }
  SECTION("a pack without its staging buffer") {
    StrategyOptions options;
    options.name = "all_to_all";
    StepPlan plan = build_plan(model, options, PlanSettings{});
    for (Op& op : plan.ops)
      if (op.kind == OpKind::pack) op.buffer = -1;
    CHECK_THROWS_WITH(lower_rank_program(plan, 0),
                      Catch::Contains("names no staging buffer") && Catch::Contains("pack"));
  }
  SECTION("a rank outside the plan") {
    const StepPlan plan = build_plan(model, StrategyOptions{}, PlanSettings{});
    CHECK_THROWS_AS(lower_rank_program(plan, 4), PlanError);
  }
}
