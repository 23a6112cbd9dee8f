// Timed runs on the GPU, beside the checked ones of gpu_loopback_test.cpp:
//   * where a step went (backends/gpu/op_times.hpp) from a real eager step's CUDA events: every
//     issued op timed once, no stream busier than the step, every NS op in one group;
//   * the cuda_loopback backend's worker side (cuda_loopback_backend.hpp, builds with MPI): a
//     point's job run on the CUDA loopback and written as a record, eager and graph.
// Label gpu: skipped (exit 77, gpu_probe.cpp) without a CUDA device.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backends/gpu/cuda_loopback.hpp"
#include "backends/gpu/op_times.hpp"
#include "core/plan/program.hpp"
#include "tests/common/strategy_matrix.hpp"
#if MUONBED_TEST_LOOPBACK_JOB
#include "backends/gpu/cuda_loopback_backend.hpp"
#include "backends/launch/launch.hpp"
#include "core/results/results.hpp"
#include "tests/common/tiny_experiment.hpp"
#endif

using namespace muonbed;

TEST_CASE("where an eager step went: every issued op timed once, inside the step",
          "[gpu][op-times]") {
  const ShardedModel sharded = testing::make_model(testing::topologies()[1]);  // FSDP
  StrategyOptions strategy;
  strategy.name = "owner";
  const StepPlan plan = build_plan(sharded, strategy, PlanSettings{});
  gpu::CudaLoopbackOptions options;
  options.device.time_ops = true;
  options.random_device_data = true;
  gpu::CudaLoopbackExecutor executor(plan, options);
  executor.run(3);
  const int step = executor.last_step().step;
  const double step_ms = executor.last_step().gpu_ms;
  REQUIRE(step_ms > 0);
  for (int r = 0; r < plan.mesh().world_size(); ++r) {
    INFO("rank " << r);
    const RankProgram& program = executor.program(r);
    const gpu::OpTimeSummary s = gpu::summarize_op_times(plan, program, executor.op_times(r));
    int issued = 0, ns_issued = 0;
    // alloc and release queue no work and get no start event: they are not timed.
    for (const RankOp& op : program.ops)
      if (!is_memory(op.kind) && issued_in_step(plan, program, op.op, step)) {
        ++issued;
        ns_issued += op.kind == OpKind::newton_schulz ? 1 : 0;
      }
    CHECK(s.ops_timed == issued);
    CHECK(s.window_ms <= step_ms * 1.001 + 1e-3);
    for (const gpu::StreamTimeSummary& st : s.streams) {
      CHECK(st.busy_ms > 0);
      CHECK(st.busy_ms <= step_ms * 1.001 + 1e-3);
    }
    int grouped = 0;
    for (const gpu::NsGroupSummary& g : s.ns) grouped += g.ops;
    CHECK(grouped == ns_issued);
  }
}

#if MUONBED_TEST_LOOPBACK_JOB
TEST_CASE("a cuda_loopback job: the point's record, eager and graph", "[gpu][cuda_loopback]") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("muonbed-gpu-job-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const Experiment e = testing::tiny_point("gpu_job", "dgx-h100", 4, "cuda_loopback",
                                           "strategy: {name: owner}\nsteps: 2\nrepeats: 5\n");
  const StepPlan plan = plan_experiment(e);
  for (const bool graph : {false, true}) {
    INFO((graph ? "graph" : "eager"));
    launch::Job job = launch::make_job(e, plan, RunSettings{});
    job.backend = "cuda_loopback";
    job.options["graph"] = graph;
    const fs::path job_file = dir / "job.json", result_file = dir / "result.json";
    std::ofstream(job_file) << launch::to_json(job).dump();
    fs::remove(result_file);
    REQUIRE(gpu::run_cuda_loopback_job(job_file.string(), result_file.string()) == 0);
    std::ifstream in(result_file);
    std::ostringstream text;
    text << in.rdbuf();
    const nlohmann::json result = nlohmann::json::parse(text.str());
    const ResultRecord r = result_from_json(result.at("record").get<std::string>());
    CHECK(r.backend == "cuda_loopback");
    CHECK(r.fidelity == "measured");
    CHECK(r.step.measured.timed_steps == 5);
    CHECK(r.step.measured.median_s > 0);
    CHECK_FALSE(r.execution.oversubscribed);
    REQUIRE(r.ranks.size() == 4);
    for (const RankResult& rr : r.ranks) {
      CHECK(rr.memory.measured_peak_bytes > 0);
      if (!graph) CHECK(rr.average.compute_s > 0);  // graphs have no per-op times
    }
    bool caveat = false;
    for (const std::string& n : r.notes) caveat = caveat || n.find("ONE GPU") != std::string::npos;
    CHECK(caveat);
    if (!graph) CHECK_NOTHROW(nlohmann::json::parse(result.at("trace").get<std::string>()));
  }
  fs::remove_all(dir);
}
#endif
