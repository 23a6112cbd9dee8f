// The host-side arithmetic of the GPU executors (backends/gpu/layout.hpp), checked on the CPU over
// the invariant matrix and the hard cases, without a GPU: the device pool never lets two
// buffers share memory unless the first one is released earlier in plan order and the second
// one's alloc waits for that release;
// every view's pool runs read what backends/cpu's RankStore reads; every phase's wire layout
// pairs sender and receiver byte for byte; every rank computes the same communicator splits and
// each color is exactly the program's group; NS batches keep every task once.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "backends/cpu/store.hpp"
#include "backends/gpu/layout.hpp"
#include "core/base/errors.hpp"
#include "kernels/bf16.hpp"
#include "tests/common/equivalence_cases.hpp"
#include "tests/common/strategy_matrix.hpp"

using namespace muonbed;

namespace {

template <typename Fn>
void for_each_view(const RankOp& op, Fn&& fn) {
  for (const auto& t : op.momentum) {
    fn(t.gradient);
    fn(t.momentum);
    fn(t.update);
  }
  for (const auto& t : op.newton_schulz) fn(t.data);
  for (const auto& t : op.apply) {
    fn(t.result);
    fn(t.parameter);
  }
  for (const auto& t : op.adamw) {
    fn(t.gradient);
    fn(t.parameter);
    fn(t.adam_m);
    fn(t.adam_v);
  }
  for (const auto& c : op.copies) {
    fn(c.source);
    fn(c.target);
  }
  for (const auto& c : op.keep) {
    fn(c.source);
    fn(c.target);
  }
  for (const auto& p : op.phases) {
    for (const auto& t : p.sends) fn(t.data);
    for (const auto& t : p.recvs) fn(t.data);
    fn(p.self_source);
    fn(p.self_target);
  }
}

// The device ordering (core/plan/program.hpp's wait_list, as the lowering keeps it) against the
// engine's semantics, for every rank and step: R(X), the issued ops the engine completes before
// issued op X starts (earlier ops on its stream and its deps; an inactive op completes with its
// deps, a pass-through send/recv with its deps and earlier ops on its stream), must be inside D(X),
// what the device orders before X (the previous issued op on its stream, the ops of wait_list(X)
// and an alloc's reuse waits, with everything ordered before those). Returns the number of (rank,
// step, op) checked.
std::int64_t check_ordering(const StepPlan& plan, const RankProgram& program,
                            const gpu::PoolLayout& layout, int step) {
  const std::size_t n = program.ops.size();
  auto index = [&](int op) { return program.op_index.at(static_cast<std::size_t>(op)); };
  auto issued = [&](int op) { return issued_in_step(plan, program, op, step); };
  auto stream_of = [&](int op) { return plan.ops.at(static_cast<std::size_t>(op)).stream; };
  // Requirements of op at program index i, as program indices.
  auto requirements = [&](std::size_t i) {
    const int op = program.ops[i].op;
    std::vector<std::size_t> req;
    for (int d : plan.ops[static_cast<std::size_t>(op)].deps)
      if (index(d) >= 0) req.push_back(static_cast<std::size_t>(index(d)));
    const bool inactive = !plan.active_in_step(plan.ops[static_cast<std::size_t>(op)], step);
    if (!inactive)
      for (std::size_t k = 0; k < i; ++k)
        if (stream_of(program.ops[k].op) == stream_of(op)) req.push_back(k);
    return req;
  };
  // E*(i): issued ops complete when op i completes (memoized, program order is topological).
  std::vector<std::set<std::size_t>> done_with(n), required(n), device(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t r : requirements(i)) {
      required[i].insert(done_with[r].begin(), done_with[r].end());
    }
    done_with[i] = required[i];
    if (issued(program.ops[i].op)) done_with[i].insert(i);
  }
  std::int64_t checked = 0;
  std::size_t last_on_stream[64];
  std::fill(std::begin(last_on_stream), std::end(last_on_stream), static_cast<std::size_t>(-1));
  for (std::size_t i = 0; i < n; ++i) {
    const int op = program.ops[i].op;
    if (!issued(op)) continue;
    auto order_after = [&](std::size_t k) {
      device[i].insert(k);
      device[i].insert(device[k].begin(), device[k].end());
    };
    const auto s = static_cast<std::size_t>(stream_of(op));
    REQUIRE(s < 64);
    if (last_on_stream[s] != static_cast<std::size_t>(-1)) order_after(last_on_stream[s]);
    // What the GPU executors wait for: the lists the lowering kept, one per hyper-period step.
    const std::vector<std::vector<int>>& kept = program.ops[i].stream_waits;
    REQUIRE(kept.size() == static_cast<std::size_t>(plan.hyper_period()));
    const std::vector<int>& waits = kept[static_cast<std::size_t>(step) % kept.size()];
    CHECK(waits == wait_list(plan, program, op, step));
    for (int w : waits) {
      REQUIRE(index(w) >= 0);
      CHECK(static_cast<std::size_t>(index(w)) < i);  // backwards in plan order: no cycle
      CHECK(issued(w));
      order_after(static_cast<std::size_t>(index(w)));
    }
    if (program.ops[i].kind == OpKind::alloc)
      for (int w : layout.reuse_waits[i])
        if (plan.active_in_step(plan.ops[static_cast<std::size_t>(w)], step))
          order_after(static_cast<std::size_t>(index(w)));
    last_on_stream[s] = i;
    for (std::size_t r : required[i]) {
      INFO("rank " << program.rank << ", step " << step << ": plan op " << op << " ('"
                   << plan.ops[static_cast<std::size_t>(op)].label
                   << "') is not ordered after plan op " << program.ops[r].op << " ('"
                   << plan.ops[static_cast<std::size_t>(program.ops[r].op)].label
                   << "') on the device");
      CHECK(device[i].count(r) == 1);
    }
    ++checked;
  }
  return checked;
}

