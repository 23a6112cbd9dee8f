// Host-side layout arithmetic of the GPU executors (see backends/gpu/layout.hpp).
#include "backends/gpu/layout.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "core/base/errors.hpp"
#include "core/plan/training.hpp"
#include "kernels/gpu.hpp"
#include "kernels/optimizer_math.hpp"
#include "kernels/reference_optimizer.hpp"

namespace muonbed::gpu {

namespace {

std::int64_t align(std::int64_t elements) {
  return (elements + kAlignElements - 1) / kAlignElements * kAlignElements;
}

std::int64_t align_bytes(std::int64_t bytes) {
  return (bytes + kPoolAlignBytes - 1) / kPoolAlignBytes * kPoolAlignBytes;
}

}  // namespace

void check_gpu_can_run(const StepPlan& plan) {
  if (has_training_ops(plan))
    throw ExecutionError(
        "the GPU executors do not run a training step yet (its forward and backward GEMMs run on "
        "CPU ranks only); fix: run it on backend mpi, analytic or sim, or remove the training "
        "section");
}

PoolLayout plan_pool(const StepPlan& plan, const RankProgram& program) {
  // Split Newton-Schulz has CPU handlers only (backends/cpu/handlers.hpp): refuse it before any
  // device memory is laid out, rather than run its all-reduces without its compute.
  for (const RankOp& op : program.ops)
    if (op.kind == OpKind::split_newton_schulz)
      throw ExecutionError("rank " + std::to_string(program.rank) + ": plan op " +
                           std::to_string(op.op) +
                           " is a split Newton-Schulz, which the GPU executors do not run yet; "
                           "fix: remove strategy.split_ns, or run the plan on the mpi backend");
  PoolLayout layout;
  layout.tensor_offset.assign(program.tensors.size(), -1);
  layout.element_bytes.assign(program.tensors.size(), 4);
  for (const ProgramTensor& t : program.tensors) {
    if (t.dtype != DType::fp32 && t.dtype != DType::bf16)
      throw ExecutionError("rank " + std::to_string(program.rank) + ": " + t.name + " is " +
                           std::string(to_string(t.dtype)) +
                           ", which the GPU executors do not store (fp32 and bf16 only); fix: "
                           "give the model's parameters and the optimizer state fp32 or bf16");
    layout.element_bytes[static_cast<std::size_t>(t.id)] = bytes_of(t.dtype);
    if (t.transient) continue;
    layout.tensor_offset[static_cast<std::size_t>(t.id)] = layout.static_bytes;
    layout.static_bytes += align_bytes(t.bytes);
  }
  layout.transient_begin = layout.static_bytes;

  (void)plan;
  layout.reuse_waits.assign(program.ops.size(), {});
  struct Block {
    std::int64_t begin = 0, end = 0;  // bytes, relative to transient_begin
    int release = -1;                 // program op index of its release, -1 while live
    int tensor = -1;
  };
  std::vector<Block> blocks;
  std::vector<int> block_of(program.tensors.size(), -1);
  std::int64_t live = 0;
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    const RankOp& op = program.ops[i];
    if (op.kind != OpKind::alloc && op.kind != OpKind::release) continue;
    const ProgramTensor& t = program.tensors.at(static_cast<std::size_t>(op.tensor));
    if (op.kind == OpKind::release) {
      const int b = block_of[static_cast<std::size_t>(t.id)];
      if (b < 0 || blocks[static_cast<std::size_t>(b)].release >= 0)
        throw ExecutionError("rank " + std::to_string(program.rank) + ": plan op " +
                             std::to_string(op.op) + " releases '" + t.name +
                             "', which is not allocated");
      blocks[static_cast<std::size_t>(b)].release = static_cast<int>(i);
      live -= t.bytes;
      continue;
    }
    if (block_of[static_cast<std::size_t>(t.id)] >= 0)
      throw ExecutionError("rank " + std::to_string(program.rank) + ": plan op " +
                           std::to_string(op.op) + " allocates '" + t.name + "' a second time");
    live += t.bytes;
    layout.peak_live_bytes = std::max(layout.peak_live_bytes, live);
    // Occupied: every block not released yet in plan order.
    std::vector<std::pair<std::int64_t, std::int64_t>> busy;
    for (const Block& b : blocks)
      if (b.release < 0) busy.emplace_back(b.begin, b.end);
    std::sort(busy.begin(), busy.end());
    const std::int64_t size = align_bytes(std::max<std::int64_t>(t.bytes, 1));
    std::int64_t at = 0;
    for (const auto& [begin, end] : busy) {
      if (begin >= at + size) break;  // the gap before this block fits
      at = std::max(at, align_bytes(end));
    }
    // Released blocks whose space this one reuses: their releases must be done on the device
    // first, so the alloc waits for each of them (an event wait; redundant where stream order or
    // deps already order them, which is cheaper to accept than to prove under periods and
    // pass-through ops).
    for (const Block& b : blocks) {
      if (b.release < 0 || t.bytes == 0 || b.end <= at || b.begin >= at + t.bytes) continue;
      layout.reuse_waits[i].push_back(program.ops[static_cast<std::size_t>(b.release)].op);
    }
    std::sort(layout.reuse_waits[i].begin(), layout.reuse_waits[i].end());
    layout.reuse_waits[i].erase(
        std::unique(layout.reuse_waits[i].begin(), layout.reuse_waits[i].end()),
        layout.reuse_waits[i].end());
    block_of[static_cast<std::size_t>(t.id)] = static_cast<int>(blocks.size());
    blocks.push_back({at, at + t.bytes, -1, t.id});
    layout.tensor_offset[static_cast<std::size_t>(t.id)] = layout.transient_begin + at;
    layout.transient_bytes = std::max(layout.transient_bytes, align_bytes(at + t.bytes));
  }
  return layout;
}

