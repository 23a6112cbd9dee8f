// The CUDA handlers of one rank's program (see backends/gpu/device_rank.hpp).
#include "backends/gpu/device_rank.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "core/base/errors.hpp"
#include "kernels/newton_schulz.hpp"
#include "kernels/optimizer_math.hpp"

namespace muonbed::gpu {

void check_cuda(int code, const char* call, const char* file, int line) {
  if (code == 0) return;
  const auto status = static_cast<cudaError_t>(code);
  (void)cudaGetLastError();
  throw ExecutionError(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                       cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

namespace {

constexpr std::int64_t kAlign = kAlignElements;
std::int64_t aligned(std::int64_t e) {
  return (e + kAlign - 1) / kAlign * kAlign;
}

struct PhaseRuns {
  std::vector<RunRef> sends, recvs;
  RunRef self_source, self_target;
  PhaseWire wire;
  std::int64_t recv_offset = 0, own_offset = 0;  // bytes into the stream's staging
};

struct OpRuns {
  std::vector<std::array<RunRef, 3>> momentum;  // gradient, momentum, update
  std::vector<RunRef> ns;                       // per task
  std::vector<NsBatch> batches;
  std::vector<int> batch_version;                // the NS kernel version of each batch
  std::vector<std::array<RunRef, 2>> apply;      // result, parameter
  std::vector<std::array<RunRef, 4>> adamw;      // gradient, parameter, adam_m, adam_v
  std::vector<std::int64_t> apply_qk, adamw_qk;  // offset into the QK-clip table, -1: none
  std::vector<std::array<RunRef, 2>> copies, keep;
  std::vector<PhaseRuns> phases;
};

}  // namespace

struct DeviceRank::Impl {
  const StepPlan* plan = nullptr;
  DeviceOptions options;
  // Per plan stream: a CudaContext (stream + cuBLAS handle) where the stream runs compute ops,
  // else a plain stream (collectives need no cuBLAS handle). Both kinds block with the legacy
  // default stream, which the synchronous uploads between steps use.
  std::vector<std::unique_ptr<CudaContext>> contexts;
  std::vector<cudaStream_t> streams;
  std::vector<cudaStream_t> own_streams;  // created here, destroyed with the rank
  DeviceBuffer pool;
  DeviceBuffer tables;
  DeviceBuffer qk_table;                              // floats, rewritten by prepare_step
  DeviceBuffer adam_scalars;                          // 3 floats, rewritten by prepare_step
  std::vector<DeviceBuffer> workspaces;               // per plan stream (NS)
  std::vector<std::int64_t> scratch_at;               // per plan stream: byte offset in the pool
  std::vector<std::int64_t> scratch_len;              // fp32 elements
  std::vector<OpRuns> runs;                           // per program op
  std::vector<cudaEvent_t> done, start;               // per program op
  std::vector<std::unique_ptr<NsKernel>> ns_kernels;  // per batch: by version
  std::int64_t qk_floats = 0;
  std::vector<std::pair<const QkClipRows*, std::int64_t>> qk_tasks;  // rows and table offset
  NsConfig ns_config;
  std::vector<char> first_op_of_stream;

  std::byte* base() const { return pool.as<std::byte>(); }
  // The fp32 elements of a view that is one stretch of an fp32 tensor (RunRef::fp32_in_place).
  float* fp32_at(std::int64_t byte_offset) const {
    return reinterpret_cast<float*>(base() + byte_offset);
  }
  DeviceRuns device_runs(const RunRef& r) const {
    return {tables.as<std::int64_t>() + kRunFields * r.first, r.num_runs, r.elements};
  }
  float* scratch(int stream) const { return fp32_at(scratch_at[static_cast<std::size_t>(stream)]); }
};

namespace {

[[noreturn]] void fail(const DeviceRank& d, const RankOp& op, const std::string& what) {
  throw ExecutionError("rank " + std::to_string(d.rank()) + ", plan op " + std::to_string(op.op) +
                       " (" + std::string(to_string(op.kind)) + "): " + what);
}

}  // namespace

DeviceRank::DeviceRank(const StepPlan& plan, const RankProgram& program,
                       const DeviceOptions& options)
    : program_(&program), layout_(plan_pool(plan, program)), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.plan = &plan;
  m.options = options;
  m.ns_config = make_ns_config(plan.settings.optimizer.muon);
  const DType comm = plan.settings.comm_dtype();
  if (comm != DType::fp32 && comm != DType::bf16)
    throw ExecutionError("the GPU executors run comm_dtype fp32 and bf16, not " +
                         std::string(to_string(comm)) + "; fix: set optimizer.comm_dtype");
  const int streams = static_cast<int>(plan.streams.size());
  // Run tables, scratch per stream, QK-clip table and NS batches: everything sized before any
  // device memory is taken, so a plan that cannot run fails before its first allocation.
  RunTable table(layout_);
  m.scratch_len.assign(static_cast<std::size_t>(std::max(streams, 1)), 0);
  std::vector<std::size_t> workspace(m.scratch_len.size(), 0);
  std::map<int, std::unique_ptr<NsKernel>> kernels;
  auto kernel_for = [&](int version) -> NsKernel& {
    auto& k = kernels[version];
    if (!k) k = make_ns_kernel(version);
    return *k;
  };
  m.runs.resize(program.ops.size());
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    const RankOp& op = program.ops[i];
    OpRuns& r = m.runs[i];
    const int s = plan.ops.at(static_cast<std::size_t>(op.op)).stream;
    for (const auto& t : op.momentum)
      r.momentum.push_back({table.add(t.gradient), table.add(t.momentum), table.add(t.update)});
    for (const auto& t : op.newton_schulz) {
      r.ns.push_back(table.add(t.data));
      if (t.batch * t.rows * t.cols != t.data.count)
        fail(*this, op,
             "Newton-Schulz of " + MatrixShape{t.batch, t.rows, t.cols}.to_string() +
                 " over a view of " + std::to_string(t.data.count) + " elements");
    }
    r.batches = ns_batches(op);
    for (const NsBatch& b : r.batches) {
      const MatrixShape shape{b.batch, b.rows, b.cols};
      std::string why, why_v1;
      int version = options.ns_version;
      if (!kernel_for(version).can_implement(shape, &why)) {
        version = 1;
        if (!kernel_for(1).can_implement(shape, &why_v1))
          fail(*this, op,
               "no Newton-Schulz kernel runs " + shape.to_string() + ": v" +
                   std::to_string(options.ns_version) + ": " + why + "; v1: " + why_v1);
      }
      r.batch_version.push_back(version);
      workspace[static_cast<std::size_t>(s)] = std::max(workspace[static_cast<std::size_t>(s)],
                                                        kernel_for(version).workspace_bytes(shape));
    }
    auto qk_slot = [&](const QkClipRows& qk, std::int64_t rows_times_cols) -> std::int64_t {
      if (!qk.enabled || qk.global_rows.empty()) return -1;
      if (static_cast<std::int64_t>(qk.global_rows.size()) * qk.cols != rows_times_cols)
        fail(*this, op,
             "QK-clip of " + std::to_string(qk.global_rows.size()) + " x " +
                 std::to_string(qk.cols) + " over a view of " + std::to_string(rows_times_cols) +
                 " elements");
      const std::int64_t at = m.qk_floats;
      m.qk_tasks.emplace_back(&qk, at);
      m.qk_floats += static_cast<std::int64_t>(qk.global_rows.size());
      return at;
    };
    for (const auto& t : op.apply) {
      r.apply.push_back({table.add(t.result), table.add(t.parameter)});
      r.apply_qk.push_back(qk_slot(t.qk_clip, t.parameter.count));
    }
    for (const auto& t : op.adamw) {
      r.adamw.push_back({table.add(t.gradient), table.add(t.parameter), table.add(t.adam_m),
                         table.add(t.adam_v)});
      r.adamw_qk.push_back(qk_slot(t.qk_clip, t.parameter.count));
    }
    for (const auto& c : op.copies) r.copies.push_back({table.add(c.source), table.add(c.target)});
    for (const auto& c : op.keep) r.keep.push_back({table.add(c.source), table.add(c.target)});
    for (const ExchangePhase& p : op.phases) {
      PhaseRuns pr;
      for (const Transfer& t : p.sends) pr.sends.push_back(table.add(t.data));
      for (const Transfer& t : p.recvs) pr.recvs.push_back(table.add(t.data));
      pr.self_source = table.add(p.self_source);
      pr.self_target = table.add(p.self_target);
      pr.wire = phase_wire(p, op.wire_dtype);
      pr.recv_offset = aligned((pr.wire.send_bytes + 3) / 4) * 4;
      pr.own_offset = pr.recv_offset + aligned((pr.wire.recv_bytes + 3) / 4) * 4;
      r.phases.push_back(std::move(pr));
    }
    auto& len = m.scratch_len[static_cast<std::size_t>(s)];
    len = std::max(len, op_scratch(op).elements);
  }
  for (auto& [version, k] : kernels) {
    (void)version;
    m.ns_kernels.push_back(std::move(k));
  }
  // Pool: static | transient (the plan's tensors in their dtypes) | fp32 scratch per stream.
  std::int64_t at = layout_.bytes();
  m.scratch_at.assign(m.scratch_len.size(), 0);
  for (std::size_t s = 0; s < m.scratch_len.size(); ++s) {
    m.scratch_at[s] = at;
    at += aligned(m.scratch_len[s]) * 4;
  }
  MUONBED_GPU_CHECK(cudaSetDevice(options.device));
  {
    // Check before allocating: the whole need against what the device has free now.
    std::size_t need = static_cast<std::size_t>(std::max<std::int64_t>(at, 1)) +
                       table.data().size() * sizeof(std::int64_t) +
                       static_cast<std::size_t>(m.qk_floats) * 4;
    for (std::size_t w : workspace) need += std::max<std::size_t>(w, 256);
    std::size_t free = 0, total = 0;
    MUONBED_GPU_CHECK(cudaMemGetInfo(&free, &total));
    if (need > free) {
      auto gib = [](double b) { return std::to_string(b / (1 << 30)).substr(0, 6) + " GiB"; };
      throw ExecutionError(
          "rank " + std::to_string(program.rank) + " needs " + gib(static_cast<double>(need)) +
          " on GPU " + std::to_string(options.device) + " (in the plan's dtypes: static " +
          gib(static_cast<double>(layout_.static_bytes)) + ", buffers " +
          gib(static_cast<double>(layout_.transient_bytes)) +
          ", fp32 scratch and NS workspaces the rest) but " + gib(static_cast<double>(free)) +
          " of " + gib(static_cast<double>(total)) +
          " are free; fix: a smaller model or more GPUs");
    }
  }
  m.pool = DeviceBuffer(static_cast<std::size_t>(std::max<std::int64_t>(at, 1)));
  MUONBED_GPU_CHECK(cudaMemset(m.pool.data(), 0, m.pool.bytes()));
  if (!table.data().empty()) m.tables = to_device(table.data());
  m.qk_table = DeviceBuffer(static_cast<std::size_t>(std::max<std::int64_t>(m.qk_floats, 1)) * 4);
  m.adam_scalars = DeviceBuffer(4 * sizeof(float));
  std::vector<char> computes(m.scratch_len.size(), 0);
  for (const RankOp& op : program.ops)
    if (is_compute(op.kind))
      computes[static_cast<std::size_t>(plan.ops.at(static_cast<std::size_t>(op.op)).stream)] = 1;
  for (std::size_t s = 0; s < m.scratch_len.size(); ++s) {
    if (computes[s]) {
      m.contexts.push_back(std::make_unique<CudaContext>(options.device));
      m.streams.push_back(m.contexts.back()->stream());
    } else {
      m.contexts.push_back(nullptr);
      cudaStream_t stream = nullptr;
      MUONBED_GPU_CHECK(cudaStreamCreate(&stream));
      m.own_streams.push_back(stream);
      m.streams.push_back(stream);
    }
    m.workspaces.emplace_back(std::max<std::size_t>(workspace[s], 256));
  }
  const unsigned flags = options.time_ops ? cudaEventDefault : cudaEventDisableTiming;
  m.done.assign(program.ops.size(), nullptr);
  m.start.assign(program.ops.size(), nullptr);
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    MUONBED_GPU_CHECK(cudaEventCreateWithFlags(&m.done[i], flags));
    if (options.time_ops) MUONBED_GPU_CHECK(cudaEventCreateWithFlags(&m.start[i], flags));
  }
}

