// The launcher of measured backends (backends/launch/launch.hpp), which needs no MPI: fault
// injection text, the job a point's ranks get (every field survives the job file), the settings
// every backend's job shares, mpirun's command line, and a job run in one worker process.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backends/launch/launch.hpp"
#include "core/base/errors.hpp"
#include "core/experiment/experiment.hpp"
#include "core/plan/plan_json.hpp"
#include "muonbed/config.hpp"
#include "tests/common/tiny_experiment.hpp"

using namespace muonbed;

namespace {

Experiment eight_rank_point() {
  return testing::tiny_point("launch", "dgx-h100", 8, "mpi",
                             "strategy: {name: owner}\nsteps: 3\nrepeats: 4\nseed: 11\n");
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

}  // namespace

TEST_CASE("fault injection text: RANK:STEP:OP:KIND, refused otherwise", "[launch]") {
  const launch::Fault f = launch::parse_fault("1:2:17:hang");
  CHECK(f.rank == 1);
  CHECK(f.step == 2);
  CHECK(f.op == 17);
  CHECK(f.kind == launch::FaultKind::hang);
  CHECK(launch::to_string(f) == "1:2:17:hang");
  CHECK(launch::parse_fault("0:0:3:throw").kind == launch::FaultKind::raise);
  CHECK(launch::to_string(launch::parse_fault("0:0:3:throw")) == "0:0:3:throw");
  CHECK_FALSE(launch::parse_fault("").active());
  CHECK(launch::to_string(launch::Fault{}).empty());
  for (const char* bad : {"1:2:17", "1:2:17:boom", "a:2:17:exit", "-1:2:17:exit", "1:2:17x:exit"})
    CHECK_THROWS_WITH(launch::parse_fault(bad), Catch::Contains("expected RANK:STEP:OP:KIND"));
}

TEST_CASE("a job survives its file: every field read back as written", "[launch]") {
  launch::Job job;
  job.kind = "compute";
  job.backend = "nccl";
  job.plan = {{"any", "json"}};
  job.warmup_steps = 5;
  job.timed_steps = 7;
  job.seed = 1ull << 40;
  job.trace_ranks = 3;
  job.timeout_s = 2.5;
  job.fault = "1:0:2:exit";
  job.blas_threads = 4;
  job.cluster_name = "local-cpu";
  job.peak_tflops = 989.5;
  job.launcher = "srun";
  job.label = "point-a";
  job.check_data = true;
  job.options = {{"graph", true}, {"ns_version", 3}};
  const nlohmann::json text = launch::to_json(job);
  const launch::Job back = launch::job_from_json(nlohmann::json::parse(text.dump()));
  CHECK(launch::to_json(back) == text);
  CHECK(back.seed == job.seed);
  CHECK(back.options.at("ns_version") == 3);
}

TEST_CASE("a point's job: the experiment's steps and seed, a fault the point has", "[launch]") {
  const Experiment e = eight_rank_point();
  const StepPlan plan = plan_experiment(e);
  const launch::Job job = launch::make_job(e, plan, RunSettings{});
  CHECK(job.kind == "plan");
  CHECK(job.warmup_steps == 3);
  CHECK(job.timed_steps == 4);
  CHECK(job.seed == 11);
  CHECK(job.cluster_name == "dgx-h100");
  CHECK(job.label == "launch");
  CHECK(plan_from_json(job.plan).ops.size() == plan.ops.size());
  CHECK(job.fault.empty());
  {
    const ScopedEnv fault("MUONBED_MPI_FAULT", "7:6:0:exit");  // last rank, last step (3 + 4)
    CHECK(launch::make_job(e, plan, RunSettings{}).fault == "7:6:0:exit");
  }
  {
    // A fault that can never fire would let a failure test pass without failing.
    const ScopedEnv fault("MUONBED_MPI_FAULT", "8:0:0:exit");
    CHECK_THROWS_WITH(launch::make_job(e, plan, RunSettings{}),
                      Catch::Contains("names rank 8") && Catch::Contains("ranks 0..7"));
  }
  {
    const ScopedEnv fault("MUONBED_MPI_FAULT", "0:7:0:exit");
    CHECK_THROWS_WITH(launch::make_job(e, plan, RunSettings{}),
                      Catch::Contains("names step 7") && Catch::Contains("steps 0..6"));
  }
  {
    const ScopedEnv timeout("MUONBED_MPI_TIMEOUT", "2.5");
    CHECK(launch::make_job(e, plan, RunSettings{}).timeout_s == 2.5);
  }
}

TEST_CASE("mpirun's command line: oversubscribed beyond the cores, never bound", "[launch]") {
  const int cores = launch::available_cores();
  REQUIRE(cores >= 1);
  const std::vector<std::string> fits = launch::mpirun_argv("/usr/bin/mpirun", cores);
  CHECK(fits.at(0) == "/usr/bin/mpirun");
  CHECK(fits.at(1) == "-np");
  CHECK(fits.at(2) == std::to_string(cores));
  CHECK(std::count(fits.begin(), fits.end(), "--oversubscribe") == 0);
  const std::vector<std::string> more = launch::mpirun_argv("/usr/bin/mpirun", cores + 1);
  CHECK(std::count(more.begin(), more.end(), "--oversubscribe") == 1);
  // Ranks run compute threads beside their MPI thread: no binding to one core.
  const auto bind = std::find(more.begin(), more.end(), "--bind-to");
  REQUIRE(bind != more.end());
  CHECK(*(bind + 1) == "none");
}

TEST_CASE("a job run in one process: the worker's command, its result, its failure kept",
          "[launch]") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("muonbed-local-job-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const Experiment e = eight_rank_point();
  launch::Job job = launch::make_job(e, plan_experiment(e), RunSettings{});
  job.backend = "cuda_loopback";
  job.label = "point-x";

  // The run a worker would write, and a fake worker that checks its arguments, keeps the job it
  // was given and writes that run as its result.
  PointRun written;
  written.record.backend = "cuda_loopback";
  written.record.step.average_s = 0.125;
  written.trace = "{\"traceEvents\": []}\n";
  written.cost.wall_s = 1.5;
  written.cost.messages = 42;
  written.cost.messages_what = "device copies";
  {
    std::ofstream(dir / "result.json") << launch::run_to_json(written);
    std::ofstream script(dir / "worker.sh");
    script << "#!/bin/sh\n"
           << "[ \"$1\" = loopback-job ] || { echo \"wrong mode $1\" >&2; exit 9; }\n"
           << "cp \"$2\" '" << (dir / "job-seen.json").string() << "'\n"
           << "cp '" << (dir / "result.json").string() << "' \"$3\"\n";
  }
  fs::permissions(dir / "worker.sh", fs::perms::owner_all);
  const std::string failure_log = (dir / "out" / "cuda_loopback.failed.log").string();
  const PointRun run =
      launch::launch_local_job(job, failure_log, (dir / "worker.sh").string(), "loopback-job");
  CHECK(run.record.backend == "cuda_loopback");
  CHECK(run.record.step.average_s == 0.125);
  CHECK(run.trace == written.trace);
  CHECK(run.cost.messages == 42);
  CHECK(run.cost.messages_what == "device copies");
  std::ifstream seen(dir / "job-seen.json");
  REQUIRE(seen);
  CHECK(launch::to_json(launch::job_from_json(nlohmann::json::parse(seen))) ==
        launch::to_json(job));
  CHECK_FALSE(fs::exists(failure_log));

  // A worker that fails: its output is kept beside the point's result and quoted in the error.
  {
    std::ofstream script(dir / "worker.sh");
    script << "#!/bin/sh\necho 'CUDA loopback: out of memory on rank 3' >&2\nexit 3\n";
  }
  CHECK_THROWS_WITH(
      launch::launch_local_job(job, failure_log, (dir / "worker.sh").string(), "loopback-job"),
      Catch::Contains("worker.sh exited with code 3") &&
          Catch::Contains("out of memory on rank 3") && Catch::Contains("no result was written"));
  CHECK(fs::exists(failure_log));
  fs::remove_all(dir);
}
