// The Newton-Schulz benchmark behind `muonbed bench ns`. Each kernel is first validated against
// the CPU reference on a small input (a wrong kernel is reported, never timed as if right), then
// timed: warm-ups, then the median of many runs on random data, inputs rotated and (GPU) the L2
// flushed before each run. Reports time, TFLOP/s counted as batch * steps * (4 m^2 n + 2 m^3),
// and that rate as a fraction of a large GEMM's rate measured in the same run (bf16 cuBLAS GEMM
// on the GPU, cblas_sgemm or the blocked loop on the CPU).
//
// With a CUDA device: 1024^2, 2048^2, 4096^2, 8192^2, 4096x11008, 8192x28672 and the whole
// Muon parameter set of a preset (llama-7b), batched by shape. Without one: the CPU fp32 path
// on 256^2, 512^2, 1024^2, 512x1376, saying so plainly.
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/model/model.hpp"
#include "kernels/newton_schulz.hpp"
#include "kernels/optimizer_math.hpp"

namespace muonbed {

struct NsBenchOptions {
  std::string device = "auto";                 // auto (GPU if one is usable, else CPU) | gpu | cpu
  std::vector<MatrixShape> shapes;             // empty: the device's default list (above)
  std::string model_preset = "llama-7b";       // GPU only: its Muon set batched by shape; "" = none
  std::string coefficients = "keller_jordan";  // keller_jordan | polar_express
  int steps = 5;
  int version = 1;   // GPU NS kernel version (ns_kernel_versions())
  int warmup = -1;   // runs before timing; -1: 5 on GPU, 1 on CPU
  int repeats = -1;  // timed runs (the median is reported); -1: 30 on GPU, 5 on CPU
  std::uint64_t seed = 1;
  bool validate = true;   // check each kernel against the CPU reference before timing it
  std::string json_path;  // if set, also write the results there as JSON
};

// Runs the benchmark and prints a table to `out`. Returns 0 on success, 1 if a validation
// failed, 2 if a GPU was demanded (device "gpu") but none is usable. Options outside the limits
// below throw ConfigError before anything is allocated or run.
int run_ns_benchmark(const NsBenchOptions& options, std::ostream& out);

// Limits of `bench ns`, checked up front (a bad shape or count must be refused, not tried):
// steps 1..100, warmup -1 or 0..1000, repeats -1 or 1..10000, every shape dim 1..65536 and at
// most 2^31 elements; on the CPU, the buffers must fit in the machine's available memory and
// all runs together stay under kMaxCpuBenchFlops (~20 minutes of a CPU GEMM); on the GPU under
// kMaxGpuBenchFlops. Throws ConfigError naming the limit and the fix.
inline constexpr double kMaxCpuBenchFlops = 2e14;
inline constexpr double kMaxGpuBenchFlops = 1e18;
void check_ns_bench_options(const NsBenchOptions& options, bool on_gpu);

// `muonbed calibrate --backend nccl`'s timer (core/results/calibration.hpp's ComputeTimer, in
// experiments/cli/commands_calibrate.cpp): the CUDA kernels the GPU executor runs, timed by the
// same code as bench ns's rows (warm-ups, then per run the L2 flushed and the run timed with CUDA
// events; the median), with the optimizer settings of the experiment's plans.
struct GpuCalibrationRequest {
  std::vector<MatrixShape> ns_shapes;
  std::vector<std::int64_t> elementwise_numels;
  int version = 2;  // the GPU executor's default; a shape it cannot run takes v1, as the executor
  NsConfig config;
  MomentumParams momentum;
  ApplyParams apply;
  AdamWConfig adamw;
  int warmup = 5;
  int repeats = 30;
  std::uint64_t seed = 1;
};
struct GpuCalibrationTimes {
  std::string device_name;
  std::string versions;                               // cuda_versions_text()
  std::string kernel;                                 // "v2 (name)", the requested version
  std::vector<double> ns_ms;                          // per request.ns_shapes, the median
  std::vector<int> ns_version;                        // the version that ran it (v1 as a fallback)
  std::vector<std::array<double, 3>> elementwise_ms;  // per numel: momentum, apply_update, adamw
};
// Validates the kernel against the CPU reference first (as bench ns does; a wrong kernel is an
// Error, never timed); throws Error when no GPU is usable or a shape cannot run (out of memory).
// Progress lines go to `out`.
GpuCalibrationTimes time_calibration_kernels_gpu(const GpuCalibrationRequest& request,
                                                 std::ostream& out);

// The default shape lists.
std::vector<MatrixShape> default_gpu_bench_shapes();
std::vector<MatrixShape> default_cpu_bench_shapes();

// A model's Muon parameters grouped by NS shape: {batch = how many, rows, cols}, largest first.
std::vector<MatrixShape> muon_shape_groups(const Model& model);

}  // namespace muonbed