DeviceRank::~DeviceRank() {
  if (!impl_) return;
  for (cudaEvent_t e : impl_->done)
    if (e) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : impl_->start)
    if (e) (void)cudaEventDestroy(e);
  for (cudaStream_t s : impl_->own_streams) (void)cudaStreamDestroy(s);
}

std::int64_t DeviceRank::device_bytes() const {
  std::int64_t bytes = static_cast<std::int64_t>(impl_->pool.bytes() + impl_->tables.bytes() +
                                                 impl_->qk_table.bytes());
  for (const auto& w : impl_->workspaces) bytes += static_cast<std::int64_t>(w.bytes());
  return bytes;
}

CUstream_st* DeviceRank::stream(int plan_stream) const {
  return impl_->streams.at(static_cast<std::size_t>(plan_stream));
}

int DeviceRank::num_streams() const {
  return static_cast<int>(impl_->streams.size());
}

void DeviceRank::upload_static(const cpu::RankStore& store) {
  // Both sides hold each tensor in its plan dtype: its bytes travel as they are.
  for (const ProgramTensor& t : program_->tensors) {
    if (t.transient || t.numel == 0) continue;
    MUONBED_GPU_CHECK(
        cudaMemcpy(impl_->base() + layout_.tensor_offset[static_cast<std::size_t>(t.id)],
                   store.bytes(t.id), static_cast<std::size_t>(t.bytes), cudaMemcpyHostToDevice));
  }
}

