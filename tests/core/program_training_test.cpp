// Host tests of the lowering of a training step (core/plan/program.hpp's TrainingGemmTask, the
// parameter gathers and the activation collectives) on a one-layer model small enough to count
// by hand: the GEMM shapes of every forward and backward task, the FLOPs they multiply against
// op_flops' formula, where FSDP's gathers land (a buffer, never the gradient slot), and the
// per-peer element counts of the activation collectives against Op::bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "core/base/errors.hpp"
#include "core/engine/cost_model.hpp"
#include "core/model/parallelize.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/program.hpp"
#include "core/plan/strategy.hpp"
#include "core/plan/training.hpp"
#include "tests/common/hand_clusters.hpp"
#include "tests/common/strategy_matrix.hpp"
#include "tests/common/training_models.hpp"

using namespace muonbed;

namespace {

ShardedModel hand_model(const std::vector<MeshDim>& dims) {
  return testing::hand_training_model(dims);
}

StepPlan hand_plan(const std::vector<MeshDim>& dims, std::int64_t tokens, std::int64_t seq_len) {
  TrainingOptions o;
  o.enabled = true;
  o.tokens_per_step = tokens;
  o.seq_len = seq_len;
  StrategyOptions options;
  options.name = "owner";
  PlanSettings settings;
  settings.training = o;
  return build_plan(hand_model(dims), options, settings);
}

// The FLOPs a task's GEMMs multiply (2 m n k each), counted from its sizes the way the CPU
// handler runs them: per matrix X W^T (backward dX and dW), per chunk the two attention products
// (backward four).
double task_flops(const TrainingGemmTask& t, bool backward) {
  double flops = 0;
  for (std::int64_t rows : t.token_rows)
    flops += (backward ? 2 : 1) * 2.0 * static_cast<double>(rows * t.rows * t.cols);
  flops += (backward ? 4 : 2) * 2.0 *
           static_cast<double>(t.attention_chunks * t.chunk_rows * t.keys * t.width);
  return flops;
}

std::string name_of(const StepPlan& plan, int p) {
  return plan.model.params[static_cast<std::size_t>(p)].name;
}

}  // namespace

// Every plan of the strategy matrix: each topology with each strategy it can take (the strategy
// matrix says which), as a training plan and as an optimizer-only one.
template <typename Fn>
void for_each_matrix_plan(Fn&& fn) {
  for (const auto& topology : testing::topologies())
    for (const StrategyOptions& strategy : testing::strategies())
      for (const bool training : {false, true}) {
        PlanSettings settings;
        settings.training.enabled = training;
        settings.training.tokens_per_step = 4 * 64 * 4;
        settings.training.seq_len = 64;
        settings.training.experts_per_token = 2;
        StepPlan plan;
        try {
          plan = build_plan(testing::make_model(topology), strategy, settings);
        } catch (const PlanError&) {
          continue;
        }
        fn(topology, strategy, training, plan);
      }
}

