// Every CUDA kernel against the CPU reference on fresh random inputs (never zeros), outputs
// poisoned with NaN before each run so an element a kernel forgot to write cannot pass:
// every Newton-Schulz version within 2e-2 of the CPU bf16 emulation (v2's block-triangular path
// also on small blocks), the fp32 elementwise kernels within
// 1e-6, random fills and shard pack/unpack exactly, and a whole-model step on the GPU against
// the reference optimizer.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/base/errors.hpp"
#include "core/model/layout.hpp"
#include "core/model/mesh.hpp"
#include "core/model/model.hpp"
#include "kernels/bench.hpp"
#include "kernels/bf16.hpp"
#include "kernels/cuda/ns_versions.cuh"
#include "kernels/gpu.hpp"
#include "kernels/random.hpp"
#include "kernels/reference_optimizer.hpp"
#include "kernels/shard_table.hpp"

using namespace muonbed;

namespace {

// One context for the whole binary, deliberately never destroyed: tearing down a cuBLAS handle
// from a static destructor can race the CUDA runtime's own shutdown.
CudaContext& context() {
  static CudaContext* ctx = new CudaContext();
  return *ctx;
}

std::vector<float> random_vector(std::int64_t n, std::uint64_t stream, double scale = 1.0) {
  std::vector<float> v(static_cast<std::size_t>(n));
  fill_uniform(v.data(), n, 77, stream, scale);
  return v;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

DeviceBuffer poisoned(std::size_t bytes) {
  DeviceBuffer b(bytes);
  b.fill_bytes(0xff);  // every fp32 / bf16 word becomes NaN
  return b;
}

// One kernel against the CPU bf16 emulation (2e-2) and the fp64 reference (5e-2) on `shapes`,
// out of place into a poisoned buffer and in place, the input left untouched.
void check_ns_kernel(const NsKernel& kernel, const std::vector<MatrixShape>& shapes) {
  CudaContext& ctx = context();
  for (const NsConfig& config : {NsConfig::keller_jordan(5), NsConfig::polar_express(5)}) {
    for (const MatrixShape& s : shapes) {
      INFO("v" << kernel.version() << " " << config.name << " " << s.to_string());
      const std::vector<float> g = random_vector(s.numel(), 1000 + s.rows);
      std::vector<float> emulated(g.size());
      newton_schulz(g.data(), emulated.data(), s, config, NsPrecision::bf16);
      std::vector<double> g64(g.begin(), g.end()), ref(g.size());
      newton_schulz(g64.data(), ref.data(), s, config);

      DeviceBuffer in = to_device(g);
      DeviceBuffer out = poisoned(g.size() * sizeof(float));
      DeviceBuffer workspace = poisoned(kernel.workspace_bytes(s));
      NsDeviceArgs args{in.as<float>(), out.as<float>(),  s,
                        &config,        workspace.data(), workspace.bytes()};
      kernel.run(ctx, args);
      const std::vector<float> got = to_host<float>(out, g.size());
      REQUIRE(all_finite(got));
      CHECK(relative_error(got, emulated) <= 2e-2);
      // Every output is a bf16 value widened (NsKernel's contract: the executors do not round
      // it again).
      std::size_t not_bf16 = 0;
      for (float x : got) not_bf16 += round_to_bf16(x) != x ? 1 : 0;
      CHECK(not_bf16 == 0);
      CHECK(relative_error(got, std::vector<float>(ref.begin(), ref.end())) <= 5e-2);
      // The input is untouched.
      CHECK(to_host<float>(in, g.size()) == g);

      // In place, on a re-poisoned workspace.
      workspace.fill_bytes(0xff);
      args.out = in.as<float>();
      kernel.run(ctx, args);
      CHECK(relative_error(to_host<float>(in, g.size()), emulated) <= 2e-2);
    }
  }
}

const std::vector<MatrixShape> kNsShapes = {{1, 96, 160}, {1, 160, 96},  {1, 256, 256},
                                            {3, 64, 80},  {2, 200, 136}, {1, 1, 300}};

}  // namespace

TEST_CASE("every Newton-Schulz version matches the CPU bf16 emulation", "[gpu][ns]") {
  for (const NsKernelVersion& v : ns_kernel_versions()) check_ns_kernel(*v.make(), kNsShapes);
  // The convenience entry point allocates its own workspace.
  const MatrixShape s{2, 48, 72};
  const std::vector<float> g = random_vector(s.numel(), 9);
  std::vector<float> emulated(g.size());
  const NsConfig config = NsConfig::keller_jordan(5);
  newton_schulz(g.data(), emulated.data(), s, config, NsPrecision::bf16);
  DeviceBuffer d = to_device(g);
  newton_schulz_cuda(context(), d.as<float>(), d.as<float>(), s, config, 2);
  CHECK(relative_error(to_host<float>(d, g.size()), emulated) <= 2e-2);
}

TEST_CASE("Newton-Schulz v2's block-triangular path on small blocks", "[gpu][ns]") {
  // Blocks of at least 16 rows: 96 -> 6 blocks of 16, 120 -> 5 of 24 (tiles straddle block
  // edges), 64 -> 4 of 16, 136 -> unblocked (no multiple of 8 >= 16 divides it but 136).
  for (auto method :
       {cuda_detail::TriangleMethod::row_panels, cuda_detail::TriangleMethod::block_pointers}) {
    const std::unique_ptr<NsKernel> v2 = cuda_detail::make_ns_v2_symmetric(16, 0, method);
    check_ns_kernel(*v2, {{1, 96, 160},
                          {1, 160, 96},
                          {2, 120, 200},
                          {1, 300, 120},
                          {3, 64, 80},
                          {2, 200, 136},
                          {1, 1024, 96}});
  }
  // Blocks of at least 8 rows: 264 = 33 x 8 exceeds the 32-block cap, so it takes 11 blocks of 24.
  const std::unique_ptr<NsKernel> fine = cuda_detail::make_ns_v2_symmetric(8, 0);
  check_ns_kernel(*fine, {{2, 264, 300}});
  CHECK_THROWS_AS(cuda_detail::make_ns_v2_symmetric(4, 0), Error);
}

TEST_CASE("Newton-Schulz kernel registry", "[gpu][ns]") {
  REQUIRE(ns_kernel_versions().size() >= 2);
  for (std::size_t i = 0; i < ns_kernel_versions().size(); ++i) {
    CHECK(ns_kernel_versions()[i].version == static_cast<int>(i) + 1);
    CHECK(ns_kernel_versions()[i].make()->version() == static_cast<int>(i) + 1);
  }
  const std::unique_ptr<NsKernel> v1 = make_ns_kernel(1);
  CHECK(v1->version() == 1);
  CHECK(v1->can_implement({4, 128, 64}, nullptr));
  std::string why;
  CHECK_FALSE(v1->can_implement({1, 0, 64}, &why));
  CHECK(!why.empty());
  CHECK_THROWS_WITH(make_ns_kernel(99), Catch::Contains("available: 1 (cublas-bf16), 2"));

  // Too small a workspace is an error, not a silent overrun.
  const MatrixShape s{1, 32, 48};
  DeviceBuffer in = to_device(random_vector(s.numel(), 5)), out(s.numel() * sizeof(float));
  DeviceBuffer ws(v1->workspace_bytes(s) / 2);
  const NsConfig config = NsConfig::keller_jordan(5);
  NsDeviceArgs args{in.as<float>(), out.as<float>(), s, &config, ws.data(), ws.bytes()};
  CHECK_THROWS_AS(v1->run(context(), args), Error);
}

TEST_CASE("fp32 elementwise kernels match the CPU within 1e-6", "[gpu][elementwise]") {
  CudaContext& ctx = context();
  const std::int64_t n = 10007;  // not a multiple of the block size
  const std::vector<float> grad = random_vector(n, 1), buf0 = random_vector(n, 2),
                           param0 = random_vector(n, 3), update = random_vector(n, 4);

  for (MomentumForm form : {MomentumForm::classic, MomentumForm::lerp}) {
    for (bool nesterov : {false, true}) {
      INFO(to_string(form) << " nesterov " << nesterov);
      const MomentumParams params{0.95, nesterov, form};
      std::vector<float> buf = buf0, want(n);
      momentum_update(params, grad.data(), buf.data(), want.data(), n);
      DeviceBuffer d_grad = to_device(grad), d_buf = to_device(buf0);
      DeviceBuffer d_update = poisoned(n * sizeof(float));
      momentum_update_cuda(ctx, params, d_grad.as<float>(), d_buf.as<float>(), d_update.as<float>(),
                           n);
      const std::vector<float> got = to_host<float>(d_update, n);
      REQUIRE(all_finite(got));
      CHECK(relative_error(got, want) <= 1e-6);
      CHECK(relative_error(to_host<float>(d_buf, n), buf) <= 1e-6);
    }
  }

  {
    const ApplyParams params{0.02, 0.02 * 20.98, 0.1};
    std::vector<float> want = param0;
    apply_update(params, want.data(), update.data(), n);
    DeviceBuffer d_param = to_device(param0), d_update = to_device(update);
    apply_update_cuda(ctx, params, d_param.as<float>(), d_update.as<float>(), n);
    CHECK(relative_error(to_host<float>(d_param, n), want) <= 1e-6);
  }

  {
    const AdamWConfig params{1e-3, 0.9, 0.95, 1e-8, 0.1};
    std::vector<float> p = param0, m(n, 0.0f), v(n, 0.0f);
    DeviceBuffer d_p = to_device(p), d_g = to_device(grad), d_m = to_device(m), d_v = to_device(v);
    for (int step = 1; step <= 3; ++step) {
      adamw_update(params, step, p.data(), grad.data(), m.data(), v.data(), n);
      adamw_update_cuda(ctx, params, step, d_p.as<float>(), d_g.as<float>(), d_m.as<float>(),
                        d_v.as<float>(), n);
    }
    CHECK(relative_error(to_host<float>(d_p, n), p) <= 1e-6);
    CHECK(relative_error(to_host<float>(d_m, n), m) <= 1e-6);
    CHECK(relative_error(to_host<float>(d_v, n), v) <= 1e-6);
  }
}

TEST_CASE("device random fill equals the CPU's", "[gpu][random]") {
  const std::int64_t n = 4099;
  std::vector<float> want(n);
  fill_uniform(want.data(), n, 12, 34, 0.5, 1000);
  DeviceBuffer d = poisoned(n * sizeof(float));
  fill_uniform_cuda(context(), d.as<float>(), n, 12, 34, 0.5, 1000);
  CHECK(to_host<float>(d, n) == want);
}

TEST_CASE("shard pack and unpack match core's pack_shard", "[gpu][pack]") {
  CudaContext& ctx = context();
  const DeviceMesh mesh({{"dp_shard", 2, DimRole::fsdp}, {"tp", 4, DimRole::tp}}, 8);
  struct Case {
    std::vector<std::int64_t> shape;
    std::vector<Placement> placements;
  };
  const std::vector<Case> cases = {
      {{96, 40}, {Placement::strided_shard(0, 4), Placement::shard(0)}},
      {{96, 40}, {Placement::shard(0), Placement::shard(1)}},
      {{6, 16, 12}, {Placement::shard(0), Placement::shard(2)}},
      {{1000}, {Placement::shard(0), Placement::replicate()}},
  };
  for (const Case& c : cases) {
    const TensorLayout layout(mesh, c.shape, c.placements);
    std::int64_t numel = 1;
    for (std::int64_t d : c.shape) numel *= d;
    for (int rank = 0; rank < mesh.world_size(); rank += 3) {
      const ShardIndexSet set = layout.index_set(mesh, rank);
      const ShardOffsetTable table = make_shard_offset_table(set, c.shape);
      const DeviceShardTable d_table(table);
      INFO(layout.describe(mesh) << " rank " << rank);

      // 4-byte elements: random fp32.
      const std::vector<float> full = random_vector(numel, 40 + rank);
      std::vector<float> want(set.numel());
      pack_shard(set, c.shape, full.data(), want.data());
      DeviceBuffer d_full = to_device(full);
      DeviceBuffer d_packed = poisoned(std::max<std::size_t>(want.size(), 1) * sizeof(float));
      pack_shard_cuda(ctx, d_table, d_full.data(), d_packed.data(), 4);
      const std::vector<float> got = to_host<float>(d_packed, want.size());
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);

      // Unpack into a poisoned full tensor: exactly the shard's elements come back.
      std::vector<float> host_full(numel);
      std::memset(host_full.data(), 0xff, host_full.size() * sizeof(float));
      unpack_shard(set, c.shape, want.data(), host_full.data());
      DeviceBuffer d_back = poisoned(numel * sizeof(float));
      unpack_shard_cuda(ctx, d_table, d_packed.data(), d_back.data(), 4);
      const std::vector<float> back = to_host<float>(d_back, numel);
      CHECK(std::memcmp(back.data(), host_full.data(), back.size() * sizeof(float)) == 0);

      // 2- and 8-byte elements move the same positions.
      for (int bytes : {2, 8}) {
        std::vector<unsigned char> raw(numel * bytes), want_raw(set.numel() * bytes);
        for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<unsigned char>(i * 131);
        if (bytes == 2) {
          pack_with_table(table, reinterpret_cast<const std::uint16_t*>(raw.data()),
                          reinterpret_cast<std::uint16_t*>(want_raw.data()));
        } else {
          pack_with_table(table, reinterpret_cast<const std::uint64_t*>(raw.data()),
                          reinterpret_cast<std::uint64_t*>(want_raw.data()));
        }
        DeviceBuffer d_raw = to_device(raw);
        DeviceBuffer d_out = poisoned(std::max<std::size_t>(want_raw.size(), 1));
        pack_shard_cuda(ctx, d_table, d_raw.data(), d_out.data(), bytes);
        CHECK(to_host<unsigned char>(d_out, want_raw.size()) == want_raw);
      }
    }
  }
  CHECK_THROWS_AS(pack_shard_cuda(ctx,
                                  DeviceShardTable(make_shard_offset_table(
                                      ShardIndexSet{{IndexList::range(0, 4)}}, {4})),
                                  nullptr, nullptr, 3),
                  Error);
}