void DeviceRank::upload_gradients(const cpu::RankStore& store) {
  // Exactly the pieces backends/cpu's fill_gradients writes: the rest of a gradient slot (update
  // and result pieces of the last step) stays as the device left it, as on the CPU.
  for (const ParamPieces& pieces : program_->params) {
    const PieceRef& g = pieces.gradient;
    if (!g.present()) continue;
    const std::int64_t n = g.set.numel();
    if (n == 0) continue;
    const std::int64_t width = layout_.element_bytes[static_cast<std::size_t>(g.tensor)];
    const std::int64_t at =
        layout_.tensor_offset[static_cast<std::size_t>(g.tensor)] + g.offset * width;
    MUONBED_GPU_CHECK(cudaMemcpy(impl_->base() + at, store.bytes(g.tensor) + g.offset * width,
                                 static_cast<std::size_t>(n * width), cudaMemcpyHostToDevice));
  }
}

void DeviceRank::download_static(cpu::RankStore& store) const {
  MUONBED_GPU_CHECK(cudaDeviceSynchronize());
  for (const ProgramTensor& t : program_->tensors) {
    if (t.transient || t.numel == 0) continue;
    MUONBED_GPU_CHECK(cudaMemcpy(
        store.bytes(t.id), impl_->base() + layout_.tensor_offset[static_cast<std::size_t>(t.id)],
        static_cast<std::size_t>(t.bytes), cudaMemcpyDeviceToHost));
  }
}

