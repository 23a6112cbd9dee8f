// Starting the ranks of a measured backend, shared by every backend whose ranks are processes
// under an MPI launcher (the mpi backend's CPU ranks, the nccl backend's GPU worker ranks). This
// side of a run includes no MPI header and links no MPI library: it writes a point's *job* to a
// job folder, starts `mpirun -np N ... WORKER mpi-worker JOB RESULT` (core/base/process.hpp: a
// process group of its own, ended with muonbed), waits, and reads the point's run back, or, when
// mpirun fails, keeps its output beside the point's result and throws with the ranks' errors.
// What the ranks do with the job (MPI bootstrap, the job protocol, the measured steps) is
// backends/ranks/.
//
//   Job job = launch::make_job(experiment, plan, settings);  // the common settings
//   job.backend = "mpi";  job.options = {...};               // the backend's own
//   PointRun run = launch::launch_job(job, ranks, failure_log, worker_program);
//
// Environment (read by the process that makes the job):
//   MUONBED_MPI_TIMEOUT=SECONDS   the ranks' watchdog (default 60)
//   MUONBED_MPI_FAULT=R:S:OP:KIND fault injection for tests: rank R exits / throws / hangs
//                                 (KIND exit | throw | hang) when it reaches plan op OP in step S
//   MUONBED_BLAS_THREADS=N        OpenBLAS threads per rank (default 1)
//   MUONBED_MPIRUN=PATH           the mpirun to start (default: the one found at configure time,
//                                 else `mpirun` on PATH)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/experiment/experiment.hpp"
#include "core/plan/plan.hpp"
#include "core/results/run_point.hpp"

namespace muonbed::launch {

// The MPI world this process was started in, from its launcher's environment (Open MPI's mpirun,
// PMIx, PMI-1/2 as MPICH and srun --mpi=pmi2 set it, Slurm's srun), without calling MPI.
struct MpiEnvironment {
  bool inside = false;
  int rank = 0;
  int size = 0;  // 0 when the launcher does not say (MPI_Comm_size tells after MPI_Init)
  std::string launcher;
};
MpiEnvironment mpi_environment();

// Fault injection: rank `rank` exits (code 3, without finalizing MPI), throws, or hangs when it
// reaches plan op `op` in step `step` (counted from 0 over warm-up and timed steps). Every
// executor under this launcher honours it.
enum class FaultKind { none, exit, raise, hang };
struct Fault {
  int rank = -1;
  int step = -1;
  int op = -1;
  FaultKind kind = FaultKind::none;
  bool active() const { return kind != FaultKind::none; }
};
// "RANK:STEP:OP:KIND" with KIND exit | throw | hang; "" is no fault. Throws Error on bad text.
Fault parse_fault(const std::string& text);
std::string to_string(const Fault& fault);

// What every rank needs to run one job: a point (kind "plan") or another collective job a backend
// registers (kind "compute": the mpi backend's compute benchmark).
struct Job {
  std::string kind = "plan";
  std::string backend = "mpi";  // whose job runner the ranks call (backends/ranks/jobs.hpp)
  nlohmann::json plan;          // plan_to_json; null for other kinds
  // A training point's AdamW twin (plan_to_json), measured in the same job with its steps
  // interleaved with the point's (backends/ranks/measure.hpp measure_paired); null: none. Set by
  // a backend whose job runner pairs them (mpi).
  nlohmann::json twin_plan;
  int warmup_steps = 2;
  int timed_steps = 10;
  std::uint64_t seed = 1;
  int trace_ranks = 64;
  double timeout_s = 60;
  std::string fault;  // to_string(Fault)
  int blas_threads = 1;
  std::string cluster_name;
  double peak_tflops = 0;
  std::string launcher;
  std::string label;
  bool check_data = false;  // RunSettings::check_data
  // The backend's own settings, read by its job runner only (mpi: exchange, compute mode, speed
  // probe; nccl: CUDA graphs, NS kernel version).
  nlohmann::json options = nlohmann::json::object();
};
nlohmann::json to_json(const Job& job);
Job job_from_json(const nlohmann::json& value);

// A point's job with the settings every measured backend shares: the experiment's warm-up and
// timed steps, seed, cluster, label; the watchdog, a fault (refused with the ranges when it names
// a rank, step or op the point does not have) and the BLAS threads from the environment.
Job make_job(const Experiment& experiment, const StepPlan& plan, const RunSettings& settings);
// MUONBED_BLAS_THREADS, checked (core/base/process.hpp env_number); nullopt when unset.
std::optional<int> env_blas_threads();

// Cores this process may run on (its affinity mask).
int available_cores();

// The mpirun to start (MUONBED_MPIRUN, the configured one, PATH), or Error with the fix naming
// `who` needs it ("the nccl backend", "muonbed calibrate").
std::string find_mpirun(const std::string& who);
// mpirun's options for `ranks` ranks on this machine: -np N, --oversubscribe beyond the cores,
// --allow-run-as-root as root, --bind-to none (ranks run compute threads beside their MPI thread).
std::vector<std::string> mpirun_argv(const std::string& mpirun, int ranks);
// This program's path (/proc/self/exe).
std::string this_program();
// A program beside this one (`name`), or the path in `variable` when set; Error with `fix`
// when it is not there.
std::string program_beside(const std::string& name, const char* variable, const std::string& what,
                           const std::string& fix);

// Runs `job` on `ranks` ranks of `worker` (empty: this program), each started as
// `WORKER mpi-worker JOB RESULT` under mpirun with OPENBLAS_NUM_THREADS defaulted to the job's
// BLAS threads; returns rank 0's run. When mpirun fails, its output is kept at `failure_log`
// (beside the point's result; removed when a later run succeeds) and Error quotes the ranks'
// errors and says that no result was written.
PointRun launch_job(const Job& job, int ranks, const std::string& failure_log,
                    std::string worker = "");

// A job whose ranks all run in ONE process started without a launcher (the CUDA loopback: every
// rank as a logical rank on one GPU): `WORKER MODE JOB RESULT`, with launch_job's job file,
// result, failure log and errors.
PointRun launch_local_job(const Job& job, const std::string& failure_log, const std::string& worker,
                          const std::string& mode);

// The result file a worker's rank 0 writes and launch_job reads: the record, the trace and the
// run's cost.
std::string run_to_json(const PointRun& run);

// Starts this program under mpirun with `ranks` ranks (mpirun_argv) and `args`, its output passed
// through; returns the exit code. `who` is named if there is no mpirun (find_mpirun).
int relaunch_under_mpirun(int ranks, const std::vector<std::string>& args, const std::string& who);

}  // namespace muonbed::launch