TEST_CASE("FSDP training ops lower to GEMMs of the gathered matrices", "[program][training]") {
  // 2 FSDP ranks, 16 tokens of sequences of 4: 2 micro-batches per rank, 4 tokens per op.
  const StepPlan plan = hand_plan({{"dp_shard", 2, DimRole::fsdp}}, 16, 4);
  for (int rank = 0; rank < 2; ++rank) {
    const RankProgram program = lower_rank_program(plan, rank);
    int forward_ops = 0, gathers = 0;
    for (const RankOp& rop : program.ops) {
      const Op& op = plan.ops[static_cast<std::size_t>(rop.op)];
      if (op.kind == OpKind::all_gather && op.tensor == TensorRole::parameter) {
        ++gathers;
        // Each member sends its half (rows 0-3 or 4-7) of every matrix to the other, in bf16.
        REQUIRE(rop.phases.size() == 1);
        const ExchangePhase& ph = rop.phases.front();
        std::int64_t half = 0;
        for (int p : op.params) half += plan.model.params[static_cast<std::size_t>(p)].numel() / 2;
        REQUIRE(ph.sends.size() == 1);
        REQUIRE(ph.recvs.size() == 1);
        CHECK(ph.sends.front().count == half);
        CHECK(ph.recvs.front().count == half);
        CHECK(rop.wire_dtype == DType::bf16);
        // What arrives lands in the gathered buffer, never in a gradient slot.
        for (const Segment& s : ph.recvs.front().data.segments)
          CHECK(program.tensors[static_cast<std::size_t>(s.tensor)].transient);
        continue;
      }
      if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
      const bool backward = op.kind == OpKind::backward;
      forward_ops += backward ? 0 : 1;
      std::map<std::string, const TrainingGemmTask*> by_name;
      double flops = 0;
      for (const TrainingGemmTask& t : rop.training) {
        by_name[name_of(plan, t.param)] = &t;
        flops += task_flops(t, backward);
        CHECK(t.matrices == 1);
        CHECK(t.token_rows == std::vector<std::int64_t>{4});
        CHECK(t.weight.count == t.rows * t.cols);
        // After FSDP's gather the rank computes with the whole matrix, read from the buffer.
        for (const Segment& s : t.weight.segments)
          CHECK(program.tensors[static_cast<std::size_t>(s.tensor)].transient);
      }
      CHECK(flops == op_flops(plan, op, rank));
      if (by_name.count("q")) {
        // Attention: q, k, v, o whole (8 x 8); q adds one chunk of 4 queries x 4 keys x 8 wide.
        CHECK(by_name.size() == 4);
        for (const auto& [name, t] : by_name) {
          CHECK(t->rows == 8);
          CHECK(t->cols == 8);
        }
        const TrainingGemmTask& q = *by_name.at("q");
        CHECK(q.attention_chunks == 1);
        CHECK(q.chunk_rows == 4);
        CHECK(q.keys == 4);
        CHECK(q.width == 8);
        CHECK(by_name.at("k")->attention_chunks == 0);
        // 2 x 4 tokens x 256 + 4 x 4 x 4 x 8, by hand (training_test.cpp's count).
        CHECK(flops == (backward ? 2 : 1) * (2.0 * 4 * 256 + 4.0 * 4 * 4 * 8));
      } else if (by_name.count("up")) {
        CHECK(by_name.at("up")->rows == 32);
        CHECK(by_name.at("up")->cols == 8);
        CHECK(by_name.at("down")->rows == 8);
        CHECK(by_name.at("down")->cols == 32);
        CHECK(flops == (backward ? 2 : 1) * 2.0 * 4 * 512);
      } else if (by_name.count("head")) {
        CHECK(by_name.size() == 1);  // the final norm is a vector: no GEMM
        CHECK(flops == (backward ? 2 : 1) * 2.0 * 4 * 128);
      } else {
        CHECK(by_name.empty());  // the embedding is a lookup
      }
    }
    // Embedding, attention, MLP, head per micro-batch group (2 groups); a gather per part and
    // pass that FSDP shards (the norm and head part, attention, MLP, embedding).
    CHECK(forward_ops == 4 * 2);
    CHECK(gathers > 0);
  }
}

