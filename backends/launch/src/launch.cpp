// Starting a measured backend's ranks (see backends/launch/launch.hpp): jobs, the environment the
// ranks were started in, mpirun's command line, the job folder and the failure log.
#include "backends/launch/launch.hpp"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include "core/base/errors.hpp"
#include "core/base/output_files.hpp"
#include "core/base/process.hpp"
#include "core/plan/plan_json.hpp"

#ifndef MUONBED_MPIRUN_PATH
#define MUONBED_MPIRUN_PATH ""
#endif

namespace muonbed::launch {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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

}  // namespace

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

Fault parse_fault(const std::string& text) {
  Fault f;
  if (text.empty()) return f;
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = text.find(':', start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) break;
    start = at + 1;
  }
  const auto bad = [&] {
    return Error("fault injection '" + text +
                 "': expected RANK:STEP:OP:KIND with KIND exit, throw or hang (e.g. 1:2:17:hang)");
  };
  if (parts.size() != 4) throw bad();
  int* fields[] = {&f.rank, &f.step, &f.op};
  for (int i = 0; i < 3; ++i) {
    try {
      std::size_t used = 0;
      *fields[i] = std::stoi(parts[i], &used);
      if (used != parts[i].size() || *fields[i] < 0) throw bad();
    } catch (const std::logic_error&) {
      throw bad();
    }
  }
  if (parts[3] == "exit")
    f.kind = FaultKind::exit;
  else if (parts[3] == "throw")
    f.kind = FaultKind::raise;
  else if (parts[3] == "hang")
    f.kind = FaultKind::hang;
  else
    throw bad();
  return f;
}

std::string to_string(const Fault& f) {
  if (!f.active()) return "";
  const char* kind = f.kind == FaultKind::exit    ? "exit"
                     : f.kind == FaultKind::raise ? "throw"
                                                  : "hang";
  return std::to_string(f.rank) + ":" + std::to_string(f.step) + ":" + std::to_string(f.op) + ":" +
         kind;
}

nlohmann::json to_json(const Job& j) {
  return {{"kind", j.kind},
          {"backend", j.backend},
          {"plan", j.plan},
          {"twin_plan", j.twin_plan},
          {"warmup_steps", j.warmup_steps},
          {"timed_steps", j.timed_steps},
          {"seed", j.seed},
          {"trace_ranks", j.trace_ranks},
          {"timeout_s", j.timeout_s},
          {"fault", j.fault},
          {"blas_threads", j.blas_threads},
          {"cluster_name", j.cluster_name},
          {"peak_tflops", j.peak_tflops},
          {"launcher", j.launcher},
          {"label", j.label},
          {"check_data", j.check_data},
          {"options", j.options}};
}

Job job_from_json(const nlohmann::json& v) {
  Job j;
  j.kind = v.at("kind").get<std::string>();
  j.backend = v.at("backend").get<std::string>();
  j.plan = v.at("plan");
  j.twin_plan = v.at("twin_plan");
  j.warmup_steps = v.at("warmup_steps").get<int>();
  j.timed_steps = v.at("timed_steps").get<int>();
  j.seed = v.at("seed").get<std::uint64_t>();
  j.trace_ranks = v.at("trace_ranks").get<int>();
  j.timeout_s = v.at("timeout_s").get<double>();
  j.fault = v.at("fault").get<std::string>();
  j.blas_threads = v.at("blas_threads").get<int>();
  j.cluster_name = v.at("cluster_name").get<std::string>();
  j.peak_tflops = v.at("peak_tflops").get<double>();
  j.launcher = v.at("launcher").get<std::string>();
  j.label = v.at("label").get<std::string>();
  j.check_data = v.at("check_data").get<bool>();
  j.options = v.at("options");
  return j;
}

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
    Fault fault;
    try {
      fault = parse_fault(v);
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
    job.fault = to_string(fault);
  }
  if (const auto threads = env_blas_threads()) job.blas_threads = *threads;
  return job;
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

std::string find_mpirun(const std::string& who) {
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
  throw Error(who +
              " starts its ranks with mpirun, which is not installed; fix: sudo "
              "apt-get install openmpi-bin (or set MUONBED_MPIRUN to an mpirun)");
}

std::vector<std::string> mpirun_argv(const std::string& mpirun, int ranks) {
  std::vector<std::string> argv = {mpirun, "-np", std::to_string(ranks)};
  if (ranks > available_cores()) argv.push_back("--oversubscribe");
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  // Each rank runs compute threads beside its MPI thread: no binding to one core.
  argv.insert(argv.end(), {"--bind-to", "none"});
  return argv;
}

