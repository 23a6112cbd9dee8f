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

#include "core/errors.hpp"
#include "kernels/gpu.hpp"
#include "kernels/random.hpp"
#include "kernels/reference_optimizer.hpp"
#include "kernels/src/cpu_gemm.hpp"
#include "muonbed/config.hpp"

namespace muonbed {
namespace {

struct Timing {
  double median_ms = 0, p95_ms = 0, max_ms = 0;
};

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
  std::ofstream file(path);
  if (!file) throw Error("bench ns: cannot write '" + path + "'");
  file << header.dump(2) << "\n";
}

void print_validation(std::ostream& out, const std::vector<Validation>& checks) {
  for (const Validation& v : checks) {
    out << "validation: " << v.what << ": max rel err " << sci(v.max_error) << " (limit "
        << sci(v.limit) << ") " << (v.ok() ? "OK" : "FAILED") << "\n";
  }
}

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

// --- GPU -------------------------------------------------------------------------------------

int run_gpu(const NsBenchOptions& o, const NsConfig& config, std::ostream& out) {
  const int warmup = o.warmup >= 0 ? o.warmup : 5;
  const int repeats = o.repeats > 0 ? o.repeats : 30;
  CudaContext ctx;
  std::unique_ptr<NsKernel> kernel = make_ns_kernel(o.version);
  out << "muonbed bench ns: GPU " << ctx.device_name() << ", kernel v" << kernel->version() << " ("
      << kernel->name() << "); coefficients " << config.name << " x" << config.num_steps()
      << "; median of " << repeats << " runs after " << warmup
      << " warm-ups, L2 flushed before each run, inputs rotated\n";

  std::vector<Validation> checks;
  if (o.validate) {
    Validation like{"GPU v" + std::to_string(kernel->version()) +
                        " vs CPU bf16 emulation on 96x160, 160x96, 3x64x80",
                    0, 2e-2};
    Validation ref{"GPU v" + std::to_string(kernel->version()) + " vs CPU fp64 reference", 0, 5e-2};
    for (const MatrixShape& s : validation_shapes()) {
      std::vector<float> in(s.numel()), emulated(s.numel());
      fill_uniform(in.data(), s.numel(), o.seed, 100, 1.0);
      newton_schulz(in.data(), emulated.data(), s, config, NsPrecision::bf16);
      std::vector<double> in64(in.begin(), in.end()), want(s.numel());
      newton_schulz(in64.data(), want.data(), s, config);
      DeviceBuffer d_in = to_device(in);
      DeviceBuffer d_out(in.size() * sizeof(float));
      d_out.fill_bytes(0xff);
      newton_schulz_cuda(ctx, d_in.as<float>(), d_out.as<float>(), s, config, o.version);
      const std::vector<float> got = to_host<float>(d_out, in.size());
      like.max_error = std::max(like.max_error, relative_error(got, emulated));
      ref.max_error = std::max(ref.max_error, relative_error(got, want));
    }
    checks = {like, ref};
    print_validation(out, checks);
    if (!like.ok() || !ref.ok()) return 1;
  }

  const double gemm_tflops = bf16_gemm_tflops(ctx, 8192, 8192, 8192, warmup, repeats);
  out << "yardstick: 8192^3 bf16 GEMM (cublasGemmEx, fp32 accumulation) " << fmt(gemm_tflops, 1)
      << " TFLOP/s\n";

  std::vector<Row> rows;
  for (const MatrixShape& s : o.shapes.empty() ? default_gpu_bench_shapes() : o.shapes) {
    rows.push_back({s, "", {}, ns_flops(s, config.num_steps()), ""});
  }
  if (!o.model_preset.empty()) {
    const std::optional<Model> model = find_preset(o.model_preset);
    if (!model) throw Error("bench ns: unknown model preset '" + o.model_preset + "'");
    for (const MatrixShape& s : muon_shape_groups(*model)) {
      rows.push_back({s, o.model_preset, {}, ns_flops(s, config.num_steps()), ""});
    }
  }

  for (Row& row : rows) {
    const MatrixShape& s = row.shape;
    std::string why;
    if (!kernel->can_implement(s, &why)) {
      row.note = why;
      continue;
    }
    try {
      // Two inputs in turn plus the L2 flush: no run finds its data in cache.
      const std::size_t bytes = static_cast<std::size_t>(s.numel()) * sizeof(float);
      DeviceBuffer in0(bytes), in1(bytes), result(bytes);
      DeviceBuffer workspace(kernel->workspace_bytes(s));
      fill_uniform_cuda(ctx, in0.as<float>(), s.numel(), o.seed, 300, 1.0);
      fill_uniform_cuda(ctx, in1.as<float>(), s.numel(), o.seed, 301, 1.0);
      std::vector<double> ms;
      for (int r = 0; r < warmup + repeats; ++r) {
        NsDeviceArgs args;
        args.in = (r % 2 ? in1 : in0).as<float>();
        args.out = result.as<float>();
        args.shape = s;
        args.config = &config;
        args.workspace = workspace.data();
        args.workspace_bytes = workspace.bytes();
        flush_l2(ctx);
        const double t = time_on_stream_ms(ctx, [&] { kernel->run(ctx, args); });
        if (r >= warmup) ms.push_back(t);
      }
      row.timing = summarize(ms);
    } catch (const Error& e) {
      row.note = e.what();  // typically out of memory for the largest groups
    }
  }
  print_table(out, rows, gemm_tflops, "GEMM");
  double total_ms = 0, total_flops = 0;
  bool complete = !o.model_preset.empty();
  for (const Row& r : rows) {
    if (r.group.empty()) continue;
    complete = complete && r.note.empty();
    total_ms += r.timing.median_ms;
    total_flops += r.flops;
  }
  if (complete && total_ms > 0) {
    out << "whole " << o.model_preset
        << " Muon set (sum of the group medians): " << fmt(total_ms, 2) << " ms, "
        << fmt(total_flops / (total_ms * 1e-3) / 1e12, 1) << " TFLOP/s\n";
  }
  out << "TFLOP/s counts batch * steps * (4 m^2 n + 2 m^3), m <= n; % is of the bf16 GEMM rate "
         "above.\n";
  if (!o.json_path.empty()) {
    write_json(o.json_path,
               {{"device", "gpu"},
                {"device_name", ctx.device_name()},
                {"kernel_version", kernel->version()},
                {"kernel", kernel->name()},
                {"precision", "bf16 storage, fp32 accumulation"},
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

int run_ns_benchmark(const NsBenchOptions& options, std::ostream& out) {
  NsConfig config;
  try {
    if (options.coefficients == "custom") {
      throw Error(
          "bench ns: the custom coefficient set needs a list; use keller_jordan or "
          "polar_express");
    }
    config = make_ns_config(options.coefficients, options.steps);
    if (options.device != "auto" && options.device != "gpu" && options.device != "cpu") {
      throw Error("bench ns: unknown device '" + options.device + "'; valid: auto, gpu, cpu");
    }
    for (const MatrixShape& s : options.shapes) {
      if (s.batch < 1 || s.rows < 1 || s.cols < 1) {
        throw Error("bench ns: invalid shape " + s.to_string());
      }
    }
  } catch (const Error& e) {
    out << "error: " << e.what() << "\n";
    return 2;
  }

  std::string why;
  const bool have_gpu = options.device != "cpu" && cuda_device_available(&why);
  if (options.device == "gpu" && !have_gpu) {
    out << "error: bench ns --device gpu: no usable CUDA device: " << why << "\n";
    return 2;
  }
  try {
    if (have_gpu) return run_gpu(options, config, out);
    return run_cpu(options, config, options.device == "cpu" ? "the CPU was asked for" : why, out);
  } catch (const Error& e) {
    out << "error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace muonbed
