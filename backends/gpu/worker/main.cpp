// muonbed-gpu-worker: the program that runs plans on GPUs, apart from the CLI so that the CLI
// never links CUDA or NCCL (a command that needs no GPU loads neither).
//
//   muonbed-gpu-worker mpi-worker JOB RESULT
//       what `muonbed run EXP --backend nccl` starts under mpirun for each point
//       (backends/launch/): the ranks' job protocol (backends/ranks/worker.hpp) with the `nccl`
//       job runner, one process per GPU (backends/gpu/nccl_executor.hpp).
//   muonbed-gpu-worker loopback-job JOB RESULT
//       what `muonbed run EXP --backend cuda_loopback` starts (one process, no mpirun) for each
//       point: the point's job on the CUDA loopback, its record written to RESULT
//       (cuda_loopback_backend.hpp).
//   muonbed-gpu-worker loopback EXP.yaml [--point LABEL] [--warmup N] [--repeats N]
//                      [--mode eager|graph|both] [--ns-version V] [--check] [--op-times]
//                      [--ns-identity] [--json FILE]
//       every point of an experiment on the CUDA loopback runtime (all ranks of a plan as
//       logical ranks on this one GPU, backends/gpu/cuda_loopback.hpp): warm-up and timed steps,
//       per step the GPU time (events around the step) and the host CPU time of issuing it;
//       --check fills the data as the reference does and compares every rank with the
//       single-device reference (bf16 NS tolerance) after the run (small models only: the
//       reference runs on the CPU); without it the data are drawn on the device (timing only,
//       random_device_data); --op-times records CUDA events around every op of eager steps and
//       says where rank 0's last step went (backends/gpu/op_times.hpp: per stream, per op kind,
//       per group of Newton-Schulz ops), then times the same NS calls alone with calibrate's
//       timer (kernels/bench.hpp), so that in-step and isolated NS stand side by side;
//       --ns-identity skips the NS kernels (the data still pass through every other kernel: the
//       step without NS, for the same table). Prints tables and writes the rows as JSON.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "backends/cpu/check.hpp"
#include "backends/gpu/cuda_loopback.hpp"
#include "backends/gpu/cuda_loopback_backend.hpp"
#include "backends/gpu/nccl_executor.hpp"
#include "backends/ranks/worker.hpp"
#include "core/base/errors.hpp"
#include "core/base/output_files.hpp"
#include "core/experiment/experiment.hpp"
#include "kernels/bench.hpp"
#include "kernels/newton_schulz.hpp"

using namespace muonbed;

