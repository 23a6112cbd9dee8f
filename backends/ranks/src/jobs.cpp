// The ranks' job protocol (see backends/ranks/jobs.hpp and worker.hpp): job runners, the
// broadcast of jobs, running one on every rank, the followers of a user-started world and the
// worker that launch_job starts.
#include "backends/ranks/jobs.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "backends/ranks/worker.hpp"
#include "backends/ranks/world.hpp"
#include "core/base/errors.hpp"
#include "core/base/output_files.hpp"
#include "core/plan/plan_json.hpp"

namespace muonbed::mpi {

namespace {

std::map<std::string, JobRunner>& job_runners() {
  static std::map<std::string, JobRunner> runners;
  return runners;
}

std::map<std::string, JobKindRunner>& kind_runners() {
  static std::map<std::string, JobKindRunner> runners;
  return runners;
}

bool g_leader = false;  // rank 0 of a world whose other ranks serve its jobs

// A failure on one rank: an ordinary error when it is alone, else the end of every rank.
[[noreturn]] void fail(const std::exception& e) {
  std::string message = e.what();
  if (message.rfind("rank ", 0) != 0)
    message = "rank " + std::to_string(world_rank()) + ": " + message;
  if (world_size() == 1) throw Error(message);  // nobody else to end: an ordinary error
  abort_world(message);
}

// Every rank runs the job; rank 0 returns the point's run (nullopt elsewhere and for other
// kinds). A world of the wrong size is an error on rank 0 (thrown) and `wrong_world` elsewhere.
std::optional<PointRun> execute_job(const launch::Job& job, bool& wrong_world) {
  wrong_world = false;
  if (job.kind != "plan") {
    const auto it = kind_runners().find(job.kind);
    try {
      if (it == kind_runners().end())
        throw Error("this program cannot run jobs of kind '" + job.kind + "'");
      it->second(job, MPI_COMM_WORLD);
    } catch (const std::exception& e) {
      fail(e);
    }
    return std::nullopt;
  }
  std::optional<StepPlan> plan;
  try {
    plan = plan_from_json(job.plan);
  } catch (const std::exception& e) {
    if (world_size() == 1) throw;
    abort_world("rank " + std::to_string(world_rank()) + ": " + e.what());
  }
  if (plan->mesh().world_size() != world_size()) {
    wrong_world = true;
    if (world_rank() == 0)
      throw Error("point '" + job.label + "' needs " + std::to_string(plan->mesh().world_size()) +
                  " ranks (mesh " + plan->mesh().describe() + ") but this MPI world has " +
                  std::to_string(world_size()) + "; fix: mpirun -np " +
                  std::to_string(plan->mesh().world_size()));
    return std::nullopt;
  }
  try {
    const JobRunner runner = find_job_runner(job.backend);
    if (runner == nullptr)
      throw Error("this program cannot run the " + job.backend +
                  " backend (its ranks run the program that registers its job runner: "
                  "muonbed for mpi, muonbed-gpu-worker for nccl)");
    std::optional<Measured> m = runner(*plan, MPI_COMM_WORLD, job, measure_settings(job));
    if (!m) return std::nullopt;
    return point_run(std::move(*m));
  } catch (const std::exception& e) {
    fail(e);
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

// A follower's wait for the next job; false when rank 0 is done.
bool receive_job(launch::Job& job) {
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
  job = launch::job_from_json(nlohmann::json::parse(text));
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void register_job_runner(const std::string& backend, JobRunner runner) {
  job_runners()[backend] = runner;
}

JobRunner find_job_runner(const std::string& backend) {
  const auto it = job_runners().find(backend);
  return it == job_runners().end() ? nullptr : it->second;
}

void register_job_kind(const std::string& kind, JobKindRunner runner) {
  kind_runners()[kind] = runner;
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

bool leading_world() {
  return g_leader;
}

void send_job(const launch::Job& job) {
  std::string text = launch::to_json(job).dump();
  send_job_header(static_cast<long long>(text.size()));
  broadcast_body(text);
}

PointRun lead_job(const launch::Job& job) {
  if (world_size() > 1) send_job(job);
  bool wrong_world = false;
  std::optional<PointRun> result = execute_job(job, wrong_world);
  if (!result) throw Error("internal: rank 0 measured nothing");
  return std::move(*result);
}

}  // namespace muonbed::mpi

namespace muonbed {

int mpi_command_begin() {
  if (!launch::mpi_environment().inside) return -1;
  mpi::init_mpi();
  if (mpi::world_rank() == 0) {
    mpi::g_leader = true;
    return -1;
  }
  launch::Job job;
  try {
    bool wrong_world = false;
    while (mpi::receive_job(job)) mpi::execute_job(job, wrong_world);
  } catch (const std::exception& e) {
    mpi::abort_world("rank " + std::to_string(mpi::world_rank()) + ": " + e.what());
  }
  MPI_Finalize();
  return 0;
}

void mpi_command_end() {
  if (!mpi::g_leader) return;
  mpi::g_leader = false;
  if (mpi::world_size() > 1) mpi::send_job_header(-1);
  MPI_Finalize();
}

bool mpi_leader() {
  return mpi::g_leader || (launch::mpi_environment().inside && mpi::world_size() == 1);
}

int run_mpi_worker(const std::string& job_file, const std::string& result_file) {
  mpi::init_mpi();
  launch::Job job;
  try {
    if (mpi::world_rank() == 0) {
      const std::string text = mpi::read_file(job_file);
      if (text.empty()) throw Error("cannot read the job file " + job_file);
      job = launch::job_from_json(nlohmann::json::parse(text));
      if (mpi::world_size() > 1) mpi::send_job(job);
    } else if (!mpi::receive_job(job)) {
      MPI_Finalize();
      return 0;
    }
  } catch (const std::exception& e) {
    mpi::abort_world("rank " + std::to_string(mpi::world_rank()) + ": " + e.what());
  }
  std::optional<PointRun> run;
  bool wrong_world = false;
  try {
    run = mpi::execute_job(job, wrong_world);
  } catch (const std::exception& e) {  // the world size on rank 0, or any error of a lone rank
    std::cerr << "muonbed: error: " << e.what() << std::endl;
    MPI_Finalize();
    return 1;
  }
  if (run) write_file_atomically(result_file, launch::run_to_json(*run));
  MPI_Finalize();
  return wrong_world ? 1 : 0;
}

}  // namespace muonbed