namespace {

constexpr double kRandomDataScale = 0.02;

// A compute context of the rank (fill_uniform_cuda queues on a CudaContext's stream), or a
// temporary one where no plan stream of this rank computes.
template <typename Fn>
void with_context(DeviceRank::Impl& m, Fn&& fn) {
  for (auto& c : m.contexts)
    if (c) return fn(*c);
  CudaContext own(m.options.device);
  fn(own);
  own.synchronize();
}

}  // namespace

void DeviceRank::fill_random_static(std::uint64_t seed) {
  Impl& m = *impl_;
  with_context(m, [&](CudaContext& ctx) {
    for (const ProgramTensor& t : program_->tensors) {
      if (t.transient || t.numel == 0) continue;
      std::byte* at = m.base() + layout_.tensor_offset[static_cast<std::size_t>(t.id)];
      const std::uint64_t stream =
          (static_cast<std::uint64_t>(rank()) << 32) + static_cast<unsigned>(t.id);
      if (t.role != PieceRole::parameter && t.role != PieceRole::gradient)
        MUONBED_GPU_CHECK(cudaMemsetAsync(at, 0, static_cast<std::size_t>(t.bytes), ctx.stream()));
      else if (t.dtype == DType::bf16)
        fill_uniform_bf16_cuda(ctx, at, t.numel, seed, stream, kRandomDataScale);
      else
        fill_uniform_cuda(ctx, reinterpret_cast<float*>(at), t.numel, seed, stream,
                          kRandomDataScale);
    }
  });
}

void DeviceRank::fill_random_gradients(std::uint64_t seed, int step) {
  Impl& m = *impl_;
  with_context(m, [&](CudaContext& ctx) {
    for (const ParamPieces& pieces : program_->params) {
      const PieceRef& g = pieces.gradient;
      if (!g.present() || g.set.numel() == 0) continue;
      const std::int64_t width = layout_.element_bytes[static_cast<std::size_t>(g.tensor)];
      const std::int64_t at =
          layout_.tensor_offset[static_cast<std::size_t>(g.tensor)] + g.offset * width;
      // A stream per (step, rank): each step's gradients are fresh, never a replay of the last.
      const std::uint64_t stream =
          (static_cast<std::uint64_t>(step + 1) << 40) + (static_cast<std::uint64_t>(rank()) << 20);
      if (width == 2)
        fill_uniform_bf16_cuda(ctx, m.base() + at, g.set.numel(), seed, stream, kRandomDataScale,
                               at / width);
      else
        fill_uniform_cuda(ctx, reinterpret_cast<float*>(m.base() + at), g.set.numel(), seed, stream,
                          kRandomDataScale, at / width);
    }
  });
}

