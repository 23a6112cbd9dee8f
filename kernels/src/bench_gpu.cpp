// The GPU half of `muonbed bench ns` (kernels/bench.hpp): validates each kernel version against
// the CPU reference, then times it with the L2 flushed and inputs rotated. Built into the CUDA
// module (libmuonbed_gpu.so, loaded on first GPU use) and into muonbed_kernels_gpu (gpu_tests);
// the CPU library reaches it through run_ns_benchmark_gpu (kernels/src/bench_detail.hpp).
#include <algorithm>
#include <memory>
#include <ostream>
#include <vector>

#include "core/base/errors.hpp"
#include "kernels/bench.hpp"
#include "kernels/gpu.hpp"
#include "kernels/random.hpp"
#include "kernels/src/bench_detail.hpp"

namespace muonbed {

using namespace bench_detail;

// --- GPU -------------------------------------------------------------------------------------

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

}  // namespace muonbed