TEST_CASE("a whole-model Muon/AdamW step on the GPU tracks the reference", "[gpu][step]") {
  CudaContext& ctx = context();
  DenseSpec spec;
  spec.name = "gpu-test-dense";
  spec.hidden = 64;
  spec.layers = 2;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.ffn = 128;
  spec.vocab = 96;
  const Model model = make_dense(spec);
  OptimizerConfig config;
  config.muon.lr = 0.02;
  config.muon.adjust_lr_fn = LrScaleRule::match_rms_adamw;
  ReferenceOptimizer<float> reference(model, config, {}, ReferenceOptions{NsPrecision::bf16});
  ModelTensors<float> params = random_params<float>(model, 21);
  const ModelTensors<float> initial = params;

  // The GPU side: the same step composed from the device kernels.
  std::vector<DeviceBuffer> d_param, d_state_a, d_state_b;
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const std::vector<float> zeros(params[i].size(), 0.0f);
    d_param.push_back(to_device(params[i]));
    d_state_a.push_back(to_device(zeros));
    d_state_b.push_back(to_device(zeros));
  }
  for (int step = 1; step <= 3; ++step) {
    const ModelTensors<float> grads = random_grads<float>(model, 21, step);
    reference.step(params, grads);
    for (std::size_t i = 0; i < model.params.size(); ++i) {
      const Parameter& p = model.params[i];
      const std::int64_t n = p.numel();
      DeviceBuffer d_grad = to_device(grads[i]);
      if (reference.kind(i) == OptimizerKind::muon) {
        DeviceBuffer d_update = poisoned(n * sizeof(float));
        momentum_update_cuda(ctx, momentum_params(config.muon), d_grad.as<float>(),
                             d_state_a[i].as<float>(), d_update.as<float>(), n);
        newton_schulz_cuda(ctx, d_update.as<float>(), d_update.as<float>(), ns_shape(p),
                           make_ns_config(config.muon), 1);
        const ApplyParams apply = apply_params(config.muon, p.rows(), p.cols());
        apply_update_cuda(ctx, apply, d_param[i].as<float>(), d_update.as<float>(), n);
      } else {
        adamw_update_cuda(ctx, config.adamw, step, d_param[i].as<float>(), d_grad.as<float>(),
                          d_state_a[i].as<float>(), d_state_b[i].as<float>(), n);
      }
    }
  }
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const std::vector<float> got = to_host<float>(d_param[i], params[i].size());
    std::vector<float> d_gpu(got.size()), d_ref(got.size());
    for (std::size_t j = 0; j < got.size(); ++j) {
      d_gpu[j] = got[j] - initial[i][j];
      d_ref[j] = params[i][j] - initial[i][j];
    }
    INFO(model.params[i].name);
    // AdamW is elementwise and exact up to fp32; Muon goes through bf16 Newton-Schulz.
    CHECK(relative_error(d_gpu, d_ref) <= (reference.kind(i) == OptimizerKind::muon ? 2e-2 : 1e-5));
  }
}

TEST_CASE("the NS benchmark validates and reports on the GPU", "[gpu][bench]") {
  NsBenchOptions options;
  options.shapes = {{1, 256, 384}, {2, 128, 128}};
  options.model_preset = "";
  options.warmup = 1;
  options.repeats = 2;
  std::ostringstream out;
  CHECK(run_ns_benchmark(options, out) == 0);
  INFO(out.str());
  CHECK(out.str().find("OK") != std::string::npos);
  CHECK(out.str().find("256x384") != std::string::npos);
}