void DeviceRank::prepare_step(std::uint64_t seed, int step) {
  Impl& m = *impl_;
  if (m.qk_floats > 0) {
    std::vector<float> scales(static_cast<std::size_t>(m.qk_floats), 1.0f);
    for (const auto& [qk, at] : m.qk_tasks) {
      const std::vector<float> rows = qk_row_scales(*qk, *m.plan, seed, step);
      std::copy(rows.begin(), rows.end(), scales.begin() + at);
    }
    // Synchronous copy on the legacy stream: ordered after the previous step's kernels, which
    // run on blocking streams (CudaContext's), and before this step's.
    MUONBED_GPU_CHECK(
        cudaMemcpy(m.qk_table.data(), scales.data(), scales.size() * 4, cudaMemcpyHostToDevice));
  }
  const AdamWStepScalars s = adamw_step_scalars(m.plan->settings.optimizer.adamw, step + 1);
  const float scalars[4] = {static_cast<float>(s.decay), static_cast<float>(s.step_size),
                            static_cast<float>(s.bias2_sqrt), 0.0f};
  MUONBED_GPU_CHECK(
      cudaMemcpy(m.adam_scalars.data(), scalars, sizeof scalars, cudaMemcpyHostToDevice));
}

void DeviceRank::begin_step(CUevent_st* start) {
  for (cudaStream_t s : impl_->streams) MUONBED_GPU_CHECK(cudaStreamWaitEvent(s, start, 0));
}

void DeviceRank::end_step(CUstream_st* join, const std::function<CUevent_st*()>& next_event) {
  for (cudaStream_t s : impl_->streams) {
    if (s == join) continue;
    cudaEvent_t e = next_event();
    MUONBED_GPU_CHECK(cudaEventRecord(e, s));
    MUONBED_GPU_CHECK(cudaStreamWaitEvent(join, e, 0));
  }
}

void DeviceRank::wait_deps(int plan_op, int step) {
  // The lowering's wait lists (core/plan/program.hpp wait_list): the engine's semantics on the
  // device (CPU-tested).
  cudaStream_t s = stream(impl_->plan->ops.at(static_cast<std::size_t>(plan_op)).stream);
  const RankOp* op = program_->find(plan_op);
  if (op == nullptr || op->stream_waits.empty()) return;
  for (int d : op->stream_waits[static_cast<std::size_t>(step) % op->stream_waits.size()])
    MUONBED_GPU_CHECK(cudaStreamWaitEvent(s, done_event(d), 0));
}

void DeviceRank::mark_start(int plan_op) {
  if (!impl_->options.time_ops) return;
  const int i = program_->op_index.at(static_cast<std::size_t>(plan_op));
  MUONBED_GPU_CHECK(
      cudaEventRecord(impl_->start[static_cast<std::size_t>(i)],
                      stream(impl_->plan->ops[static_cast<std::size_t>(plan_op)].stream)));
}

void DeviceRank::record(int plan_op) {
  const int i = program_->op_index.at(static_cast<std::size_t>(plan_op));
  MUONBED_GPU_CHECK(
      cudaEventRecord(impl_->done[static_cast<std::size_t>(i)],
                      stream(impl_->plan->ops[static_cast<std::size_t>(plan_op)].stream)));
}

CUevent_st* DeviceRank::done_event(int plan_op) const {
  return impl_->done.at(
      static_cast<std::size_t>(program_->op_index.at(static_cast<std::size_t>(plan_op))));
}

void DeviceRank::run_memory(const RankOp& op, int step) {
  if (op.kind != OpKind::alloc) return;
  const Impl& m = *impl_;
  cudaStream_t s = stream(m.plan->ops.at(static_cast<std::size_t>(op.op)).stream);
  const int i = program_->op_index.at(static_cast<std::size_t>(op.op));
  for (int release : layout_.reuse_waits.at(static_cast<std::size_t>(i))) {
    // A release inactive in this step frees nothing this step.
    if (!m.plan->active_in_step(m.plan->ops.at(static_cast<std::size_t>(release)), step)) continue;
    MUONBED_GPU_CHECK(cudaStreamWaitEvent(s, done_event(release), 0));
  }
  if (!m.options.poison) return;
  const ProgramTensor& t = program_->tensors.at(static_cast<std::size_t>(op.tensor));
  if (t.numel == 0) return;
  // 0xff bytes: NaN in fp32 and in bf16.
  MUONBED_GPU_CHECK(
      cudaMemsetAsync(impl_->base() + layout_.tensor_offset[static_cast<std::size_t>(t.id)], 0xff,
                      static_cast<std::size_t>(t.bytes), s));
}