// Checks one plan on every rank; returns the number of views checked.
std::int64_t check_plan(const StepPlan& plan) {
  const int world = plan.model.mesh.world_size();
  std::vector<RankProgram> programs;
  for (int r = 0; r < world; ++r) programs.push_back(lower_rank_program(plan, r));
  std::int64_t views = 0;
  std::vector<std::vector<CommunicatorSplit>> splits;  // RankProgram::splits, every rank
  for (const RankProgram& program : programs) {
    INFO("rank " << program.rank);
    const gpu::PoolLayout layout = gpu::plan_pool(plan, program);
    CHECK(layout.transient_bytes >= layout.peak_live_bytes);
    CHECK(layout.peak_live_bytes == program.memory().peak_transient_bytes);
    // Static tensors one after another in program order, each aligned, each in its dtype;
    // transient ones after them.
    std::map<int, int> alloc_at, release_at;  // tensor -> program op index
    for (std::size_t i = 0; i < program.ops.size(); ++i) {
      if (program.ops[i].kind == OpKind::alloc)
        alloc_at[program.ops[i].tensor] = static_cast<int>(i);
      if (program.ops[i].kind == OpKind::release)
        release_at[program.ops[i].tensor] = static_cast<int>(i);
    }
    std::int64_t static_end = 0;
    for (const ProgramTensor& a : program.tensors) {
      const std::int64_t at = layout.tensor_offset[static_cast<std::size_t>(a.id)];
      CHECK(layout.element_bytes[static_cast<std::size_t>(a.id)] == bytes_of(a.dtype));
      if (at >= 0) CHECK(at % gpu::kPoolAlignBytes == 0);
      if (!a.transient) {
        CHECK(at >= static_end);
        static_end = at + a.bytes;
        CHECK(static_end <= layout.static_bytes);
        continue;
      }
      if (!alloc_at.count(a.id)) continue;
      CHECK(at >= layout.transient_begin);
      CHECK(at + a.bytes <= layout.bytes());
      for (const ProgramTensor& b : program.tensors) {
        if (!b.transient || b.id == a.id || !alloc_at.count(b.id)) continue;
        if (alloc_at[a.id] > alloc_at[b.id]) continue;  // each pair once: a allocated first
        const std::int64_t bt = layout.tensor_offset[static_cast<std::size_t>(b.id)];
        const bool overlap = a.bytes > 0 && b.bytes > 0 && at < bt + b.bytes && bt < at + a.bytes;
        if (!overlap) continue;
        INFO("'" << a.name << "' and '" << b.name << "' share pool bytes");
        REQUIRE(release_at.count(a.id));
        CHECK(release_at[a.id] < alloc_at[b.id]);
        // Ordered on the device: the alloc waits for the release.
        const auto& waits = layout.reuse_waits[static_cast<std::size_t>(alloc_at[b.id])];
        const int release_op = program.ops[static_cast<std::size_t>(release_at[a.id])].op;
        CHECK(std::find(waits.begin(), waits.end(), release_op) != waits.end());
      }
    }
    // Pool runs read what the store reads: a byte pool whose 16-bit units count up (never a NaN
    // or infinity pattern, in fp32 or bf16), copied into the store's storage tensor by tensor, so
    // every run's byte offset and dtype must match where and how the store keeps the element.
    cpu::RankStore store(program);
    for (const ProgramTensor& t : program.tensors)
      if (t.transient && alloc_at.count(t.id)) store.allocate(t.id);
    std::vector<std::uint16_t> units(static_cast<std::size_t>(layout.bytes() / 2 + 1));
    for (std::size_t i = 0; i < units.size(); ++i)
      units[i] = static_cast<std::uint16_t>(0x0100 + i % 0x3e00);
    const auto* pool = reinterpret_cast<const std::byte*>(units.data());
    for (const ProgramTensor& t : program.tensors) {
      if (t.transient && !alloc_at.count(t.id)) continue;
      const std::int64_t at = layout.tensor_offset[static_cast<std::size_t>(t.id)];
      if (t.bytes > 0) std::memcpy(store.bytes(t.id), pool + at, static_cast<std::size_t>(t.bytes));
    }
    for (const RankOp& op : program.ops) {
      for_each_view(op, [&](const View& view) {
        // Transient buffers that share space hold the same pool values in this emulation, so
        // reading through either is the same: compare element positions through the runs.
        const std::vector<gpu::PoolRun> runs = gpu::pool_runs(view, layout);
        std::vector<float> through_runs(static_cast<std::size_t>(view.count));
        for (const auto& r : runs)
          for (std::int64_t i = 0; i < r.length; ++i) {
            const std::byte* at = pool + r.pool + i * r.element_bytes;
            float& out = through_runs[static_cast<std::size_t>(r.sequence + i)];
            if (r.element_bytes == 4) {
              std::memcpy(&out, at, 4);
            } else {
              std::uint16_t bits = 0;
              std::memcpy(&bits, at, 2);
              out = bf16_bits_to_float(bits);
            }
          }
        CHECK(store.read(view) == through_runs);
        ++views;
      });
      const gpu::OpScratch scratch = gpu::op_scratch(op);
      CHECK(scratch.elements >= 0);
      std::set<int> seen;
      for (const gpu::NsBatch& b : gpu::ns_batches(op)) {
        std::int64_t batch = 0;
        for (int t : b.tasks) {
          CHECK(seen.insert(t).second);
          CHECK(op.newton_schulz[static_cast<std::size_t>(t)].rows == b.rows);
          CHECK(op.newton_schulz[static_cast<std::size_t>(t)].cols == b.cols);
          batch += op.newton_schulz[static_cast<std::size_t>(t)].batch;
        }
        CHECK(batch == b.batch);
      }
      CHECK(seen.size() == op.newton_schulz.size());
    }
    splits.push_back(program.splits);
    for (int step = 0; step < 2; ++step) CHECK(check_ordering(plan, program, layout, step) > 0);
  }
  // Wire layouts pair up: what i sends j in phase p is what j receives from i.
  for (const Op& op : plan.ops) {
    if (!is_collective(op.kind)) continue;
    std::map<std::tuple<int, int, std::size_t>, std::int64_t> sent, received;
    for (const RankProgram& program : programs) {
      const RankOp* rop = program.find(op.id);
      if (rop == nullptr) continue;
      for (std::size_t p = 0; p < rop->phases.size(); ++p) {
        const gpu::PhaseWire wire = gpu::phase_wire(rop->phases[p], rop->wire_dtype);
        for (const auto& m : wire.sends) sent[{program.rank, m.peer_rank, p}] += m.bytes;
        for (const auto& m : wire.recvs) received[{m.peer_rank, program.rank, p}] += m.bytes;
        const Communicator& c =
            program.communicators.at(static_cast<std::size_t>(rop->communicator));
        for (const auto& m : wire.sends)
          CHECK(c.members.at(static_cast<std::size_t>(m.peer)) == m.peer_rank);
      }
    }
    INFO("op " << op.id << " '" << op.label << "'");
    CHECK(sent == received);
  }
  // Splits: one list on every rank; each color's members are the program's group, keyed by index.
  for (int r = 1; r < world; ++r) {
    REQUIRE(splits[static_cast<std::size_t>(r)].size() == splits[0].size());
    for (std::size_t s = 0; s < splits[0].size(); ++s) {
      CHECK(splits[static_cast<std::size_t>(r)][s].stream == splits[0][s].stream);
      CHECK(splits[static_cast<std::size_t>(r)][s].dims == splits[0][s].dims);
    }
  }
  for (std::size_t s = 0; s < splits[0].size(); ++s) {
    std::map<int, std::map<int, int>> colors;  // color -> key -> rank
    for (int r = 0; r < world; ++r) {
      const auto& split = splits[static_cast<std::size_t>(r)][s];
      if (split.color < 0) continue;
      CHECK(colors[split.color].emplace(split.key, r).second);
    }
    for (int r = 0; r < world; ++r) {
      const auto& split = splits[static_cast<std::size_t>(r)][s];
      if (split.color < 0) continue;
      const Communicator& c = programs[static_cast<std::size_t>(r)].communicators.at(
          static_cast<std::size_t>(split.communicator));
      std::vector<int> members;
      for (const auto& [key, rank] : colors[split.color]) members.push_back(rank);
      CHECK(members == c.members);
    }
  }
  return views;
}

}  // namespace

