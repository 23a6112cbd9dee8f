// The Open MPI executor of one rank (see backends/mpi/executor.hpp): communicators, the engine's
// op handler (compute on worker threads, collectives as nonblocking MPI calls), the main loop that
// tests requests and takes compute completions, the watchdog and fault injection.
#include "backends/mpi/executor.hpp"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>

#include "backends/cpu/data.hpp"
#include "backends/cpu/handlers.hpp"
#include "core/base/errors.hpp"
#include "core/engine/engine.hpp"
#include "kernels/progress.hpp"

namespace muonbed::mpi {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// A message that already names the rank, step and op: passed on as it is.
using Located = LocatedError;

// CPU time of the calling thread: the executor's own cost, which ranks sharing cores (or a busy
// machine) would inflate in wall time.
double thread_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Adds the calling thread's CPU time between construction and destruction to `total`.
class CpuTimed {
 public:
  explicit CpuTimed(double& total) : total_(total), start_(thread_cpu()) {}
  ~CpuTimed() { total_ += thread_cpu() - start_; }
  CpuTimed(const CpuTimed&) = delete;
  CpuTimed& operator=(const CpuTimed&) = delete;

 private:
  double& total_;
  double start_;
};

// Adds the wall time between construction and destruction to `total`.
class WallTimed {
 public:
  explicit WallTimed(double& total) : total_(total), start_(Clock::now()) {}
  ~WallTimed() { total_ += seconds(Clock::now() - start_); }
  WallTimed(const WallTimed&) = delete;
  WallTimed& operator=(const WallTimed&) = delete;

