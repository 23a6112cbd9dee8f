// The CUDA loopback runtime (see backends/gpu/cuda_loopback.hpp).
#include "backends/gpu/cuda_loopback.hpp"

#include <cuda_runtime.h>

#include <time.h>

#include <algorithm>
#include <map>

#include "backends/cpu/data.hpp"
#include "backends/cpu/handlers.hpp"
#include "core/base/errors.hpp"

namespace muonbed::gpu {

namespace {

// CPU time of the calling thread (not wall time, which other processes on shared cores inflate).
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

struct CudaLoopbackExecutor::Events {
  cudaStream_t origin = nullptr;  // where a step starts and ends (and a capture begins)
  cudaEvent_t start = nullptr, end = nullptr;  // timing, recorded outside captures
  cudaEvent_t fork = nullptr;                  // the step's start inside issue_step
  std::vector<cudaEvent_t> pool;               // phase events, reused every step
  std::size_t used = 0;
  std::map<std::vector<char>, cudaGraphExec_t> graphs;  // by pattern of active ops

  cudaEvent_t next() {
    if (used == pool.size()) {
      cudaEvent_t e = nullptr;
      MUONBED_GPU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      pool.push_back(e);
    }
    return pool[used++];
  }
  ~Events() {
    for (auto& [pattern, exec] : graphs) (void)cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : pool) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : {start, end, fork})
      if (e) (void)cudaEventDestroy(e);
    if (origin) (void)cudaStreamDestroy(origin);
  }
};

// The engine's calls are collected (each op completes at once: the GPU orders the work); the
// step is then issued in plan order, see device_rank.hpp.
class CudaLoopbackExecutor::Handler final : public OpHandler {
 public:
  explicit Handler(CudaLoopbackExecutor& x) : x_(x) {}
  Engine* engine = nullptr;
  int step = 0;

  struct Started {
    int op = -1;
    int rank = -1;             // compute and memory ops
    std::vector<int> members;  // collectives: the participants
  };
  std::vector<Started> started;

  void start_compute(int rank, int op) override {
    started.push_back({op, rank, {}});
    engine->finish_compute(rank, op);
  }
  void memory(int rank, int op) override { started.push_back({op, rank, {}}); }
  void start_collective(const CollectiveInstance& instance) override {
    started.push_back({instance.op, -1, instance.participants});
    engine->finish_collective(instance.id);
  }

  void issue_all() {
    std::stable_sort(started.begin(), started.end(),
                     [](const Started& a, const Started& b) { return a.op < b.op; });
    for (const Started& s : started) {
      if (!s.members.empty()) {
        issue_collective(s.op, s.members);
        continue;
      }
      DeviceRank& d = device(s.rank);
      const RankOp& rop = rank_op(s.rank, s.op);
      d.wait_deps(s.op, step);
      if (is_memory(rop.kind)) {
        d.run_memory(rop, step);
      } else {
        d.mark_start(s.op);
        d.run_compute(rop);
      }
      d.record(s.op);
    }
    started.clear();
  }