std::vector<PoolRun> pool_runs(const View& view, const PoolLayout& layout) {
  std::vector<PoolRun> runs;
  for (const Segment& s : view.segments) {
    const std::int64_t base = layout.tensor_offset.at(static_cast<std::size_t>(s.tensor));
    if (base < 0)
      throw ExecutionError("a view reads tensor " + std::to_string(s.tensor) +
                           ", which has no place in the pool");
    const int width = layout.element_bytes.at(static_cast<std::size_t>(s.tensor));
    for (const Run& r : s.runs)
      if (r.length > 0) runs.push_back({r.sequence, base + r.tensor * width, r.length, width});
  }
  std::sort(runs.begin(), runs.end(),
            [](const PoolRun& a, const PoolRun& b) { return a.sequence < b.sequence; });
  std::int64_t next = 0;
  std::vector<PoolRun> merged;
  for (const PoolRun& r : runs) {
    if (r.sequence != next)
      throw ExecutionError("a view's runs do not cover its " + std::to_string(view.count) +
                           " elements once (a run starts at " + std::to_string(r.sequence) +
                           ", expected " + std::to_string(next) + ")");
    const PoolRun* last = merged.empty() ? nullptr : &merged.back();
    if (last != nullptr && last->element_bytes == r.element_bytes &&
        last->pool + last->length * last->element_bytes == r.pool)
      merged.back().length += r.length;
    else
      merged.push_back(r);
    next += r.length;
  }
  if (next != view.count)
    throw ExecutionError("a view's runs cover " + std::to_string(next) + " of its " +
                         std::to_string(view.count) + " elements");
  return merged;
}

RunRef RunTable::add(const View& view) {
  const std::vector<PoolRun> runs = pool_runs(view, *layout_);
  RunRef ref;
  ref.first = static_cast<std::int64_t>(data_.size()) / kRunFields;
  ref.num_runs = static_cast<std::int64_t>(runs.size());
  ref.elements = view.count;
  ref.contiguous = runs.size() == 1;
  ref.pool_begin = runs.empty() ? 0 : runs.front().pool;
  ref.element_bytes = runs.empty() ? 4 : runs.front().element_bytes;
  for (const PoolRun& r : runs)
    data_.insert(data_.end(), {r.sequence, r.pool, r.length, std::int64_t{r.element_bytes}});
  return ref;
}

