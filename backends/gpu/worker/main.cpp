// muonbed-gpu-worker: the program that runs plans on GPUs, apart from the CLI so that the CLI
// never links CUDA or NCCL (a command that needs no GPU loads neither).
//
//   muonbed-gpu-worker mpi-worker JOB RESULT
//       what `muonbed run EXP --backend nccl` starts under mpirun for each point
//       (backends/launch/): the ranks' job protocol (backends/ranks/worker.hpp) with the `nccl`
//       job runner, one process per GPU (backends/gpu/nccl_executor.hpp).
//   muonbed-gpu-worker loopback EXP.yaml [--point LABEL] [--warmup N] [--repeats N]
//                      [--mode eager|graph|both] [--ns-version V] [--check] [--op-times]
//                      [--json FILE]
//       every point of an experiment on the CUDA loopback runtime (all ranks of a plan as
//       logical ranks on this one GPU, backends/gpu/cuda_loopback.hpp): warm-up and timed steps,
//       per step the GPU time (events around the step) and the host CPU time of issuing it;
//       --check fills the data as the reference does and compares every rank with the
//       single-device reference (bf16 NS tolerance) after the run (small models only: the
//       reference runs on the CPU); without it the data are drawn on the device (timing only,
//       random_device_data); --op-times records CUDA
//       events around every op of eager steps and reports rank 0's op time per stream. Prints a
//       table and writes the rows as JSON.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cpu/check.hpp"
#include "backends/gpu/cuda_loopback.hpp"
#include "backends/gpu/nccl_executor.hpp"
#include "backends/ranks/worker.hpp"
#include "core/base/errors.hpp"
#include "core/base/output_files.hpp"
#include "core/experiment/experiment.hpp"

using namespace muonbed;

namespace {

int usage() {
  std::cerr << "usage: muonbed-gpu-worker mpi-worker JOB RESULT\n"
               "       muonbed-gpu-worker loopback EXP.yaml [--point LABEL] [--warmup N] "
               "[--repeats N] [--mode eager|graph|both] [--ns-version V] [--check] [--op-times] "
               "[--json FILE]\n";
  return 2;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

int loopback(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string file = argv[2];
  std::string point, mode = "both", json_file;
  int warmup = -1, repeats = -1, ns_version = 2;
  bool check = false, op_times = false;
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
    else if (a == "--json")
      json_file = next();
    else
      return usage();
  }
  if (mode != "eager" && mode != "graph" && mode != "both") return usage();
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
      // Without --check nothing reads the values: draw them on the device (seconds instead of
      // a host minute per billion parameters and step; the GPU work is the same).
      options.random_device_data = !check;
      gpu::CudaLoopbackExecutor executor(plan, options);
      std::vector<double> gpu_ms, host_ms;
      for (int k = 0; k < w + n; ++k) {
        executor.run_step();
        if (k >= w && !executor.last_step().captured) {
          gpu_ms.push_back(executor.last_step().gpu_ms);
          host_ms.push_back(executor.last_step().host_ms);
        }
      }
      // Rank 0's ops of the last step: the sum of their GPU times per stream (what the step would
      // take with no overlap and no gaps on that stream) beside the step.
      std::map<int, double> stream_ms;
      for (const gpu::DeviceOpTime& t : executor.op_times(0))
        stream_ms[t.stream] += t.end_ms - t.start_ms;
      nlohmann::json op_sums = nlohmann::json::object();
      for (const auto& [stream, ms] : stream_ms)
        op_sums[plan.streams.at(static_cast<std::size_t>(stream))] = ms;
      std::string verdict = "-";
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
      const std::string label = e.point_label.empty() ? e.name : e.point_label;
      const double g50 = percentile(gpu_ms, 0.5), g95 = percentile(gpu_ms, 0.95),
                   h50 = percentile(host_ms, 0.5);
      std::printf("  %-40s %5d %6s %12.3f %12.3f %12.3f %8.1f%% %s\n", label.c_str(),
                  plan.mesh().world_size(), m.c_str(), g50, g95, h50,
                  g50 > 0 ? 100.0 * h50 / g50 : 0.0, verdict.c_str());
      std::fflush(stdout);
      rows.push_back({{"point", label},
                      {"experiment", e.name},
                      {"ranks", plan.mesh().world_size()},
                      {"mode", m},
                      {"device", device},
                      {"ns_version", ns_version},
                      {"warmup", w},
                      {"gpu_ms", gpu_ms},
                      {"host_cpu_ms", host_ms},
                      {"gpu_ms_p50", g50},
                      {"gpu_ms_p95", g95},
                      {"host_cpu_ms_p50", h50},
                      {"rank0_op_ms_per_stream", op_sums},
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
  } catch (const std::exception& e) {
    std::cerr << "muonbed-gpu-worker: error: " << e.what() << std::endl;
    return 1;
  }
  return usage();
}
