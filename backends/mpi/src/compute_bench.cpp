// The compute half of `muonbed calibrate` on MPI ranks (backends/mpi/measure.hpp): every rank
// runs the CPU handlers of backends/cpu (what the executor's compute threads run) on the
// synthetic plan of core/results/calibration.hpp's compute_bench_plan, one rank at a time (the
// others wait in a barrier, as a rank's idle threads wait in a step) or all ranks at once. Per
// kernel and round the slowest rank's mean call counts; each row is the median over rounds. Then,
// per Newton-Schulz shape and with every rank at once, the host cost of messages (rows "host_comm":
// Newton-Schulz while a MessageStream exchanges messages with a partner).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "backends/cpu/data.hpp"
#include "backends/cpu/handlers.hpp"
#include "backends/cpu/store.hpp"
#include "backends/mpi/executor.hpp"
#include "backends/mpi/measure.hpp"
#include "core/base/errors.hpp"
#include "core/plan/program.hpp"
#include "kernels/newton_schulz.hpp"
#include "kernels/progress.hpp"

namespace muonbed::mpi {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sizes of the host-comm benchmark's messages, each way: the range of a step's per-matrix pieces
// (the validation plans move 36 KiB..350 KiB per piece, a training step's FSDP gathers 0.4..2 MiB
// per layer at mpi_training's shapes), so that both the cost per message and the cost per byte
// show (a line through the extra time per exchange against its bytes). Up to 256 KiB alone, the
// messages stayed in cache and the line's slope was a third below what 1-4 MiB messages cost.
constexpr std::int64_t kHostCommMessageBytes[] = {16 * 1024, 64 * 1024, 256 * 1024, 1024 * 1024,
                                                  4096 * 1024};

// One exchange at a time with a partner rank (an MPI_Isend and an MPI_Irecv of `bytes` in the
// wire dtype), packed from and unpacked into a RankStore's tensors of the plan's parameter dtype
// by the executor's own message path (RankStore::read_wire / write_wire: the stored bits copied
// where the dtypes match, converted where they differ), advanced only by progress(): what a rank
// in the executor's progress_points mode does for its messages. Both partners make exactly
// `budget` exchanges (drain() finishes them untimed), so they match.
class MessageStream {
 public:
  MessageStream(MPI_Comm world, int partner, DType storage, DType wire, std::int64_t bytes,
                int budget)
      : world_(world),
        partner_(partner),
        wire_(wire),
        budget_(budget),
        program_(program_of(storage, bytes / bytes_of(wire))),
        store_(program_),
        out_wire_(static_cast<std::size_t>(bytes)),
        in_wire_(static_cast<std::size_t>(bytes)) {
    const std::int64_t count = bytes / bytes_of(wire);
    out_view_ = whole(0, count);
    in_view_ = whole(1, count);
    const std::vector<float> half(static_cast<std::size_t>(count), 0.5f);
    store_.write(out_view_, half.data());
  }

  void start() { post(); }

  // Completes the exchange in flight if MPI has finished it, then posts the next one.
  void progress() {
    if (completed_ == posted_) return;
    int done = 0;
    MUONBED_MPI_CHECK(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE));
    if (!done) return;
    finish();
    ++exchanges_done_;
    if (posted_ < budget_) post();
  }

  void drain(double timeout_s, const std::string& where) {
    while (completed_ < posted_) {
      wait_for(requests_[0], timeout_s, where, "a host-comm benchmark send", WaitMode::spin);
      wait_for(requests_[1], timeout_s, where, "a host-comm benchmark receive", WaitMode::spin);
      finish();
      if (posted_ < budget_) post();
    }
  }

  int exchanges_done() const { return exchanges_done_; }

 private:
  // Two static tensors of `count` elements: 0 sends, 1 receives.
  static RankProgram program_of(DType storage, std::int64_t count) {
    RankProgram p;
    for (int id = 0; id < 2; ++id) {
      ProgramTensor t;
      t.id = id;
      t.name = id == 0 ? "host-comm send" : "host-comm receive";
      t.dtype = storage;
      t.numel = count;
      t.bytes = count * bytes_of(storage);
      p.tensors.push_back(t);
    }
    return p;
  }
  static View whole(int tensor, std::int64_t count) {
    View v;
    v.count = count;
    v.segments.push_back({tensor, {{0, 0, count}}});
    return v;
  }
  void post() {
    store_.read_wire(out_view_, wire_, out_wire_.data());
    const int n = static_cast<int>(out_wire_.size());
    MUONBED_MPI_CHECK(
        MPI_Irecv(in_wire_.data(), n, MPI_BYTE, partner_, kTag, world_, &requests_[1]));
    MUONBED_MPI_CHECK(
        MPI_Isend(out_wire_.data(), n, MPI_BYTE, partner_, kTag, world_, &requests_[0]));
    ++posted_;
  }
  void finish() {
    store_.write_wire(in_view_, wire_, in_wire_.data());
    ++completed_;
  }

