// The `mpi` backend (see backends/mpi/mpi_backend.hpp): jobs, the run function that starts mpirun
// or leads a user-started world, the hidden worker, and the follower loop of user-started worlds.
#include "backends/mpi/mpi_backend.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <mpi.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "backends/mpi/executor.hpp"
#include "backends/mpi/measure.hpp"
#include "core/base/errors.hpp"
#include "core/base/process.hpp"
#include "core/experiment/experiment.hpp"
#include "core/plan/plan_json.hpp"
#include "core/plan/program.hpp"
#include "core/results/calibration.hpp"
#include "core/results/compare.hpp"
#include "core/results/run_point.hpp"
#include "kernels/gpu.hpp"

#ifndef MUONBED_MPIRUN_PATH
#define MUONBED_MPIRUN_PATH ""
#endif

namespace muonbed {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// What every rank needs to execute one point.
struct Job {
  nlohmann::json plan;
  int warmup_steps = 2;
  int timed_steps = 10;
  std::uint64_t seed = 1;
  int trace_ranks = 64;
  double timeout_s = 60;
  std::string fault;
  bool generic_exchange = false;
  std::string compute_mode = "auto";  // mpi::parse_compute_mode
  int blas_threads = 1;
  std::string cluster_name;
  double peak_tflops = 0;
  std::string launcher;
  std::string label;
  std::string backend = "mpi";  // or a registered job runner's (nccl)
  bool graph = false;           // nccl: capture steps as CUDA graphs
  int ns_version = 2;           // nccl: the NS kernel version
  bool check_data = false;      // RunSettings::check_data
  // "plan" (measure `plan`) or "compute" (the compute benchmark of `muonbed calibrate` on
  // `compute_plans`, `warmup_steps` and `timed_steps` rounds).
  std::string kind = "plan";
  bool concurrent = false;  // compute: every rank at once (else one at a time)
  nlohmann::json compute_plans = nlohmann::json::array();
  // The machine-speed probe (core/results/calibration.hpp speed_probe), timed before and after the
  // point's steps by the mpi backend; null: none.
  nlohmann::json probe_plan;
  std::vector<std::int64_t> probe_shape;
  double probe_predicted_s = 0;
};

nlohmann::json to_json(const Job& j) {
  return {{"plan", j.plan},
          {"warmup_steps", j.warmup_steps},
          {"timed_steps", j.timed_steps},
          {"seed", j.seed},
          {"trace_ranks", j.trace_ranks},
          {"timeout_s", j.timeout_s},
          {"fault", j.fault},
          {"generic_exchange", j.generic_exchange},
          {"compute_mode", j.compute_mode},
          {"blas_threads", j.blas_threads},
          {"cluster_name", j.cluster_name},
          {"peak_tflops", j.peak_tflops},
          {"launcher", j.launcher},
          {"label", j.label},
          {"backend", j.backend},
          {"graph", j.graph},
          {"ns_version", j.ns_version},
          {"check_data", j.check_data},
          {"kind", j.kind},
          {"concurrent", j.concurrent},
          {"compute_plans", j.compute_plans},
          {"probe_plan", j.probe_plan},
          {"probe_shape", j.probe_shape},
          {"probe_predicted_s", j.probe_predicted_s}};
}

Job job_from_json(const nlohmann::json& v) {
  Job j;
  j.plan = v.at("plan");
  j.warmup_steps = v.at("warmup_steps").get<int>();
  j.timed_steps = v.at("timed_steps").get<int>();
  j.seed = v.at("seed").get<std::uint64_t>();
  j.trace_ranks = v.at("trace_ranks").get<int>();
  j.timeout_s = v.at("timeout_s").get<double>();
  j.fault = v.at("fault").get<std::string>();
  j.generic_exchange = v.at("generic_exchange").get<bool>();
  j.compute_mode = v.value("compute_mode", std::string("auto"));
  j.blas_threads = v.at("blas_threads").get<int>();
  j.cluster_name = v.at("cluster_name").get<std::string>();
  j.peak_tflops = v.at("peak_tflops").get<double>();
  j.launcher = v.at("launcher").get<std::string>();
  j.label = v.at("label").get<std::string>();
  j.backend = v.value("backend", std::string("mpi"));
  j.graph = v.value("graph", false);
  j.ns_version = v.value("ns_version", 2);
  j.check_data = v.value("check_data", false);
  j.kind = v.value("kind", std::string("plan"));
  j.concurrent = v.value("concurrent", false);
  if (v.contains("compute_plans")) j.compute_plans = v.at("compute_plans");
  if (v.contains("probe_plan")) j.probe_plan = v.at("probe_plan");
  if (v.contains("probe_shape"))
    j.probe_shape = v.at("probe_shape").get<std::vector<std::int64_t>>();
  j.probe_predicted_s = v.value("probe_predicted_s", 0.0);
  return j;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// Variables the MPI launchers set (OMPI_COMM_WORLD_RANK, SLURM_PROCID, ...), not users.
int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  try {
    return std::stoi(v);
  } catch (const std::exception&) {
    return fallback;
  }
}

// The strict numeric variables (core/base/process.hpp env_number), each with its range once.
std::optional<int> env_blas_threads() {
  const auto v = env_number("MUONBED_BLAS_THREADS", 1, 1024, true, "1");
  return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
}

Job make_job(const Experiment& experiment, const StepPlan& plan, const RunSettings& settings) {
  Job job;
  job.plan = plan_to_json(plan);
  job.warmup_steps = experiment.steps;
  job.timed_steps = experiment.repeats;
  job.seed = experiment.seed;
  job.trace_ranks = settings.trace_max_ranks;
  job.cluster_name = experiment.cluster.name;
  job.peak_tflops = experiment.cluster.gpu.peak_tflops;
  job.label = experiment.point_label.empty() ? experiment.name : experiment.point_label;
  job.check_data = settings.check_data;
  // The watchdog: at least a tenth of a second, at most a day (a larger value would disable it).
  if (const auto v = env_number("MUONBED_MPI_TIMEOUT", 0.1, 86400, false, "60")) job.timeout_s = *v;
  if (const char* v = env("MUONBED_MPI_FAULT")) {
    mpi::Fault fault;
    try {
      fault = mpi::parse_fault(v);
    } catch (const Error& e) {
      throw ConfigError(SourceLocation{"environment", 0, 0}, e.what(),
                        "e.g. MUONBED_MPI_FAULT=1:2:17:hang (rank:step:op:exit|throw|hang)");
    }
    // A fault that can never fire would let a test of failure handling pass without failing.
    const int ranks = plan.mesh().world_size();
    const int steps = experiment.steps + experiment.repeats;
    const int ops = static_cast<int>(plan.ops.size());
    const auto refuse = [&](const std::string& what) {
      return ConfigError(
          SourceLocation{"environment", 0, 0},
          std::string("MUONBED_MPI_FAULT='") + v + "' names " + what + ", which point '" +
              experiment.point_label + "' does not have (ranks 0.." + std::to_string(ranks - 1) +
              ", steps 0.." + std::to_string(steps - 1) + ", plan ops 0.." +
              std::to_string(ops - 1) + ")",
          "name one that exists, e.g. MUONBED_MPI_FAULT=" + std::to_string(ranks - 1) +
              ":0:0:exit");
    };
    if (fault.rank >= ranks) throw refuse("rank " + std::to_string(fault.rank));
    if (fault.step >= steps) throw refuse("step " + std::to_string(fault.step));
    if (fault.op >= ops) throw refuse("plan op " + std::to_string(fault.op));
    job.fault = mpi::to_string(fault);
  }
  if (const auto mode = env_choice("MUONBED_MPI_EXCHANGE", {"alltoallv", "natural"}))
    job.generic_exchange = *mode == "alltoallv";
  if (const char* v = env("MUONBED_MPI_COMPUTE")) {
    try {
      job.compute_mode = std::string(mpi::to_string(mpi::parse_compute_mode(v)));
    } catch (const Error& e) {
      throw ConfigError(SourceLocation{"environment", 0, 0},
                        std::string("MUONBED_MPI_COMPUTE='") + v + "': " + e.what(),
                        "unset it, or use one of the modes above");
    }
  }
  if (env_choice("MUONBED_MPI_SPEED_PROBE", {"on", "off"}).value_or("on") == "on") {
    try {
      if (const std::optional<SpeedProbe> probe =
              speed_probe(plan, experiment.cluster, settings.speed_probe_from_profile)) {
        job.probe_plan = plan_to_json(probe->plan);
        job.probe_shape = {probe->shape.batch, probe->shape.rows, probe->shape.cols};
        job.probe_predicted_s = probe->predicted_s;
      }
    } catch (const PlanError&) {
      // A profile without a compute rate: nothing to check the machine against.
    }
  }
  if (const auto threads = env_blas_threads()) job.blas_threads = *threads;
  return job;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Every rank runs the job; rank 0 returns the point's run. A failure anywhere ends every rank
// (MPI_Abort) with the message naming the rank, step and op. A world of the wrong size is an
// error on rank 0 (thrown) and `wrong_world` elsewhere: every rank knows both sizes, so none hangs.
std::vector<ComputeBenchRow> execute_compute_job(const Job& job) {
  const int rank = world_rank();
  try {
    mpi::set_blas_threads(job.blas_threads);
    std::vector<StepPlan> plans;
    for (const nlohmann::json& p : job.compute_plans) plans.push_back(plan_from_json(p));
    return mpi::compute_bench(plans, MPI_COMM_WORLD, job.warmup_steps, job.timed_steps,
                              job.timeout_s, job.concurrent);
  } catch (const std::exception& e) {
    std::string message = e.what();
    if (message.rfind("rank ", 0) != 0) message = "rank " + std::to_string(rank) + ": " + message;
    if (world_size() == 1) throw Error(message);
    mpi::abort_world(message);
  }
}

std::optional<PointRun> execute_job(const Job& job, bool& wrong_world) {
  const int rank = world_rank();
  wrong_world = false;
  if (job.kind == "compute") {
    execute_compute_job(job);
    return std::nullopt;
  }
  std::optional<StepPlan> plan;
  try {
    plan = plan_from_json(job.plan);
  } catch (const std::exception& e) {
    if (world_size() == 1) throw;
    mpi::abort_world("rank " + std::to_string(rank) + ": " + e.what());
  }
  if (plan->mesh().world_size() != world_size()) {
    wrong_world = true;
    if (rank == 0)
      throw Error("point '" + job.label + "' needs " + std::to_string(plan->mesh().world_size()) +
                  " ranks (mesh " + plan->mesh().describe() + ") but this MPI world has " +
                  std::to_string(world_size()) + "; fix: mpirun -np " +
                  std::to_string(plan->mesh().world_size()));
    return std::nullopt;
  }
  try {
    mpi::ExecutorOptions options;
    options.seed = job.seed;
    options.timeout_s = job.timeout_s;
    options.fault = mpi::parse_fault(job.fault);
    options.generic_exchange = job.generic_exchange;
    options.compute_mode = mpi::parse_compute_mode(job.compute_mode);
    mpi::MeasureSettings settings;
    settings.warmup_steps = job.warmup_steps;
    settings.timed_steps = job.timed_steps;
    settings.trace_ranks = job.trace_ranks;
    settings.cluster_name = job.cluster_name;
    settings.peak_tflops = job.peak_tflops;
    settings.launcher = job.launcher;
    settings.blas_threads = job.blas_threads;
    settings.check_data = job.check_data;
    std::optional<mpi::Measured> m;
    if (job.backend == "mpi") {
      // The speed probe brackets the steps: the machine's speed before and after them, against
      // the profile's (compare flags a profile made on another machine, or drift during the point).
      const bool probe = job.probe_predicted_s > 0 && !job.probe_plan.is_null();
      std::optional<StepPlan> probe_plan;
      if (probe) probe_plan = plan_from_json(job.probe_plan);
      const double before =
          probe ? mpi::time_newton_schulz(*probe_plan, MPI_COMM_WORLD, job.timeout_s) : 0;
      m = mpi::measure(*plan, MPI_COMM_WORLD, options, settings);
      const double after =
          probe ? mpi::time_newton_schulz(*probe_plan, MPI_COMM_WORLD, job.timeout_s) : 0;
      if (m && probe) {
        ExecutionInfo& e = m->record.execution;
        e.probe_shape = job.probe_shape;
        e.probe_predicted_s = job.probe_predicted_s;
        e.probe_before_s = before;
        e.probe_after_s = after;
        m->record.notes.push_back(
            "mpi: speed probe: one Newton-Schulz call of the plan's costliest shape timed as "
            "calibrate times gpu.ns_table, before and after the steps (execution.speed_probe), "
            "against cluster profile '" +
            job.cluster_name + "'");
        for (std::string& w : speed_probe_warnings(e, job.cluster_name))
          m->record.notes.push_back(std::move(w));
      }
    } else {
      const mpi::JobRunner runner = mpi::find_job_runner(job.backend);
      if (runner == nullptr)
        throw Error("this program cannot run the " + job.backend +
                    " backend (muonbed-gpu-worker runs it, in a build with CUDA, NCCL and MPI)");
      m = runner(*plan, MPI_COMM_WORLD, options, settings, to_json(job));
    }
    if (!m) return std::nullopt;
    PointRun run;
    run.record = std::move(m->record);
    run.trace = std::move(m->trace);
    run.cost.what = "execution";
    run.cost.wall_s = m->wall_s;
    run.cost.peak_rss_bytes = m->peak_rss_bytes;
    run.cost.messages = m->messages;
    run.cost.messages_what = job.backend == "mpi" ? "MPI messages" : "NCCL messages";
    run.wrong_elements = m->wrong_elements;
    return run;
  } catch (const std::exception& e) {
    std::string message = e.what();
    if (message.rfind("rank ", 0) != 0) message = "rank " + std::to_string(rank) + ": " + message;
    if (world_size() == 1) throw Error(message);  // nobody else to end: an ordinary error
    mpi::abort_world(message);
  }
}

// Rank 0's job to every rank: a size (negative: no more jobs), then the text. The size travels by
// MPI_Ibcast on both sides (followers poll it, sleeping, so they idle without a busy core).
void send_job_header(long long size) {
  MPI_Request request = MPI_REQUEST_NULL;
  MUONBED_MPI_CHECK(MPI_Ibcast(&size, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD, &request));
  MUONBED_MPI_CHECK(MPI_Wait(&request, MPI_STATUS_IGNORE));
}

void broadcast_body(std::string& text) {
  for (std::size_t at = 0; at < text.size(); at += INT_MAX / 2) {
    const int n = static_cast<int>(std::min<std::size_t>(INT_MAX / 2, text.size() - at));
    MUONBED_MPI_CHECK(MPI_Bcast(text.data() + at, n, MPI_CHAR, 0, MPI_COMM_WORLD));
  }
}

void send_job(const Job& job) {
  std::string text = to_json(job).dump();
  send_job_header(static_cast<long long>(text.size()));
  broadcast_body(text);
}

// A follower's wait for the next job; false when rank 0 is done.
bool receive_job(Job& job) {
  long long size = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MUONBED_MPI_CHECK(MPI_Ibcast(&size, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD, &request));
  while (true) {
    int done = 0;
    MUONBED_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (size < 0) return false;
  std::string text(static_cast<std::size_t>(size), '\0');
  broadcast_body(text);
  job = job_from_json(nlohmann::json::parse(text));
  return true;
}

void init_mpi() {
  // SimGrid's library exports SMPI's MPI_* too: a program that links it before libmpi would call
  // the simulator's MPI (experiments/CMakeLists.txt links libmpi first).
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) != 0 && info.dli_fname != nullptr &&
      std::string(info.dli_fname).find("simgrid") != std::string::npos)
    throw Error(std::string("MPI_Init_thread resolves to ") + info.dli_fname +
                " (SimGrid's SMPI), not to the MPI library; fix: link libmpi before SimGrid");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  // A rank whose launcher (mpirun, orted) is killed must not run on alone (core/base/process.hpp).
  if (mpi_environment().inside) exit_with_parent();
  int provided = 0;
  MUONBED_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  if (provided < MPI_THREAD_FUNNELED)
    throw Error(
        "this MPI library does not provide MPI_THREAD_FUNNELED (compute threads beside "
        "MPI on the main thread); fix: an MPI built with thread support");
}

bool g_leader = false;  // rank 0 of a world whose other ranks serve its jobs

// ---- starting mpirun

std::string find_mpirun() {
  const auto executable = [](const std::string& p) {
    return !p.empty() && access(p.c_str(), X_OK) == 0;
  };
  if (const char* v = env("MUONBED_MPIRUN")) {
    if (!executable(v))
      throw Error(std::string("MUONBED_MPIRUN='") + v +
                  "' is not an executable; fix: the path of "
                  "mpirun, or unset it");
    return v;
  }
  if (executable(MUONBED_MPIRUN_PATH)) return MUONBED_MPIRUN_PATH;
  if (const char* path = env("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':'))
      for (const char* name : {"mpirun", "mpiexec"})
        if (executable(dir + "/" + name)) return dir + "/" + name;
  }
  throw Error(
      "the mpi backend starts its ranks with mpirun, which is not installed; fix: sudo "
      "apt-get install openmpi-bin (or set MUONBED_MPIRUN to an mpirun)");
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The lines of a failed run worth showing: every rank's "muonbed: error:" line and the launcher's
// own summary (the last lines), at most ~40.
std::string failure_excerpt(const std::string& log) {
  std::vector<std::string> lines;
  std::stringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line.find_first_not_of("-= ") != std::string::npos) lines.push_back(line);
  if (lines.size() <= 40) {
    std::string out;
    for (const auto& l : lines) out += "\n  " + l;
    return out;
  }
  std::string out;
  int errors = 0;
  for (const auto& l : lines)
    if (l.find("muonbed: error:") != std::string::npos && errors++ < 16) out += "\n  " + l;
  out += "\n  ...";
  for (std::size_t i = lines.size() - 20; i < lines.size(); ++i) out += "\n  " + lines[i];
  return out;
}

// mpirun's options for `ranks` ranks of this program on this machine.
std::vector<std::string> mpirun_argv(const std::string& mpirun, int ranks) {
  std::vector<std::string> argv = {mpirun, "-np", std::to_string(ranks)};
  if (ranks > mpi::available_cores()) argv.push_back("--oversubscribe");
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  // Each rank runs compute threads beside its MPI thread: no binding to one core.
  argv.insert(argv.end(), {"--bind-to", "none"});
  return argv;
}

// `log_copy`: where the launcher's output is kept when the run fails (beside the point's result
// file); removed when it succeeds.
// `worker`: the program mpirun starts (its `mpi-worker JOB RESULT` command); empty: this one.
PointRun launch(const Job& job, int ranks, const fs::path& log_copy, std::string worker = "") {
  const std::string mpirun = find_mpirun();
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    throw Error("cannot find this program's path (/proc/self/exe) to start it under mpirun");
  if (worker.empty()) worker = std::string(self, static_cast<std::size_t>(n));
  std::string pattern = (temporary_folder() / "muonbed-mpi-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr)
    throw Error("cannot create a temporary folder in " + temporary_folder().string() + ": " +
                std::strerror(errno) + "; fix: set TMPDIR to a writable folder");
  const fs::path dir(pattern);
  const fs::path job_file = dir / "job.json", result_file = dir / "result.json",
                 log_file = dir / "mpirun.log";
  {
    std::ofstream out(job_file, std::ios::binary);
    out << to_json(job).dump();
    if (!out) throw Error("cannot write " + job_file.string());
  }
  std::vector<std::string> argv = mpirun_argv(mpirun, ranks);
  argv.insert(argv.end(), {worker, "mpi-worker", job_file.string(), result_file.string()});

  const auto start = Clock::now();
  SpawnOptions spawn;
  spawn.output_file = log_file.string();
  spawn.default_env = {{"OPENBLAS_NUM_THREADS", std::to_string(job.blas_threads)}};
  int status = 0;
  try {
    status = wait_process(spawn_process(argv, spawn));
  } catch (const Interrupted&) {
    std::error_code ec;
    fs::remove_all(dir, ec);  // the job's own temporary folder; no result was written
    throw;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::error_code ec;
  if (!ok || !fs::exists(result_file)) {
    const std::string how = describe_wait_status(status);
    char took[32];
    std::snprintf(took, sizeof took, "%.1f", seconds);
    const std::string log = read_file(log_file);
    std::string kept = log_file.string();
    fs::create_directories(log_copy.parent_path(), ec);
    if (!ec && fs::copy_file(log_file, log_copy, fs::copy_options::overwrite_existing, ec)) {
      kept = log_copy.string();
      fs::remove_all(dir, ec);
    }
    throw Error("mpirun " + how + " after " + took + " s (" + shell_words(argv) +
                "); its output:" + failure_excerpt(log) + "\n  (full output: " + kept +
                "; no result was written, so the next run reruns this point)");
  }
  const nlohmann::json result = nlohmann::json::parse(read_file(result_file));
  PointRun run;
  run.record = result_from_json(result.at("record").get<std::string>());
  run.trace = result.at("trace");
  const auto& cost = result.at("cost");
  run.cost.what = "execution";
  run.cost.wall_s = cost.at("wall_s").get<double>();
  run.cost.peak_rss_bytes = cost.at("peak_rss_bytes").get<double>();
  run.cost.messages = cost.at("messages").get<std::int64_t>();
  run.cost.messages_what = job.backend == "mpi" ? "MPI messages" : "NCCL messages";
  run.wrong_elements = result.value("wrong_elements", std::int64_t{-1});
  fs::remove_all(dir, ec);
  fs::remove(log_copy, ec);
  return run;
}

// Before ranks start: the host memory the CPU executor's ranks of this plan hold at once (each
// rank's program in the plan's dtypes, as backends/cpu's RankStore holds it: its static tensors
// and its peak of live buffers, which is rank_memory; plus each process's own ~64 MiB, which also
// covers the handlers' fp32 working copies of small ops) against what this machine has available;
// a point that cannot fit is refused with the numbers instead of swapping or being killed
// halfway. A plan with more ranks than this machine has cores still counts all of them.
void check_host_memory(const StepPlan& plan, const std::string& label) {
  const long long available = available_memory_bytes();
  if (available < 0) return;  // no /proc/meminfo: nothing to check against
  constexpr double kPerProcess = 64.0 * (1 << 20);
  double need = 0;
  const int ranks = plan.mesh().world_size();
  for (int r = 0; r < ranks; ++r)
    need += static_cast<double>(rank_memory(plan, r).peak_bytes()) + kPerProcess;
  if (need <= static_cast<double>(available)) return;
  const double gib = 1024.0 * 1024 * 1024;
  char text[512];
  std::snprintf(text, sizeof text,
                "point '%s' needs about %.2f GiB of host memory in its %d ranks (the plan's "
                "tensors in their dtypes, rank_memory, plus ~64 MiB per process), but this "
                "machine has %.2f GiB available (MemAvailable)",
                label.c_str(), need / gib, ranks, static_cast<double>(available) / gib);
  throw Error(std::string(text) +
              "; fix: a smaller model or fewer ranks, free memory, or run it on a larger "
              "machine (the analytic and sim backends predict it without running it)");
}

PointRun run_mpi(const Experiment& experiment, const StepPlan& plan, const RunSettings& settings) {
  Job job = make_job(experiment, plan, settings);
  const int ranks = plan.mesh().world_size();
  const MpiEnvironment environment = mpi_environment();
  PointRun run;
  if (environment.inside) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized || (!g_leader && world_size() > 1))
      throw Error("this process runs under " + environment.launcher +
                  ", where the mpi backend runs only from `muonbed run`; fix: run this command "
                  "outside mpirun and it starts mpirun itself");
    if (world_size() != ranks)
      throw Error("point '" + job.label + "' needs " + std::to_string(ranks) + " ranks (mesh " +
                  plan.mesh().describe() + ") but this MPI world has " +
                  std::to_string(world_size()) + "; fix: start the job with " +
                  std::to_string(ranks) + " ranks (mpirun -np " + std::to_string(ranks) +
                  " / srun -n " + std::to_string(ranks) +
                  "), or run muonbed outside mpirun and it starts mpirun -np " +
                  std::to_string(ranks) + " for each point");
    job.launcher = environment.launcher;
    if (world_size() > 1) send_job(job);
    bool wrong_world = false;
    std::optional<PointRun> result = execute_job(job, wrong_world);
    if (!result) throw Error("internal: rank 0 measured nothing");
    run = std::move(*result);
  } else {
    job.launcher = "mpirun (started by muonbed)";
    check_host_memory(plan, job.label);  // every rank on this machine
    run = launch(job, ranks,
                 fs::path(result_path(experiment, "mpi")).replace_filename("mpi.failed.log"));
  }
  run.record.provenance = make_provenance(&experiment, "");
  return run;
}

// The GPU worker program beside this one (a CUDA + NCCL + MPI build puts it there).
std::string find_gpu_worker() {
  if (const char* v = env("MUONBED_GPU_WORKER")) return v;
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  const fs::path path =
      fs::path(std::string(self, static_cast<std::size_t>(std::max<ssize_t>(n, 0)))).parent_path() /
      "muonbed-gpu-worker";
  if (n <= 0 || access(path.c_str(), X_OK) != 0)
    throw Error("the nccl backend runs its ranks as muonbed-gpu-worker, which is not beside " +
                std::string(self) +
                "; fix: build it (a build with CUDA, NCCL and MPI: cmake --build BUILD --target "
                "muonbed-gpu-worker) or set MUONBED_GPU_WORKER to its path");
  return path.string();
}

PointRun run_nccl(const Experiment& experiment, const StepPlan& plan, const RunSettings& settings) {
  Job job = make_job(experiment, plan, settings);
  job.backend = "nccl";
  if (const auto graph = env_choice("MUONBED_NCCL_GRAPH", {"0", "1"})) job.graph = *graph == "1";
  if (const auto v = env_number("MUONBED_NS_VERSION", 1, 99, true, "2"))
    job.ns_version = static_cast<int>(*v);
  if (mpi_environment().inside)
    throw Error("the nccl backend starts mpirun itself; fix: run this command outside mpirun");
  const int ranks = plan.mesh().world_size();
  job.launcher = "mpirun (started by muonbed)";
  PointRun run = launch(
      job, ranks, fs::path(result_path(experiment, "nccl")).replace_filename("nccl.failed.log"),
      find_gpu_worker());
  run.record.provenance = make_provenance(&experiment, "");
  return run;
}

}  // namespace

void register_nccl_backend() {
  register_backend({"nccl",
                    "measured on GPUs with NCCL (one process per GPU under mpirun, started per "
                    "point as muonbed-gpu-worker; MUONBED_NCCL_GRAPH=1 replays CUDA graphs)",
                    &run_nccl, [] {
                      std::string why;
                      if (cuda_device_available(&why)) return std::string();
                      return "backend 'nccl' needs a GPU per rank, and this machine has none: " +
                             why +
                             "; fix: run it where each rank has a GPU; on one GPU, "
                             "build/muonbed-gpu-worker loopback EXP runs every rank on it";
                    }});
}

MpiEnvironment mpi_environment() {
  MpiEnvironment e;
  const bool slurm = env("SLURM_JOB_ID") != nullptr;
  if (env("OMPI_COMM_WORLD_SIZE")) {
    e = {true, env_int("OMPI_COMM_WORLD_RANK", 0), env_int("OMPI_COMM_WORLD_SIZE", 0),
         slurm && !env("OMPI_MCA_orte_launch") ? "Open MPI (mpirun or srun)" : "mpirun (Open MPI)"};
  } else if (env("PMIX_RANK")) {
    e = {true, env_int("PMIX_RANK", 0), env_int("SLURM_STEP_NUM_TASKS", 0),
         slurm ? "srun (PMIx)" : "a PMIx launcher"};
  } else if (env("PMI_RANK") && env("PMI_SIZE")) {
    e = {true, env_int("PMI_RANK", 0), env_int("PMI_SIZE", 0),
         slurm ? "srun (PMI-2)" : "mpiexec (PMI)"};
  } else if (env("SLURM_STEP_NUM_TASKS") && env("SLURM_PROCID") && env("SLURM_STEP_ID")) {
    e = {true, env_int("SLURM_PROCID", 0), env_int("SLURM_STEP_NUM_TASKS", 0), "srun"};
  }
  return e;
}

int mpi_command_begin() {
  if (!mpi_environment().inside) return -1;
  init_mpi();
  if (world_rank() == 0) {
    g_leader = true;
    return -1;
  }
  Job job;
  try {
    bool wrong_world = false;
    while (receive_job(job)) execute_job(job, wrong_world);
  } catch (const std::exception& e) {
    mpi::abort_world("rank " + std::to_string(world_rank()) + ": " + e.what());
  }
  MPI_Finalize();
  return 0;
}

void mpi_command_end() {
  if (!g_leader) return;
  g_leader = false;
  if (world_size() > 1) send_job_header(-1);
  MPI_Finalize();
}

int run_mpi_worker(const std::string& job_file, const std::string& result_file) {
  init_mpi();
  Job job;
  try {
    if (world_rank() == 0) {
      const std::string text = read_file(job_file);
      if (text.empty()) throw Error("cannot read the job file " + job_file);
      job = job_from_json(nlohmann::json::parse(text));
      if (world_size() > 1) send_job(job);
    } else if (!receive_job(job)) {
      MPI_Finalize();
      return 0;
    }
  } catch (const std::exception& e) {
    mpi::abort_world("rank " + std::to_string(world_rank()) + ": " + e.what());
  }
  std::optional<PointRun> run;
  bool wrong_world = false;
  try {
    run = execute_job(job, wrong_world);
  } catch (const std::exception& e) {  // the world size on rank 0, or any error of a lone rank
    std::cerr << "muonbed: error: " << e.what() << std::endl;
    MPI_Finalize();
    return 1;
  }
  if (run) {
    nlohmann::json out = {{"record", result_to_json(run->record)},
                          {"trace", run->trace},
                          {"cost",
                           {{"wall_s", run->cost.wall_s},
                            {"peak_rss_bytes", run->cost.peak_rss_bytes},
                            {"messages", run->cost.messages}}},
                          {"wrong_elements", run->wrong_elements}};
    write_file_atomically(result_file, out.dump());
  }
  MPI_Finalize();
  return wrong_world ? 1 : 0;
}

std::vector<ComputeBenchRow> run_compute_bench(const std::vector<StepPlan>& plans, int warmup,
                                               int repeats, bool concurrent) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || (!g_leader && world_size() > 1))
    throw Error(
        "the compute benchmark runs on the MPI world muonbed leads (rank 0 after "
        "mpi_command_begin); fix: start the command under mpirun, or let it start mpirun itself");
  Job job;
  job.kind = "compute";
  for (const StepPlan& p : plans) job.compute_plans.push_back(plan_to_json(p));
  job.warmup_steps = warmup;
  job.timed_steps = repeats;
  job.concurrent = concurrent;
  if (const auto threads = env_blas_threads()) job.blas_threads = *threads;
  if (world_size() > 1) send_job(job);
  return execute_compute_job(job);
}