  void issue_collective(int op, const std::vector<int>& members) {
    const int stream = x_.plan_.ops.at(static_cast<std::size_t>(op)).stream;
    std::vector<const RankOp*> rops;
    for (int m : members) {
      rops.push_back(&rank_op(m, op));
      device(m).wait_deps(op, step);
      device(m).mark_start(op);
    }
    const std::size_t phases = rops.front()->phases.size();
    for (const RankOp* r : rops)
      if (r->phases.size() != phases) fail(op, "members lowered different numbers of phases");
    if (phases == 0) {
      // A barrier: every member's stream waits for every member's arrival.
      std::vector<cudaEvent_t> arrived;
      for (int m : members) {
        arrived.push_back(x_.events_->next());
        MUONBED_GPU_CHECK(cudaEventRecord(arrived.back(), device(m).stream(stream)));
      }
      for (int m : members)
        for (cudaEvent_t e : arrived)
          MUONBED_GPU_CHECK(cudaStreamWaitEvent(device(m).stream(stream), e, 0));
    }
    for (std::size_t ph = 0; ph < phases; ++ph) {
      const int p = static_cast<int>(ph);
      std::map<int, cudaEvent_t> sent, received;  // world rank -> event
      for (std::size_t i = 0; i < members.size(); ++i) {
        DeviceRank& d = device(members[i]);
        d.begin_phase(*rops[i], p);
        sent[members[i]] = x_.events_->next();
        MUONBED_GPU_CHECK(cudaEventRecord(sent[members[i]], d.stream(stream)));
      }
      for (std::size_t j = 0; j < members.size(); ++j) {
        DeviceRank& d = device(members[j]);
        cudaStream_t s = d.stream(stream);
        const ExchangePhase& phase = rops[j]->phases[ph];
        for (std::size_t k = 0; k < phase.recvs.size(); ++k) {
          const int from = phase.recvs[k].peer_rank;
          const auto it = sent.find(from);
          if (it == sent.end())
            fail(op, "rank " + std::to_string(members[j]) + " receives from rank " +
                         std::to_string(from) + ", which is not a participant");
          const RankOp& peer = rank_op(from, op);
          const auto& peer_sends = peer.phases[ph].sends;
          int index = -1;
          for (std::size_t q = 0; q < peer_sends.size(); ++q)
            if (peer_sends[q].peer_rank == members[j]) index = static_cast<int>(q);
          if (index < 0)
            fail(op, "rank " + std::to_string(members[j]) + " expects a message from rank " +
                         std::to_string(from) + ", which sends none");
          const std::int64_t bytes = d.wire(*rops[j], p).recvs[k].bytes;
          if (device(from).wire(peer, p).sends[static_cast<std::size_t>(index)].bytes != bytes)
            fail(op, "rank " + std::to_string(from) + " sends rank " + std::to_string(members[j]) +
                         " another size than it receives");
          MUONBED_GPU_CHECK(cudaStreamWaitEvent(s, it->second, 0));
          if (bytes > 0)
            MUONBED_GPU_CHECK(cudaMemcpyAsync(d.recv_data(*rops[j], p, static_cast<int>(k)),
                                              device(from).send_data(peer, p, index),
                                              static_cast<std::size_t>(bytes),
                                              cudaMemcpyDeviceToDevice, s));
        }
        d.finish_phase(*rops[j], p);
        received[members[j]] = x_.events_->next();
        MUONBED_GPU_CHECK(cudaEventRecord(received[members[j]], s));
      }
      // A sender's staging is free again once its receivers have copied their messages.
      for (std::size_t i = 0; i < members.size(); ++i)
        for (const Transfer& t : rops[i]->phases[ph].sends)
          MUONBED_GPU_CHECK(
              cudaStreamWaitEvent(device(members[i]).stream(stream), received.at(t.peer_rank), 0));
    }
    for (std::size_t i = 0; i < members.size(); ++i) {
      device(members[i]).run_keep(*rops[i]);
      device(members[i]).record(op);
    }
  }

 private:
  DeviceRank& device(int rank) { return *x_.devices_.at(static_cast<std::size_t>(rank)); }
  const RankOp& rank_op(int rank, int op) const {
    const RankOp* r = x_.programs_.at(static_cast<std::size_t>(rank)).find(op);
    if (r == nullptr) fail(op, "rank " + std::to_string(rank) + " has no part in it");
    return *r;
  }
  [[noreturn]] void fail(int op, const std::string& what) const {
    throw ExecutionError("CUDA loopback, step " + std::to_string(step) + ", plan op " +
                         std::to_string(op) + " ('" +
                         x_.plan_.ops.at(static_cast<std::size_t>(op)).label + "'): " + what);
  }
  CudaLoopbackExecutor& x_;
};

CudaLoopbackExecutor::CudaLoopbackExecutor(const StepPlan& plan, CudaLoopbackOptions options)
    : plan_(plan), options_(std::move(options)), index_(plan) {
  std::string why;
  if (!cuda_device_available(&why)) throw ExecutionError("CUDA loopback: " + why);
  if (options_.graph) options_.device.time_ops = false;  // per-op events cannot time a replay
  cpu::check_can_run(plan);
  check_gpu_can_run(plan);
  const int world = plan.model.mesh.world_size();
  for (int r = 0; r < world; ++r) programs_.push_back(lower_rank_program(plan, r, options_.lower));
  if (!options_.random_device_data)
    for (int r = 0; r < world; ++r) {
      stores_.push_back(std::make_unique<cpu::RankStore>(programs_[static_cast<std::size_t>(r)]));
      cpu::fill_parameters(plan, programs_[static_cast<std::size_t>(r)], *stores_.back(),
                           options_.seed);
    }
  for (int r = 0; r < world; ++r) {
    devices_.push_back(std::make_unique<DeviceRank>(plan, programs_[static_cast<std::size_t>(r)],
                                                    options_.device));
    if (options_.random_device_data)
      devices_.back()->fill_random_static(options_.seed);
    else
      devices_.back()->upload_static(*stores_[static_cast<std::size_t>(r)]);
  }
  events_ = std::make_unique<Events>();
  MUONBED_GPU_CHECK(cudaStreamCreateWithFlags(&events_->origin, cudaStreamNonBlocking));
  MUONBED_GPU_CHECK(cudaEventCreate(&events_->start));
  MUONBED_GPU_CHECK(cudaEventCreate(&events_->end));
  MUONBED_GPU_CHECK(cudaEventCreateWithFlags(&events_->fork, cudaEventDisableTiming));
  handler_ = std::make_unique<Handler>(*this);
  std::vector<int> all(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) all[static_cast<std::size_t>(r)] = r;
  engine_ = std::make_unique<Engine>(index_, *handler_, all);
  handler_->engine = engine_.get();
  downloaded_.assign(static_cast<std::size_t>(world), 0);
}

