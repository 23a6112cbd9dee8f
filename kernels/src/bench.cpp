// `muonbed bench ns`: validates, then times Newton-Schulz on the GPU (cuBLAS kernel versions) or,
// without a GPU, on the CPU's fp32 path (see kernels/bench.hpp).
#include "kernels/bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <vector>

#include "core/base/errors.hpp"
#include "core/results/results.hpp"
#include "kernels/gpu.hpp"
#include "kernels/random.hpp"
#include "kernels/reference_optimizer.hpp"
#include "kernels/src/bench_detail.hpp"
#include "kernels/src/cpu_gemm.hpp"
#include "muonbed/config.hpp"

namespace muonbed {
namespace bench_detail {

Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  Timing t;
  const std::size_t n = ms.size();
  t.median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  // Nearest-rank percentile.
  t.p95_ms = ms[std::min(n - 1, static_cast<std::size_t>(std::ceil(0.95 * n)) - 1)];
  t.max_ms = ms.back();
  return t;
}

double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += want[i] * want[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  return relative_error(got, std::vector<double>(want.begin(), want.end()));
}

// Small shapes that exercise the wide, tall and batched paths.
std::vector<MatrixShape> validation_shapes() {
  return {{1, 96, 160}, {1, 160, 96}, {3, 64, 80}};
}

std::string fmt(double value, int precision) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(precision) << value;
  return os.str();
}
std::string sci(double value) {
  std::ostringstream os;
  os << std::scientific << std::setprecision(2) << value;
  return os.str();
}

void print_table(std::ostream& out, const std::vector<Row>& rows, double yardstick_tflops,
                 const std::string& yardstick_name) {
  out << std::left << std::setw(16) << "shape" << std::right << std::setw(7) << "batch"
      << std::setw(12) << "median_ms" << std::setw(12) << "p95_ms" << std::setw(11) << "TFLOP/s"
      << std::setw(10) << "%" + yardstick_name << "\n";
  for (const Row& r : rows) {
    const std::string name = std::to_string(r.shape.rows) + "x" + std::to_string(r.shape.cols);
    out << std::left << std::setw(16) << name << std::right << std::setw(7) << r.shape.batch;
    if (!r.note.empty()) {
      out << "  skipped: " << r.note << "\n";
      continue;
    }
    const double tflops = r.flops / (r.timing.median_ms * 1e-3) / 1e12;
    out << std::setw(12) << fmt(r.timing.median_ms, 3) << std::setw(12) << fmt(r.timing.p95_ms, 3)
        << std::setw(11) << fmt(tflops, tflops < 1 ? 4 : 1) << std::setw(9)
        << fmt(100.0 * tflops / yardstick_tflops, 1) << "%";
    if (!r.group.empty()) out << "  (" << r.group << ")";
    out << "\n";
  }
}

void write_json(const std::string& path, nlohmann::json header, const std::vector<Row>& rows,
                const std::vector<Validation>& checks, double yardstick_tflops) {
  nlohmann::json records = nlohmann::json::array();
  for (const Row& r : rows) {
    // Each row names what it measured, as `muonbed bench collective --json` rows do.
    nlohmann::json j = {
        {"bench", "ns"},
        {"device", header.value("device", "")},
        {"kernel_version",
         header.contains("kernel_version") ? header["kernel_version"] : nlohmann::json(nullptr)},
        {"batch", r.shape.batch},
        {"rows", r.shape.rows},
        {"cols", r.shape.cols},
        {"group", r.group},
        {"flops", r.flops},
        {"skipped", r.note}};
    if (r.note.empty()) {
      const double tflops = r.flops / (r.timing.median_ms * 1e-3) / 1e12;
      j["time_us"] = r.timing.median_ms * 1e3;
      j["median_ms"] = r.timing.median_ms;
      j["p95_ms"] = r.timing.p95_ms;
      j["max_ms"] = r.timing.max_ms;
      j["tflops"] = tflops;
      j["fraction_of_gemm"] = tflops / yardstick_tflops;
    }
    records.push_back(j);
  }
  nlohmann::json validation = nlohmann::json::array();
  for (const Validation& v : checks) {
    validation.push_back({{"what", v.what}, {"max_rel_error", v.max_error}, {"limit", v.limit}});
  }
  header["gemm_tflops"] = yardstick_tflops;
  header["validation"] = validation;
  header["results"] = records;
  header["muonbed_version"] = MUONBED_VERSION;
  write_file_atomically(path, header.dump(2) + "\n");  // Error with the OS reason and the fix
}

