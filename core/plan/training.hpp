// The training step around the optimizer step (issue 24): with PlanSettings::training enabled, a
// plan holds, before the optimizer, the forward and backward pass of every layer over the step's
// tokens and the parallelism's communication, as ops of the same IR every backend interprets:
//
//   forward, backward   compute ops of one part of a layer (attention, MLP or experts, the
//                       embedding, the LM head) over Op::tokens tokens per rank; FLOPs from the
//                       layer's matrices as each rank holds them after FSDP's gather (2 per
//                       element and token forward, 4 backward; routed experts by the tokens
//                       top-k routing sends them), plus attention's 4 x seq_len x the query rows
//                       per token forward (the full, non-causal count of the PaLM/Megatron MFU
//                       convention);
//   all_gather (parameter)  FSDP: each part's parameters gathered over its sharding dims but TP
//                       before its forward and again before its backward (FSDP2's
//                       reshard_after_forward), one part ahead of the compute (prefetch), into a
//                       transient buffer released after the compute;
//   all_reduce (activation) TP: the activations after attention and after the MLP, forward and
//                       backward (t x hidden, bf16);
//   all_to_all (activation) EP: the tokens to their experts and back (t x top-k x hidden);
//   all_gather (activation) CP: the keys and values of the other ranks' sequence chunks;
//   send (activation)   PP: activations to the next stage, gradients to the previous one, per
//                       micro-batch group (GPipe order: every forward, then every backward; its
//                       bubble, (p-1)/(m+p-1) of the step, is that of 1F1B too);
//   gradient sync       per layer, after its last backward (reduce-scatter over FSDP dims,
//                       all-reduce over replicas), on its own stream; level-scheduled periods
//                       apply as before.
// Micro-batches: tokens_per_step / (data-parallel degree x micro_batch_size x seq_len) of them,
// run in at most max_micro_batch_groups groups (a group's ops process its micro-batches' tokens
// at once: FSDP gathers once per group and pass, which undercounts them when groups hold several
// micro-batches; results say so). The data-parallel degree is the product of the mesh dims with
// role fsdp, replicate or ep, except a dim named cp (context parallel).
//
// overlap: none starts the optimizer once every gradient is synced; backward gives each layer its
// own momentum op after that layer's sync and runs the optimizer's units in backward order, so a
// matrix's gathers and Newton-Schulz start once its gradient is there, sharing the GPU (compute
// on two streams is processor-shared by the analytic model and the simulator) and the links with
// the rest of the backward pass.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/plan/plan.hpp"

namespace muonbed {

class PlanBuilder;

// The step's shape, checked: throws PlanError naming the option and the fix when the tokens do
// not divide into micro-batches of the mesh.
struct TrainingShape {
  std::int64_t data_parallel = 1;  // data-parallel degree
  std::int64_t context_parallel = 1;
  std::int64_t micro_batches = 1;  // per data-parallel rank
  int groups = 1;                  // micro-batch groups the plan runs
  std::int64_t hidden = 0;         // the model's hidden size (from its shapes)
  std::int64_t layers = 0;
  int stages = 1;                                // pipeline stages
  std::int64_t tokens_per_micro_batch_rank = 0;  // micro_batch_size x seq_len / cp
};
TrainingShape training_shape(const ShardedModel& model, const TrainingOptions& options);

// FLOPs of a forward or backward op on `rank` (op_flops delegates here).
double training_op_flops(const StepPlan& plan, const Op& op, int rank);
// The smallest dimension of the op's GEMMs on `rank` (tokens or a matrix dim), for the
// GEMM-efficiency curve when the profile gives no training efficiency.
double training_gemm_min_dim(const StepPlan& plan, const Op& op, int rank);

// training_op_flops and training_gemm_min_dim of a plan's forward and backward ops, computed once
// per rank for all the ops that differ only in their micro-batch or layer (same kind, tokens,
// gathered dims, and params of the same role, shape and layout in the same order): a step repeats
// its layers' GEMMs per micro-batch and per layer, and re-deriving the shards' sizes for each took
// a third of a 1,024-GPU training step's simulation (perf), and still 6 % of llama-70B's at
// 1,024 GPUs with one entry per layer. Other ops: 0.
class TrainingCosts {
 public:
  explicit TrainingCosts(const StepPlan& plan);
  double flops(const Op& op, int rank);
  double gemm_min_dim(const Op& op, int rank);