namespace {

// Copies of views through a stream's scratch: kernels compute in fp32, the pool holds each tensor
// in its plan dtype (layout.hpp).
struct Views {
  const DeviceRank::Impl* m;
  cudaStream_t stream;
  // The view's elements contiguous in fp32: in place when it is one stretch of an fp32 tensor,
  // else gathered (widened) into `scratch`.
  float* read(const RunRef& r, float* scratch) const {
    if (r.elements == 0) return scratch;
    if (r.fp32_in_place()) return m->fp32_at(r.pool_begin);
    gather_runs_cuda(stream, m->base(), m->device_runs(r), scratch, 4);
    return scratch;
  }
  // After a kernel wrote `data` (from read): back to the pool (rounded to its dtypes) unless it
  // was in place.
  void write_back(const RunRef& r, const float* data) const {
    if (r.elements == 0 || (r.fp32_in_place() && data == m->fp32_at(r.pool_begin))) return;
    scatter_runs_cuda(stream, m->base(), m->device_runs(r), data, 4, false);
  }
  void write(const RunRef& r, const float* data) const {
    if (r.elements == 0) return;
    scatter_runs_cuda(stream, m->base(), m->device_runs(r), data, 4, false);
  }
};

}  // namespace

void DeviceRank::run_compute(const RankOp& op) {
  Impl& m = *impl_;
  const int i = program_->op_index.at(static_cast<std::size_t>(op.op));
  const OpRuns& r = m.runs[static_cast<std::size_t>(i)];
  const int s = m.plan->ops.at(static_cast<std::size_t>(op.op)).stream;
  if (!m.contexts.at(static_cast<std::size_t>(s)))
    fail(*this, op, "internal: no CUDA context on its stream");
  CudaContext& ctx = *m.contexts[static_cast<std::size_t>(s)];
  const Views v{&m, ctx.stream()};
  float* scratch = m.scratch(s);
  const OptimizerConfig& config = m.plan->settings.optimizer;
  const bool bf16 = config.comm_dtype == DType::bf16;
  switch (op.kind) {
    case OpKind::momentum: {
      const MomentumParams params = momentum_params(config.muon);
      for (const auto& [grad, buf, update] : r.momentum) {
        const std::int64_t n = grad.elements;
        if (buf.elements != n || update.elements != n)
          fail(*this, op, "momentum over views of different sizes");
        float* g = v.read(grad, scratch);
        float* b = v.read(buf, scratch + aligned(n));
        float* u = scratch + 2 * aligned(n);
        momentum_update_cuda(ctx, params, g, b, u, n);
        if (bf16) round_to_bf16_cuda(ctx.stream(), u, n);
        v.write_back(buf, b);
        v.write(update, u);
      }
      break;
    }
    case OpKind::newton_schulz:
      for (std::size_t b = 0; b < r.batches.size(); ++b) {
        const NsBatch& batch = r.batches[b];
        const MatrixShape shape{batch.batch, batch.rows, batch.cols};
        const RunRef& first = r.ns[static_cast<std::size_t>(batch.tasks.front())];
        float* x = nullptr;
        const bool in_place = batch.tasks.size() == 1 && first.fp32_in_place();
        if (in_place) {
          x = m.fp32_at(first.pool_begin);
        } else {
          std::int64_t at = 0;
          for (int t : batch.tasks) {
            const RunRef& ref = r.ns[static_cast<std::size_t>(t)];
            gather_runs_cuda(ctx.stream(), m.base(), m.device_runs(ref), scratch + at, 4);
            at += ref.elements;
          }
          x = scratch;
        }
        const int version = r.batch_version[b];
        const NsKernel* kernel = nullptr;
        for (const auto& k : m.ns_kernels)
          if (k->version() == version) kernel = k.get();
        if (kernel == nullptr) fail(*this, op, "internal: NS kernel v" + std::to_string(version));
        NsDeviceArgs args;
        args.in = x;
        args.out = x;
        args.shape = shape;
        args.config = &m.ns_config;
        args.workspace = m.workspaces[static_cast<std::size_t>(s)].data();
        args.workspace_bytes = m.workspaces[static_cast<std::size_t>(s)].bytes();
        // The kernels' output is bf16 already (NsDeviceArgs): only the identity needs rounding.
        if (!m.options.ns_identity)
          kernel->run(ctx, args);
        else if (bf16)
          round_to_bf16_cuda(ctx.stream(), x, shape.numel());
        if (!in_place) {
          std::int64_t at = 0;
          for (int t : batch.tasks) {
            const RunRef& ref = r.ns[static_cast<std::size_t>(t)];
            v.write(ref, scratch + at);
            at += ref.elements;
          }
        }
      }
      break;
    case OpKind::apply_update:
      for (std::size_t k = 0; k < r.apply.size(); ++k) {
        const auto& [result, param] = r.apply[k];
        const ApplyTask& task = op.apply[k];
        const std::int64_t n = param.elements;
        if (result.elements != n) fail(*this, op, "apply over views of different sizes");
        const float* u = v.read(result, scratch);
        float* p = v.read(param, scratch + aligned(n));
        apply_update_cuda(ctx, apply_params(config.muon, task.rows, task.cols), p, u, n);
        if (r.apply_qk[k] >= 0)
          scale_rows_cuda(ctx.stream(), p,
                          static_cast<std::int64_t>(task.qk_clip.global_rows.size()),
                          task.qk_clip.cols, m.qk_table.as<float>() + r.apply_qk[k]);
        v.write_back(param, p);
      }
      break;
    case OpKind::adamw:
      for (std::size_t k = 0; k < r.adamw.size(); ++k) {
        const auto& [grad, param, am, av] = r.adamw[k];
        const AdamwTask& task = op.adamw[k];
        const std::int64_t n = param.elements;
        if (grad.elements != n || am.elements != n || av.elements != n)
          fail(*this, op, "AdamW over views of different sizes");
        const float* g = v.read(grad, scratch);
        float* p = v.read(param, scratch + aligned(n));
        float* mm = v.read(am, scratch + 2 * aligned(n));
        float* vv = v.read(av, scratch + 3 * aligned(n));
        adamw_update_scalars_cuda(ctx, config.adamw, m.adam_scalars.as<float>(), p, g, mm, vv, n);
        if (r.adamw_qk[k] >= 0)
          scale_rows_cuda(ctx.stream(), p,
                          static_cast<std::int64_t>(task.qk_clip.global_rows.size()),
                          task.qk_clip.cols, m.qk_table.as<float>() + r.adamw_qk[k]);
        v.write_back(param, p);
        v.write_back(am, mm);
        v.write_back(av, vv);
      }
      break;
    case OpKind::pack:
    case OpKind::unpack:
      for (const auto& [source, target] : r.copies) {
        // Through scratch even when the source is one stretch: source and target may overlap.
        if (source.elements == 0) continue;
        gather_runs_cuda(ctx.stream(), m.base(), m.device_runs(source), scratch, 4);
        v.write(target, scratch);
      }
      break;
    default:
      fail(*this, op, "is not a compute op");
  }
  run_keep(op);
}