 private:
  double& total_;
  Clock::time_point start_;
};

std::byte g_dummy{};  // a valid buffer address for empty MPI buffers

std::byte* data_or_dummy(std::vector<std::byte>& v) {
  return v.empty() ? &g_dummy : v.data();
}

// Freed memory stays with the process, as a caching allocator keeps GPU memory: after the warm-up
// steps no step pays page faults for its messages, buffers and temporaries (in a VM a page fault
// costs microseconds: packing a step's messages took 31 ms with glibc's defaults, 1.9 ms so).
void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum: larger blocks are still mmapped
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

// nccl-tests' -c for the transport: in a check step every message carries a known pattern,
// element k of sender s's message being (37 s + k) mod 251, exact in fp32 and bf16 (integers
// below 256), and every receiver counts the elements that differ from it (#wrong).
float check_value(int sender, std::int64_t k) {
  return static_cast<float>((37 * static_cast<std::int64_t>(sender) + k) % 251);
}

void write_check_pattern(int sender, std::int64_t count, DType wire, std::byte* out) {
  std::vector<float> values(static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k)
    values[static_cast<std::size_t>(k)] = check_value(sender, k);
  cpu::encode_into(values.data(), count, wire, out);
}

std::int64_t count_wrong(int sender, std::span<const std::byte> bytes, DType wire,
                         std::int64_t count) {
  std::vector<float> values(static_cast<std::size_t>(count));
  cpu::decode(bytes, wire, values.data(), count);
  std::int64_t wrong = 0;
  for (std::int64_t k = 0; k < count; ++k)
    if (values[static_cast<std::size_t>(k)] != check_value(sender, k)) ++wrong;
  return wrong;
}

// How a collective's phase travels (see the header comment).
enum class Call { alltoallv, gatherv, scatterv, bcast, allgatherv, p2p, barrier };

Call call_for(OpKind kind, std::size_t phase, bool generic) {
  switch (kind) {
    case OpKind::send:
    case OpKind::recv:
      return Call::p2p;
    case OpKind::barrier:
      return Call::barrier;
    default:
      break;
  }
  if (generic) return Call::alltoallv;
  switch (kind) {
    case OpKind::gather:
      return Call::gatherv;
    case OpKind::scatter:
      return Call::scatterv;
    case OpKind::broadcast:
      return Call::bcast;
    case OpKind::all_gather:
      return Call::allgatherv;
    case OpKind::all_reduce:
      return phase == 0 ? Call::alltoallv : Call::allgatherv;
    case OpKind::split_newton_schulz:  // all-reduces: phases 0-1 (norms), 2-3 (Grams)
      return phase % 2 == 0 ? Call::alltoallv : Call::allgatherv;
    default:  // all_to_all, reduce_scatter
      return Call::alltoallv;
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------

class Executor::Impl final : public OpHandler {
 public:
  Impl(const StepPlan& plan, MPI_Comm world, ExecutorOptions options)
      : plan_(plan), options_(std::move(options)), world_(world), index_(plan) {
    MUONBED_MPI_CHECK(MPI_Comm_rank(world_, &rank_));
    MUONBED_MPI_CHECK(MPI_Comm_size(world_, &size_));
    if (size_ != index_.world_size())
      throw ExecutionError("this MPI world has " + std::to_string(size_) +
                           " ranks but the plan's " + "mesh (" + plan.mesh().describe() +
                           ") needs " + std::to_string(index_.world_size()) + "; fix: start " +
                           std::to_string(index_.world_size()) + " ranks (mpirun -np " +
                           std::to_string(index_.world_size()) + ")");
    cpu::check_can_run(plan_);
    keep_freed_memory();
    program_ = lower_rank_program(plan_, rank_, options_.lower);
    if (options_.edit_program) options_.edit_program(program_);
    store_ = std::make_unique<cpu::RankStore>(program_);
    cpu::fill_parameters(plan_, program_, *store_, options_.seed);
    find_hosts();
    split_communicators();
    engine_ = std::make_unique<Engine>(index_, *this, std::vector<int>{rank_});
    mode_ = resolve_compute_mode();
    if (mode_ == ComputeMode::threads)
      start_workers();  // last: nothing after it may throw (a thrown constructor joins no thread)
  }

  ~Impl() override {
    for (auto& w : workers_) {
      if (!w) continue;
      {
        std::lock_guard<std::mutex> lock(w->m);
        w->stop = true;
      }
      w->cv.notify_one();
      if (w->thread.joinable()) w->thread.join();
    }
    for (MPI_Comm& comm : comms_)
      if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }

  void run_step(int step) {
    step_ = step;
    current_op_ = -1;
    cpu::fill_gradients(plan_, program_, *store_, options_.seed, step);
    context_ = cpu::make_step_context(plan_, options_.seed, step);
    gemm_flops_ = 0;
    context_.gemm_flops = &gemm_flops_;
    timings_ = StepTimings{};
    timings_.step = step;
    hang_op_ = -1;
    computing_ = 0;
    try {
      barrier();
      t0_ = Clock::now();
      last_progress_ = t0_;
      engine_work([&] { engine_->begin_step(step); });
      auto spin_until = t0_;
      int sleep_us = 0;
      while (!engine_->step_done()) {
        bool progressed = run_pending_compute();
        progressed = take_compute_completions() || progressed;
        progressed = test_collectives() || progressed;
        const auto now = Clock::now();
        if (progressed) {
          last_progress_ = now;
          // A compute thread of this rank needs the core: no spinning while it runs.
          if (computing_ == 0) spin_until = now + std::chrono::microseconds(50);
          sleep_us = 0;
          continue;
        }
        check_watchdog(now);
        if (active_.empty()) {
          idle_wait(std::chrono::milliseconds(5));  // only a compute completion can come
        } else if (computing_ == 0 && idle_mode_ == WaitMode::spin) {
          continue;  // the core is this rank's and idle: MPI progresses only while we test
        } else if (now >= spin_until) {
          sleep_us = std::min(std::max(2 * sleep_us, 5), std::max(1, options_.max_poll_sleep_us));
          idle_wait(std::chrono::microseconds(sleep_us));
        }
      }
      timings_.gemm_flops = gemm_flops_;
    } catch (const Located&) {
      throw;
    } catch (const std::exception& e) {
      throw Located(where(current_op_) + ": " + e.what());
    }
  }

  void run_check_step(int step) {
    check_pass_ = true;
    try {
      run_step(step);
    } catch (...) {
      check_pass_ = false;
      throw;
    }
    check_pass_ = false;
  }

  // "rank R, step S, op O ('label')"
  std::string where(int op) const {
    std::string out = "rank " + std::to_string(rank_) + ", step " + std::to_string(step_);
    if (op >= 0 && op < static_cast<int>(plan_.ops.size()))
      out += ", op " + std::to_string(op) + " ('" + plan_.ops[op].label + "')";
    return out;
  }

  // OpHandler ---------------------------------------------------------------------------------

  void reached(int /*rank*/, int op) override {
    current_op_ = op;
    const launch::Fault& f = options_.fault;
    if (!f.active() || f.rank != rank_ || f.step != step_ || f.op != op) return;
    switch (f.kind) {
      case launch::FaultKind::exit:
        std::cerr << "muonbed: error: " << where(op)
                  << ": fault injection: this rank exits with code 3 without finalizing MPI"
                  << std::endl;
        std::fflush(stderr);
        std::_Exit(3);
      case launch::FaultKind::raise:
        throw ExecutionError("fault injection: this rank throws");
      case launch::FaultKind::hang:
        hang_op_ = op;  // start_compute / start_collective never start it
        break;
      case launch::FaultKind::none:
        break;
    }
  }

  void memory(int /*rank*/, int op) override {
    current_op_ = op;
    CpuTimed t(timings_.handlers_s);
    const RankOp& rop = rank_op(op);
    if (rop.kind == OpKind::alloc)
      store_->allocate(rop.tensor);
    else
      store_->release(rop.tensor);
  }

  void start_compute(int /*rank*/, int op) override {
    current_op_ = op;
    ++computing_;
    if (op == hang_op_) return;
    const RankOp& rop = rank_op(op);
    if (options_.inline_compute) {
      ComputeDone done;
      done.op = op;
      done.start = now_s();
      cpu::run_compute(rop, *store_, context_);
      done.end = now_s();
      std::lock_guard<std::mutex> lock(done_m_);
      done_.push_back(std::move(done));
      return;
    }
    if (mode_ == ComputeMode::progress_points) {
      pending_.push_back(op);  // run by the main loop, outside the engine's call
      return;
    }
    Worker& w = *workers_.at(static_cast<std::size_t>(index_.stream(op)));
    {
      std::lock_guard<std::mutex> lock(w.m);
      if (w.has_job) throw ExecutionError("internal: two compute ops at once on one stream");
      w.has_job = true;
      w.op = op;
      w.rop = &rop;
    }
    w.cv.notify_one();
  }

  void start_collective(const CollectiveInstance& instance) override {
    const int op = instance.op;
    current_op_ = op;
    if (op == hang_op_) return;
    std::unique_ptr<Active> a = take_active();
    a->instance = instance.id;
    a->op = op;
    a->rop = &rank_op(op);
    a->start = now_s();
    a->wire = a->rop->wire_dtype;
    if (a->rop->kind == OpKind::split_newton_schulz) {
      // Its compute runs here, between its all-reduces, on this thread (cpu/handlers.hpp).
      CpuTimed t(timings_.handlers_s);
      a->split = cpu::split_ns_begin(*a->rop, *store_, context_);
      a->round = 0;
      a->phase = cpu::split_ns_phase(0, 0);
      a->wire = cpu::split_ns_wire(*a->rop, 0);
    }
    if (a->rop->phases.empty() && plan_.ops[op].kind != OpKind::barrier) {
      complete(*a);  // nothing to exchange
      recycle(std::move(a));
      return;
    }
    post(*a);
    active_.push_back(std::move(a));
  }

  void rank_done(int /*rank*/) override { timings_.finish = now_s(); }

  // Accessors --------------------------------------------------------------------------------

  const StepTimings& timings() const { return timings_; }
  int rank() const { return rank_; }
  const RankProgram& program() const { return program_; }
  const cpu::RankStore& store() const { return *store_; }
  const std::vector<int>& host_of() const { return host_of_; }
  const std::vector<std::string>& hosts() const { return hosts_; }
  ComputeMode compute_mode() const { return mode_; }
  int compute_threads() const {
    int n = 0;
    for (const auto& w : workers_) n += w ? 1 : 0;
    return n;
  }

 private:
  struct Worker {
    std::thread thread;
    std::mutex m;
    std::condition_variable cv;
    bool has_job = false;
    bool stop = false;
    int op = -1;
    const RankOp* rop = nullptr;
  };
  struct ComputeDone {
    int op = -1;
    double start = 0, end = 0;
    std::string error;
  };
  // A collective instance in flight on this rank.
  struct Active {
    int instance = -1;
    int op = -1;
    const RankOp* rop = nullptr;
    std::size_t phase = 0;
    DType wire = DType::fp32;  // of this phase
    // split_newton_schulz: the round of all-reduces and the member's state between them.
    int round = -1;
    std::optional<cpu::SplitNsState> split;
    double start = 0;
    MPI_Request request = MPI_REQUEST_NULL;
    cpu::PackedPhase packed;
    std::vector<std::byte> recv;
    std::vector<std::size_t> recv_offsets;  // per phase.recvs entry, bytes into recv
    std::vector<int> send_counts, send_displs, recv_counts, recv_displs;  // live until done
  };

  double now_s() const { return seconds(Clock::now() - t0_); }

  const RankOp& rank_op(int op) const {
    const RankOp* r = program_.find(op);
    if (r == nullptr) throw ExecutionError("this rank has no part in the op");
    return *r;
  }

  // ---- setup

  void find_hosts() {
    HostMap map = exchange_hosts(world_);
    host_of_ = std::move(map.host_of);
    hosts_ = std::move(map.hosts);
    // A rank spins on MPI only when every rank of its host has a core: oversubscribed, a spinning
    // rank would take the core of the peer it waits for.
    const auto neighbours = std::count(host_of_.begin(), host_of_.end(), host_of_[rank_]);
    idle_mode_ = neighbours <= launch::available_cores() ? WaitMode::spin : WaitMode::sleep;
  }

  // One communicator per (stream, group dims) of the plan's collectives: the lowering's splits
  // (RankProgram::splits), called in their one order on every rank, color = the group instance's
  // leader, key = the position in the group, so a communicator's MPI ranks are the program's
  // group indices.
  void split_communicators() {
    comms_.assign(program_.communicators.size(), MPI_COMM_NULL);
    for (const CommunicatorSplit& s : program_.splits) {
      MPI_Comm comm = MPI_COMM_NULL;
      MUONBED_MPI_CHECK(
          MPI_Comm_split(world_, s.color < 0 ? MPI_UNDEFINED : s.color, s.key, &comm));
      if (s.color < 0) continue;
      comms_.at(static_cast<std::size_t>(s.communicator)) = comm;
      int n = 0, me = 0;
      MUONBED_MPI_CHECK(MPI_Comm_size(comm, &n));
      MUONBED_MPI_CHECK(MPI_Comm_rank(comm, &me));
      const Communicator& c = program_.communicators.at(static_cast<std::size_t>(s.communicator));
      if (n != static_cast<int>(c.members.size()) || me != s.key)
        throw ExecutionError("internal: communicator of stream " + std::to_string(s.stream) +
                             " has " + std::to_string(n) + " ranks, rank " + std::to_string(me) +
                             "; the plan's group has " + std::to_string(c.members.size()));
    }
  }

  void start_workers() {
    workers_.resize(static_cast<std::size_t>(index_.num_streams()));
    for (const Op& op : plan_.ops) {
      auto& w = workers_[static_cast<std::size_t>(op.stream)];
      if (index_.op_class(op.id) != OpClass::compute || w) continue;
      w = std::make_unique<Worker>();
      Worker* worker = w.get();
      w->thread = std::thread([this, worker] { worker_loop(*worker); });
    }
  }

  void worker_loop(Worker& w) {
    std::unique_lock<std::mutex> lock(w.m);
    while (true) {
      w.cv.wait(lock, [&] { return w.stop || w.has_job; });
      if (w.stop) return;
      const RankOp* rop = w.rop;
      ComputeDone done;
      done.op = w.op;
      lock.unlock();
      done.start = now_s();
      try {
        cpu::run_compute(*rop, *store_, context_);
      } catch (const std::exception& e) {
        done.error = e.what();
      } catch (...) {
        done.error = "unknown exception";
      }
      done.end = now_s();
      lock.lock();
      w.has_job = false;
      {
        std::lock_guard<std::mutex> g(done_m_);
        done_.push_back(std::move(done));
      }
      done_cv_.notify_one();
    }
  }

  // ---- the step loop

  void barrier() {
    MPI_Request request = MPI_REQUEST_NULL;
    MUONBED_MPI_CHECK(MPI_Ibarrier(world_, &request));
    wait_for(request, options_.timeout_s, where(-1), "the barrier before the step", idle_mode_);
  }

  void idle_wait(Clock::duration d) {
    WallTimed t(timings_.idle_s);
    std::unique_lock<std::mutex> lock(done_m_);
    if (done_.empty()) done_cv_.wait_for(lock, d);
  }

  // The engine's own work (and what it calls): its CPU time, less the handlers' and MPI's inside.
  template <typename Fn>
  void engine_work(Fn&& fn) {
    const double nested = timings_.handlers_s + timings_.mpi_s;
    const double start = thread_cpu();
    fn();
    timings_.engine_s += thread_cpu() - start - (timings_.handlers_s + timings_.mpi_s - nested);
  }

  ComputeMode resolve_compute_mode() const {
    if (options_.compute_mode != ComputeMode::automatic) return options_.compute_mode;
    std::set<int> compute_streams;
    for (const Op& op : plan_.ops)
      if (index_.op_class(op.id) == OpClass::compute) compute_streams.insert(op.stream);
    const auto neighbours = std::count(host_of_.begin(), host_of_.end(), host_of_[rank_]);
    const auto threads = neighbours * (1 + static_cast<long>(compute_streams.size()));
    return threads <= launch::available_cores() ? ComputeMode::threads
                                                : ComputeMode::progress_points;
  }

  // progress_points: runs the next compute op the engine started on this thread, testing the
  // outstanding requests at every progress point of its kernels (which may finish collectives,
  // post new ones and queue further compute ops, never run them: one compute at a time).
  bool run_pending_compute() {
    if (pending_.empty()) return false;
    const int op = pending_.front();
    pending_.pop_front();
    current_op_ = op;
    ComputeDone done;
    done.op = op;
    done.start = now_s();
    {
      ScopedProgressHook hook([](void* self) { static_cast<Impl*>(self)->test_collectives(); },
                              this);
      cpu::run_compute(rank_op(op), *store_, context_);
    }
    done.end = now_s();
    std::lock_guard<std::mutex> lock(done_m_);
    done_.push_back(std::move(done));
    return true;
  }

  bool take_compute_completions() {
    std::vector<ComputeDone> done;
    {
      std::lock_guard<std::mutex> lock(done_m_);
      if (done_.empty()) return false;
      done.swap(done_);
    }
    engine_work([&] {
      for (const ComputeDone& d : done) {
        current_op_ = d.op;
        if (!d.error.empty()) throw ExecutionError(d.error);
        --computing_;
        timings_.ops.push_back({d.op, d.start, d.end});
        engine_->finish_compute(rank_, d.op);
      }
    });
    return true;
  }

  bool test_collectives() {
    if (active_.empty()) return false;
    std::vector<std::size_t> finished;
    {
      CpuTimed t(timings_.mpi_s);
      for (std::size_t i = 0; i < active_.size(); ++i) {
        int done = 0;
        MUONBED_MPI_CHECK(MPI_Test(&active_[i]->request, &done, MPI_STATUS_IGNORE));
        if (done) finished.push_back(i);
      }
    }
    if (finished.empty()) return false;
    engine_work([&] {
      // Take them out first: finishing one may start others (appended to active_).
      std::vector<std::unique_ptr<Active>> ready;
      for (auto it = finished.rbegin(); it != finished.rend(); ++it) {
        ready.push_back(std::move(active_[*it]));
        active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(*it));
      }
      std::reverse(ready.begin(), ready.end());
      for (auto& a : ready) {
        current_op_ = a->op;
        finish_phase(*a);
        if (a->split) {
          if (!next_split_phase(*a)) {
            complete(*a);
            recycle(std::move(a));
            continue;
          }
          post(*a);
          active_.push_back(std::move(a));
        } else if (++a->phase < a->rop->phases.size()) {
          post(*a);
          active_.push_back(std::move(a));
        } else {
          complete(*a);
          recycle(std::move(a));
        }
      }
    });
    return true;
  }

  // Collectives in flight are recycled with their buffers' storage (packed sends, receive
  // buffer): a step allocates, and the OS zero-fills, no pages per message once the first step
  // has grown them, as MPI codes keep their message buffers (and as the calibration's message
  // benchmark, whose host cost per byte the model charges, does).
  std::unique_ptr<Active> take_active() {
    if (spare_active_.empty()) return std::make_unique<Active>();
    std::unique_ptr<Active> a = std::move(spare_active_.back());
    spare_active_.pop_back();
    return a;
  }
  void recycle(std::unique_ptr<Active> a) {
    a->instance = a->op = -1;
    a->rop = nullptr;
    a->phase = 0;
    a->round = -1;
    a->split.reset();
    a->request = MPI_REQUEST_NULL;
    spare_active_.push_back(std::move(a));
  }

  void check_watchdog(Clock::time_point now) {
    const double idle = seconds(now - last_progress_);
    // A rank with a stuck op of its own (a compute op that does not end, a hang) reports after
    // half the timeout, before the ranks that only wait for it.
    const bool own = computing_ > 0 || hang_op_ >= 0;
    if (idle < (own ? 0.5 : 1.0) * options_.timeout_s) return;
    int op = hang_op_;
    for (int s = 0; op < 0 && s < index_.num_streams(); ++s)
      if (engine_->busy(rank_, s) && index_.op_class(engine_->head(rank_, s)) == OpClass::compute)
        op = engine_->head(rank_, s);
    for (int s = 0; op < 0 && s < index_.num_streams(); ++s)
      if (engine_->busy(rank_, s)) op = engine_->head(rank_, s);
    char waited[32];
    std::snprintf(waited, sizeof waited, "%.1f", idle);
    throw Located(where(op) + ": no progress for " + waited + " s (timeout " +
                  std::to_string(static_cast<int>(options_.timeout_s)) +
                  " s; MUONBED_MPI_TIMEOUT sets it)" +
                  (hang_op_ >= 0 ? "; fault injection: this rank hangs here" : "") +
                  "; where this rank stands:\n" + engine_->stall_report());
  }

  // ---- collectives

  int bytes(std::int64_t elements, int width) const {
    const std::int64_t b = elements * width;
    if (b > INT_MAX)
      throw ExecutionError("a message of " + std::to_string(b) +
                           " bytes exceeds MPI's int count; fix: a smaller model or more ranks");
    return static_cast<int>(b);
  }

  void post(Active& a) {
    const RankOp& rop = *a.rop;
    const Op& op = plan_.ops[a.op];
    MPI_Comm comm = comms_.at(static_cast<std::size_t>(rop.communicator));
    const Call call = call_for(op.kind, a.phase, options_.generic_exchange);
    if (call == Call::barrier) {
      CpuTimed t(timings_.mpi_s);
      MUONBED_MPI_CHECK(MPI_Ibarrier(comm, &a.request));
      return;
    }
    const ExchangePhase& phase = rop.phases[a.phase];
    const int w = bytes_of(a.wire);
    // A broadcast's root and an all-gather member send one buffer to every peer: encoded once.
    const bool one_buffer = call == Call::allgatherv || call == Call::bcast;
    if (one_buffer)
      for (const Transfer& t : phase.sends)
        if (!(t.data == phase.sends.front().data))
          throw ExecutionError("internal: the " + std::string(to_string(op.kind)) +
                               " sends different elements to its peers, which " +
                               (call == Call::bcast ? "MPI_Ibcast" : "MPI_Iallgatherv") +
                               " cannot carry");
    {
      CpuTimed t(timings_.handlers_s);
      cpu::begin_phase_packed(*store_, phase, a.wire, one_buffer, a.packed);
      if (check_pass_)
        for (std::size_t i = 0;
             i < (one_buffer ? std::min<std::size_t>(1, phase.sends.size()) : phase.sends.size());
             ++i)
          write_check_pattern(rank_, phase.sends[i].count, a.wire,
                              a.packed.sends.data() + phase.sends[i].displacement * w);
    }
    int n = 0;
    MUONBED_MPI_CHECK(MPI_Comm_size(comm, &n));
    const int me = rop.group_index;
    const auto mismatch = [&](const std::string& what) {
      return ExecutionError("internal: the " + std::string(to_string(op.kind)) +
                            " phase does not fit its MPI call: " + what);
    };
    // Receive layout: by the phase's displacements (peers in group order).
    std::int64_t recv_end = 0;
    a.recv_offsets.clear();
    for (const Transfer& t : phase.recvs) {
      a.recv_offsets.push_back(static_cast<std::size_t>(bytes(t.displacement, w)));
      recv_end = std::max<std::int64_t>(recv_end, bytes(t.displacement + t.count, w));
    }
    const auto per_peer = [&](const std::vector<Transfer>& list, std::vector<int>& counts,
                              std::vector<int>& displs) {
      counts.assign(n, 0);
      displs.assign(n, 0);
      for (const Transfer& t : list) {
        counts[t.peer] = bytes(t.count, w);
        displs[t.peer] = bytes(t.displacement, w);
      }
    };
    // Every send carries the same elements (bcast, allgatherv): their common count.
    const auto uniform_send = [&]() -> std::int64_t {
      if (phase.sends.empty()) return 0;
      for (const Transfer& t : phase.sends)
        if (t.count != phase.sends.front().count) throw mismatch("sends of different sizes");
      if (static_cast<int>(phase.sends.size()) != n - 1)
        throw mismatch("sends to " + std::to_string(phase.sends.size()) + " of " +
                       std::to_string(n - 1) + " peers");
      return phase.sends.front().count;
    };
    CpuTimed t(timings_.mpi_s);
    switch (call) {
      case Call::alltoallv: {
        per_peer(phase.sends, a.send_counts, a.send_displs);
        per_peer(phase.recvs, a.recv_counts, a.recv_displs);
        a.recv.resize(static_cast<std::size_t>(recv_end));
        MUONBED_MPI_CHECK(MPI_Ialltoallv(data_or_dummy(a.packed.sends), a.send_counts.data(),
                                         a.send_displs.data(), MPI_BYTE, data_or_dummy(a.recv),
                                         a.recv_counts.data(), a.recv_displs.data(), MPI_BYTE, comm,
                                         &a.request));
        break;
      }
      case Call::gatherv: {
        if (me == op.root) {
          if (!phase.sends.empty()) throw mismatch("the root sends");
          per_peer(phase.recvs, a.recv_counts, a.recv_displs);
          a.recv.resize(static_cast<std::size_t>(recv_end));
          MUONBED_MPI_CHECK(MPI_Igatherv(&g_dummy, 0, MPI_BYTE, data_or_dummy(a.recv),
                                         a.recv_counts.data(), a.recv_displs.data(), MPI_BYTE,
                                         op.root, comm, &a.request));
        } else {
          if (!phase.recvs.empty() || phase.sends.size() > 1 ||
              (!phase.sends.empty() && phase.sends.front().peer != op.root))
            throw mismatch("a member exchanges with others than the root");
          const int count = phase.sends.empty() ? 0 : bytes(phase.sends.front().count, w);
          MUONBED_MPI_CHECK(MPI_Igatherv(data_or_dummy(a.packed.sends), count, MPI_BYTE, nullptr,
                                         nullptr, nullptr, MPI_BYTE, op.root, comm, &a.request));
        }
        break;
      }
      case Call::scatterv: {
        if (me == op.root) {
          if (!phase.recvs.empty()) throw mismatch("the root receives");
          per_peer(phase.sends, a.send_counts, a.send_displs);
          MUONBED_MPI_CHECK(MPI_Iscatterv(data_or_dummy(a.packed.sends), a.send_counts.data(),
                                          a.send_displs.data(), MPI_BYTE, &g_dummy, 0, MPI_BYTE,
                                          op.root, comm, &a.request));
        } else {
          if (!phase.sends.empty() || phase.recvs.size() > 1 ||
              (!phase.recvs.empty() && phase.recvs.front().peer != op.root))
            throw mismatch("a member exchanges with others than the root");
          a.recv.resize(static_cast<std::size_t>(recv_end));
          const int count = phase.recvs.empty() ? 0 : bytes(phase.recvs.front().count, w);
          MUONBED_MPI_CHECK(MPI_Iscatterv(nullptr, nullptr, nullptr, MPI_BYTE,
                                          data_or_dummy(a.recv), count, MPI_BYTE, op.root, comm,
                                          &a.request));
        }
        break;
      }
      case Call::bcast: {
        if (me == op.root) {
          if (!phase.recvs.empty()) throw mismatch("the root receives");
          const int count = bytes(uniform_send(), w);
          MUONBED_MPI_CHECK(MPI_Ibcast(data_or_dummy(a.packed.sends), count, MPI_BYTE, op.root,
                                       comm, &a.request));
        } else {
          if (!phase.sends.empty() || phase.recvs.size() > 1)
            throw mismatch("a member other than the root sends");
          a.recv.resize(static_cast<std::size_t>(recv_end));
          const int count = phase.recvs.empty() ? 0 : bytes(phase.recvs.front().count, w);
          MUONBED_MPI_CHECK(
              MPI_Ibcast(data_or_dummy(a.recv), count, MPI_BYTE, op.root, comm, &a.request));
        }
        break;
      }
      case Call::allgatherv: {
        const int mine = bytes(uniform_send(), w);
        per_peer(phase.recvs, a.recv_counts, a.recv_displs);
        // This rank's own block (MPI copies it back to us) goes after the others'.
        a.recv_counts[me] = mine;
        a.recv_displs[me] = static_cast<int>(recv_end);
        a.recv.resize(static_cast<std::size_t>(recv_end + mine));
        MUONBED_MPI_CHECK(MPI_Iallgatherv(data_or_dummy(a.packed.sends), mine, MPI_BYTE,
                                          data_or_dummy(a.recv), a.recv_counts.data(),
                                          a.recv_displs.data(), MPI_BYTE, comm, &a.request));
        break;
      }
      case Call::p2p: {
        // Tags keep the ops of one communicator apart; MPI's order between one pair on one
        // communicator does the rest (the stream posts its ops in plan order).
        const int tag = a.op % 32768;
        if (me == op.root) {
          if (!phase.recvs.empty() || phase.sends.size() > 1) throw mismatch("the sender receives");
          const int count = phase.sends.empty() ? 0 : bytes(phase.sends.front().count, w);
          MUONBED_MPI_CHECK(MPI_Isend(data_or_dummy(a.packed.sends), count, MPI_BYTE, op.peer, tag,
                                      comm, &a.request));
        } else {
          if (!phase.sends.empty() || phase.recvs.size() > 1) throw mismatch("the receiver sends");
          a.recv.resize(static_cast<std::size_t>(recv_end));
          const int count = phase.recvs.empty() ? 0 : bytes(phase.recvs.front().count, w);
          MUONBED_MPI_CHECK(
              MPI_Irecv(data_or_dummy(a.recv), count, MPI_BYTE, op.root, tag, comm, &a.request));
        }
        break;
      }
      case Call::barrier:
        break;
    }
  }

  void finish_phase(Active& a) {
    const RankOp& rop = *a.rop;
    if (rop.phases.empty()) return;  // barrier
    const ExchangePhase& phase = rop.phases[a.phase];
    const int w = bytes_of(a.wire);
    CpuTimed t(timings_.handlers_s);
    std::vector<std::span<const std::byte>> received;
    received.reserve(phase.recvs.size());
    for (std::size_t i = 0; i < phase.recvs.size(); ++i)
      received.emplace_back(a.recv.data() + a.recv_offsets[i],
                            static_cast<std::size_t>(phase.recvs[i].count * w));
    if (check_pass_)
      for (std::size_t i = 0; i < phase.recvs.size(); ++i)
        timings_.wrong_elements +=
            count_wrong(phase.recvs[i].peer_rank, received[i], a.wire, phase.recvs[i].count);
    cpu::finish_phase(*store_, phase, a.wire, a.packed, received);
    const int my_host = host_of_[rank_];
    for (const Transfer& s : phase.sends) {
      const double b = static_cast<double>(s.count * w);
      timings_.bytes_sent += b;
      (host_of_[s.peer_rank] == my_host ? timings_.intra_host_bytes : timings_.network_bytes) += b;
      timings_.messages += 1;
    }
    for (const Transfer& r : phase.recvs)
      timings_.bytes_received += static_cast<double>(r.count * w);
  }

  // split_newton_schulz: after a phase, the next one, with the member's compute after each
  // all-reduce (split_ns_after_round, which also runs the op's keep copies at the end). False when
  // the op is done.
  bool next_split_phase(Active& a) {
    if (a.phase == cpu::split_ns_phase(a.round, 0)) {
      a.phase = cpu::split_ns_phase(a.round, 1);
      return true;
    }
    {
      CpuTimed t(timings_.handlers_s);
      cpu::split_ns_after_round(*a.split, a.round, *a.rop, *store_, context_);
    }
    if (++a.round >= cpu::split_ns_rounds(context_)) return false;
    a.phase = cpu::split_ns_phase(a.round, 0);
    a.wire = cpu::split_ns_wire(*a.rop, a.round);
    return true;
  }

  void complete(Active& a) {
    if (!a.split) {
      CpuTimed t(timings_.handlers_s);
      cpu::run_keep(*a.rop, *store_);
    }
    timings_.ops.push_back({a.op, a.start, now_s()});
    engine_->finish_collective(a.instance);
  }

  const StepPlan& plan_;
  ExecutorOptions options_;
  MPI_Comm world_;
  int rank_ = 0, size_ = 1;
  PlanIndex index_;
  RankProgram program_;
  std::unique_ptr<cpu::RankStore> store_;
  std::unique_ptr<Engine> engine_;
  std::vector<int> host_of_;
  WaitMode idle_mode_ = WaitMode::sleep;
  std::vector<std::string> hosts_;
  std::vector<MPI_Comm> comms_;  // per program communicator

  std::vector<std::unique_ptr<Worker>> workers_;       // per stream; null without compute ops
  std::vector<std::unique_ptr<Active>> spare_active_;  // done collectives, buffers kept
  std::mutex done_m_;
  std::condition_variable done_cv_;
  std::vector<ComputeDone> done_;
  std::vector<std::unique_ptr<Active>> active_;

  cpu::StepContext context_;
  std::atomic<double> gemm_flops_{0};
  Clock::time_point t0_ = Clock::now();
  Clock::time_point last_progress_ = t0_;
  StepTimings timings_;
  int step_ = 0;
  int current_op_ = -1;
  int hang_op_ = -1;
  int computing_ = 0;
  ComputeMode mode_ = ComputeMode::threads;
  std::deque<int> pending_;  // progress_points: compute ops started, not yet run
  bool check_pass_ = false;  // run_check_step: messages carry the check pattern  // compute ops
                             // started and not finished (a hung one included)
};

void retain_freed_memory() {
  keep_freed_memory();
}

Executor::Executor(const StepPlan& plan, MPI_Comm world, ExecutorOptions options)
    : impl_(std::make_unique<Impl>(plan, world, std::move(options))) {}
Executor::~Executor() = default;
void Executor::run_step(int step) {
  impl_->run_step(step);
}
void Executor::run_check_step(int step) {
  impl_->run_check_step(step);
}
const StepTimings& Executor::timings() const {
  return impl_->timings();
}
int Executor::rank() const {
  return impl_->rank();
}
const RankProgram& Executor::program() const {
  return impl_->program();
}
const cpu::RankStore& Executor::store() const {
  return impl_->store();
}
const std::vector<int>& Executor::host_of() const {
  return impl_->host_of();
}
const std::vector<std::string>& Executor::hosts() const {
  return impl_->hosts();
}
ComputeMode Executor::compute_mode() const {
  return impl_->compute_mode();
}

std::string_view to_string(ComputeMode mode) {
  switch (mode) {
    case ComputeMode::automatic:
      return "auto";
    case ComputeMode::threads:
      return "threads";
    case ComputeMode::progress_points:
      return "progress_points";
  }
  return "?";
}

ComputeMode parse_compute_mode(const std::string& text) {
  for (ComputeMode m : {ComputeMode::automatic, ComputeMode::threads, ComputeMode::progress_points})
    if (text == to_string(m)) return m;
  throw Error("unknown compute mode '" + text + "'; valid: auto, threads, progress_points");
}

int Executor::compute_threads() const {
  return impl_->compute_threads();
}

}  // namespace muonbed::mpi