 private:
  struct Known {
    std::vector<double> flops, min_dim;  // per rank; NaN: not computed yet
  };
  Known* known(const Op& op);
  // The figure `table` keeps for (op, rank), computed by `compute` the first time.
  double remember(const Op& op, int rank, std::vector<double> Known::*table,
                  double (*compute)(const StepPlan&, const Op&, int));
  const StepPlan& plan_;
  std::vector<int> signature_;  // per op (by id): index into known_, -1 for other ops
  std::vector<Known> known_;
};

// The matrices a forward or backward op multiplies on `rank`, as the real executors run them
// (core/plan/program.hpp's TrainingGemmTask): per param of the op the rank holds (matrices and
// stacks; no embedding lookup, no vectors), its piece after the op's gathers, the activation rows
// of each matrix (the op's tokens; a routed expert's share of top-k x tokens), and for a query
// projection attention's products per sequence chunk: scores [chunk_rows x keys] over `width`
// query columns, then scores x values, the full non-causal count of training_op_flops. Forward
// runs Y = X W^T per matrix and the two attention products; backward dX = dY W, dW = dY^T X and
// the four attention gradients: twice the forward's FLOPs.
struct TrainingMatrix {
  int param = -1;
  ShardIndexSet set;  // the rank's piece (index set with the op's gathered dims)
  std::int64_t matrices = 1;
  std::int64_t rows = 0, cols = 0;       // of each matrix of the piece
  std::vector<std::int64_t> token_rows;  // activation rows, per matrix
  std::int64_t attention_chunks = 0;     // query projections: sequences of the op's tokens
  std::int64_t chunk_rows = 0;           // query rows per chunk (seq_len / cp)
  std::int64_t keys = 0;                 // keys each query attends to (seq_len)
  std::int64_t width = 0;                // query columns of the rank (its heads x head_dim)
};
std::vector<TrainingMatrix> training_matrices(const StepPlan& plan, const Op& op, int rank);

// What the training ops of a plan emitted, for the gradient sync and the optimizer after them.
struct TrainingEmission {
  // param -> the ops after which its gradient is complete on its holders (its part's last
  // backward); a rank waits only for the ones it takes part in.
  std::map<int, std::vector<int>> gradient_ready;
  std::vector<int> last_ops;  // every stage's last backward op
};
TrainingEmission emit_training(PlanBuilder& b, const TrainingOptions& options);

// Activation memory one rank keeps for the backward pass, by Korthikanti et al. (2022, "Reducing
// Activation Recomputation in Large Transformer Models", eq. 2 with tensor parallelism, no
// sequence parallelism): s x b x h x (10 + 24/t + 5 a s / (h t)) bytes per layer and micro-batch,
// without the 5 a s / (h t) score term under flash_attention (the default), times the layers of
// the rank's stage and the micro-batches 1F1B keeps in flight (min(m, p)).
std::int64_t training_activation_bytes(const ShardedModel& model, const TrainingOptions& options);

// What a plan op belongs to in the training step, for the step's breakdown.
enum class StepPhase {
  forward,
  backward,
  parameter_gather,
  activation_comm,
  gradient_sync,
  optimizer
};
inline constexpr int kStepPhases = 6;
StepPhase step_phase(const Op& op);
std::string_view to_string(StepPhase phase);
bool has_training_ops(const StepPlan& plan);

}  // namespace muonbed
