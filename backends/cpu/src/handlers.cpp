// CPU handlers of rank-program ops (see backends/cpu/handlers.hpp).
#include "backends/cpu/handlers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backends/cpu/data.hpp"
#include "core/base/errors.hpp"
#include "kernels/bf16.hpp"
#include "kernels/optimizer_math.hpp"
#include "kernels/progress.hpp"

namespace muonbed::cpu {

namespace {

// An elementwise update over n elements in slices, with a progress point (kernels/progress.hpp)
// before each slice after the first: a rank that progresses its messages from this thread keeps
// serving its peers during a long update. Exact: every element sees the same scalars.
template <typename Fn>
void in_slices(std::size_t n, Fn&& fn) {
  const auto total = static_cast<std::int64_t>(n);
  for (std::int64_t at = 0; at < total; at += kProgressSliceElements) {
    if (at > 0) progress_point();
    fn(at, std::min<std::int64_t>(kProgressSliceElements, total - at));
  }
}

[[noreturn]] void fail(const RankStore& store, const RankOp& op, const StepContext* context,
                       const std::string& what) {
  std::string label;
  if (context && context->plan && op.op >= 0 && op.op < static_cast<int>(context->plan->ops.size()))
    label = " '" + context->plan->ops[op.op].label + "'";
  throw ExecutionError("rank " + std::to_string(store.rank()) + ", plan op " +
                       std::to_string(op.op) + " (" + std::string(to_string(op.kind)) + label +
                       "): " + what);
}

void round_to(DType dtype, std::vector<float>& values) {
  if (dtype == DType::bf16) round_to_bf16(values.data(), static_cast<std::int64_t>(values.size()));
}

void copy(RankStore& store, const LocalCopy& c) {
  const std::vector<float> values = store.read(c.source);  // all read before anything is written
  store.write(c.target, values.data());
}

void qk_clip(const QkClipRows& qk, std::vector<float>& values, const StepContext& context) {
  if (!qk.enabled || values.empty()) return;
  const auto& cfg = context.plan->settings.optimizer.qk_clip;
  const QkLogits logits =
      random_max_logits(qk.layer + 1, qk.query_heads, cfg.tau, context.seed, context.step + 1);
  const auto& layer = logits.per_layer.at(static_cast<std::size_t>(qk.layer));
  const std::vector<double> scales =
      qk.key ? qk_clip_head_scales(kv_group_max_logits(layer, qk.heads), cfg.tau)
             : qk_clip_head_scales(layer, cfg.tau);
  qk_clip_rows(values.data(), static_cast<std::int64_t>(qk.global_rows.size()), qk.cols,
               qk.head_dim, scales, qk.global_rows.data());
}

// Scratch of the training step's GEMMs, per thread (a rank's streams compute at once): a seeded
// pool every operand but the weights reads (activations and their gradients: values of a fixed
// hash in [-1, 1], so no operand is denormal and the fp32 sums stay small), and two output pools.
struct TrainingScratch {
  std::vector<float> seeded, first, second;
};

float* grown(std::vector<float>& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
  return v.data();
}

const float* seeded(TrainingScratch& s, std::int64_t n) {
  const auto had = static_cast<std::int64_t>(s.seeded.size());
  if (had < n) {
    s.seeded.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = had; i < n; ++i) {
      const std::uint64_t h = (static_cast<std::uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull;
      s.seeded[static_cast<std::size_t>(i)] =
          static_cast<float>(static_cast<double>((h >> 40) % 2001) / 1000.0 - 1.0);
    }
  }
  return s.seeded.data();
}

// A rank on progress points (backends/mpi) tests its messages only between kernels, so a partner
// waiting on it for a collective waits out the kernel it runs: the vocabulary head's products
// (~0.5 GFLOP at mpi_training's shapes, 5 ms on one core) held the FSDP gathers that long, which
// a GPU's communication engine, running beside its compute, does not. Longer products run as
// blocks of at most this many FLOPs (about 1 ms at 0.1 TFLOP/s), with a progress point after
// each; the shorter ones stay whole, since small blocks run slower (16-MFLOP blocks made the
// forward and backward a third slower; experiments/BENCHMARKS.md, issue 24).
constexpr double kMaxFlopsBetweenProgress = 128e6;

// forward / backward: Y = X W^T per matrix (backward: dX = dY W and dW = dY^T X) and a query
// projection's attention products per sequence chunk (TrainingGemmTask; FLOPs counted as run).
void run_training(const RankOp& op, RankStore& store, const StepContext& context) {
  thread_local TrainingScratch scratch;
  const bool backward = op.kind == OpKind::backward;
  const auto gemm = [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                        const float* a, const float* b, float* c) {
    if (m <= 0 || n <= 0 || k <= 0) return;
    const double flops =
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    if (context.gemm_flops != nullptr) *context.gemm_flops += flops;
    // Blocks along C's longer side, a progress point after each: see kMaxFlopsBetweenProgress.
    const auto blocks = static_cast<std::int64_t>(std::ceil(flops / kMaxFlopsBetweenProgress));
    const std::int64_t side = std::max(m, n), parts = std::clamp<std::int64_t>(blocks, 1, side);
    for (std::int64_t p = 0; p < parts; ++p) {
      const std::int64_t from = side * p / parts, to = side * (p + 1) / parts;
      if (m >= n)
        cpu_gemm_block(ta, tb, m, n, k, a, b, c, from, to - from, 0, n);
      else
        cpu_gemm_block(ta, tb, m, n, k, a, b, c, 0, m, from, to - from);
      progress_point();
    }
  };
  thread_local std::vector<float> copied;  // reused: no allocation per product
  for (const TrainingGemmTask& t : op.training) {
    const std::int64_t per = t.rows * t.cols;
    if (t.weight.count != t.matrices * per)
      fail(store, op, &context,
           "weights of " + std::to_string(t.weight.count) + " elements, expected " +
               std::to_string(t.matrices) + " x " + std::to_string(t.rows) + " x " +
               std::to_string(t.cols));
    // The piece in place when it is one run of an fp32 tensor (a gathered buffer's slot, the
    // parameter itself); a bf16 tensor (the plan's dtype) is widened into a copy.
    const float* w = nullptr;
    const bool one_run = t.weight.segments.size() == 1 && t.weight.segments[0].runs.size() == 1;
    if (one_run && store.program().tensors.at(t.weight.segments[0].tensor).dtype == DType::fp32) {
      w = store.fp32_data(t.weight.segments[0].tensor) + t.weight.segments[0].runs[0].tensor;
    } else {
      copied.resize(static_cast<std::size_t>(t.weight.count));
      store.read(t.weight, copied.data());
      w = copied.data();
    }
    for (std::int64_t e = 0; e < t.matrices; ++e) {
      const std::int64_t m = t.token_rows.at(static_cast<std::size_t>(e));
      const float* we = w + e * per;
      const float* in = seeded(scratch, m * std::max(t.rows, t.cols));
      if (!backward) {
        gemm(false, true, m, t.rows, t.cols, in, we, grown(scratch.first, m * t.rows));
      } else {
        gemm(false, false, m, t.cols, t.rows, in, we, grown(scratch.first, m * t.cols));
        gemm(true, false, t.rows, t.cols, m, in, in, grown(scratch.second, per));
      }
    }
    // Attention of one chunk: scores S [q, keys] = Q K^T, output O = S V; backward
    // dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q.
    const std::int64_t q = t.chunk_rows, keys = t.keys, width = t.width;
    for (std::int64_t c = 0; c < t.attention_chunks; ++c) {
      const float* in = seeded(scratch, std::max(q, keys) * std::max(width, keys));
      float* scores = grown(scratch.first, q * keys);
      float* out = grown(scratch.second, std::max(q, keys) * width);
      if (!backward) {
        gemm(false, true, q, keys, width, in, in, scores);
        gemm(false, false, q, width, keys, scores, in, out);
      } else {
        gemm(false, true, q, keys, width, in, in, scores);
        gemm(true, false, keys, width, q, in, in, out);
        gemm(false, false, q, width, keys, scores, in, out);
        gemm(true, false, keys, width, q, scores, in, out);
      }
    }
  }
}

}  // namespace

StepContext make_step_context(const StepPlan& plan, std::uint64_t seed, int step) {
  StepContext c;
  c.plan = &plan;
  c.seed = seed;
  c.step = step;
  c.ns = make_ns_config(plan.settings.optimizer.muon);
  return c;
}

void check_can_run(const StepPlan& plan) {
  const DType comm = plan.settings.comm_dtype();
  if (comm != DType::fp32 && comm != DType::bf16)
    throw ExecutionError("the CPU executors emulate comm_dtype fp32 and bf16, not " +
                         std::string(to_string(comm)) + "; fix: set optimizer.comm_dtype");
  const DType state = plan.settings.state_dtype;
  if (state != DType::fp32 && state != DType::bf16)
    throw ExecutionError("the CPU executors store optimizer state in fp32 or bf16, not " +
                         std::string(to_string(state)) + "; fix: set the plan's state_dtype");
  for (const auto& dp : plan.model.params)
    if (dp.dtype != DType::fp32 && dp.dtype != DType::bf16)
      throw ExecutionError("parameter '" + dp.name + "' is " + std::string(to_string(dp.dtype)) +
                           ", which the CPU executors do not store (fp32 and bf16 only); fix: "
                           "give the model's parameters dtype fp32 or bf16");
}

void run_compute(const RankOp& op, RankStore& store, const StepContext& context) {
  const StepPlan& plan = *context.plan;
  const OptimizerConfig& config = plan.settings.optimizer;
  const DType comm = config.comm_dtype;
  switch (op.kind) {
    case OpKind::momentum: {
      const MomentumParams params = momentum_params(config.muon);
      for (const auto& t : op.momentum) {
        progress_point();
        std::vector<float> grad = store.read(t.gradient);
        std::vector<float> buf = store.read(t.momentum);
        std::vector<float> update(grad.size());
        in_slices(grad.size(), [&](std::int64_t at, std::int64_t count) {
          momentum_update(params, grad.data() + at, buf.data() + at, update.data() + at, count);
        });
        round_to(comm, update);  // the update moves, and is orthogonalized, in the comm dtype
        store.write(t.momentum, buf.data());
        store.write(t.update, update.data());
      }
      break;
    }
    case OpKind::newton_schulz:
      for (const auto& t : op.newton_schulz) {
        std::vector<float> x = store.read(t.data);
        const MatrixShape shape{t.batch, t.rows, t.cols};
        if (shape.numel() != static_cast<std::int64_t>(x.size()))
          fail(store, op, &context,
               "Newton-Schulz of " + shape.to_string() + " got " + std::to_string(x.size()) +
                   " elements");
        newton_schulz(x.data(), x.data(), shape, context.ns, NsPrecision::fp32);
        round_to(comm, x);
        store.write(t.data, x.data());
      }
      break;
    case OpKind::apply_update:
      for (const auto& t : op.apply) {
        progress_point();
        const std::vector<float> result = store.read(t.result);
        std::vector<float> param = store.read(t.parameter);
        const ApplyParams scalars = apply_params(config.muon, t.rows, t.cols);
        in_slices(param.size(), [&](std::int64_t at, std::int64_t count) {
          apply_update(scalars, param.data() + at, result.data() + at, count);
        });
        qk_clip(t.qk_clip, param, context);
        store.write(t.parameter, param.data());
      }
      break;
    case OpKind::adamw:
      for (const auto& t : op.adamw) {
        progress_point();
        const std::vector<float> grad = store.read(t.gradient);
        std::vector<float> param = store.read(t.parameter);
        std::vector<float> m = store.read(t.adam_m);
        std::vector<float> v = store.read(t.adam_v);
        in_slices(param.size(), [&](std::int64_t at, std::int64_t count) {
          adamw_update(config.adamw, context.step + 1, param.data() + at, grad.data() + at,
                       m.data() + at, v.data() + at, count);
        });
        qk_clip(t.qk_clip, param, context);
        store.write(t.parameter, param.data());
        store.write(t.adam_m, m.data());
        store.write(t.adam_v, v.data());
      }
      break;
    case OpKind::pack:
    case OpKind::unpack:
      for (const auto& c : op.copies) copy(store, c);
      break;
    case OpKind::forward:
    case OpKind::backward:
      run_training(op, store, context);
      break;
    default:
      fail(store, op, &context, "is not a compute op");
  }
  run_keep(op, store);
}

int split_ns_rounds(const StepContext& context) {
  return context.ns.num_steps() + 1;
}

std::size_t split_ns_phase(int round, int index) {
  return static_cast<std::size_t>((round == 0 ? 0 : 2) + index);
}

DType split_ns_wire(const RankOp& op, int round) {
  return round == 0 ? DType::fp32 : op.wire_dtype;  // norms in fp32, Grams in the comm dtype
}

namespace {

// The slice [part, gram] of rows <-> its wide orientation [gram, part].
void transpose_into(const float* in, float* out, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) out[j * rows + i] = in[i * cols + j];
}

void write_partial_grams(const SplitNsState& state, const RankOp& op, RankStore& store) {
  float* ws = store.fp32_data(op.tensor);
  for (std::size_t k = 0; k < op.split_ns.size(); ++k) {
    const SplitNsTask& t = op.split_ns[k];
    split_ns_gram(state.x[k].data(), t.gram, t.part, ws + t.gram_offset);
  }
}

}  // namespace