TEST_CASE("GPU layout: pools, pool runs, wire layouts and splits over the invariant matrix",
          "[gpu-layout]") {
  std::int64_t views = 0;
  for (const auto& topology : testing::topologies()) {
    const Model model = *find_preset(topology.model);
    const ShardedModel sharded = testing::make_model(topology);
    for (const auto& options : testing::strategies()) {
      if (!testing::gpu_runs(options)) continue;
      INFO("topology " << topology.name << ", strategy " << options.to_json_text());
      const StepPlan plan =
          build_plan(sharded, options, testing::settings_of(testing::kVariants[0], model));
      views += check_plan(plan);
    }
  }
  CHECK(views > 10000);
}

TEST_CASE("GPU layout: uneven splits and empty shards", "[gpu-layout]") {
  const Model model = testing::odd_model();
  for (const auto& dims : std::vector<std::vector<MeshDim>>{
           {{"dp_shard", 4, DimRole::fsdp}},
           {{"dp_shard", 2, DimRole::fsdp}, {"tp", 3, DimRole::tp}},
           {{"dp_shard", 3, DimRole::fsdp}, {"ep", 2, DimRole::ep}},
           {{"pp", 2, DimRole::pp}, {"dp_shard", 3, DimRole::fsdp}}}) {
    const ShardedModel sharded = parallelize(model, DeviceMesh(dims, 8), ParallelRules{});
    for (const auto& variant : testing::kVariants)
      for (const auto& options : testing::strategies()) {
        if (!testing::gpu_runs(options)) continue;
        INFO(DeviceMesh(dims, 8).describe() << ", strategy " << options.to_json_text());
        check_plan(build_plan(sharded, options, testing::settings_of(variant, model)));
      }
  }
}