namespace {

int usage() {
  std::cerr << "usage: muonbed-gpu-worker mpi-worker JOB RESULT\n"
               "       muonbed-gpu-worker loopback-job JOB RESULT\n"
               "       muonbed-gpu-worker loopback EXP.yaml [--point LABEL] [--warmup N] "
               "[--repeats N] [--mode eager|graph|both] [--ns-version V] [--check] [--op-times] "
               "[--ns-identity] [--json FILE]\n";
  return 2;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Where rank 0's last eager step went (summarize_op_times), printed and as JSON; unless NS was
// skipped, each NS call shape of the step is then timed alone with calibrate's timer (L2 flushed,
// median of 10 after 3 warm-ups), and each group of NS ops is set beside the sum of its calls
// alone. The step's NS ran on inputs its gathers had just written and beside the other streams'
// copies; alone, it runs on a cold L2 with the GPU to itself.
nlohmann::json report_op_times(const gpu::OpTimeSummary& s, double step_ms, const StepPlan& plan,
                               int ns_version, bool ns_identity) {
  nlohmann::json out = {{"step_ms", step_ms},
                        {"window_ms", s.window_ms},
                        {"ops_timed", s.ops_timed},
                        {"ops_dropped", s.ops_dropped}};
  std::printf(
      "    where rank 0's last step (%.3f ms, GPU events around it) went, from events around "
      "each of its %d ops%s:\n",
      step_ms, s.ops_timed, ns_identity ? " (NS skipped)" : "");
  nlohmann::json streams = nlohmann::json::array();
  for (const gpu::StreamTimeSummary& st : s.streams) {
    std::printf(
        "      stream %-14s %5d ops, busy %10.3f ms (%5.1f %% of the step), %.3f to %.3f ms\n",
        st.stream.c_str(), st.ops, st.busy_ms, step_ms > 0 ? 100 * st.busy_ms / step_ms : 0,
        st.first_ms, st.last_ms);
    streams.push_back({{"stream", st.stream},
                       {"ops", st.ops},
                       {"busy_ms", st.busy_ms},
                       {"first_ms", st.first_ms},
                       {"last_ms", st.last_ms}});
    for (const gpu::KindTimeSummary& k : s.kinds)
      if (k.stream == st.stream)
        std::printf("        %-18s %5d ops %10.3f ms (longest %.3f ms)\n", k.kind.c_str(), k.ops,
                    k.ms, k.max_ms);
  }
  out["streams"] = streams;
  nlohmann::json kinds = nlohmann::json::array();
  for (const gpu::KindTimeSummary& k : s.kinds)
    kinds.push_back({{"stream", k.stream},
                     {"kind", k.kind},
                     {"ops", k.ops},
                     {"ms", k.ms},
                     {"max_ms", k.max_ms}});
  out["kinds"] = kinds;
  // The NS calls alone (not when NS was skipped: the op times are then its gathers and scatters).
  std::map<std::string, double> alone_ms;
  std::string alone_note;
  const std::vector<MatrixShape> shapes = s.ns_call_shapes();
  if (!ns_identity && !shapes.empty()) {
    GpuCalibrationRequest q;
    q.ns_shapes = shapes;
    q.version = ns_version;
    q.config = make_ns_config(plan.settings.optimizer.muon);
    q.warmup = 3;
    q.repeats = 10;
    try {
      const GpuCalibrationTimes t = time_calibration_kernels_gpu(q, std::cout);
      for (std::size_t i = 0; i < shapes.size(); ++i)
        alone_ms[shapes[i].to_string()] = t.ns_ms.at(i);
    } catch (const std::exception& e) {
      alone_note = std::string("the NS calls could not be timed alone: ") + e.what();
      std::printf("    %s\n", alone_note.c_str());
    }
  }
  nlohmann::json groups = nlohmann::json::array();
  if (!s.ns.empty())
    std::printf(
        "    Newton-Schulz ops by their calls (batch x rows x cols per call): in the step "
        "against alone%s\n",
        alone_ms.empty() ? " (not timed)" : "");
  double in_step_total = 0, alone_total = 0;
  bool all_alone = !alone_ms.empty();
  for (const gpu::NsGroupSummary& g : s.ns) {
    std::string calls;
    double alone = 0;
    bool have = true;
    nlohmann::json call_list = nlohmann::json::array();
    for (const MatrixShape& c : g.calls) {
      calls += (calls.empty() ? "" : " + ") + c.to_string();
      call_list.push_back(c.to_string());
      const auto it = alone_ms.find(c.to_string());
      if (it == alone_ms.end())
        have = false;
      else
        alone += it->second;
    }
    in_step_total += g.ms;
    all_alone = all_alone && have;
    if (have) alone_total += alone * g.ops;
    const double per_op = g.ms / g.ops;
    if (have && alone > 0)
      std::printf(
          "      %-34s %5d ops, %10.3f ms in the step, %8.3f per op, alone %8.3f: %+6.1f %%\n",
          calls.c_str(), g.ops, g.ms, per_op, alone, 100 * (per_op / alone - 1));
    else
      std::printf("      %-34s %5d ops, %10.3f ms in the step, %8.3f per op\n", calls.c_str(),
                  g.ops, g.ms, per_op);
    nlohmann::json row = {{"calls", call_list}, {"ops", g.ops}, {"in_step_ms", g.ms}};
    row["alone_ms_per_op"] = have ? nlohmann::json(alone) : nlohmann::json(nullptr);
    groups.push_back(row);
  }
  if (all_alone && alone_total > 0)
    std::printf("      all NS ops: %.3f ms in the step, %.3f ms alone: %+.1f %%\n", in_step_total,
                alone_total, 100 * (in_step_total / alone_total - 1));
  out["ns_groups"] = groups;
  out["ns_in_step_ms"] = in_step_total;
  out["ns_alone_ms"] = all_alone ? nlohmann::json(alone_total) : nlohmann::json(nullptr);
  if (!alone_note.empty()) out["ns_alone_note"] = alone_note;
  std::fflush(stdout);
  return out;
}

int loopback(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string file = argv[2];
  std::string point, mode = "both", json_file;
  int warmup = -1, repeats = -1, ns_version = 2;
  bool check = false, op_times = false, ns_identity = false;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--point")
      point = next();
    else if (a == "--warmup")
      warmup = std::stoi(next());
    else if (a == "--repeats")
      repeats = std::stoi(next());
    else if (a == "--mode")
      mode = next();
    else if (a == "--ns-version")
      ns_version = std::stoi(next());
    else if (a == "--check")
      check = true;
    else if (a == "--op-times")
      op_times = true;
    else if (a == "--ns-identity")
      ns_identity = true;
    else if (a == "--json")
      json_file = next();
    else
      return usage();
  }
  if (mode != "eager" && mode != "graph" && mode != "both") return usage();
  if (ns_identity && check) {
    std::cerr << "muonbed-gpu-worker: --ns-identity skips Newton-Schulz, so the reference check "
                 "(--check) would fail by design: use one or the other\n";
    return 2;
  }
  std::string why;
  if (!cuda_device_available(&why)) {
    std::cout << "SKIPPED: " << why << std::endl;
    return 77;
  }
  const std::string device = gpu::describe_device(0);
  std::cout << "device: " << device << std::endl;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("  %-40s %5s %6s %12s %12s %12s %9s %s\n", "point", "ranks", "mode", "GPU p50 ms",
              "GPU p95 ms", "host CPU ms", "host/GPU", "check");
  for (const Experiment& e : load_experiment(file)) {
    if (!point.empty() && e.point_label != point) continue;
    const StepPlan plan = plan_experiment(e);
    std::printf("  # %s: %d ranks, %s data\n",
                (e.point_label.empty() ? e.name : e.point_label).c_str(), plan.mesh().world_size(),
                check ? "reference (checked)" : "device-random");
    std::fflush(stdout);
    const int w = warmup >= 0 ? warmup : e.steps;
    const int n = repeats > 0 ? repeats : e.repeats;
    for (const char* mode_name : {"eager", "graph"}) {
      const std::string m = mode_name;
      if (mode != "both" && mode != m) continue;
      gpu::CudaLoopbackOptions options;
      options.seed = e.seed;
      options.graph = m == "graph";
      options.device.ns_version = ns_version;
      options.device.time_ops = op_times && m == "eager";
      options.device.ns_identity = ns_identity;
      // Without --check nothing reads the values: draw them on the device (seconds instead of
      // a host minute per billion parameters and step; the GPU work is the same).
      options.random_device_data = !check;
      std::vector<double> gpu_ms, host_ms;
      std::optional<gpu::OpTimeSummary> ops;
      std::string verdict = "-";
      nlohmann::json memory;
      {
        // The device memory the executor takes: what cudaMemGetInfo says is used, before and
        // while it lives, beside the plan's rank_memory and the pools it laid out.
        std::size_t free_before = 0, free_during = 0, total = 0;
        MUONBED_GPU_CHECK(cudaMemGetInfo(&free_before, &total));
        gpu::CudaLoopbackExecutor executor(plan, options);
        for (int k = 0; k < w + n; ++k) {
          executor.run_step();
          if (k >= w && !executor.last_step().captured) {
            gpu_ms.push_back(executor.last_step().gpu_ms);
            host_ms.push_back(executor.last_step().host_ms);
          }
        }
        MUONBED_GPU_CHECK(cudaMemGetInfo(&free_during, &total));
        std::int64_t planned = 0, pools = 0, device_bytes = 0;
        for (int r = 0; r < plan.mesh().world_size(); ++r) {
          planned += rank_memory(plan, r).peak_bytes();
          pools += executor.device(r).pool_bytes();
          device_bytes += executor.device(r).device_bytes();
        }
        const auto grew =
            static_cast<std::int64_t>(free_before) - static_cast<std::int64_t>(free_during);
        memory = {{"ranks", plan.mesh().world_size()},
                  {"rank_memory_bytes", planned},
                  {"pool_bytes", pools},
                  {"device_bytes", device_bytes},
                  {"measured_used_growth_bytes", grew}};
        if (options.device.time_ops)
          ops = gpu::summarize_op_times(plan, executor.program(0), executor.op_times(0));
        if (check) {
          cpu::ReferenceRun reference(plan, e.seed);
          reference.run_to(executor.steps_done());
          verdict = "ok";
          for (int r = 0; r < plan.mesh().world_size(); ++r)
            if (auto mm =
                    cpu::first_mismatch(plan, executor.store(r), reference, cpu::kBf16NsCheck)) {
              verdict = "WRONG: " + mm->message;
              break;
            }
        }
      }  // the executor's memory is free again for the NS calls timed alone
      // Rank 0's ops of the last step: the sum of their GPU times per stream (what the step would
      // take with no overlap and no gaps on that stream) beside the step.
      nlohmann::json op_sums = nlohmann::json::object();
      if (ops)
        for (const gpu::KindTimeSummary& k : ops->kinds)
          op_sums[k.stream] = op_sums.value(k.stream, 0.0) + k.ms;
      const std::string label = e.point_label.empty() ? e.name : e.point_label;
      const double g50 = percentile(gpu_ms, 0.5), g95 = percentile(gpu_ms, 0.95),
                   h50 = percentile(host_ms, 0.5);
      std::printf("  %-40s %5d %6s %12.3f %12.3f %12.3f %8.1f%% %s%s\n", label.c_str(),
                  plan.mesh().world_size(), m.c_str(), g50, g95, h50,
                  g50 > 0 ? 100.0 * h50 / g50 : 0.0, verdict.c_str(),
                  ns_identity ? " (NS skipped: --ns-identity)" : "");
      std::fflush(stdout);
      {
        const auto gb = [&](const char* key) { return memory[key].get<double>() / 1e9; };
        const double planned = gb("rank_memory_bytes"), pools = gb("pool_bytes");
        std::printf(
            "    memory of its %d rank(s): plan rank_memory %.3f GB; pools %.3f GB "
            "(%+.2f %%); with fp32 scratch, NS workspaces and tables %.3f GB; the "
            "device's used memory grew by %.3f GB while the executor lived "
            "(cudaMemGetInfo: cuBLAS, streams and graphs included)\n",
            memory["ranks"].get<int>(), planned, pools,
            planned > 0 ? 100.0 * (pools / planned - 1) : 0.0, gb("device_bytes"),
            gb("measured_used_growth_bytes"));
      }
      nlohmann::json breakdown = nullptr;
      if (ops)
        breakdown = report_op_times(*ops, gpu_ms.empty() ? 0 : gpu_ms.back(), plan, ns_version,
                                    ns_identity);
      rows.push_back({{"point", label},
                      {"experiment", e.name},
                      {"ranks", plan.mesh().world_size()},
                      {"mode", m},
                      {"device", device},
                      {"ns_version", ns_version},
                      {"ns_identity", ns_identity},
                      {"warmup", w},
                      {"gpu_ms", gpu_ms},
                      {"host_cpu_ms", host_ms},
                      {"gpu_ms_p50", g50},
                      {"gpu_ms_p95", g95},
                      {"host_cpu_ms_p50", h50},
                      {"rank0_op_ms_per_stream", op_sums},
                      {"rank0_step_breakdown", breakdown},
                      {"memory", memory},
                      {"check", verdict}});
      if (verdict.rfind("WRONG", 0) == 0) {
        std::cerr << "muonbed-gpu-worker: error: " << verdict << "\n";
        return 1;
      }
    }
  }
  if (!json_file.empty()) write_output_file(json_file, rows.dump(2) + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string command = argv[1];
  try {
    if (command == "mpi-worker") {
      if (argc != 4) return usage();
      gpu::register_nccl_job_runner();
      return run_mpi_worker(argv[2], argv[3]);
    }
    if (command == "loopback") return loopback(argc, argv);
    if (command == "loopback-job") {
      if (argc != 4) return usage();
      return gpu::run_cuda_loopback_job(argv[2], argv[3]);
    }
  } catch (const std::exception& e) {
    std::cerr << "muonbed-gpu-worker: error: " << e.what() << std::endl;
    return 1;
  }
  return usage();
}