SplitNsState split_ns_begin(const RankOp& op, RankStore& store, const StepContext& context) {
  if (op.kind != OpKind::split_newton_schulz || op.tensor < 0)
    fail(store, op, &context, "is not a lowered split Newton-Schulz op");
  if (context.ns.num_steps() != context.plan->ops.at(op.op).ns_steps)
    fail(store, op, &context,
         "the plan op runs " + std::to_string(context.plan->ops.at(op.op).ns_steps) +
             " NS steps but the optimizer " + std::to_string(context.ns.num_steps()));
  store.allocate(op.tensor);
  float* ws = store.fp32_data(op.tensor);
  SplitNsState state;
  for (const SplitNsTask& t : op.split_ns) {
    const std::vector<float> slice = store.read(t.data);
    if (static_cast<std::int64_t>(slice.size()) != t.gram * t.part)
      fail(store, op, &context,
           "split slice of " + std::to_string(slice.size()) + " elements, expected " +
               std::to_string(t.gram) + " x " + std::to_string(t.part));
    std::vector<float> x(slice.size());
    if (t.rows)
      transpose_into(slice.data(), x.data(), t.part, t.gram);
    else
      x = slice;
    double sum_squares = 0.0;  // fp64, as newton_schulz accumulates the norm
    for (float v : x) sum_squares += static_cast<double>(v) * static_cast<double>(v);
    ws[t.norm_offset] = static_cast<float>(sum_squares);
    state.x.push_back(std::move(x));
  }
  return state;
}