std::string this_program() {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    throw Error("cannot find this program's path (/proc/self/exe) to start it under mpirun");
  return std::string(self, static_cast<std::size_t>(n));
}

std::string program_beside(const std::string& name, const char* variable, const std::string& what,
                           const std::string& fix) {
  if (const char* v = env(variable)) return v;
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  const fs::path path =
      fs::path(std::string(self, static_cast<std::size_t>(std::max<ssize_t>(n, 0)))).parent_path() /
      name;
  if (n <= 0 || access(path.c_str(), X_OK) != 0)
    throw Error(what + ", which is not beside " + std::string(self) + "; fix: " + fix + " or set " +
                variable + " to its path");
  return path.string();
}

namespace {

// Writes the job into a temporary folder, starts `command(job file, result file)` with its output
// into the folder's log, waits, and reads the result back; `who` names the starter in errors
// ("mpirun", "muonbed-gpu-worker").
PointRun run_job_command(
    const Job& job, const std::string& failure_log, const std::string& who,
    const std::function<std::vector<std::string>(const std::string&, const std::string&)>&
        command) {
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
  const std::vector<std::string> argv = command(job_file.string(), result_file.string());

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
  const fs::path log_copy(failure_log);
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
    throw Error(who + " " + how + " after " + took + " s (" + shell_words(argv) +
                "); its output:" + failure_excerpt(log) + "\n  (full output: " + kept +
                "; no result was written, so the next run reruns this point)");
  }
  const nlohmann::json result = nlohmann::json::parse(read_file(result_file));
  PointRun run;
  run.record = result_from_json(result.at("record").get<std::string>());
  run.trace = result.at("trace").get<std::string>();
  const auto& cost = result.at("cost");
  run.cost.what = "execution";
  run.cost.wall_s = cost.at("wall_s").get<double>();
  run.cost.peak_rss_bytes = cost.at("peak_rss_bytes").get<double>();
  run.cost.messages = cost.at("messages").get<std::int64_t>();
  run.cost.messages_what = cost.at("messages_what").get<std::string>();
  run.wrong_elements = result.value("wrong_elements", std::int64_t{-1});
  if (result.contains("adamw_twin"))
    run.adamw_twin = result_from_json(result.at("adamw_twin").get<std::string>());
  fs::remove_all(dir, ec);
  fs::remove(log_copy, ec);
  return run;
}

}  // namespace

PointRun launch_job(const Job& job, int ranks, const std::string& failure_log, std::string worker) {
  const std::string mpirun = find_mpirun("the " + job.backend + " backend");
  if (worker.empty()) worker = this_program();
  return run_job_command(job, failure_log, "mpirun",
                         [&](const std::string& job_file, const std::string& result_file) {
                           std::vector<std::string> argv = mpirun_argv(mpirun, ranks);
                           argv.insert(argv.end(), {worker, "mpi-worker", job_file, result_file});
                           return argv;
                         });
}

PointRun launch_local_job(const Job& job, const std::string& failure_log, const std::string& worker,
                          const std::string& mode) {
  return run_job_command(job, failure_log, fs::path(worker).filename().string(),
                         [&](const std::string& job_file, const std::string& result_file) {
                           return std::vector<std::string>{worker, mode, job_file, result_file};
                         });
}

std::string run_to_json(const PointRun& run) {
  nlohmann::json out = {{"record", result_to_json(run.record)},
                        {"trace", run.trace},
                        {"cost",
                         {{"wall_s", run.cost.wall_s},
                          {"peak_rss_bytes", run.cost.peak_rss_bytes},
                          {"messages", run.cost.messages},
                          {"messages_what", run.cost.messages_what}}},
                        {"wrong_elements", run.wrong_elements}};
  if (run.adamw_twin) out["adamw_twin"] = result_to_json(*run.adamw_twin);
  return out.dump();
}

int relaunch_under_mpirun(int ranks, const std::vector<std::string>& args, const std::string& who) {
  const std::string mpirun = find_mpirun(who);
  std::vector<std::string> argv = mpirun_argv(mpirun, ranks);
  argv.push_back(this_program());
  argv.insert(argv.end(), args.begin(), args.end());
  std::cout << "# starting: " << shell_words(argv) << std::endl;
  SpawnOptions spawn;
  spawn.null_stdin = false;
  spawn.default_env = {{"OPENBLAS_NUM_THREADS", "1"}};
  const int status = wait_process(spawn_process(argv, spawn));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  throw Error("mpirun " + describe_wait_status(status));
}

}  // namespace muonbed::launch