  static constexpr int kTag = 7301;
  MPI_Comm world_;
  int partner_;
  DType wire_;
  int budget_;
  int posted_ = 0, completed_ = 0, exchanges_done_ = 0;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  RankProgram program_;
  cpu::RankStore store_;
  View out_view_, in_view_;
  std::vector<std::byte> out_wire_, in_wire_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::vector<ComputeBenchRow> compute_bench(const std::vector<StepPlan>& plans, MPI_Comm world,
                                           int warmup, int repeats, double timeout_s,
                                           bool concurrent, bool newton_schulz_only) {
  int rank = 0, size = 1;
  MUONBED_MPI_CHECK(MPI_Comm_rank(world, &rank));
  MUONBED_MPI_CHECK(MPI_Comm_size(world, &size));
  retain_freed_memory();  // as the executor runs its steps
  const std::string where = "rank " + std::to_string(rank) + ", compute benchmark";
  const auto barrier = [&] {
    MPI_Request request = MPI_REQUEST_NULL;
    MUONBED_MPI_CHECK(MPI_Ibarrier(world, &request));
    wait_for(request, timeout_s, where, "a barrier");
  };
  // The number of back-to-back calls each rank times, agreed on (the largest any rank wants).
  const auto agree = [&](int calls) {
    int out = calls;
    MPI_Request request = MPI_REQUEST_NULL;
    MUONBED_MPI_CHECK(MPI_Iallreduce(&calls, &out, 1, MPI_INT, MPI_MAX, world, &request));
    wait_for(request, timeout_s, where, "agreeing on a call count");
    return out;
  };
  constexpr int kKernels = 5;  // momentum, newton_schulz, apply_update, gemm, pack
  const char* names[kKernels] = {"momentum", "newton_schulz", "apply_update", "gemm", "pack"};
  constexpr int kElementwise = 3;  // momentum, apply_update, adamw
  const char* elementwise_names[kElementwise] = {"momentum", "apply_update", "adamw"};
  // Each timed round calls a kernel back to back for at least kRoundSeconds and reports the mean
  // call: on a shared machine a lone short call is either undisturbed or pays a whole scheduler
  // slice of another task, while a step's many calls pay their share of the machine, which is
  // what a mean over back-to-back calls measures (nccl-tests times its -n iterations so too).
  constexpr double kRoundSeconds = 0.03;
  // mine[plan][kernel][repeat]
  std::vector<double> mine;
  // A plan of compute_bench_plan (3 ops) times the kernels above; one of elementwise_bench_plan
  // (4 ops) times momentum, apply_update and adamw at a step's size.
  const auto elementwise_plan = [](const StepPlan& plan) { return plan.ops.size() == 4; };
  for (const StepPlan& plan : plans) {
    if (plan.ops.size() != 3 && !elementwise_plan(plan))
      throw ExecutionError(
          "internal: a compute benchmark plan has 3 ops (compute_bench_plan) or 4 "
          "(elementwise_bench_plan)");
    const bool elementwise = elementwise_plan(plan);
    const RankProgram program = lower_rank_program(plan, rank);
    cpu::RankStore store(program);
    cpu::fill_parameters(plan, program, store, 1);
    cpu::fill_gradients(plan, program, store, 1, 0);
    const cpu::StepContext context = cpu::make_step_context(plan, 1, 0);
    const DistributedParam& p = plan.model.params.front();
    const std::int64_t rows = std::min(p.rows(), p.cols()), cols = std::max(p.rows(), p.cols());
    std::vector<float> x(static_cast<std::size_t>(rows * cols), 0.5f);
    std::vector<float> c(static_cast<std::size_t>(rows * rows));
    std::vector<float> values(static_cast<std::size_t>(p.numel()), 0.25f);
    std::vector<std::byte> wire(static_cast<std::size_t>(p.numel() * 2));
    const auto call = [&](int kernel) {
      if (elementwise)  // momentum, apply_update, adamw: ops 0, 2, 3
        cpu::run_compute(*program.find(kernel == 0 ? 0 : kernel + 1), store, context);
      else if (kernel < 3)
        cpu::run_compute(*program.find(kernel), store, context);
      else if (kernel == 3)
        cpu_gemm_abt(rows, rows, cols, x.data(), x.data(), c.data());
      else
        cpu::encode_into(values.data(), p.numel(), DType::bf16, wire.data());
    };
    std::vector<double> times(static_cast<std::size_t>(kKernels * repeats));
    for (int j = 0; j < (elementwise ? kElementwise : kKernels); ++j) {
      if (newton_schulz_only && (elementwise || j != 1)) continue;
      // Warm-up calls, the first of them timed to size the rounds.
      barrier();
      auto t0 = Clock::now();
      call(j);
      const double first = std::max(1e-7, since(t0));
      for (int k = 1; k < warmup; ++k) call(j);
      const int calls =
          agree(static_cast<int>(std::clamp(std::ceil(kRoundSeconds / first), 1.0, 10000.0)));
      for (int k = 0; k < repeats; ++k) {
        // Concurrent: every rank at once. Alone: the ranks take turns, the others waiting in
        // the barrier (sleeping), so each rank has a core to itself.
        for (int turn = 0; turn < (concurrent ? 1 : size); ++turn) {
          barrier();
          if (!concurrent && turn != rank) continue;
          t0 = Clock::now();
          for (int i = 0; i < calls; ++i) call(j);
          times[static_cast<std::size_t>(j * repeats + k)] = since(t0) / calls;
        }
      }
    }
    mine.insert(mine.end(), times.begin(), times.end());
  }
  // Host cost of messages (-> gpu.host_comm_us_per_message and host_comm_ns_per_byte), per
  // Newton-Schulz plan and message size, every rank at once: the Newton-Schulz back to back,
  // quiet, then while a MessageStream with the partner (rank ^ 1) advances at the kernel's
  // progress points. Per rank and round, (streamed - quiet) per exchange completed; the median
  // round, then the largest over ranks.
  const int partner = (rank ^ 1) < size ? (rank ^ 1) : -1;
  std::vector<double> host;  // per Newton-Schulz plan and size: extra seconds per exchange
  for (const StepPlan& plan : plans) {
    if (elementwise_plan(plan) || newton_schulz_only) continue;
    const RankProgram program = lower_rank_program(plan, rank);
    cpu::RankStore store(program);
    cpu::fill_parameters(plan, program, store, 1);
    cpu::fill_gradients(plan, program, store, 1, 0);
    const cpu::StepContext context = cpu::make_step_context(plan, 1, 0);
    const RankOp& ns = *program.find(1);
    barrier();
    auto t0 = Clock::now();
    cpu::run_compute(ns, store, context);
    const int calls = agree(static_cast<int>(
        std::clamp(std::ceil(kRoundSeconds / std::max(1e-7, since(t0))), 1.0, 1000.0)));
    // Each progress point finishes at most one exchange: the budget never runs out while timed.
    const int points =
        3 * context.ns.num_steps() * static_cast<int>(plan.model.params.front().batch());
    const int budget = std::min(calls * points + 2, 4096);
    for (const std::int64_t message : kHostCommMessageBytes) {
      std::vector<double> per_exchange;
      for (int k = 0; k < repeats; ++k) {
        barrier();
        t0 = Clock::now();
        for (int i = 0; i < calls; ++i) cpu::run_compute(ns, store, context);
        const double quiet = since(t0);
        barrier();
        if (partner < 0) continue;
        MessageStream stream(world, partner, plan.model.params.front().dtype,
                             plan.settings.comm_dtype(), message, budget);
        stream.start();
        double streamed = 0;
        {
          ScopedProgressHook hook([](void* s) { static_cast<MessageStream*>(s)->progress(); },
                                  &stream);
          t0 = Clock::now();
          for (int i = 0; i < calls; ++i) cpu::run_compute(ns, store, context);
          streamed = since(t0);
        }
        stream.drain(timeout_s, where);
        if (stream.exchanges_done() > 0)
          per_exchange.push_back((streamed - quiet) / stream.exchanges_done());
      }
      host.push_back(per_exchange.empty() ? -1e9 : median(per_exchange));
    }
  }
  std::vector<double> host_max(host.size());
  {
    MPI_Request request = MPI_REQUEST_NULL;
    MUONBED_MPI_CHECK(MPI_Ireduce(host.data(), host_max.data(), static_cast<int>(host.size()),
                                  MPI_DOUBLE, MPI_MAX, 0, world, &request));
    wait_for(request, timeout_s, where, "reducing the host-comm timings");
  }

  std::vector<double> slowest(mine.size());
  MPI_Request request = MPI_REQUEST_NULL;
  MUONBED_MPI_CHECK(MPI_Ireduce(mine.data(), slowest.data(), static_cast<int>(mine.size()),
                                MPI_DOUBLE, MPI_MAX, 0, world, &request));
  wait_for(request, timeout_s, where, "reducing the timings");
  if (rank != 0) return {};
  std::vector<ComputeBenchRow> rows;
  std::size_t at = 0;
  for (const StepPlan& plan : plans) {
    const DistributedParam& p = plan.model.params.front();
    const NsCallShape shape{p.batch(), p.rows(), p.cols()};
    if (elementwise_plan(plan)) {
      for (int j = 0; j < (newton_schulz_only ? 0 : kElementwise); ++j) {
        const std::size_t first = at + static_cast<std::size_t>(j * repeats);
        std::vector<double> v(slowest.begin() + static_cast<std::ptrdiff_t>(first),
                              slowest.begin() + static_cast<std::ptrdiff_t>(first + repeats));
        ComputeBenchRow r;
        r.kernel = elementwise_names[j];
        r.numel = p.numel();
        r.seconds = median(v);
        r.model_bytes = op_memory_bytes(plan, plan.ops[j == 0 ? 0 : j + 1], 0);
        r.step_sized = true;
        rows.push_back(r);
      }
      at += static_cast<std::size_t>(kKernels * repeats);  // the plan's slots (see `times`)
      continue;
    }
    for (int j = 0; j < kKernels; ++j) {
      std::vector<double> v(slowest.begin() + static_cast<std::ptrdiff_t>(at),
                            slowest.begin() + static_cast<std::ptrdiff_t>(at + repeats));
      at += static_cast<std::size_t>(repeats);
      if (newton_schulz_only && j != 1) continue;
      ComputeBenchRow r;
      r.kernel = names[j];
      r.shape = shape;
      r.numel = p.numel();
      r.seconds = median(v);
      const std::int64_t m = std::min(p.rows(), p.cols()), n = std::max(p.rows(), p.cols());
      if (j == 0 || j == 2) r.model_bytes = op_memory_bytes(plan, plan.ops[j], 0);
      if (j == 1) r.flops = op_flops(plan, plan.ops[1], 0);
      if (j == 3) {
        r.flops = 2.0 * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(n);
        r.shape = {1, m, n};
        r.numel = m * n;
      }
      if (j == 4) r.model_bytes = static_cast<double>(p.numel()) * (4 + 2);
      rows.push_back(r);
    }
  }
  std::size_t h = 0;
  for (const StepPlan& plan : plans) {
    if (elementwise_plan(plan) || newton_schulz_only) continue;
    const DistributedParam& p = plan.model.params.front();
    for (const std::int64_t message : kHostCommMessageBytes) {
      const double extra = host_max[h++];
      if (extra < -1e8) continue;  // no rank had a partner
      ComputeBenchRow r;
      r.kernel = "host_comm";
      r.shape = {p.batch(), p.rows(), p.cols()};
      r.numel = p.numel();
      r.model_bytes = 2.0 * static_cast<double>(message);  // sent + received per exchange
      r.seconds = extra;                                   // extra seconds per exchange
      rows.push_back(r);
    }
  }
  return rows;
}

double time_newton_schulz(const StepPlan& probe_plan, MPI_Comm world, double timeout_s) {
  // Two warm-up calls and three rounds: the probe runs twice per measured point, so it is kept
  // to a fraction of a second, and the median of three rounds already drops one disturbed round.
  const std::vector<ComputeBenchRow> rows =
      compute_bench({probe_plan}, world, 2, 3, timeout_s, false, true);
  return rows.empty() ? 0 : rows.front().seconds;
}

}  // namespace muonbed::mpi