void split_ns_after_round(SplitNsState& state, int round, const RankOp& op, RankStore& store,
                          const StepContext& context) {
  float* ws = store.fp32_data(op.tensor);
  const int steps = context.ns.num_steps();
  if (round == 0) {
    for (std::size_t k = 0; k < op.split_ns.size(); ++k) {
      const double norm = std::sqrt(static_cast<double>(ws[op.split_ns[k].norm_offset]));
      const float scale = static_cast<float>(1.0 / (norm * context.ns.norm_scale + context.ns.eps));
      for (float& v : state.x[k]) v *= scale;
    }
  } else {
    std::int64_t grams = 0;
    for (const SplitNsTask& t : op.split_ns)
      grams = std::max(grams, t.gram_offset + t.gram * t.gram);
    if (op.wire_dtype == DType::bf16) round_to_bf16(ws, grams);
    for (std::size_t k = 0; k < op.split_ns.size(); ++k) {
      const SplitNsTask& t = op.split_ns[k];
      split_ns_step(state.x[k].data(), t.gram, t.part, ws + t.gram_offset,
                    context.ns.steps.at(static_cast<std::size_t>(round - 1)));
    }
  }
  if (round < steps) {
    write_partial_grams(state, op, store);
    return;
  }
  const DType comm = context.plan->settings.comm_dtype();
  for (std::size_t k = 0; k < op.split_ns.size(); ++k) {
    const SplitNsTask& t = op.split_ns[k];
    std::vector<float> out(state.x[k].size());
    if (t.rows)
      transpose_into(state.x[k].data(), out.data(), t.gram, t.part);
    else
      out = state.x[k];
    round_to(comm, out);
    store.write(t.data, out.data());
  }
  store.release(op.tensor);
  run_keep(op, store);
}