void print_validation(std::ostream& out, const std::vector<Validation>& checks) {
  for (const Validation& v : checks) {
    out << "validation: " << v.what << ": max rel err " << sci(v.max_error) << " (limit "
        << sci(v.limit) << ") " << (v.ok() ? "OK" : "FAILED") << "\n";
  }
}

}  // namespace bench_detail

namespace {

using namespace bench_detail;

// --- CPU -------------------------------------------------------------------------------------

double cpu_gemm_tflops(int repeats) {
  // 1024^3 takes tens of milliseconds: three warm-ups wake BLAS's threads, and at least nine
  // timed runs keep one slow run (the machine may be shared) from setting the yardstick.
  const std::int64_t n = 1024;
  const int warmup = 3, timed = std::max(repeats, 9);
  std::vector<float> a(n * n), b(n * n), c(n * n);
  fill_uniform(a.data(), n * n, 7, 1, 1.0);
  fill_uniform(b.data(), n * n, 7, 2, 1.0);
  std::vector<double> ms;
  for (int r = 0; r < warmup + timed; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    detail::sgemm(false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const auto t1 = std::chrono::steady_clock::now();
    if (r >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return 2.0 * n * n * n / (summarize(ms).median_ms * 1e-3) / 1e12;
}

int run_cpu(const NsBenchOptions& o, const NsConfig& config, const std::string& reason,
            std::ostream& out) {
  const int warmup = o.warmup >= 0 ? o.warmup : 1;
  const int repeats = o.repeats > 0 ? o.repeats : 5;
  out << "muonbed bench ns: ran on the CPU, not a GPU (" << reason << ").\n"
      << "  Newton-Schulz fp32 path, GEMM: " << cpu_gemm_backend() << "; coefficients "
      << config.name << " x" << config.num_steps() << "; median of " << repeats << " runs after "
      << warmup << " warm-up(s)\n";

  std::vector<Validation> checks;
  if (o.validate) {
    Validation v{"CPU fp32 vs fp64 reference on 96x160, 160x96, 3x64x80", 0, 1e-4};
    for (const MatrixShape& s : validation_shapes()) {
      std::vector<double> in(s.numel()), want(s.numel());
      fill_uniform(in.data(), s.numel(), o.seed, 100, 1.0);
      newton_schulz(in.data(), want.data(), s, config);
      std::vector<float> in32(in.begin(), in.end()), got(s.numel());
      newton_schulz(in32.data(), got.data(), s, config, NsPrecision::fp32);
      v.max_error = std::max(v.max_error, relative_error(got, want));
    }
    checks.push_back(v);
    print_validation(out, checks);
    if (!v.ok()) return 1;
  }

  const double gemm_tflops = cpu_gemm_tflops(repeats);
  out << "yardstick: 1024x1024x1024 fp32 GEMM " << fmt(gemm_tflops * 1e3, 1) << " GFLOP/s\n";

  std::vector<Row> rows;
  const std::vector<MatrixShape> shapes = o.shapes.empty() ? default_cpu_bench_shapes() : o.shapes;
  for (const MatrixShape& s : shapes) {
    // Three inputs in turn, so no run starts with the previous run's input in cache.
    std::vector<std::vector<float>> inputs(3, std::vector<float>(s.numel()));
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      fill_uniform(inputs[k].data(), s.numel(), o.seed, 200 + k, 1.0);
    }
    std::vector<float> result(s.numel());
    std::vector<double> ms;
    for (int r = 0; r < warmup + repeats; ++r) {
      const auto& in = inputs[static_cast<std::size_t>(r) % inputs.size()];
      const auto t0 = std::chrono::steady_clock::now();
      newton_schulz(in.data(), result.data(), s, config, NsPrecision::fp32);
      const auto t1 = std::chrono::steady_clock::now();
      if (r >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    rows.push_back({s, "", summarize(ms), ns_flops(s, config.num_steps()), ""});
  }
  print_table(out, rows, gemm_tflops, "GEMM");
  out << "TFLOP/s counts batch * steps * (4 m^2 n + 2 m^3), m <= n; % is of the fp32 GEMM rate "
         "above.\n";
  if (!o.json_path.empty()) {
    write_json(o.json_path,
               {{"device", "cpu"},
                {"reason", reason},
                {"gemm", cpu_gemm_backend()},
                {"precision", "fp32"},
                {"coefficients", config.name},
                {"steps", config.num_steps()}},
               rows, checks, gemm_tflops);
  }
  return 0;
}

}  // namespace

std::vector<MatrixShape> default_gpu_bench_shapes() {
  return {{1, 1024, 1024}, {1, 2048, 2048},  {1, 4096, 4096},
          {1, 8192, 8192}, {1, 4096, 11008}, {1, 8192, 28672}};
}

std::vector<MatrixShape> default_cpu_bench_shapes() {
  return {{1, 256, 256}, {1, 512, 512}, {1, 1024, 1024}, {1, 512, 1376}};
}

std::vector<MatrixShape> muon_shape_groups(const Model& model) {
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> count;
  for (const Parameter& p : model.params) {
    if (route(p, RoutingRules{}) != OptimizerKind::muon) continue;
    const MatrixShape s = ns_shape(p);
    count[{s.rows, s.cols}] += s.batch;
  }
  std::vector<MatrixShape> groups;
  for (const auto& [rc, batch] : count) groups.push_back({batch, rc.first, rc.second});
  std::sort(groups.begin(), groups.end(), [](const MatrixShape& a, const MatrixShape& b) {
    return ns_flops(a, 1) > ns_flops(b, 1);
  });
  return groups;
}

namespace {

// Bytes the system can still give (MemAvailable), or 0 when unknown.
double available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

std::string gib_text(double bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << bytes / (1024.0 * 1024.0 * 1024.0) << " GiB";
  return os.str();
}

[[noreturn]] void bench_limit(const std::string& what, const std::string& fix) {
  throw ConfigError(SourceLocation{}, "bench ns: " + what, fix);
}

}  // namespace

void check_ns_bench_options(const NsBenchOptions& o, bool on_gpu) {
  if (o.steps < 1 || o.steps > 100)
    bench_limit("--steps " + std::to_string(o.steps) + " is outside 1..100",
                "use --steps 5 (Muon's usual count) or another count in 1..100");
  if (o.warmup < -1 || o.warmup > 1000)
    bench_limit("--warmup " + std::to_string(o.warmup) + " is outside 0..1000",
                "use -1 for the default (5 on GPU, 1 on CPU) or a count in 0..1000");
  if (o.repeats < -1 || o.repeats == 0 || o.repeats > 10000)
    bench_limit("--repeats " + std::to_string(o.repeats) + " is outside 1..10000",
                "use -1 for the default (30 on GPU, 5 on CPU) or a count in 1..10000");
  constexpr std::int64_t kMaxDim = 65536;
  constexpr std::int64_t kMaxElements = std::int64_t{1} << 31;
  for (const MatrixShape& s : o.shapes) {
    for (const std::int64_t d : {s.batch, s.rows, s.cols})
      if (d < 1 || d > kMaxDim)
        bench_limit("shape " + s.to_string() + " has a size outside 1.." + std::to_string(kMaxDim),
                    "use sizes in 1.." + std::to_string(kMaxDim) + ", e.g. --shape 4096x4096");
    std::int64_t n = 0;
    if (__builtin_mul_overflow(s.batch * s.rows, s.cols, &n) || n > kMaxElements)
      bench_limit("shape " + s.to_string() + " has more than 2^31 elements (8 GiB in fp32)",
                  "use a smaller shape or batch, e.g. --shape 8x4096x4096");
  }
  const std::vector<MatrixShape> shapes =
      o.shapes.empty() ? (on_gpu ? default_gpu_bench_shapes() : default_cpu_bench_shapes())
                       : o.shapes;
  const int warmup = o.warmup >= 0 ? o.warmup : (on_gpu ? 5 : 1);
  const int repeats = o.repeats > 0 ? o.repeats : (on_gpu ? 30 : 5);
  double flops = 0, peak_bytes = 0;
  for (const MatrixShape& s : shapes) {
    flops += ns_flops(s, o.steps) * (warmup + repeats);
    // CPU: three rotated inputs and the result, plus X, X' ([m, n]) and A, B ([m, m]) per matrix.
    const double m = static_cast<double>(s.small_dim()), n = static_cast<double>(s.large_dim());
    peak_bytes =
        std::max(peak_bytes, 4.0 * (4.0 * static_cast<double>(s.numel()) + 2 * m * n + 2 * m * m));
  }
  const double budget = on_gpu ? kMaxGpuBenchFlops : kMaxCpuBenchFlops;
  if (flops > budget) {
    std::ostringstream what;
    what << std::scientific << std::setprecision(2) << "the runs add up to " << flops
         << " FLOP, more than the " << budget << " FLOP a " << (on_gpu ? "GPU" : "CPU")
         << " benchmark may take (" << warmup << " warm-up + " << repeats
         << " timed runs of every shape)";
    bench_limit(what.str(), "use fewer --repeats / --warmup or smaller shapes" +
                                std::string(on_gpu ? "" : " (or run on a GPU)"));
  }
  const double available = available_memory_bytes();
  if (!on_gpu && available > 0 && peak_bytes > 0.8 * available)
    bench_limit("the largest shape needs about " + gib_text(peak_bytes) +
                    " of memory, and this machine has " + gib_text(available) + " available",
                "use a smaller shape or batch");
}

int run_ns_benchmark(const NsBenchOptions& options, std::ostream& out) {
  if (options.device != "auto" && options.device != "gpu" && options.device != "cpu") {
    out << "error: bench ns: unknown device '" << options.device << "'; valid: auto, gpu, cpu\n";
    return 2;
  }
  // Limits next: nothing is allocated or run for options outside them (ConfigError). Asking
  // for the device loads the CUDA module (in a CUDA build): not for --device cpu.
  std::string why;
  const bool have_gpu = options.device != "cpu" && cuda_device_available(&why);
  check_ns_bench_options(options, have_gpu);
  NsConfig config;
  try {
    if (options.coefficients == "custom") {
      throw Error(
          "bench ns: the custom coefficient set needs a list; use keller_jordan or "
          "polar_express");
    }
    config = make_ns_config(options.coefficients, options.steps);
    for (const MatrixShape& s : options.shapes) {
      if (s.batch < 1 || s.rows < 1 || s.cols < 1) {
        throw Error("bench ns: invalid shape " + s.to_string());
      }
    }
  } catch (const Error& e) {
    out << "error: " << e.what() << "\n";
    return 2;
  }

  if (options.device == "gpu" && !have_gpu) {
    out << "error: bench ns --device gpu: no usable CUDA device: " << why << "\n";
    return 2;
  }
  try {
    if (have_gpu) return run_ns_benchmark_gpu(options, config, out);
    return run_cpu(options, config, options.device == "cpu" ? "the CPU was asked for" : why, out);
  } catch (const Error& e) {
    out << "error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace muonbed