void DeviceRank::run_keep(const RankOp& op) {
  Impl& m = *impl_;
  const int i = program_->op_index.at(static_cast<std::size_t>(op.op));
  const OpRuns& r = m.runs[static_cast<std::size_t>(i)];
  if (r.keep.empty()) return;
  const int s = m.plan->ops.at(static_cast<std::size_t>(op.op)).stream;
  cudaStream_t stream = this->stream(s);
  const Views v{&m, stream};
  for (const auto& [source, target] : r.keep) {
    if (source.elements == 0) continue;
    gather_runs_cuda(stream, m.base(), m.device_runs(source), m.scratch(s), 4);
    v.write(target, m.scratch(s));
  }
}

const PhaseWire& DeviceRank::wire(const RankOp& op, int phase) const {
  const int i = program_->op_index.at(static_cast<std::size_t>(op.op));
  return impl_->runs[static_cast<std::size_t>(i)].phases.at(static_cast<std::size_t>(phase)).wire;
}

namespace {

std::byte* staging_of(const DeviceRank::Impl& m, const RankOp& op) {
  return reinterpret_cast<std::byte*>(
      m.scratch(m.plan->ops.at(static_cast<std::size_t>(op.op)).stream));
}

}  // namespace

std::byte* DeviceRank::send_data(const RankOp& op, int phase, int k) const {
  const int i = program_->op_index.at(static_cast<std::size_t>(op.op));
  const PhaseRuns& p =
      impl_->runs[static_cast<std::size_t>(i)].phases.at(static_cast<std::size_t>(phase));
  return staging_of(*impl_, op) + p.wire.sends.at(static_cast<std::size_t>(k)).offset;
}

