// Private pieces of the Newton-Schulz benchmark shared by its CPU half (bench.cpp) and its GPU
// half (bench_gpu.cpp, in the CUDA module): result rows, the table and JSON writers, and the GPU
// entry point, which the CPU library reaches in one of three ways: bench_gpu.cpp itself
// (gpu_tests), the CUDA module loaded on first use (gpu_loader.cpp, the muonbed CLI in a CUDA
// build), or a stub saying the build has no CUDA (gpu_stub.cpp).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/bench.hpp"
#include "kernels/newton_schulz.hpp"

namespace muonbed {

namespace bench_detail {

struct Timing {
  double median_ms = 0, p95_ms = 0, max_ms = 0;
};
Timing summarize(std::vector<double> ms);

double relative_error(const std::vector<float>& got, const std::vector<double>& want);
double relative_error(const std::vector<float>& got, const std::vector<float>& want);

struct Row {
  MatrixShape shape;
  std::string group;  // "" or the model preset
  Timing timing;
  double flops = 0;
  std::string note;  // why a row was skipped
};

struct Validation {
  std::string what;
  double max_error = 0;
  double limit = 0;
  bool ok() const { return max_error <= limit; }
};

// Small shapes that exercise the wide, tall and batched paths.
std::vector<MatrixShape> validation_shapes();
std::string fmt(double value, int precision);
std::string sci(double value);
void print_table(std::ostream& out, const std::vector<Row>& rows, double yardstick_tflops,
                 const std::string& yardstick_name);
void write_json(const std::string& path, nlohmann::json header, const std::vector<Row>& rows,
                const std::vector<Validation>& checks, double yardstick_tflops);
void print_validation(std::ostream& out, const std::vector<Validation>& checks);

}  // namespace bench_detail

// The GPU benchmark (options already checked, a usable device found).
int run_ns_benchmark_gpu(const NsBenchOptions& options, const NsConfig& config, std::ostream& out);

}  // namespace muonbed