PhaseWire phase_wire(const ExchangePhase& phase, DType wire) {
  const std::int64_t width = bytes_of(wire);
  PhaseWire out;
  auto lay = [&](const std::vector<Transfer>& transfers, std::vector<WireMessage>& messages,
                 std::int64_t& total, const char* what) {
    std::set<int> peers;
    std::vector<std::pair<std::int64_t, std::int64_t>> spans;
    for (const Transfer& t : transfers) {
      if (!peers.insert(t.peer).second)
        throw ExecutionError(std::string("a phase ") + what + " group member " +
                             std::to_string(t.peer) + " twice");
      if (t.count != t.data.count)
        throw ExecutionError(std::string("a phase message ") + what + " " +
                             std::to_string(t.count) + " elements with a view of " +
                             std::to_string(t.data.count));
      messages.push_back({t.peer, t.peer_rank, t.displacement * width, t.count * width});
      spans.emplace_back(t.displacement, t.displacement + t.count);
      total = std::max(total, (t.displacement + t.count) * width);
    }
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i)
      if (spans[i].first < spans[i - 1].second)
        throw ExecutionError(std::string("messages a phase ") + what +
                             " overlap in its buffer (elements " + std::to_string(spans[i].first) +
                             " and " + std::to_string(spans[i - 1].first) + ")");
  };
  lay(phase.sends, out.sends, out.send_bytes, "sends");
  lay(phase.recvs, out.recvs, out.recv_bytes, "receives");
  out.own_bytes = phase.self_source.count * width;
  return out;
}

OpScratch op_scratch(const RankOp& op) {
  OpScratch s;
  auto need = [&](std::int64_t e) { s.elements = std::max(s.elements, e); };
  for (const auto& t : op.momentum) need(3 * align(t.gradient.count));
  for (const NsBatch& b : ns_batches(op)) {
    const std::int64_t n = b.batch * b.rows * b.cols;
    need(align(n));
    s.ns_batch_elements = std::max(s.ns_batch_elements, n);
  }
  for (const auto& t : op.apply) need(align(t.result.count) + align(t.parameter.count));
  for (const auto& t : op.adamw)
    need(align(t.gradient.count) + align(t.parameter.count) + align(t.adam_m.count) +
         align(t.adam_v.count));
  for (const auto& c : op.copies) need(align(c.source.count));
  for (const auto& c : op.keep) need(align(c.source.count));
  for (const ExchangePhase& p : op.phases) {
    const PhaseWire w = phase_wire(p, op.wire_dtype);
    auto words = [](std::int64_t bytes) { return align((bytes + 3) / 4); };
    need(words(w.send_bytes) + words(w.recv_bytes) + words(w.own_bytes));
  }
  return s;
}

std::vector<NsBatch> ns_batches(const RankOp& op) {
  std::vector<NsBatch> out;
  for (std::size_t i = 0; i < op.newton_schulz.size(); ++i) {
    const NewtonSchulzTask& t = op.newton_schulz[i];
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const NsBatch& b) { return b.rows == t.rows && b.cols == t.cols; });
    if (it == out.end()) {
      out.push_back({t.rows, t.cols, 0, {}});
      it = out.end() - 1;
    }
    it->batch += t.batch;
    it->tasks.push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<float> qk_row_scales(const QkClipRows& qk, const StepPlan& plan, std::uint64_t seed,
                                 int step) {
  std::vector<float> out(qk.global_rows.size(), 1.0f);
  if (!qk.enabled || out.empty()) return out;
  const auto& cfg = plan.settings.optimizer.qk_clip;
  const QkLogits logits = random_max_logits(qk.layer + 1, qk.query_heads, cfg.tau, seed, step + 1);
  const auto& layer = logits.per_layer.at(static_cast<std::size_t>(qk.layer));
  const std::vector<double> scales =
      qk.key ? qk_clip_head_scales(kv_group_max_logits(layer, qk.heads), cfg.tau)
             : qk_clip_head_scales(layer, cfg.tau);
  if (qk.head_dim <= 0) throw ExecutionError("qk_clip: head_dim must be > 0");
  for (std::size_t r = 0; r < out.size(); ++r) {
    const std::int64_t head = qk.global_rows[r] / qk.head_dim;
    if (head < 0 || head >= static_cast<std::int64_t>(scales.size()))
      throw ExecutionError("qk_clip: row " + std::to_string(qk.global_rows[r]) + " is in head " +
                           std::to_string(head) + " of " + std::to_string(scales.size()));
    out[r] = static_cast<float>(scales[static_cast<std::size_t>(head)]);
  }
  return out;
}

}  // namespace muonbed::gpu