int relaunch_under_mpirun(int ranks, const std::vector<std::string>& args) {
  const std::string mpirun = find_mpirun();
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    throw Error("cannot find this program's path (/proc/self/exe) to start it under mpirun");
  std::vector<std::string> argv = mpirun_argv(mpirun, ranks);
  argv.push_back(std::string(self, static_cast<std::size_t>(n)));
  argv.insert(argv.end(), args.begin(), args.end());
  std::cout << "# starting: " << shell_words(argv) << std::endl;
  SpawnOptions spawn;
  spawn.null_stdin = false;
  spawn.default_env = {{"OPENBLAS_NUM_THREADS", "1"}};
  const int status = wait_process(spawn_process(argv, spawn));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  throw Error("mpirun " + describe_wait_status(status));
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string out(text, strnlen(text, static_cast<std::size_t>(std::max(0, length))));
  const std::size_t newline = out.find_first_of("\r\n");
  if (newline != std::string::npos) out.resize(newline);
  return out;
}

bool mpi_leader() {
  return g_leader || (mpi_environment().inside && world_size() == 1);
}

void register_mpi_backend() {
  register_backend({"mpi",
                    "measured on CPU ranks under Open MPI (one process per rank; mpirun started "
                    "per point, or the world muonbed runs in)",
                    &run_mpi});
}

}  // namespace muonbed