std::byte* DeviceRank::recv_data(const RankOp& op, int phase, int k) const {
  const int i = program_->op_index.at(static_cast<std::size_t>(op.op));
  const PhaseRuns& p =
      impl_->runs[static_cast<std::size_t>(i)].phases.at(static_cast<std::size_t>(phase));
  return staging_of(*impl_, op) + p.recv_offset +
         p.wire.recvs.at(static_cast<std::size_t>(k)).offset;
}

void DeviceRank::begin_phase(const RankOp& op, int phase) {
  Impl& m = *impl_;
  const int i = program_->op_index.at(static_cast<std::size_t>(op.op));
  const PhaseRuns& p =
      m.runs[static_cast<std::size_t>(i)].phases.at(static_cast<std::size_t>(phase));
  const int width = bytes_of(op.wire_dtype);
  cudaStream_t stream = this->stream(m.plan->ops.at(static_cast<std::size_t>(op.op)).stream);
  std::byte* staging = staging_of(m, op);
  for (std::size_t k = 0; k < p.sends.size(); ++k)
    gather_runs_cuda(stream, m.base(), m.device_runs(p.sends[k]), staging + p.wire.sends[k].offset,
                     width);
  gather_runs_cuda(stream, m.base(), m.device_runs(p.self_source), staging + p.own_offset, width);
}

void DeviceRank::finish_phase(const RankOp& op, int phase) {
  Impl& m = *impl_;
  const int i = program_->op_index.at(static_cast<std::size_t>(op.op));
  const PhaseRuns& p =
      m.runs[static_cast<std::size_t>(i)].phases.at(static_cast<std::size_t>(phase));
  const ExchangePhase& ph = op.phases.at(static_cast<std::size_t>(phase));
  const int width = bytes_of(op.wire_dtype);
  cudaStream_t stream = this->stream(m.plan->ops.at(static_cast<std::size_t>(op.op)).stream);
  std::byte* staging = staging_of(m, op);
  if (p.self_target.elements != p.self_source.elements)
    fail(*this, op,
         "own part of " + std::to_string(p.self_source.elements) + " elements into " +
             std::to_string(p.self_target.elements));
  scatter_runs_cuda(stream, m.base(), m.device_runs(p.self_target), staging + p.own_offset, width,
                    false);
  for (std::size_t k = 0; k < p.recvs.size(); ++k)
    scatter_runs_cuda(stream, m.base(), m.device_runs(p.recvs[k]),
                      staging + p.recv_offset + p.wire.recvs[k].offset, width, ph.reduce);
}

std::vector<DeviceOpTime> DeviceRank::op_times(CUevent_st* step_start) const {
  std::vector<DeviceOpTime> out;
  if (!impl_->options.time_ops) return out;
  for (std::size_t i = 0; i < program_->ops.size(); ++i) {
    const RankOp& op = program_->ops[i];
    float a = 0, b = 0;
    // An op not issued this step (inactive) has events from an earlier step, or none.
    if (cudaEventQuery(impl_->start[i]) != cudaSuccess ||
        cudaEventQuery(impl_->done[i]) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (cudaEventElapsedTime(&a, step_start, impl_->start[i]) != cudaSuccess ||
        cudaEventElapsedTime(&b, step_start, impl_->done[i]) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    out.push_back({op.op, impl_->plan->ops[static_cast<std::size_t>(op.op)].stream, a, b});
  }
  return out;
}

std::string describe_device(int device) {
  std::string out;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    out += std::string(prop.name) + ", " + std::to_string(prop.totalGlobalMem >> 20) + " MiB, sm_" +
           std::to_string(prop.major) + std::to_string(prop.minor);
  } else {
    (void)cudaGetLastError();
    out += "no device";
  }
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  out += "; driver CUDA " + version(driver) + ", runtime " + version(runtime);
  int cublas = 0;
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) == CUBLAS_STATUS_SUCCESS) {
    (void)cublasGetVersion(h, &cublas);
    (void)cublasDestroy(h);
    out += ", cuBLAS " + std::to_string(cublas / 10000) + "." + std::to_string(cublas / 100 % 100) +
           "." + std::to_string(cublas % 100);
  }
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess)
    out += ", NCCL " + std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." +
           std::to_string(nccl % 100);
  return out;
}

}  // namespace muonbed::gpu