void run_keep(const RankOp& op, RankStore& store) {
  for (const auto& c : op.keep) copy(store, c);
}

std::vector<std::byte> encode(const float* values, std::int64_t count, DType wire) {
  std::vector<std::byte> bytes(static_cast<std::size_t>(count * bytes_of(wire)));
  encode_into(values, count, wire, bytes.data());
  return bytes;
}

void encode_into(const float* values, std::int64_t count, DType wire, std::byte* out) {
  if (count == 0) return;  // (memcpy with the null pointers of empty buffers is undefined)
  if (wire == DType::fp32) {
    std::memcpy(out, values, static_cast<std::size_t>(count) * 4);
  } else if (wire == DType::bf16) {
    for (std::int64_t i = 0; i < count; ++i) {
      const std::uint16_t b = float_to_bf16_bits(values[i]);
      std::memcpy(out + 2 * i, &b, 2);
    }
  } else {
    throw ExecutionError("wire dtype " + std::string(to_string(wire)) + " is not emulated");
  }
}

void decode(std::span<const std::byte> bytes, DType wire, float* values, std::int64_t count) {
  if (static_cast<std::int64_t>(bytes.size()) != count * bytes_of(wire))
    throw ExecutionError("a message of " + std::to_string(bytes.size()) + " bytes where " +
                         std::to_string(count) + " " + std::string(to_string(wire)) +
                         " elements were expected");
  if (count == 0) return;
  if (wire == DType::fp32) {
    std::memcpy(values, bytes.data(), bytes.size());
  } else {
    for (std::int64_t i = 0; i < count; ++i) {
      std::uint16_t b = 0;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      values[i] = bf16_bits_to_float(b);
    }
  }
}