TEST_CASE("GPU layout: a released buffer is reused only after its release", "[gpu-layout]") {
  // The pool of an owner plan reuses space (its transient region is below the sum of its
  // buffers, near the plan's peak) and never exceeds the sum.
  const auto topologies = testing::topologies();
  const ShardedModel sharded = testing::make_model(topologies[1]);  // FSDP
  StrategyOptions options;
  options.name = "owner";
  const StepPlan plan = build_plan(sharded, options, PlanSettings{});
  bool reused = false;
  for (int r = 0; r < plan.model.mesh.world_size(); ++r) {
    const RankProgram program = lower_rank_program(plan, r);
    const gpu::PoolLayout layout = gpu::plan_pool(plan, program);
    std::int64_t sum = 0;
    for (const ProgramTensor& t : program.tensors)
      if (t.transient)
        sum += (t.bytes + gpu::kPoolAlignBytes - 1) / gpu::kPoolAlignBytes * gpu::kPoolAlignBytes;
    CHECK(layout.transient_bytes <= sum);
    CHECK(layout.transient_bytes <= 2 * layout.peak_live_bytes + 64 * gpu::kPoolAlignBytes);
    reused = reused || layout.transient_bytes < sum;
  }
  CHECK(reused);
}

TEST_CASE("GPU layout: broken views and phases are refused", "[gpu-layout]") {
  // Tensor 0: fp32 at byte 0; tensor 1: bf16 at byte 400; tensor 2: fp32 right after tensor 1's
  // first four elements (bytes 408 on).
  gpu::PoolLayout layout;
  layout.tensor_offset = {0, 400, 408};
  layout.element_bytes = {4, 2, 4};
  View gap;
  gap.count = 4;
  gap.segments = {{0, {{0, 0, 2}, {3, 10, 1}}}};
  CHECK_THROWS_AS(gpu::pool_runs(gap, layout), ExecutionError);
  View merged;
  merged.count = 4;
  merged.segments = {{0, {{2, 2, 2}}}, {0, {{0, 0, 2}}}};  // adjacent in the pool: one run
  const auto runs = gpu::pool_runs(merged, layout);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0] == gpu::PoolRun{0, 0, 4, 4});
  View other;
  other.count = 2;
  other.segments = {{1, {{0, 5, 2}}}};  // bf16 elements 5 and 6: bytes 410 and 412
  CHECK(gpu::pool_runs(other, layout) == std::vector<gpu::PoolRun>{{0, 410, 2, 2}});
  // Byte-adjacent runs of different dtypes stay two runs.
  View mixed;
  mixed.count = 6;
  mixed.segments = {{1, {{0, 0, 4}}}, {2, {{4, 0, 2}}}};
  CHECK(gpu::pool_runs(mixed, layout) == std::vector<gpu::PoolRun>{{0, 400, 4, 2}, {4, 408, 2, 4}});

  ExchangePhase phase;
  Transfer a;
  a.peer = 1;
  a.peer_rank = 1;
  a.count = 4;
  a.displacement = 0;
  a.data.count = 4;
  Transfer b = a;
  b.peer = 2;
  b.peer_rank = 2;
  b.displacement = 2;  // overlaps a
  phase.sends = {a, b};
  CHECK_THROWS_AS(gpu::phase_wire(phase, DType::bf16), ExecutionError);
  phase.sends[1].displacement = 4;
  const gpu::PhaseWire wire = gpu::phase_wire(phase, DType::bf16);
  CHECK(wire.send_bytes == 16);
  CHECK(wire.sends[1].offset == 8);
  CHECK(wire.sends[1].bytes == 8);
}