CudaLoopbackExecutor::~CudaLoopbackExecutor() {
  (void)cudaDeviceSynchronize();  // nothing queued may outlive the pools
}

void CudaLoopbackExecutor::issue_step(int step) {
  events_->used = 0;
  handler_->step = step;
  MUONBED_GPU_CHECK(cudaEventRecord(events_->fork, events_->origin));
  for (auto& d : devices_) d->begin_step(events_->fork);
  handler_->started.clear();
  engine_->begin_step(step);
  if (!engine_->step_done())
    throw ExecutionError("CUDA loopback: step " + std::to_string(step) + " cannot finish:\n" +
                         engine_->stall_report());
  handler_->issue_all();
  for (auto& d : devices_) d->end_step(events_->origin, [this] { return events_->next(); });
}

void CudaLoopbackExecutor::run_step() {
  const int step = steps_;
  for (std::size_t r = 0; r < devices_.size(); ++r) {
    if (options_.random_device_data) {
      devices_[r]->fill_random_gradients(options_.seed, step);
    } else {
      cpu::fill_gradients(plan_, programs_[r], *stores_[r], options_.seed, step);
      devices_[r]->upload_gradients(*stores_[r]);
    }
    devices_[r]->prepare_step(options_.seed, step);
  }
  // The uploads above ran on the legacy stream; the origin stream is non-blocking.
  MUONBED_GPU_CHECK(cudaDeviceSynchronize());
  last_ = StepTime{};
  last_.step = step;
  if (!options_.graph) {
    MUONBED_GPU_CHECK(cudaEventRecord(events_->start, events_->origin));
    const double t0 = thread_cpu_ms();
    issue_step(step);
    last_.host_ms = thread_cpu_ms() - t0;
  } else {
    std::vector<char> pattern(plan_.ops.size());
    for (const Op& op : plan_.ops)
      pattern[static_cast<std::size_t>(op.id)] = plan_.active_in_step(op, step);
    auto it = events_->graphs.find(pattern);
    if (it == events_->graphs.end()) {
      // Relaxed: the phase-event pool may grow (cudaEventCreate) during the capture.
      MUONBED_GPU_CHECK(cudaStreamBeginCapture(events_->origin, cudaStreamCaptureModeRelaxed));
      cudaGraph_t graph = nullptr;
      try {
        issue_step(step);
      } catch (...) {
        (void)cudaStreamEndCapture(events_->origin, &graph);
        if (graph) (void)cudaGraphDestroy(graph);
        throw;
      }
      MUONBED_GPU_CHECK(cudaStreamEndCapture(events_->origin, &graph));
      cudaGraphExec_t exec = nullptr;
      const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      (void)cudaGraphDestroy(graph);
      MUONBED_GPU_CHECK(made);
      it = events_->graphs.emplace(pattern, exec).first;
      last_.captured = true;
    }
    MUONBED_GPU_CHECK(cudaEventRecord(events_->start, events_->origin));
    const double t0 = thread_cpu_ms();
    MUONBED_GPU_CHECK(cudaGraphLaunch(it->second, events_->origin));
    last_.host_ms = thread_cpu_ms() - t0;
  }
  MUONBED_GPU_CHECK(cudaEventRecord(events_->end, events_->origin));
  MUONBED_GPU_CHECK(cudaEventSynchronize(events_->end));
  MUONBED_GPU_CHECK(cudaGetLastError());
  float ms = 0;
  MUONBED_GPU_CHECK(cudaEventElapsedTime(&ms, events_->start, events_->end));
  last_.gpu_ms = ms;
  std::fill(downloaded_.begin(), downloaded_.end(), 0);
  ++steps_;
}

const cpu::RankStore& CudaLoopbackExecutor::store(int rank) {
  if (options_.random_device_data)
    throw ExecutionError(
        "CUDA loopback: this run drew its data on the device (random_device_data) and keeps no "
        "host copy to check; fix: run without it to compare with the reference");
  const auto r = static_cast<std::size_t>(rank);
  if (!downloaded_.at(r)) {
    devices_[r]->download_static(*stores_[r]);
    downloaded_[r] = 1;
  }
  return *stores_[r];
}

std::vector<DeviceOpTime> CudaLoopbackExecutor::op_times(int rank) const {
  return devices_.at(static_cast<std::size_t>(rank))->op_times(events_->start);
}

}  // namespace muonbed::gpu