TEST_CASE("TP training ops: column and row slices, activation all-reduces of Op::bytes",
          "[program][training]") {
  const StepPlan plan = hand_plan({{"tp", 2, DimRole::tp}}, 8, 4);
  // One data-parallel rank: 8 tokens = 2 micro-batches of one sequence, 4 tokens per op.
  for (int rank = 0; rank < 2; ++rank) {
    const RankProgram program = lower_rank_program(plan, rank);
    int all_reduces = 0;
    for (const RankOp& rop : program.ops) {
      const Op& op = plan.ops[static_cast<std::size_t>(rop.op)];
      if (op.tensor == TensorRole::activation) {
        REQUIRE(op.kind == OpKind::all_reduce);
        ++all_reduces;
        // 4 tokens x hidden 8 in bf16 = 64 bytes: 32 elements, a half each way per phase.
        CHECK(op.bytes == 4 * 8 * 2);
        CHECK(rop.wire_dtype == DType::bf16);
        REQUIRE(rop.phases.size() == 2);
        for (const ExchangePhase& ph : rop.phases) {
          REQUIRE(ph.sends.size() == 1);
          REQUIRE(ph.recvs.size() == 1);
          CHECK(ph.sends.front().count == 16);
          CHECK(ph.recvs.front().count == 16);
        }
        continue;
      }
      if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
      const bool backward = op.kind == OpKind::backward;
      double flops = 0;
      for (const TrainingGemmTask& t : rop.training) {
        flops += task_flops(t, backward);
        const std::string name = name_of(plan, t.param);
        // Column-parallel q, k, v, up: half the rows; row-parallel o, down: half the columns.
        if (name == "q" || name == "k" || name == "v") CHECK((t.rows == 4 && t.cols == 8));
        if (name == "o") CHECK((t.rows == 8 && t.cols == 4));
        if (name == "up") CHECK((t.rows == 16 && t.cols == 8));
        if (name == "down") CHECK((t.rows == 8 && t.cols == 16));
        if (name == "q") CHECK((t.width == 4 && t.attention_chunks == 1));
        // No FSDP: the rank's own parameter, not a buffer.
        for (const Segment& s : t.weight.segments)
          CHECK(!program.tensors[static_cast<std::size_t>(s.tensor)].transient);
      }
      CHECK(flops == op_flops(plan, op, rank));
    }
    // After attention and after the MLP, forward and backward, in 2 micro-batch groups.
    CHECK(all_reduces == 2 * 2 * 2);
  }
}