TEST_CASE("GPU layout: ops not issued stand for what the engine waits for", "[gpu-layout]") {
  // Streams 0 (compute), 1 (comm), 2 (comm_scatter). Op 2 is a send this rank passes through:
  // it completes after op 1, the op before it on its stream, so op 3 (another stream) must wait
  // for op 1. Op 4 runs every other step: when it is inactive, op 5 waits for its dep, op 0.
  StepPlan plan;
  plan.streams = {"compute", "comm", "comm_scatter"};
  auto add = [&](OpKind kind, int stream, std::vector<int> deps, int period = 1) {
    Op op;
    op.id = static_cast<int>(plan.ops.size());
    op.kind = kind;
    op.stream = stream;
    op.deps = std::move(deps);
    op.period = period;
    plan.ops.push_back(op);
  };
  add(OpKind::momentum, 0, {});
  add(OpKind::all_gather, 1, {});
  add(OpKind::send, 1, {});
  add(OpKind::unpack, 2, {2});
  add(OpKind::reduce_scatter, 1, {0}, 2);
  add(OpKind::pack, 2, {4});
  RankProgram program;
  for (const Op& op : plan.ops) {
    RankOp r;
    r.op = op.id;
    r.kind = op.kind;
    r.bystander = op.kind == OpKind::send;
    program.op_index.push_back(static_cast<int>(program.ops.size()));
    program.ops.push_back(r);
  }
  CHECK_FALSE(issued_in_step(plan, program, 2, 0));
  CHECK(wait_list(plan, program, 3, 0) == std::vector<int>{1});
  CHECK(wait_list(plan, program, 5, 0) == std::vector<int>{4});
  CHECK_FALSE(issued_in_step(plan, program, 4, 1));
  CHECK(wait_list(plan, program, 5, 1) == std::vector<int>{0});
  // Op 4 itself waits for op 0 (a dep on another stream), not for op 1 (its own stream).
  CHECK(wait_list(plan, program, 4, 0) == std::vector<int>{0});
}
