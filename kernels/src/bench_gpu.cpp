// The GPU half of `muonbed bench ns` (kernels/bench.hpp): validates each kernel version against
// the CPU reference, then times it with the L2 flushed and inputs rotated; and the timer of
// `muonbed calibrate --backend nccl` (time_calibration_kernels_gpu), through the same code. Built
// into the CUDA module (libmuonbed_gpu.so, loaded on first GPU use) and into muonbed_kernels_gpu
// (gpu_tests); the CPU library reaches it through run_ns_benchmark_gpu
// (kernels/src/bench_detail.hpp).
#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "kernels/bench.hpp"
#include "kernels/gpu.hpp"
#include "kernels/random.hpp"
#include "kernels/src/bench_detail.hpp"

namespace muonbed {

using namespace bench_detail;

// --- GPU -------------------------------------------------------------------------------------

namespace {

// The one GPU timer of bench ns and calibrate --backend nccl: `warmup` untimed runs, then
// `repeats` timed ones, each after an L2 flush (no run finds its data in cache) and timed with
// CUDA events around the kernels `queue(run)` queues; the median, p95 and max.
Timing time_runs(CudaContext& ctx, int warmup, int repeats, const std::function<void(int)>& queue) {
  std::vector<double> ms;
  for (int r = 0; r < warmup + repeats; ++r) {
    flush_l2(ctx);
    const double t = time_on_stream_ms(ctx, [&] { queue(r); });
    if (r >= warmup) ms.push_back(t);
  }
  return summarize(ms);
}

// Newton-Schulz of `s` with `kernel` on random data, two inputs in turn.
Timing time_ns_kernel(CudaContext& ctx, const NsKernel& kernel, const MatrixShape& s,
                      const NsConfig& config, int warmup, int repeats, std::uint64_t seed) {
  const std::size_t bytes = static_cast<std::size_t>(s.numel()) * sizeof(float);
  DeviceBuffer in0(bytes), in1(bytes), result(bytes);
  DeviceBuffer workspace(kernel.workspace_bytes(s));
  fill_uniform_cuda(ctx, in0.as<float>(), s.numel(), seed, 300, 1.0);
  fill_uniform_cuda(ctx, in1.as<float>(), s.numel(), seed, 301, 1.0);
  return time_runs(ctx, warmup, repeats, [&](int r) {
    NsDeviceArgs args;
    args.in = (r % 2 ? in1 : in0).as<float>();
    args.out = result.as<float>();
    args.shape = s;
    args.config = &config;
    args.workspace = workspace.data();
    args.workspace_bytes = workspace.bytes();
    kernel.run(ctx, args);
  });
}

// The kernel against the CPU's bf16 emulation and fp64 reference on small shapes that exercise
// the wide, tall and batched paths.
std::vector<Validation> validate_ns_kernel(CudaContext& ctx, int version, const NsConfig& config,
                                           std::uint64_t seed) {
  Validation like{
      "GPU v" + std::to_string(version) + " vs CPU bf16 emulation on 96x160, 160x96, 3x64x80", 0,
      2e-2};
  Validation ref{"GPU v" + std::to_string(version) + " vs CPU fp64 reference", 0, 5e-2};
  for (const MatrixShape& s : validation_shapes()) {
    std::vector<float> in(s.numel()), emulated(s.numel());
    fill_uniform(in.data(), s.numel(), seed, 100, 1.0);
    newton_schulz(in.data(), emulated.data(), s, config, NsPrecision::bf16);
    std::vector<double> in64(in.begin(), in.end()), want(s.numel());
    newton_schulz(in64.data(), want.data(), s, config);
    DeviceBuffer d_in = to_device(in);
    DeviceBuffer d_out(in.size() * sizeof(float));
    d_out.fill_bytes(0xff);
    newton_schulz_cuda(ctx, d_in.as<float>(), d_out.as<float>(), s, config, version);
    const std::vector<float> got = to_host<float>(d_out, in.size());
    like.max_error = std::max(like.max_error, relative_error(got, emulated));
    ref.max_error = std::max(ref.max_error, relative_error(got, want));
  }
  return {like, ref};
}

}  // namespace

int run_ns_benchmark_gpu(const NsBenchOptions& o, const NsConfig& config, std::ostream& out) {
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
    checks = validate_ns_kernel(ctx, o.version, config, o.seed);
    print_validation(out, checks);
    for (const Validation& v : checks)
      if (!v.ok()) return 1;
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
      row.timing = time_ns_kernel(ctx, *kernel, s, config, warmup, repeats, o.seed);
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

GpuCalibrationTimes time_calibration_kernels_gpu(const GpuCalibrationRequest& q,
                                                 std::ostream& out) {
  CudaContext ctx;
  GpuCalibrationTimes t;
  t.device_name = ctx.device_name();
  t.versions = cuda_versions_text(ctx.device());
  std::map<int, std::unique_ptr<NsKernel>> kernels;
  const auto kernel_for = [&](int version) -> const NsKernel& {
    auto& k = kernels[version];
    if (!k) k = make_ns_kernel(version);
    return *k;
  };
  t.kernel = "v" + std::to_string(q.version) + " (" + kernel_for(q.version).name() + ")";
  out << "# GPU " << t.device_name << ": " << t.versions << "; NS kernel " << t.kernel
      << ", coefficients " << q.config.name << " x" << q.config.num_steps() << "; median of "
      << q.repeats << " runs after " << q.warmup
      << " warm-ups, L2 flushed before each run (bench ns's timer)\n";
  // A wrong kernel is refused before it is timed, as bench ns refuses it.
  for (const int version : {q.version, 1}) {
    const std::vector<Validation> checks = validate_ns_kernel(ctx, version, q.config, q.seed);
    print_validation(out, checks);
    for (const Validation& v : checks)
      if (!v.ok())
        throw Error("calibrate: NS kernel v" + std::to_string(version) +
                    " disagrees with the CPU (" + v.what + ": " + sci(v.max_error) + " > " +
                    sci(v.limit) +
                    "); no profile was written; fix: run gpu_tests and bench ns to find why");
    if (version == 1) break;
  }
  for (const MatrixShape& s : q.ns_shapes) {
    int version = q.version;
    std::string why;
    if (!kernel_for(version).can_implement(s, &why)) version = 1;  // as the executor falls back
    std::string why_v1;
    if (!kernel_for(version).can_implement(s, &why_v1))
      throw Error("calibrate: no NS kernel runs " + s.to_string() + " (v" +
                  std::to_string(q.version) + ": " + why + "; v1: " + why_v1 + ")");
    try {
      const Timing timing =
          time_ns_kernel(ctx, kernel_for(version), s, q.config, q.warmup, q.repeats, q.seed);
      t.ns_ms.push_back(timing.median_ms);
      t.ns_version.push_back(version);
    } catch (const Error& e) {
      throw Error("calibrate: timing NS " + s.to_string() + " failed: " + e.what());
    }
    out << "  NS " << s.to_string() << " (v" << version << "): " << fmt(t.ns_ms.back(), 3) << " ms"
        << std::endl;
  }
  for (const std::int64_t n : q.elementwise_numels) {
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
    try {
      DeviceBuffer grad(bytes), buf(bytes), update(bytes), param(bytes), m(bytes), v(bytes);
      fill_uniform_cuda(ctx, grad.as<float>(), n, q.seed, 400, 1.0);
      fill_uniform_cuda(ctx, param.as<float>(), n, q.seed, 401, 1.0);
      buf.fill_bytes(0);
      m.fill_bytes(0);
      v.fill_bytes(0);
      std::array<double, 3> ms{};
      ms[0] = time_runs(ctx, q.warmup, q.repeats, [&](int) {
                momentum_update_cuda(ctx, q.momentum, grad.as<float>(), buf.as<float>(),
                                     update.as<float>(), n);
              }).median_ms;
      ms[1] = time_runs(ctx, q.warmup, q.repeats, [&](int) {
                apply_update_cuda(ctx, q.apply, param.as<float>(), update.as<float>(), n);
              }).median_ms;
      ms[2] = time_runs(ctx, q.warmup, q.repeats, [&](int r) {
                adamw_update_cuda(ctx, q.adamw, r + 1, param.as<float>(), grad.as<float>(),
                                  m.as<float>(), v.as<float>(), n);
              }).median_ms;
      t.elementwise_ms.push_back(ms);
      out << "  elementwise " << n << " elements: momentum " << fmt(ms[0], 4) << " ms, apply "
          << fmt(ms[1], 4) << " ms, adamw " << fmt(ms[2], 4) << " ms" << std::endl;
    } catch (const Error& e) {
      throw Error("calibrate: timing the elementwise kernels over " + std::to_string(n) +
                  " elements failed: " + e.what());
    }
  }
  return t;
}

}  // namespace muonbed
