// The worker's side of the cuda_loopback backend (backends/gpu/cuda_loopback_backend.hpp): a
// point's job run on the CUDA loopback runtime, its record built like the MPI-launched backends'.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "backends/gpu/cuda_loopback.hpp"
#include "backends/gpu/cuda_loopback_backend.hpp"
#include "backends/launch/launch.hpp"
#include "backends/ranks/record.hpp"
#include "core/base/errors.hpp"
#include "core/base/output_files.hpp"
#include "core/plan/plan_json.hpp"
#include "kernels/gpu.hpp"

namespace muonbed::gpu {

namespace {

std::string read_job(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read the job file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// Rank r's timings of the step just run: its ops' intervals on the GPU's clock (eager; a graph
// replay has none, so the rank's finish is the step's end) and its messages' bytes.
mpi::StepTimings rank_timings(const StepPlan& plan, const CudaLoopbackExecutor& executor, int r,
                              bool per_op) {
  const StepTime& t = executor.last_step();
  const RankProgram& program = executor.program(r);
  mpi::StepTimings st;
  st.step = t.step;
  st.finish = per_op ? 0 : t.gpu_ms * 1e-3;
  if (per_op)
    for (const DeviceOpTime& o : executor.op_times(r)) {
      // Events left from an earlier step (an op not issued in this one) start before it.
      if (o.start_ms < 0 || o.end_ms < o.start_ms) continue;
      if (!issued_in_step(plan, program, o.op, t.step)) continue;
      st.ops.push_back({o.op, o.start_ms * 1e-3, o.end_ms * 1e-3});
      st.finish = std::max(st.finish, o.end_ms * 1e-3);
    }
  for (const RankOp& op : program.ops) {
    if (op.phases.empty() || !issued_in_step(plan, program, op.op, t.step)) continue;
    for (std::size_t p = 0; p < op.phases.size(); ++p) {
      const PhaseWire& w = executor.device(r).wire(op, static_cast<int>(p));
      for (const auto& m : w.sends) {
        st.bytes_sent += static_cast<double>(m.bytes);
        st.intra_host_bytes += static_cast<double>(m.bytes);  // one GPU: every peer is local
        st.messages += 1;
      }
      for (const auto& m : w.recvs) st.bytes_received += static_cast<double>(m.bytes);
    }
  }
  // One host thread issues every rank's ops: each rank is charged the whole issue time, so the
  // record's overhead fraction is the issuing thread's CPU time over the step.
  st.handlers_s = t.host_ms * 1e-3;
  return st;
}

// Ends the process loudly (exit 124) when no step finishes within `timeout_s` of the last one
// (the job's MUONBED_MPI_TIMEOUT): a step that hangs on the GPU never leaves `muonbed run`
// waiting. Stopped (joined) when it goes out of scope.
class StepWatchdog {
 public:
  StepWatchdog(double timeout_s, std::string label)
      : timeout_(timeout_s), label_(std::move(label)), thread_([this] { watch(); }) {}
  ~StepWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void step_done(int step) {
    std::lock_guard<std::mutex> lock(mutex_);
    last_ = std::chrono::steady_clock::now();
    step_ = step + 1;
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!done_) {
      const auto deadline = last_ + std::chrono::duration<double>(timeout_);
      if (wake_.wait_until(lock, deadline, [this] { return done_; })) return;
      if (std::chrono::steady_clock::now() < last_ + std::chrono::duration<double>(timeout_))
        continue;
      std::cerr << "muonbed-gpu-worker: error: cuda_loopback point '" << label_ << "': step "
                << step_ << " did not finish within " << timeout_
                << " s (MUONBED_MPI_TIMEOUT); the GPU hangs or the step is far slower than "
                   "expected; the worker ends with no result"
                << std::endl;
      std::_Exit(124);
    }
  }
  double timeout_;
  std::string label_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  int step_ = 0;
  bool done_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace

int run_cuda_loopback_job(const std::string& job_file, const std::string& result_file) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const launch::Job job = launch::job_from_json(nlohmann::json::parse(read_job(job_file)));
  if (job.kind != "plan" || job.backend != "cuda_loopback")
    throw Error("this job is a " + job.kind + " job of the " + job.backend +
                " backend; muonbed-gpu-worker loopback-job runs plans of cuda_loopback");
  std::string why;
  if (!cuda_device_available(&why)) {
    std::cerr << "SKIPPED: " << why << std::endl;
    return 77;
  }
  const StepPlan plan = plan_from_json(job.plan);
  CudaLoopbackOptions options;
  options.seed = job.seed;
  options.graph = job.options.value("graph", false);
  options.device.ns_version = job.options.value("ns_version", 2);
  options.device.time_ops = !options.graph;
  // A timed run reads no values back: data drawn on the device (a host fill costs about a minute
  // per billion parameters and step; the GPU work is the same).
  options.random_device_data = true;
  CudaLoopbackExecutor executor(plan, options);
  const int world = plan.mesh().world_size();

  std::vector<std::vector<mpi::StepTimings>> ranks(static_cast<std::size_t>(world));
  std::int64_t messages = 0;
  int warm = 0, timed = 0;
  StepWatchdog watchdog(job.timeout_s, job.label);
  // A step that captured its graph is not timed (the capture's first launch); the loop runs until
  // the job's timed steps are in.
  while (timed < job.timed_steps) {
    executor.run_step();
    const StepTime& t = executor.last_step();
    watchdog.step_done(t.step);
    for (int r = 0; r < world; ++r) {
      mpi::StepTimings st = rank_timings(plan, executor, r, !options.graph);
      messages += static_cast<std::int64_t>(st.messages);
      if (warm >= job.warmup_steps && !t.captured)
        ranks[static_cast<std::size_t>(r)].push_back(std::move(st));
    }
    if (warm < job.warmup_steps)
      ++warm;
    else if (!t.captured)
      ++timed;
  }

  mpi::MeasureSettings settings = mpi::measure_settings(job);
  const std::string device = describe_device(0);
  settings.messages_what = "device copies between the logical ranks";
  settings.step_clock =
      "from the step's start event to the rank's last op's end event, every rank on the one "
      "GPU's clock";
  settings.trace_clock = "from the step's start event (one GPU, one clock)";
  settings.notes.push_back(
      "cuda_loopback: all " + std::to_string(world) + " ranks ran as logical ranks on ONE GPU (" +
      device +
      "): their kernels shared its SMs and their messages were copies in its memory, so the "
      "step is about the sum of the ranks' work, not an " +
      std::to_string(world) +
      "-GPU step; NVLink and the network were not exercised. Compare it with a prediction of "
      "the same work on one GPU, not with a cluster of " +
      std::to_string(world) + " GPUs");
  settings.notes.push_back(std::string("cuda_loopback: ") +
                           (options.graph ? "steps replayed as captured CUDA graphs (no per-op "
                                            "times: the trace and phases are empty)"
                                          : "eager issue in plan order, op times from CUDA "
                                            "events") +
                           "; NS kernel v" + std::to_string(options.device.ns_version) +
                           " (bf16); data drawn on the device (timed, not checked)");
  mpi::RanksPlacement placement;
  placement.host_of.assign(static_cast<std::size_t>(world), 0);
  placement.hosts = {host_name()};
  placement.cores_of_host = {
      world};  // logical ranks share a GPU, not cores: never "oversubscribed"
  ExecutionInfo execution;
  execution.library = device;
  execution.blas = "none (cuBLAS on the GPU)";
  mpi::Measured m = mpi::measured_record(plan, ranks, placement, settings, std::move(execution));
  std::vector<std::int64_t> pools;
  for (int r = 0; r < world; ++r) pools.push_back(executor.device(r).pool_bytes());
  mpi::add_run_cost(m, pools, messages, start);
  write_file_atomically(result_file, launch::run_to_json(mpi::point_run(std::move(m))));
  return 0;
}

}  // namespace muonbed::gpu
