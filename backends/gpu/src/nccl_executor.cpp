// The NCCL executor (see backends/gpu/nccl_executor.hpp).
#include "backends/gpu/nccl_executor.hpp"

#include <cuda_runtime.h>
#include <nccl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <thread>

#include "backends/cpu/data.hpp"
#include "backends/cpu/handlers.hpp"
#include "backends/ranks/jobs.hpp"
#include "backends/ranks/world.hpp"
#include "core/base/errors.hpp"
#include "core/engine/engine.hpp"
#include "core/plan/plan_json.hpp"

namespace muonbed::gpu {

namespace {

using Clock = std::chrono::steady_clock;

void check_nccl(ncclResult_t result, ncclComm_t comm, const char* call, const char* file,
                int line) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  std::string detail = ncclGetErrorString(result);
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0')
    detail += std::string(": ") + last;
  throw ExecutionError(std::string(file) + ":" + std::to_string(line) + ": " + call +
                       " failed: " + detail);
}
#define MUONBED_NCCL_CHECK(call, comm) check_nccl((call), (comm), #call, __FILE__, __LINE__)

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Collects the ops the engine starts; they are issued afterwards, in plan order.
class Collector final : public OpHandler {
 public:
  Engine* engine = nullptr;
  std::vector<int> started;
  void start_compute(int, int op) override {
    started.push_back(op);
    engine->finish_compute(engine->local_ranks().front(), op);
  }
  void start_collective(const CollectiveInstance& instance) override {
    started.push_back(instance.op);
    engine->finish_collective(instance.id);
  }
  void memory(int, int op) override { started.push_back(op); }
};

}  // namespace

class NcclExecutor::Impl {
 public:
  Impl(const StepPlan& plan, MPI_Comm world, NcclOptions options)
      : plan_(plan), world_(world), options_(std::move(options)), index_(plan) {
    MUONBED_MPI_CHECK(MPI_Comm_rank(world_, &rank_));
    MUONBED_MPI_CHECK(MPI_Comm_size(world_, &size_));
    if (plan.mesh().world_size() != size_)
      throw ExecutionError("nccl: the plan needs " + std::to_string(plan.mesh().world_size()) +
                           " ranks (mesh " + plan.mesh().describe() + ") but the world has " +
                           std::to_string(size_));
    cpu::check_can_run(plan);
    check_gpu_can_run(plan);
    find_hosts();
    // One GPU per rank: NCCL refuses two ranks on one device ("Duplicate GPU detected").
    int local = 0, on_host = 0;
    for (int r = 0; r < size_; ++r) {
      if (host_of_[static_cast<std::size_t>(r)] != host_of_[static_cast<std::size_t>(rank_)])
        continue;
      if (r < rank_) ++local;
      ++on_host;
    }
    int devices = 0;
    const cudaError_t counted = cudaGetDeviceCount(&devices);
    if (counted != cudaSuccess) {
      (void)cudaGetLastError();
      devices = 0;
    }
    if (devices < on_host)
      throw ExecutionError(
          "nccl: rank " + std::to_string(rank_) + ": host " +
          hosts_[static_cast<std::size_t>(host_of_[static_cast<std::size_t>(rank_)])] + " runs " +
          std::to_string(on_host) + " ranks but has " + std::to_string(devices) +
          " CUDA device(s); NCCL needs one GPU per rank (it refuses two ranks on one GPU). Fix: "
          "fewer ranks per host, or the CUDA loopback runtime (muonbed-gpu-worker loopback) for "
          "several logical ranks on one GPU");
    if (options_.device.device < 0) options_.device.device = local;
    if (options_.graph) options_.device.time_ops = false;
    MUONBED_GPU_CHECK(cudaSetDevice(options_.device.device));

    program_ = lower_rank_program(plan, rank_, options_.lower);
    device_ = std::make_unique<DeviceRank>(plan, program_, options_.device);
    if (options_.random_device_data) {
      device_->fill_random_static(options_.seed);
    } else {
      store_ = std::make_unique<cpu::RankStore>(program_);
      cpu::fill_parameters(plan, program_, *store_, options_.seed);
      device_->upload_static(*store_);
    }
    make_communicators();
    MUONBED_GPU_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
    MUONBED_GPU_CHECK(cudaMemset(barrier_word_, 0, sizeof(float)));
    MUONBED_GPU_CHECK(cudaStreamCreateWithFlags(&origin_, cudaStreamNonBlocking));
    MUONBED_GPU_CHECK(cudaEventCreate(&start_));
    MUONBED_GPU_CHECK(cudaEventCreate(&end_));
    MUONBED_GPU_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    collector_.engine = nullptr;
    engine_ = std::make_unique<Engine>(index_, collector_, std::vector<int>{rank_});
    collector_.engine = engine_.get();
  }