namespace {

// The own part does not travel, but it is what a message would carry: in the wire dtype.
std::vector<float> own_part(const RankStore& store, const ExchangePhase& phase, DType wire) {
  const std::int64_t count = phase.self_source.count;
  std::vector<std::byte> bytes(static_cast<std::size_t>(count * bytes_of(wire)));
  store.read_wire(phase.self_source, wire, bytes.data());
  std::vector<float> own(static_cast<std::size_t>(count));
  decode(bytes, wire, own.data(), count);
  return own;
}

void check_received(const RankStore& store, const ExchangePhase& phase,
                    const std::vector<std::span<const std::byte>>& received) {
  if (received.size() != phase.recvs.size())
    throw ExecutionError("rank " + std::to_string(store.rank()) + ": " +
                         std::to_string(received.size()) + " messages for " +
                         std::to_string(phase.recvs.size()) + " receives");
}

// The received messages into the store: added in fp32 (a reduction), or their bits written.
void take_received(RankStore& store, const ExchangePhase& phase, DType wire,
                   const std::vector<std::span<const std::byte>>& received) {
  thread_local std::vector<float> values;
  for (std::size_t i = 0; i < phase.recvs.size(); ++i) {
    const Transfer& t = phase.recvs[i];
    if (phase.reduce) {
      values.resize(static_cast<std::size_t>(t.count));
      decode(received[i], wire, values.data(), t.count);
      store.accumulate(t.data, values.data());
      continue;
    }
    if (static_cast<std::int64_t>(received[i].size()) != t.count * bytes_of(wire))
      throw ExecutionError("a message of " + std::to_string(received[i].size()) + " bytes where " +
                           std::to_string(t.count) + " " + std::string(to_string(wire)) +
                           " elements were expected");
    store.write_wire(t.data, wire, received[i].data());
  }
}

}  // namespace

PhaseMessages begin_phase(const RankStore& store, const ExchangePhase& phase, DType wire) {
  PhaseMessages out;
  out.sends.reserve(phase.sends.size());
  for (const Transfer& t : phase.sends) {
    std::vector<std::byte> bytes(static_cast<std::size_t>(t.count * bytes_of(wire)));
    store.read_wire(t.data, wire, bytes.data());
    out.sends.push_back(std::move(bytes));
  }
  out.own = own_part(store, phase, wire);
  return out;
}

void begin_phase_packed(const RankStore& store, const ExchangePhase& phase, DType wire,
                        bool first_send_only, PackedPhase& out) {
  const std::int64_t width = bytes_of(wire);
  const std::size_t sends =
      first_send_only ? std::min<std::size_t>(1, phase.sends.size()) : phase.sends.size();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < sends; ++i)
    total = std::max(total, phase.sends[i].displacement + phase.sends[i].count);
  out.sends.resize(static_cast<std::size_t>(total * width));
  for (std::size_t i = 0; i < sends; ++i) {
    const Transfer& t = phase.sends[i];
    store.read_wire(t.data, wire, out.sends.data() + t.displacement * width);
  }
  out.own.resize(static_cast<std::size_t>(phase.self_source.count * width));
  store.read_wire(phase.self_source, wire, out.own.data());
}

PackedPhase begin_phase_packed(const RankStore& store, const ExchangePhase& phase, DType wire,
                               bool first_send_only) {
  PackedPhase out;
  begin_phase_packed(store, phase, wire, first_send_only, out);
  return out;
}

void finish_phase(RankStore& store, const ExchangePhase& phase, DType wire,
                  const std::vector<float>& own,
                  const std::vector<std::span<const std::byte>>& received) {
  check_received(store, phase, received);
  store.write(phase.self_target, own.data());
  take_received(store, phase, wire, received);
}

void finish_phase(RankStore& store, const ExchangePhase& phase, DType wire, const PackedPhase& mine,
                  const std::vector<std::span<const std::byte>>& received) {
  check_received(store, phase, received);
  store.write_wire(phase.self_target, wire, mine.own.data());
  take_received(store, phase, wire, received);
}

void finish_phase(RankStore& store, const ExchangePhase& phase, DType wire,
                  const PhaseMessages& mine,
                  const std::vector<const std::vector<std::byte>*>& received) {
  std::vector<std::span<const std::byte>> views;
  views.reserve(received.size());
  for (const std::vector<std::byte>* m : received) views.emplace_back(m->data(), m->size());
  finish_phase(store, phase, wire, mine.own, views);
}

}  // namespace muonbed::cpu