TEST_CASE(
    "gradients are summed over data-parallel dims only; whole-matrix strategies gather TP "
    "slices",
    "[program][training][grad_sync]") {
  // FSDP 2 x TP 2. Each TP rank's backward computes its own slice of a TP-sharded weight, so a
  // sync that summed over TP would add slices of different rows (and move tp x the bytes). q is
  // column-parallel (rows split over tp): the FSDP reduce-scatter's input on a rank is its TP
  // slice, 4 x 8 = 32 elements, not the whole 64.
  const std::vector<MeshDim> dims = {{"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}};
  const ShardedModel model = hand_model(dims);
  const int tp_dim = 1;
  int q = -1;
  for (const auto& dp : model.params)
    if (dp.name == "q") q = dp.index;
  REQUIRE(q >= 0);
  for (const bool training : {false, true}) {
    for (const std::string& name : strategy_names()) {
      INFO((training ? "training step, " : "optimizer step, ") << "strategy " << name);
      StrategyOptions options;
      options.name = name;
      options.grad_sync.enabled = true;
      PlanSettings settings;
      if (training) {
        settings.training.enabled = true;
        settings.training.tokens_per_step = 16;
        settings.training.seq_len = 4;
      }
      const StepPlan plan = build_plan(model, options, settings);
      bool gathers_tp = false;
      for (const Op& op : plan.ops) {
        if (op.tensor != TensorRole::gradient) continue;
        if (op.kind == OpKind::all_gather) {
          CHECK(op.group == DimSet{}.with(tp_dim));  // slices are gathered, never summed
          gathers_tp = true;
          continue;
        }
        CHECK(!op.group.contains(tp_dim));
        if (op.kind == OpKind::reduce_scatter &&
            std::find(op.params.begin(), op.params.end(), q) != op.params.end())
          for (int rank = 0; rank < 4; ++rank)
            CHECK(plan.model.params[static_cast<std::size_t>(q)]
                      .layout.index_set(plan.mesh(), rank, op.gathered | op.group)
                      .numel() == 32);
      }
      // A strategy whose owners keep whole matrices in the gradient slot must get the other TP
      // slices from somewhere: every rank's program lowers only if each read was produced.
      bool whole = false;
      for (const Op& op : plan.ops)
        if (op.kind == OpKind::momentum && op.owned_only) whole = true;
      if (whole) CHECK(gathers_tp);
      for (int rank = 0; rank < 4; ++rank) CHECK_NOTHROW(lower_rank_program(plan, rank));
    }
  }
}

TEST_CASE("TrainingCosts prices every forward and backward op as the direct formulas do",
          "[program][training]") {
  // TrainingCosts computes once per rank for ops that differ only in their micro-batch; the
  // figures must be those of training_op_flops and training_gemm_min_dim for every op and rank,
  // on FSDP, TP, FSDP x TP and more micro-batches than ranks, asked in plan order and again.
  for (const auto& dims : std::vector<std::vector<MeshDim>>{
           {{"dp_shard", 2, DimRole::fsdp}},
           {{"tp", 2, DimRole::tp}},
           {{"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}}}) {
    const StepPlan plan = hand_plan(dims, 64, 4);
    TrainingCosts costs(plan);
    int priced = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (const Op& op : plan.ops)
        for (int rank = 0; rank < plan.mesh().world_size(); ++rank) {
          INFO(plan.mesh().describe() << ", op " << op.id << " (" << to_string(op.kind)
                                      << "), rank " << rank << ", pass " << pass);
          CHECK(costs.flops(op, rank) == training_op_flops(plan, op, rank));
          if (op.kind == OpKind::forward || op.kind == OpKind::backward) {
            CHECK(costs.gemm_min_dim(op, rank) == training_gemm_min_dim(plan, op, rank));
            ++priced;
          }
        }
    CHECK(priced > 8);  // several micro-batches of forward and backward ops per rank
  }
  // Ops of different layers share figures when their params have the same role, shape and
  // layout: the tiny models' layers on every topology of the strategy matrix, with PP (layers
  // on different stages: different layouts) and EP (routed experts, dense and expert layers).
  for (const auto& topology : testing::topologies()) {
    const ShardedModel model = testing::make_model(topology);
    TrainingOptions o;
    o.enabled = true;
    o.tokens_per_step = 4 * 64 * 4;
    o.seq_len = 64;
    o.experts_per_token = 2;
    StrategyOptions options;
    options.name = "owner";
    PlanSettings settings;
    settings.training = o;
    const StepPlan plan = build_plan(model, options, settings);
    TrainingCosts costs(plan);
    std::set<int> layers;
    for (const Op& op : plan.ops)
      for (int rank = 0; rank < plan.mesh().world_size(); ++rank) {
        INFO(topology.name << ", op " << op.id << " (" << to_string(op.kind) << "), rank " << rank);
        CHECK(costs.flops(op, rank) == training_op_flops(plan, op, rank));
        if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
        CHECK(costs.gemm_min_dim(op, rank) == training_gemm_min_dim(plan, op, rank));
        for (int p : op.params) layers.insert(plan.model.params[static_cast<std::size_t>(p)].layer);
      }
    CHECK(layers.size() >= 3);  // the embedding or head, and two layers or more
  }
}

TEST_CASE("compute_cost gives op_flops' FLOPs, and elementwise times from them and their bytes",
          "[program][training]") {
  // compute_cost counts an elementwise op's elements once for its time and its FLOPs. On every
  // compute op and rank of the strategy matrix (training and optimizer-only plans, owned-only
  // momentum, pack and unpack): FLOPs as op_flops gives them, and an elementwise op's time, with
  // no launch overhead, the larger of its FLOPs at peak and op_memory_bytes at HBM bandwidth (HBM
  // fast enough that FLOPs win for the optimizer's updates, bytes for pack and unpack).
  ClusterSpec cluster = testing::unit_cluster();
  cluster.gpu.hbm_GBps = 1e6;
  cluster.launch_overhead.kernel_us = 0;
  std::map<OpKind, int> checked;
  for_each_matrix_plan([&](const testing::Topology& topology, const StrategyOptions& strategy,
                           bool training, const StepPlan& plan) {
    TrainingCosts costs(plan);
    for (const Op& op : plan.ops) {
      if (!is_compute(op.kind) || is_memory(op.kind)) continue;
      for (const int rank : op.ranks.ranks(plan.mesh())) {
        INFO(topology.name << ", " << strategy.name << (training ? ", training" : "") << ", op "
                           << op.id << " (" << to_string(op.kind) << "), rank " << rank);
        const ComputeCost cost = compute_cost(plan, op, rank, cluster, &costs);
        const double flops = op_flops(plan, op, rank);
        CHECK(cost.flops == flops);
        CHECK(compute_cost(plan, op, rank, cluster, &costs, false).seconds == cost.seconds);
        const bool elementwise = op.kind == OpKind::momentum || op.kind == OpKind::apply_update ||
                                 op.kind == OpKind::adamw || op.kind == OpKind::pack ||
                                 op.kind == OpKind::unpack;
        if (!elementwise) continue;
        const double at_peak = flops > 0 ? flops / (cluster.gpu.peak_tflops * 1e12) : 0.0;
        CHECK(cost.seconds ==
              std::max(at_peak, op_memory_bytes(plan, op, rank) / (cluster.gpu.hbm_GBps * 1e9)));
        ++checked[op.kind];
      }
    }
  });
  CHECK(checked[OpKind::momentum] > 100);
  CHECK(checked[OpKind::apply_update] > 100);
  CHECK(checked[OpKind::adamw] > 100);
  CHECK(checked[OpKind::pack] + checked[OpKind::unpack] > 10);
}

TEST_CASE("PieceBytes sizes every collective's pieces as piece_bytes does", "[program][training]") {
  // PieceBytes keeps answers per op signature and rank: the pieces of ops that differ only in
  // their micro-batch group are sized once. Every op and rank must still get piece_bytes' figure
  // (asked in plan order and again), on FSDP, TP, FSDP x TP and more micro-batches than ranks.
  for (const auto& dims : std::vector<std::vector<MeshDim>>{
           {{"dp_shard", 2, DimRole::fsdp}},
           {{"tp", 2, DimRole::tp}},
           {{"dp_shard", 2, DimRole::fsdp}, {"tp", 2, DimRole::tp}}}) {
    const StepPlan plan = hand_plan(dims, 64, 4);
    PieceBytes pieces(plan);
    int sized = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t k = 0; k < plan.ops.size(); ++k) {
        const Op& op = plan.ops[k];
        if (!is_collective(op.kind)) continue;
        for (int rank = 0; rank < plan.mesh().world_size(); ++rank) {
          INFO(plan.mesh().describe() << ", op " << k << " (" << to_string(op.kind) << "), rank "
                                      << rank << ", pass " << pass);
          CHECK(pieces(static_cast<int>(k), rank) == piece_bytes(plan, op, rank));
          ++sized;
        }
      }
    CHECK(sized > 8);
  }
  // Ops of different layers share figures when their params have the same layout, dtype and
  // owner: every topology and strategy of the strategy matrix (owned-only gathers, whose bytes
  // depend on the owner; PP stages; EP), in training plans and optimizer-only ones.
  int owned_only = 0;
  for_each_matrix_plan([&](const testing::Topology& topology, const StrategyOptions& strategy,
                           bool training, const StepPlan& plan) {
    PieceBytes pieces(plan);
    for (std::size_t k = 0; k < plan.ops.size(); ++k) {
      const Op& op = plan.ops[k];
      if (!is_collective(op.kind)) continue;
      owned_only += op.owned_only ? 1 : 0;
      for (int rank = 0; rank < plan.mesh().world_size(); ++rank) {
        INFO(topology.name << ", " << strategy.name << (training ? ", training" : "") << ", op "
                           << k << " (" << to_string(op.kind) << "), rank " << rank);
        CHECK(pieces(static_cast<int>(k), rank) == piece_bytes(plan, op, rank));
      }
    }
  });
  CHECK(owned_only > 10);
}