  ~Impl() {
    (void)cudaDeviceSynchronize();
    for (auto& [pattern, exec] : graphs_) (void)cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : join_events_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : {start_, end_, fork_})
      if (e) (void)cudaEventDestroy(e);
    if (origin_) (void)cudaStreamDestroy(origin_);
    if (barrier_word_) (void)cudaFree(barrier_word_);
    device_.reset();
    for (ncclComm_t c : owned_) (void)ncclCommDestroy(c);
  }

  void run_step(int step) {
    const double cpu0 = thread_cpu_s();
    if (options_.random_device_data) {
      device_->fill_random_gradients(options_.seed, step);
    } else {
      cpu::fill_gradients(plan_, program_, *store_, options_.seed, step);
      device_->upload_gradients(*store_);
    }
    device_->prepare_step(options_.seed, step);
    MUONBED_GPU_CHECK(cudaDeviceSynchronize());
    downloaded_ = false;
    // Which ops run in this step, from the one engine; then the barrier, then the issue.
    const double engine0 = thread_cpu_s();
    collector_.started.clear();
    engine_->begin_step(step);
    if (!engine_->step_done())
      throw ExecutionError("nccl: rank " + std::to_string(rank_) + ": step " +
                           std::to_string(step) + " cannot finish:\n" + engine_->stall_report());
    std::vector<int> ops = collector_.started;
    std::sort(ops.begin(), ops.end());  // plan order: one issue order on every rank
    const double engine_s = thread_cpu_s() - engine0;
    MPI_Request barrier = MPI_REQUEST_NULL;
    const double mpi0 = thread_cpu_s();
    MUONBED_MPI_CHECK(MPI_Ibarrier(world_, &barrier));
    mpi::wait_for(barrier, options_.timeout_s,
                  "rank " + std::to_string(rank_) + ", step " + std::to_string(step),
                  "the barrier before the step");
    const double mpi_s = thread_cpu_s() - mpi0;

    const double issue0 = thread_cpu_s();
    MUONBED_GPU_CHECK(cudaEventRecord(start_, origin_));
    if (!options_.graph) {
      issue(ops, step);
    } else {
      std::vector<char> pattern(plan_.ops.size());
      for (const Op& op : plan_.ops)
        pattern[static_cast<std::size_t>(op.id)] = plan_.active_in_step(op, step);
      auto it = graphs_.find(pattern);
      if (it == graphs_.end()) {
        // NCCL's calls are captured in Relaxed mode (its own bookkeeping may call APIs that the
        // stricter modes refuse during a capture).
        MUONBED_GPU_CHECK(cudaStreamBeginCapture(origin_, cudaStreamCaptureModeRelaxed));
        cudaGraph_t graph = nullptr;
        try {
          issue(ops, step);
        } catch (...) {
          (void)cudaStreamEndCapture(origin_, &graph);
          if (graph) (void)cudaGraphDestroy(graph);
          throw;
        }
        MUONBED_GPU_CHECK(cudaStreamEndCapture(origin_, &graph));
        cudaGraphExec_t exec = nullptr;
        const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
        (void)cudaGraphDestroy(graph);
        MUONBED_GPU_CHECK(made);
        it = graphs_.emplace(pattern, exec).first;
      }
      MUONBED_GPU_CHECK(cudaGraphLaunch(it->second, origin_));
    }
    MUONBED_GPU_CHECK(cudaEventRecord(end_, origin_));
    const double handlers_s = thread_cpu_s() - issue0;
    const auto wait0 = Clock::now();
    wait(step, ops);
    const double idle_s = std::chrono::duration<double>(Clock::now() - wait0).count();

    float ms = 0;
    MUONBED_GPU_CHECK(cudaEventElapsedTime(&ms, start_, end_));
    timings_ = mpi::StepTimings{};
    timings_.step = step;
    timings_.finish = ms * 1e-3;
    for (const DeviceOpTime& t : device_->op_times(start_))
      if (std::binary_search(ops.begin(), ops.end(), t.op))
        timings_.ops.push_back({t.op, t.start_ms * 1e-3, t.end_ms * 1e-3});
    for (int op : ops) {
      const RankOp* rop = program_.find(op);
      if (rop == nullptr) continue;
      for (std::size_t p = 0; p < rop->phases.size(); ++p) {
        const PhaseWire& w = device_->wire(*rop, static_cast<int>(p));
        for (const auto& m : w.sends) {
          timings_.bytes_sent += static_cast<double>(m.bytes);
          timings_.messages += 1;
          (host_of_[static_cast<std::size_t>(m.peer_rank)] ==
                   host_of_[static_cast<std::size_t>(rank_)]
               ? timings_.intra_host_bytes
               : timings_.network_bytes) += static_cast<double>(m.bytes);
        }
        for (const auto& m : w.recvs) timings_.bytes_received += static_cast<double>(m.bytes);
      }
    }
    timings_.engine_s = engine_s;
    timings_.handlers_s = handlers_s;
    timings_.mpi_s = mpi_s;
    timings_.idle_s = idle_s;
    (void)cpu0;
  }

  const mpi::StepTimings& timings() const { return timings_; }
  int rank() const { return rank_; }
  const std::vector<int>& host_of() const { return host_of_; }
  const std::vector<std::string>& hosts() const { return hosts_; }
  const RankProgram& program() const { return program_; }
  const cpu::RankStore& store() {
    if (!store_)
      throw ExecutionError(
          "nccl: this run drew its data on the device (random_device_data) and keeps no host "
          "copy to check; fix: run without it to compare with the reference");
    if (!downloaded_) {
      device_->download_static(*store_);
      downloaded_ = true;
    }
    return *store_;
  }
  int device() const { return options_.device.device; }
  std::int64_t pool_bytes() const { return device_->pool_bytes(); }

 private:
  void find_hosts() {
    mpi::HostMap map = mpi::exchange_hosts(world_);
    host_of_ = std::move(map.host_of);
    hosts_ = std::move(map.hosts);
  }

  void make_communicators() {
    ncclUniqueId id{};
    if (rank_ == 0) MUONBED_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
    MUONBED_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, world_));
    MUONBED_NCCL_CHECK(ncclCommInitRank(&world_comm_, size_, id, rank_), nullptr);
    owned_.push_back(world_comm_);
    comms_.assign(program_.communicators.size(), nullptr);
    // Every rank calls every split, in the lowering's one order.
    for (const CommunicatorSplit& s : program_.splits) {
      ncclComm_t comm = nullptr;
      MUONBED_NCCL_CHECK(ncclCommSplit(world_comm_, s.color < 0 ? NCCL_SPLIT_NOCOLOR : s.color,
                                       s.key, &comm, nullptr),
                         world_comm_);
      if (s.color < 0) continue;
      if (comm == nullptr)
        throw ExecutionError("nccl: rank " + std::to_string(rank_) +
                             ": ncclCommSplit gave no communicator for stream " +
                             std::to_string(s.stream));
      owned_.push_back(comm);
      int n = 0, me = 0;
      MUONBED_NCCL_CHECK(ncclCommCount(comm, &n), comm);
      MUONBED_NCCL_CHECK(ncclCommUserRank(comm, &me), comm);
      const Communicator& c = program_.communicators.at(static_cast<std::size_t>(s.communicator));
      if (n != static_cast<int>(c.members.size()) || me != s.key)
        throw ExecutionError("nccl: internal: communicator " + std::to_string(c.id) + " has " +
                             std::to_string(n) + " ranks, this one " + std::to_string(me) +
                             "; the plan's group has " + std::to_string(c.members.size()) +
                             ", this rank at " + std::to_string(s.key));
      comms_[static_cast<std::size_t>(s.communicator)] = comm;
    }
  }

  cudaEvent_t join_event() {
    if (join_used_ == join_events_.size()) {
      cudaEvent_t e = nullptr;
      MUONBED_GPU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      join_events_.push_back(e);
    }
    return join_events_[join_used_++];
  }

  // Queues the step's ops in plan order (inside a capture in graph mode).
  void issue(const std::vector<int>& ops, int step) {
    join_used_ = 0;
    MUONBED_GPU_CHECK(cudaEventRecord(fork_, origin_));
    device_->begin_step(fork_);
    for (int op : ops) {
      const RankOp* rop = program_.find(op);
      if (rop == nullptr) continue;
      current_ = op;
      inject_fault(step, op);
      try {
        issue_op(*rop, step);
      } catch (const std::exception& e) {
        throw ExecutionError(where(step, op) + ": " + e.what());
      }
    }
    current_ = -1;
    device_->end_step(origin_, [this] { return join_event(); });
  }

  void inject_fault(int step, int op) const {
    const launch::Fault& f = options_.fault;
    if (!f.active() || f.rank != rank_ || f.step != step || f.op != op) return;
    switch (f.kind) {
      case launch::FaultKind::exit:
        std::cerr << "muonbed: fault injected: rank " << rank_ << " exits at step " << step
                  << ", plan op " << op << std::endl;
        std::_Exit(3);
      case launch::FaultKind::raise:
        throw ExecutionError("fault injected (throw)");
      case launch::FaultKind::hang:
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
      case launch::FaultKind::none:
        break;
    }
  }

  void issue_op(const RankOp& rop, int step) {
    const int op = rop.op;
    device_->wait_deps(op, step);
    if (is_memory(rop.kind)) {
      device_->run_memory(rop, step);
      device_->record(op);
      return;
    }
    device_->mark_start(op);
    if (is_compute(rop.kind)) {
      device_->run_compute(rop);
      device_->record(op);
      return;
    }
    ncclComm_t comm = comms_.at(static_cast<std::size_t>(rop.communicator));
    if (comm == nullptr)
      throw ExecutionError("no NCCL communicator for communicator " +
                           std::to_string(rop.communicator));
    cudaStream_t stream = device_->stream(plan_.ops.at(static_cast<std::size_t>(op)).stream);
    if (rop.kind == OpKind::barrier) {
      MUONBED_NCCL_CHECK(
          ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat, ncclSum, comm, stream), comm);
    }
    for (std::size_t p = 0; p < rop.phases.size(); ++p) {
      const int ph = static_cast<int>(p);
      device_->begin_phase(rop, ph);
      const PhaseWire& w = device_->wire(rop, ph);
      MUONBED_NCCL_CHECK(ncclGroupStart(), comm);
      try {
        for (std::size_t k = 0; k < w.sends.size(); ++k)
          if (w.sends[k].bytes > 0)
            MUONBED_NCCL_CHECK(ncclSend(device_->send_data(rop, ph, static_cast<int>(k)),
                                        static_cast<std::size_t>(w.sends[k].bytes), ncclInt8,
                                        w.sends[k].peer, comm, stream),
                               comm);
        for (std::size_t k = 0; k < w.recvs.size(); ++k)
          if (w.recvs[k].bytes > 0)
            MUONBED_NCCL_CHECK(ncclRecv(device_->recv_data(rop, ph, static_cast<int>(k)),
                                        static_cast<std::size_t>(w.recvs[k].bytes), ncclInt8,
                                        w.recvs[k].peer, comm, stream),
                               comm);
      } catch (...) {
        (void)ncclGroupEnd();
        throw;
      }
      MUONBED_NCCL_CHECK(ncclGroupEnd(), comm);
      device_->finish_phase(rop, ph);
    }
    device_->run_keep(rop);
    device_->record(op);
  }

  std::string where(int step, int op) const {
    std::string s = "rank " + std::to_string(rank_) + ", step " + std::to_string(step);
    if (op >= 0)
      s += ", plan op " + std::to_string(op) + " (" +
           std::string(to_string(plan_.ops.at(static_cast<std::size_t>(op)).kind)) + " '" +
           plan_.ops[static_cast<std::size_t>(op)].label + "')";
    return s;
  }

  // The first issued op whose completion has not happened (eager steps), for failure messages.
  int first_unfinished(const std::vector<int>& ops) const {
    if (options_.graph) return -1;
    for (int op : ops) {
      if (program_.find(op) == nullptr) continue;
      const cudaError_t q = cudaEventQuery(device_->done_event(op));
      if (q != cudaSuccess) {
        if (q != cudaErrorNotReady) (void)cudaGetLastError();
        return op;
      }
    }
    return -1;
  }

  void abort_all() {
    for (ncclComm_t c : owned_) (void)ncclCommAbort(c);
    owned_.clear();
  }

  // Waits for the step, watching CUDA, every communicator's async error and the clock.
  void wait(int step, const std::vector<int>& ops) {
    const auto start = Clock::now();
    int sleep_us = 20;
    while (true) {
      const cudaError_t q = cudaEventQuery(end_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        const std::string what =
            std::string(cudaGetErrorName(q)) + " (" + cudaGetErrorString(q) + ")";
        const int op = first_unfinished(ops);
        abort_all();
        throw ExecutionError(where(step, op) + ": CUDA error " + what);
      }
      for (ncclComm_t c : owned_) {
        ncclResult_t async = ncclSuccess;
        const ncclResult_t got = ncclCommGetAsyncError(c, &async);
        if (got != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
          const int op = first_unfinished(ops);
          const std::string what = ncclGetErrorString(got != ncclSuccess ? got : async);
          abort_all();
          throw ExecutionError(where(step, op) + ": NCCL error " + what);
        }
      }
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      if (waited > options_.timeout_s) {
        const int op = first_unfinished(ops);
        abort_all();
        throw ExecutionError(where(step, op) + ": no progress for " +
                             std::to_string(options_.timeout_s) +
                             " s (a rank died or hangs; NCCL communicators aborted)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(sleep_us * 2, 1000);
    }
  }

  const StepPlan& plan_;
  MPI_Comm world_;
  NcclOptions options_;
  PlanIndex index_;
  int rank_ = 0, size_ = 1;
  std::vector<int> host_of_;
  std::vector<std::string> hosts_;
  RankProgram program_;
  std::unique_ptr<cpu::RankStore> store_;
  std::unique_ptr<DeviceRank> device_;
  ncclComm_t world_comm_ = nullptr;
  std::vector<ncclComm_t> owned_;
  std::vector<ncclComm_t> comms_;  // per program communicator
  float* barrier_word_ = nullptr;
  cudaStream_t origin_ = nullptr;
  cudaEvent_t start_ = nullptr, end_ = nullptr, fork_ = nullptr;
  std::vector<cudaEvent_t> join_events_;
  std::size_t join_used_ = 0;
  std::map<std::vector<char>, cudaGraphExec_t> graphs_;
  Collector collector_;
  std::unique_ptr<Engine> engine_;
  mpi::StepTimings timings_;
  bool downloaded_ = false;
  int current_ = -1;
};

NcclExecutor::NcclExecutor(const StepPlan& plan, MPI_Comm world, NcclOptions options)
    : impl_(std::make_unique<Impl>(plan, world, std::move(options))) {}
NcclExecutor::~NcclExecutor() = default;
void NcclExecutor::run_step(int step) {
  impl_->run_step(step);
}
const mpi::StepTimings& NcclExecutor::timings() const {
  return impl_->timings();
}
int NcclExecutor::rank() const {
  return impl_->rank();
}
const std::vector<int>& NcclExecutor::host_of() const {
  return impl_->host_of();
}
const std::vector<std::string>& NcclExecutor::hosts() const {
  return impl_->hosts();
}
const RankProgram& NcclExecutor::program() const {
  return impl_->program();
}
const cpu::RankStore& NcclExecutor::store() {
  return impl_->store();
}
std::int64_t NcclExecutor::pool_peak_bytes() const {
  return impl_->pool_bytes();
}
std::string NcclExecutor::device_description() const {
  return describe_device(impl_->device());
}

namespace {

std::optional<mpi::Measured> run_nccl_job(const StepPlan& plan, MPI_Comm world,
                                          const launch::Job& job,
                                          const mpi::MeasureSettings& settings) {
  NcclOptions n;
  n.seed = job.seed;
  n.timeout_s = job.timeout_s;
  n.device.device = -1;
  n.device.ns_version = job.options.value("ns_version", 2);
  n.graph = job.options.value("graph", false);
  n.device.time_ops = !n.graph;
  n.fault = launch::parse_fault(job.fault);
  // A timed run reads no values back: its data are drawn on the device (a host fill costs about
  // a minute per billion parameters and step; the GPU work is the same).
  n.random_device_data = true;
  NcclExecutor executor(plan, world, n);
  mpi::MeasureSettings s = settings;
  s.messages_what = "NCCL messages";
  s.library = executor.device_description();
  s.notes.push_back(std::string("nccl: one process per GPU; op times from CUDA events on each "
                                "rank's streams, ") +
                    (n.graph ? "steps replayed as captured CUDA graphs (no per-op times)"
                             : "eager issue in plan order") +
                    "; NS kernel v" + std::to_string(n.device.ns_version) +
                    " (bf16); data drawn on the device (timed, not checked: nccl_equivalence "
                    "checks the executor against the fp32 reference within bf16 NS tolerance)");
  return mpi::measure_rank(plan, world, executor, job.timeout_s, s);
}

}  // namespace

void register_nccl_job_runner() {
  mpi::register_job_runner("nccl", &run_nccl_job);
}

}  // namespace muonbed::gpu
