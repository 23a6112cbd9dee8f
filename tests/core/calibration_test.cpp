// `muonbed calibrate`'s host side (core/results/calibration.hpp): the workload an experiment's
// plans need, the compute benchmark's plan, the fits (rows made by a known profile give that
// profile back), the bench-row prediction that equals the analytic backend's, and a profile the
// loader accepts. The measured side runs under mpirun (tests/mpi/calibrate_test.sh).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/base/errors.hpp"
#include "core/config/cluster_fields.hpp"
#include "core/engine/cost_model.hpp"
#include "core/results/calibration.hpp"
#include "core/results/collective_bench.hpp"
#include "muonbed/config.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;
using Catch::Matchers::Contains;

namespace {

const char* kExperiment = R"(name: cal
cluster: local-cpu
mesh: {dims: {dp_shard: 2}}
model:
  dense: {name: llama-cpu, hidden: 128, layers: 2, heads: 4, kv_heads: 2, ffn: 344, vocab: 1024}
strategy: {name: owner}
backend: [analytic]
sweep:
  strategy.name: [sequential, owner, all_to_all, owner_allgather]
  mesh.dp_shard: [2, 4]
)";

// A known single-node profile, as calibrate writes them.
ClusterSpec known_profile() {
  ClusterSpec c;
  c.name = "known";
  c.gpus_per_node = 8;
  c.nodes = 1;
  c.gpu.peak_tflops = 0.1;
  c.gpu.hbm_GBps = 8;
  c.intra.kind = IntraNodeKind::pcie;
  c.intra.bandwidth_GBps = 6;
  c.intra.latency_us = 3;
  c.efficiency.intra_node = {0.5, 0.7, 1.0, 1.0};
  c.launch_overhead.collective_us = 20;
  c.launch_overhead.kernel_us = 4;
  return c;
}

CollectiveBenchRow bench_row(const std::string& op, int n, std::int64_t size) {
  CollectiveBenchRow r;
  r.op = op;
  r.size_bytes = size;
  r.gpus = n;
  r.group_size = n;
  r.instances = 1;
  r.backend = "test";
  return r;
}

// The least a profile needs from the compute benchmark: one Newton-Schulz and one GEMM row.
std::pair<ComputeBenchRow, ComputeBenchRow> minimal_compute_rows() {
  ComputeBenchRow ns;
  ns.kernel = "newton_schulz";
  ns.shape = {1, 64, 96};
  ns.seconds = 1e-3;
  ComputeBenchRow gemm;
  gemm.kernel = "gemm";
  gemm.shape = {1, 64, 96};
  gemm.flops = 1e6;
  gemm.seconds = 1e-4;
  return {ns, gemm};
}

}  // namespace

TEST_CASE("the workload has the plans' NS shapes and collectives", "[core][calibrate]") {
  const std::vector<Experiment> points = parse_experiment(kExperiment, "cal.yaml");
  const CalibrationWorkload w = calibration_workload(points, 2);
  CHECK(w.ranks == 2);
  CHECK(w.ns_steps == 5);
  // hidden 128: q/o 128x128, k/v 64x128, MLP 344x128 (and its transpose), embeddings AdamW.
  bool square = false, mlp = false;
  for (const NsCallShape& s : w.ns_shapes) {
    square = square || (s.rows == 128 && s.cols == 128);
    mlp = mlp || (std::min(s.rows, s.cols) == 128 && std::max(s.rows, s.cols) == 344);
  }
  CHECK(square);
  CHECK(mlp);
  REQUIRE_FALSE(w.collectives.empty());
  for (const CollectiveWorkload& c : w.collectives) {
    INFO(c.spec.op);
    CHECK(c.spec.mesh.world_size() == 2);
    CHECK(c.min_bytes > 0);
    CHECK(c.min_bytes <= c.max_bytes);
    REQUIRE_FALSE(c.sizes.empty());
    CHECK(c.sizes.front() <= std::max<std::int64_t>(c.min_bytes, 1024));
    CHECK(c.sizes.back() >= c.max_bytes);
    CHECK(c.sizes.size() <= 7);
  }
  CHECK_THROWS_WITH(calibration_workload(points, 3),
                    Contains("no point of the experiment has 3 ranks") && Contains("--ranks"));
}

TEST_CASE("the compute benchmark's plan runs momentum, NS and apply on every rank",
          "[core][calibrate]") {
  const DeviceMesh mesh({{"g", 2, DimRole::replicate}}, 8);
  const StepPlan plan = compute_bench_plan(mesh, {1, 64, 96}, OptimizerConfig{});
  REQUIRE(plan.ops.size() == 3);
  CHECK(plan.ops[0].kind == OpKind::momentum);
  CHECK(plan.ops[1].kind == OpKind::newton_schulz);
  CHECK(plan.ops[2].kind == OpKind::apply_update);
  for (int r = 0; r < 2; ++r) {
    CHECK(op_flops(plan, plan.ops[1], r) ==
          Approx(5.0 * (4.0 * 64 * 64 * 96 + 2.0 * 64 * 64 * 64)));
    CHECK(op_memory_bytes(plan, plan.ops[0], r) > 0);
  }
}

TEST_CASE("a bench row's model time is what the analytic backend predicts", "[core][calibrate]") {
  const ClusterSpec c = known_profile();
  for (const std::string& op : collective_bench_ops())
    for (int n : {2, 4})
      for (std::int64_t size : {4096LL, 1LL << 20}) {
        INFO(op << " n=" << n << " S=" << size);
        CollectiveBenchSpec spec;
        spec.op = op;
        spec.mesh = DeviceMesh({{"g", n, DimRole::replicate}}, 8);
        spec.group = DimSet::of({0});
        Experiment e;
        e.name = "bench";
        e.cluster = c;
        e.mesh = spec.mesh;
        e.backends = {"analytic"};
        const CollectiveBenchRow row = run_collective_bench(spec, e, size, "analytic");
        CHECK(model_bench_seconds(c, row) * 1e6 == Approx(row.time_us).epsilon(1e-9));
      }
}

TEST_CASE("fitting rows made by a known profile gives that profile back", "[core][calibrate]") {
  const ClusterSpec truth = known_profile();
  CalibrationInput in;
  in.name = "fitted";
  in.ranks = 2;
  for (const char* op : {"all_gather", "all_to_all", "gather", "scatter", "broadcast"})
    for (std::int64_t size = 1024; size <= (16 << 20); size *= 4) {
      CollectiveBenchRow r = bench_row(op, 2, size);
      r.time_us = model_bench_seconds(truth, r) * 1e6;
      r.algbw_GBps = static_cast<double>(size) / (r.time_us * 1e-6) / 1e9;
      r.busbw_GBps = r.algbw_GBps;
      in.collectives.push_back(r);
    }
  // Compute: NS of two shapes, GEMMs at 40 and 100 GFLOP/s, elementwise t = 4 us + bytes / 8 GB/s.
  ComputeBenchRow ns{"newton_schulz", {1, 256, 688}, 256 * 688, 0.02, 0, 1e9};
  ComputeBenchRow ns2{"newton_schulz", {1, 256, 256}, 256 * 256, 0.006, 0, 3e8};
  ComputeBenchRow g1{"gemm", {1, 64, 64},       64 * 64, 2.0 * 64 * 64 * 64 / 40e9,
                     0,      2.0 * 64 * 64 * 64};
  ComputeBenchRow g2{"gemm", {1, 256, 688},        256 * 688, 2.0 * 256 * 256 * 688 / 100e9,
                     0,      2.0 * 256 * 256 * 688};
  in.compute = {ns, ns2, g1, g2};
  for (double bytes : {1e5, 1e6, 1e7}) {
    in.compute.push_back({"momentum", {}, 0, 4e-6 + bytes / 8e9, bytes, 0});
    in.compute.push_back({"apply_update", {}, 0, 4e-6 + bytes / 2 / 8e9, bytes / 2, 0});
  }
  in.info.tool = "test";
  const ClusterSpec fit = calibrated_profile(in);
  CHECK(fit.gpu.peak_tflops == Approx(0.1));
  CHECK(fit.gpu.efficiency(64) == Approx(0.4));
  CHECK(fit.gpu.hbm_GBps == Approx(8).epsilon(0.01));
  CHECK(fit.launch_overhead.kernel_us == Approx(4).epsilon(0.01));
  CHECK(fit.gpu.ns_kernel == "cpu-fp32");
  CHECK(fit.gpu.ns_call_seconds(256, 688, 1, 5, "cpu-fp32") == Approx(0.02));
  // The collective fit reproduces every row (the parameters themselves are not all
  // identifiable from 2-rank rows: launch and latency add up).
  for (const CollectiveBenchRow& r : in.collectives)
    CHECK(model_bench_seconds(fit, r) * 1e6 == Approx(r.time_us).epsilon(0.02));
  CHECK(fit.efficiency.intra_node.p2p == Approx(1));
  CHECK(fit.efficiency.intra_node.ring == Approx(0.5).epsilon(0.02));
  CHECK(fit.efficiency.intra_node.all_to_all == Approx(0.7).epsilon(0.02));
  CHECK(fit.intra.bandwidth_GBps == Approx(6).epsilon(0.02));
  CHECK(fit.measurements.size() == in.collectives.size());
  // Rows the model made are reproduced: every fit's largest error is small, nothing is warned
  // about, nothing clamped.
  const CalibrationResult quality = calibrate_profile(in);
  REQUIRE(quality.fits.size() == 6);  // the elementwise line and one per collective
  for (const FitQuality& f : quality.fits) {
    INFO(f.name);
    CHECK(f.max_error_pct < 2);
  }
  CHECK(fit_error_warnings(quality, kDefaultMaxFitErrorPct).empty());
  CHECK(quality.clamped.empty());

  // The YAML the command writes is accepted by the loader and gives the same profile.
  const std::string yaml = calibrated_profile_yaml(fit, {"header line", ""});
  CHECK(yaml.rfind("# header line\n#\n", 0) == 0);
  const ClusterSpec back = parse_cluster(YAML::Load(yaml), "fitted.yaml");
  CHECK(back.name == "fitted");
  CHECK(back.gpu.ns_table.size() == 2);
  CHECK(back.intra.bandwidth_GBps == Approx(fit.intra.bandwidth_GBps).epsilon(1e-4));
  CHECK(back.calibration.tool == "test");
  for (const CollectiveBenchRow& r : in.collectives)
    CHECK(model_bench_seconds(back, r) == Approx(model_bench_seconds(fit, r)).epsilon(1e-3));

  // Free text in the header (--note, a host name) cannot end the comment: a line break in it
  // would have put "name: evil" into the profile.
  ClusterSpec named = fit;
  named.name = "it's: {a} \"name\"\n# x";
  const std::string hostile = calibrated_profile_yaml(
      named, {"note: x\nname: evil\rgpus_per_node: 1", std::string("tab\there \x01 end")});
  const ClusterSpec parsed = parse_cluster(YAML::Load(hostile), "fitted.yaml");
  CHECK(parsed.name == named.name);  // the name round-trips through the emitter's quoting
  CHECK(parsed.gpus_per_node == fit.gpus_per_node);
  CHECK_THAT(hostile, Catch::Contains("# note: x\\nname: evil\\rgpus_per_node: 1\n") &&
                          Catch::Contains("# tab\\x09here \\x01 end\n"));
}

TEST_CASE("the workload times elementwise ops at the sizes the plans' ops have",
          "[core][calibrate][elementwise]") {
  const std::vector<Experiment> points = parse_experiment(kExperiment, "cal.yaml");
  const CalibrationWorkload w = calibration_workload(points, 2);
  REQUIRE_FALSE(w.elementwise_numels.empty());
  // Every momentum, apply and adamw op of every 2-rank plan touches a size between the first
  // and the last benched one, and the sizes are the plans' own (the smallest and largest of them
  // are benched exactly).
  std::int64_t lo = 0, hi = 0;
  for (const Experiment& point : points) {
    if (point.mesh.world_size() != 2) continue;
    const StepPlan plan = plan_experiment(point);
    for (const Op& op : plan.ops) {
      if (op.kind != OpKind::momentum && op.kind != OpKind::apply_update &&
          op.kind != OpKind::adamw)
        continue;
      for (int r : op.ranks.ranks(plan.mesh())) {
        const std::int64_t n = elementwise_numel(plan, op, r);
        if (n == 0) continue;
        lo = lo == 0 ? n : std::min(lo, n);
        hi = std::max(hi, n);
      }
    }
  }
  CHECK(w.elementwise_numels.front() == lo);
  CHECK(w.elementwise_numels.back() == hi);
  for (std::size_t i = 1; i + 1 < w.elementwise_numels.size(); ++i)
    CHECK(w.elementwise_numels[i] >= 2 * w.elementwise_numels[i - 1]);
}

TEST_CASE("the elementwise benchmark plan runs momentum, apply and adamw over numel elements",
          "[core][calibrate][elementwise]") {
  const DeviceMesh mesh({{"g", 2, DimRole::replicate}}, 8);
  const StepPlan plan = elementwise_bench_plan(mesh, 5000, OptimizerConfig{});
  REQUIRE(plan.ops.size() == 4);
  CHECK(plan.ops[0].kind == OpKind::momentum);
  CHECK(plan.ops[1].kind == OpKind::newton_schulz);
  CHECK(plan.ops[2].kind == OpKind::apply_update);
  CHECK(plan.ops[3].kind == OpKind::adamw);
  for (int r = 0; r < 2; ++r)
    for (int op : {0, 2, 3}) CHECK(elementwise_numel(plan, plan.ops[op], r) == 5000);
}

TEST_CASE(
    "step-sized elementwise rows become the profile's elementwise table, which the model "
    "uses for those ops",
    "[core][calibrate][elementwise]") {
  CalibrationInput in;
  in.ranks = 2;
  const auto [ns, gemm] = minimal_compute_rows();
  in.compute = {ns, gemm};
  for (const auto& [kernel, ms] :
       {std::pair{"momentum", 2.0}, {"apply_update", 0.5}, {"adamw", 4.0}}) {
    ComputeBenchRow r;
    r.kernel = kernel;
    r.numel = 1000000;
    r.seconds = ms * 1e-3;
    r.step_sized = true;
    in.compute.push_back(r);
  }
  const ClusterSpec fit = calibrated_profile(in);
  REQUIRE(fit.gpu.elementwise_table.size() == 3);
  CHECK(fit.gpu.elementwise_seconds("adamw", 1000000) == Approx(4e-3));
  CHECK(fit.gpu.elementwise_seconds("adamw", 250000) == Approx(1e-3));  // its rate, below
  // The profile round-trips through its YAML.
  const ClusterSpec back =
      parse_cluster(YAML::Load(calibrated_profile_yaml(fit, {"h"})), "fitted.yaml");
  REQUIRE(back.gpu.elementwise_table.size() == 3);
  CHECK(back.gpu.elementwise_seconds("momentum", 1000000) == Approx(2e-3));
  // The model times a plan's elementwise ops from it: the bench plan's ops of a million elements
  // take exactly the measured times.
  const DeviceMesh mesh({{"g", 2, DimRole::replicate}}, 8);
  const StepPlan plan = elementwise_bench_plan(mesh, 1000000, OptimizerConfig{});
  CHECK(compute_time(plan, plan.ops[0], 1, back) == Approx(2e-3));
  CHECK(compute_time(plan, plan.ops[2], 1, back) == Approx(0.5e-3));
  CHECK(compute_time(plan, plan.ops[3], 1, back) == Approx(4e-3));
}

TEST_CASE("host_comm rows: a line through the median extra time per exchange",
          "[core][calibrate][host_comm]") {
  CalibrationInput in;
  in.ranks = 2;
  const auto [ns, gemm] = minimal_compute_rows();
  // Two shapes x three sizes on t = 10 us + 0.3 ns x bytes (an exchange is two messages: 5 us
  // each); a third shape off the line by noise does not move the medians of three.
  const auto row = [](double bytes, double seconds) {
    ComputeBenchRow r;
    r.kernel = "host_comm";
    r.model_bytes = bytes;
    r.seconds = seconds;
    return r;
  };
  in.compute = {ns, gemm};
  for (double bytes : {32768.0, 131072.0, 524288.0}) {
    const double t = 10e-6 + 0.3e-9 * bytes;
    in.compute.push_back(row(bytes, t));
    in.compute.push_back(row(bytes, t));
    in.compute.push_back(row(bytes, bytes > 100000 ? 3 * t : -t));
  }
  ClusterSpec fit = calibrated_profile(in);
  CHECK(fit.gpu.host_comm_us_per_message == Approx(5.0).epsilon(1e-6));
  CHECK(fit.gpu.host_comm_ns_per_byte == Approx(0.3).epsilon(1e-6));
  const ClusterSpec back =
      parse_cluster(YAML::Load(calibrated_profile_yaml(fit, {"h"})), "fitted.yaml");
  CHECK(back.gpu.host_comm_ns_per_byte == Approx(0.3).epsilon(1e-6));

  SECTION("noise that tilts the line below zero gives a constant, never a negative cost") {
    in.compute = {ns, gemm, row(32768, 20e-6), row(131072, 15e-6), row(524288, 10e-6)};
    fit = calibrated_profile(in);
    CHECK(fit.gpu.host_comm_ns_per_byte == 0.0);
    CHECK(fit.gpu.host_comm_us_per_message == Approx(7.5));  // the mean, per message
  }
  SECTION("no rows (a GPU calibration): nothing charged") {
    in.compute = {ns, gemm};
    fit = calibrated_profile(in);
    CHECK(fit.gpu.host_comm_us_per_message == 0.0);
    CHECK(fit.gpu.host_comm_ns_per_byte == 0.0);
  }
}

TEST_CASE("the speed probe times the plan's costliest Newton-Schulz at the profile's time",
          "[core][calibrate]") {
  const std::vector<Experiment> points = parse_experiment(kExperiment, "cal.yaml");
  const auto two_ranks = std::find_if(points.begin(), points.end(),
                                      [](const Experiment& e) { return e.mesh.world_size() == 2; });
  REQUIRE(two_ranks != points.end());
  const StepPlan plan = plan_experiment(*two_ranks);
  // hidden 128: the MLP matrices (344 x 128 and 128 x 344) carry the most FLOPs per call.
  ClusterSpec c = known_profile();
  c.gpu.ns_kernel = "cpu-fp32";
  c.gpu.ns_table = {{"cpu-fp32", 128, 128, 1, 5, 2.0, ""}, {"cpu-fp32", 344, 128, 1, 5, 7.0, ""}};
  const std::optional<SpeedProbe> probe = speed_probe(plan, c);
  REQUIRE(probe);
  CHECK(std::min(probe->shape.rows, probe->shape.cols) == 128);
  CHECK(std::max(probe->shape.rows, probe->shape.cols) == 344);
  CHECK(probe->shape.batch == 1);
  CHECK(probe->predicted_s == Approx(7e-3));  // the table's entry (orientation does not matter)
  // The probe plan is the compute benchmark's, on the point's mesh.
  REQUIRE(probe->plan.ops.size() == 3);
  CHECK(probe->plan.ops[1].kind == OpKind::newton_schulz);
  CHECK(probe->plan.mesh().world_size() == 2);

  // Without a table: the FLOPs at the sustained rate plus one kernel launch, as the model
  // charges it: 5 x (4 x 128^2 x 344 + 2 x 128^3) FLOPs at 0.1 TFLOP/s + 4 us.
  ClusterSpec bare = known_profile();
  const std::optional<SpeedProbe> rate = speed_probe(plan, bare);
  REQUIRE(rate);
  const double flops = 5.0 * (4.0 * 128 * 128 * 344 + 2.0 * 128 * 128 * 128);
  CHECK(rate->predicted_s == Approx(flops / (0.1e12 * bare.gpu.efficiency(128)) + 4e-6));
}

namespace {

ComputeBenchRow host_comm_row(double bytes, double seconds) {
  ComputeBenchRow r;
  r.kernel = "host_comm";
  r.shape = {1, 64, 96};
  r.model_bytes = bytes;
  r.seconds = seconds;
  return r;
}

ComputeBenchRow elementwise_row(const char* kernel, double bytes, double seconds) {
  ComputeBenchRow r;
  r.kernel = kernel;
  r.shape = {1, 64, 96};
  r.model_bytes = bytes;
  r.seconds = seconds;
  return r;
}

bool any_contains(const std::vector<std::string>& lines, const std::string& text) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

}  // namespace

TEST_CASE("a cost least squares puts below 0 is refitted at 0 and reported, never written negative",
          "[core][calibrate][quality]") {
  CalibrationInput in;
  in.ranks = 2;
  const auto [ns, gemm] = minimal_compute_rows();
  in.compute = {ns, gemm};
  // host_comm: extra time per exchange exactly on t = -5 us + 0.3 ns x bytes, so plain least
  // squares gives a cost of -5 us per exchange (-2.5 us per message). Non-negative least squares
  // puts it at 0 and refits the slope through the origin: sum(x y) / sum(x^2).
  double sxy = 0, sxx = 0;
  for (double bytes : {32768.0, 131072.0, 524288.0}) {
    const double t = -5e-6 + 0.3e-9 * bytes;
    REQUIRE(t > 0);
    in.compute.push_back(host_comm_row(bytes, t));
    sxy += bytes * t;
    sxx += bytes * bytes;
  }
  // momentum: t = -2 us + bytes / 8 GB/s, so the fitted kernel launch would be -2 us; at 0 the
  // weighted (1 / t^2) line through the origin has slope sum(w x t) / sum(w x^2).
  double wxy = 0, wxx = 0;
  for (double bytes : {1e5, 1e6, 1e7}) {
    const double t = -2e-6 + bytes / 8e9;
    in.compute.push_back(elementwise_row("momentum", bytes, t));
    wxy += bytes * t / (t * t);
    wxx += bytes * bytes / (t * t);
  }
  const CalibrationResult r = calibrate_profile(in);
  const GpuSpec& gpu = r.profile.gpu;
  CHECK(gpu.host_comm_us_per_message == 0.0);
  CHECK(gpu.host_comm_ns_per_byte == Approx(sxy / sxx * 1e9).epsilon(1e-9));
  CHECK(r.profile.launch_overhead.kernel_us == 0.0);
  CHECK(gpu.hbm_GBps == Approx(1.0 / (wxy / wxx) / 1e9).epsilon(1e-9));
  // Said loudly: each clamped term named with what least squares gave and its rows.
  REQUIRE(r.clamped.size() == 2);
  CHECK_THAT(r.clamped[0], Contains("gpu.host_comm_us_per_message") && Contains("-2.5 us") &&
                               Contains("32768 B") && Contains("non-negative least squares"));
  CHECK_THAT(r.clamped[1],
             Contains("launch_overhead_us.kernel") && Contains("-2 us") && Contains("momentum"));
  const std::vector<std::string> header = fit_quality_header(r, kDefaultMaxFitErrorPct);
  CHECK(any_contains(header, "CLAMPED: gpu.host_comm_us_per_message"));
  CHECK(any_contains(header, "CLAMPED: launch_overhead_us.kernel"));
  // The profile with that header is one the loader reads, with the clamped values.
  const ClusterSpec back =
      parse_cluster(YAML::Load(calibrated_profile_yaml(r.profile, header)), "clamped.yaml");
  CHECK(back.gpu.host_comm_us_per_message == 0.0);
  CHECK(back.gpu.host_comm_ns_per_byte == Approx(gpu.host_comm_ns_per_byte));

  SECTION("a line least squares fits with every term >= 0 is kept as it is") {
    in.compute = {ns, gemm};
    for (double bytes : {32768.0, 131072.0, 524288.0})
      in.compute.push_back(host_comm_row(bytes, 5e-6 + 0.3e-9 * bytes));
    const CalibrationResult plain = calibrate_profile(in);
    CHECK(plain.clamped.empty());
    CHECK(plain.profile.gpu.host_comm_us_per_message == Approx(2.5));
    CHECK(plain.profile.gpu.host_comm_ns_per_byte == Approx(0.3));
  }
}

TEST_CASE("a physically impossible fit is refused with the quantity, its value, rows and fix",
          "[core][calibrate][quality]") {
  CalibrationInput in;
  in.ranks = 2;
  const auto [ns, gemm] = minimal_compute_rows();
  SECTION("elementwise times that fall as the bytes grow: no bandwidth fits") {
    in.compute = {ns, gemm, elementwise_row("momentum", 1e5, 50e-6),
                  elementwise_row("apply_update", 1e6, 40e-6),
                  elementwise_row("momentum", 1e7, 30e-6)};
    CHECK_THROWS_AS(calibrate_profile(in), Error);
    CHECK_THROWS_WITH(calibrate_profile(in),
                      Contains("gpu.hbm_GBps = -") && Contains("physically impossible") &&
                          Contains("momentum 64x96 (10000000 B): 0.03 ms") &&
                          Contains("no profile was written") && Contains("fix: rerun"));
  }
  SECTION("a host_comm time that is not a number") {
    in.compute = {ns, gemm, host_comm_row(32768, 1e-6), host_comm_row(131072, std::nan(""))};
    CHECK_THROWS_WITH(calibrate_profile(in), Contains("gpu.host_comm_us_per_message") &&
                                                 Contains("must be finite") &&
                                                 Contains("host_comm 64x96 (131072 B): nan ms"));
  }
  SECTION("an infinite Newton-Schulz time") {
    ComputeBenchRow slow = ns;
    slow.seconds = INFINITY;
    in.compute = {slow, gemm};
    CHECK_THROWS_WITH(calibrate_profile(in), Contains("gpu.ns_table (64x96) = inf ms"));
  }
}

TEST_CASE(
    "calibrate writes its numbers through the cluster field table: what the loader refuses "
    "is refused before a profile is written",
    "[core][calibrate][quality]") {
  CalibrationInput in;
  in.ranks = 2;
  const auto [ns, gemm] = minimal_compute_rows();
  in.compute = {ns, gemm};
  in.memory_GiB = 2e6;  // per rank: past the loader's 1,000,000 GiB
  CHECK_THROWS_WITH(calibrate_profile(in), Contains("gpu.memory_GiB = 2000000 GiB") &&
                                               Contains("0.001 .. 1000000 GiB") &&
                                               Contains("no profile was written"));
  // The loader refuses the same number in a profile (the reason calibrate refuses it).
  in.memory_GiB = 2;
  ClusterSpec ok = calibrate_profile(in).profile;
  const std::string yaml = calibrated_profile_yaml(ok, {});
  CHECK_NOTHROW(parse_cluster(YAML::Load(yaml), "ok.yaml"));
  ok.gpu.memory_GiB = 2e6;
  CHECK_THROWS_AS(parse_cluster(YAML::Load(calibrated_profile_yaml(ok, {})), "big.yaml"),
                  ConfigError);
}

TEST_CASE("the profile header says what each number is from the cluster field table",
          "[core][calibrate]") {
  const std::vector<std::string> lines = calibrated_fields_header();
  for (const std::string& line : lines) {
    INFO(line);
    CHECK(line.size() <= 100);
  }
  // Every field the key reference says calibrate (mpi) writes starts one line, in table order,
  // with the reference's words after it.
  std::size_t at = 0;
  int fields = 0;
  for (const ClusterKeyDoc& d : cluster_key_reference()) {
    if (!d.calibrated.starts_with("calibrate (mpi): ")) continue;
    INFO(d.path);
    const auto it =
        std::find_if(lines.begin() + static_cast<std::ptrdiff_t>(at), lines.end(),
                     [&](const std::string& l) { return l.starts_with("  " + d.path + " "); });
    REQUIRE(it != lines.end());
    at = static_cast<std::size_t>(it - lines.begin()) + 1;
    const std::string first_word = d.calibrated.substr(17, d.calibrated.find(' ', 17) - 17);
    CHECK_THAT(*it, Contains(first_word));
    ++fields;
  }
  // The numbers calibrate fits are among them.
  for (const char* path :
       {"gpu.peak_tflops", "gpu.hbm_GBps", "launch_overhead_us.kernel", "gpu.host_comm_ns_per_byte",
        "intra_node.bandwidth_GBps", "intra_node.latency_us", "launch_overhead_us.collective",
        "efficiency.intra_node.p2p", "gpu.ns_table"})
    CHECK(std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
      return l.starts_with("  " + std::string(path) + " ");
    }));
  CHECK(fields >= 15);
}

TEST_CASE("a fit that misses its own rows by more than --max-fit-error is warned about",
          "[core][calibrate][quality]") {
  CalibrationInput in;
  in.ranks = 2;
  const auto [ns, gemm] = minimal_compute_rows();
  in.compute = {ns, gemm};
  // all_gather rows a known profile makes, one of them 4x slower than it says (a burst of other
  // work): the closed form cannot follow it.
  const ClusterSpec truth = known_profile();
  for (std::int64_t size = 1024; size <= (16 << 20); size *= 4) {
    CollectiveBenchRow r = bench_row("all_gather", 2, size);
    r.time_us = model_bench_seconds(truth, r) * 1e6 * (size == 65536 ? 4 : 1);
    r.algbw_GBps = static_cast<double>(size) / (r.time_us * 1e-6) / 1e9;
    in.collectives.push_back(r);
  }
  const CalibrationResult r = calibrate_profile(in);
  // The errors, computed here from the fitted profile.
  std::vector<double> errors;
  for (const CollectiveBenchRow& row : in.collectives)
    errors.push_back(std::abs(model_bench_seconds(r.profile, row) * 1e6 / row.time_us - 1) * 100);
  std::sort(errors.begin(), errors.end());
  const double max_error = errors.back();
  REQUIRE(errors.size() == 8);
  REQUIRE(max_error > kDefaultMaxFitErrorPct);
  REQUIRE(r.fits.size() == 1);
  const FitQuality& f = r.fits[0];
  CHECK_THAT(f.name, Contains("all_gather"));
  CHECK(f.rows == 8);
  CHECK(f.max_error_pct == Approx(max_error));
  CHECK(f.median_error_pct == Approx((errors[3] + errors[4]) / 2));  // of 8
  CHECK_THAT(f.worst, Contains("all_gather 65536 B"));

  // Above the threshold: a warning naming the fit, its error and its worst row, and the header
  // says so; below it neither.
  const std::vector<std::string> warned = fit_error_warnings(r, kDefaultMaxFitErrorPct);
  REQUIRE(warned.size() == 1);
  CHECK_THAT(warned[0], Contains("above --max-fit-error 25 %") && Contains("all_gather") &&
                            Contains("worst all_gather 65536 B"));
  const std::vector<std::string> header = fit_quality_header(r, kDefaultMaxFitErrorPct);
  CHECK(any_contains(header, "WARNING: fit error"));
  CHECK(any_contains(header, "on all_gather: |error| median"));  // every fit's errors, always
  CHECK(fit_error_warnings(r, max_error * 0.99).size() == 1);
  CHECK(fit_error_warnings(r, max_error * 1.01).empty());
  const std::vector<std::string> quiet = fit_quality_header(r, max_error * 1.01);
  CHECK_FALSE(any_contains(quiet, "WARNING"));
  CHECK(any_contains(quiet, "on all_gather: |error| median"));
  // The header keeps the profile loadable.
  const ClusterSpec back =
      parse_cluster(YAML::Load(calibrated_profile_yaml(r.profile, header)), "warned.yaml");
  CHECK(back.intra.bandwidth_GBps == Approx(r.profile.intra.bandwidth_GBps).epsilon(1e-4));
}

namespace {

// A tiny MoE on ep=2 x dp_shard=2: 8 routed experts of 96 x 64 per MoE layer, stacked per EP
// rank as [experts / ep, rows, cols] (4 experts per EP rank).
const char* kMoeExperiment = R"(name: moe_cal
cluster: dgx-h100
mesh: {dims: {ep: 2, dp_shard: 2}}
model:
  moe: {hidden: 64, layers: 2, heads: 4, ffn: 128, vocab: 512, experts: 8, expert_ffn: 96}
strategy: {name: owner}
backend: [analytic]
)";

// A timer that needs no device: times from a known machine, NS at 10 us + FLOPs at 50 TFLOP/s,
// elementwise ops at 2 us + model bytes at 500 GB/s (the line calibrate fits).
class FakeTimer : public ComputeTimer {
 public:
  std::string ns_version() const override { return "v2"; }
  std::vector<ComputeBenchRow> time(const CalibrationWorkload& w) override {
    std::vector<ComputeBenchRow> rows = calibration_compute_rows(w);
    for (ComputeBenchRow& r : rows)
      r.seconds =
          r.kernel == "newton_schulz" ? 10e-6 + r.flops / 50e12 : 2e-6 + r.model_bytes / 500e9;
    return rows;
  }
};

}  // namespace

TEST_CASE(
    "calibrate's shared path with a fake timer: a MoE plan's batched NS shapes become "
    "table rows of the base profile, written and loaded back",
    "[core][calibrate][nccl]") {
  const std::vector<Experiment> points = parse_experiment(kMoeExperiment, "moe_cal.yaml");
  const NsCallShape extra{1, 1024, 1024};  // a default table shape (bench ns's GPU list)
  const CalibrationWorkload w = calibrate_workload(points, 0, {extra});
  // The expert stack of one EP rank: 8 experts / ep 2 = 4 matrices of 96 x 64 in one call.
  const auto stack = std::find_if(w.ns_shapes.begin(), w.ns_shapes.end(), [](const NsCallShape& s) {
    return s.batch == 4 && std::min(s.rows, s.cols) == 64 && std::max(s.rows, s.cols) == 96;
  });
  REQUIRE(stack != w.ns_shapes.end());
  CHECK(std::find(w.ns_shapes.begin(), w.ns_shapes.end(), extra) != w.ns_shapes.end());
  CHECK(std::is_sorted(w.ns_shapes.begin(), w.ns_shapes.end()));
  REQUIRE_FALSE(w.elementwise_numels.empty());

  const ClusterSpec base =
      load_cluster_file(std::string(MUONBED_SOURCE_DIR) + "/experiments/clusters/dgx-h100.yaml");
  FakeTimer timer;
  const std::vector<ComputeBenchRow> rows = timer.time(w);
  CalibrationInfo info;
  info.backend = "nccl";
  info.date = "2026-11-28";
  CalibrationResult fitted =
      calibrate_compute(base, rows, timer.ns_version(), w.ns_steps, "fake-gpu", info);
  const ClusterSpec& p = fitted.profile;
  // The line through the elementwise rows gives the fake machine back.
  CHECK(p.gpu.hbm_GBps == Approx(500).epsilon(1e-9));
  CHECK(p.launch_overhead.kernel_us == Approx(2).epsilon(1e-9));
  CHECK(p.gpu.ns_kernel == "v2");
  // Every measured shape is a v2 row; the base's v2 rows of other shapes are gone, its v1 and
  // pytorch rows and everything one GPU cannot measure stay.
  int v2 = 0;
  for (const NsTiming& t : p.gpu.ns_table)
    if (t.version == "v2") {
      ++v2;
      CHECK(std::find(w.ns_shapes.begin(), w.ns_shapes.end(),
                      NsCallShape{t.batch, t.rows, t.cols}) != w.ns_shapes.end());
    }
  CHECK(v2 == static_cast<int>(w.ns_shapes.size()));
  const auto count = [](const ClusterSpec& c, const std::string& version) {
    return std::count_if(c.gpu.ns_table.begin(), c.gpu.ns_table.end(),
                         [&](const NsTiming& t) { return t.version == version; });
  };
  CHECK(count(p, "v1") == count(base, "v1"));
  CHECK(count(p, "pytorch") == count(base, "pytorch"));
  CHECK(p.intra.bandwidth_GBps == base.intra.bandwidth_GBps);
  CHECK(p.nic.bandwidth_GBps == base.nic.bandwidth_GBps);
  CHECK(p.gpu.peak_tflops == base.gpu.peak_tflops);
  CHECK(p.gpu.elementwise_table.size() == 3 * w.elementwise_numels.size());

  testing::TempDir dir("calibrate-nccl");
  const std::string path = (std::filesystem::path(dir.path()) / "fake-gpu.yaml").string();
  const ClusterSpec back =
      write_calibrated_profile(path, fitted, {"fake-gpu: a test"}, {}, "nccl", 25);
  const ClusterSpec loaded = load_cluster_file(path);
  CHECK(loaded.name == "fake-gpu");
  CHECK(back.gpu.ns_table.size() == loaded.gpu.ns_table.size());
  // The batched expert stack is timed from the table, at the time the fake timer gave it.
  NsTimeSource source = NsTimeSource::curve;
  const double seconds =
      loaded.gpu.ns_call_seconds(stack->rows, stack->cols, stack->batch, w.ns_steps, "v2", &source);
  CHECK(source == NsTimeSource::table);
  const auto row = std::find_if(rows.begin(), rows.end(), [&](const ComputeBenchRow& r) {
    return r.kernel == "newton_schulz" && r.shape == *stack;
  });
  REQUIRE(row != rows.end());
  CHECK(seconds == Approx(row->seconds).epsilon(1e-3));
  // The header says what calibrate --backend nccl measured, from the cluster field table.
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Contains("# fake-gpu: a test"));
  CHECK_THAT(text, Contains("#   gpu.ns_table "));
  CHECK_THAT(text, Contains("#   gpu.elementwise_table "));
  CHECK_THAT(text, Contains("fit quality"));
}

TEST_CASE(
    "calibrate_workload adds table shapes to the plans' and leaves them otherwise as "
    "calibration_workload makes them",
    "[core][calibrate]") {
  const std::vector<Experiment> points = parse_experiment(kExperiment, "cal.yaml");
  const CalibrationWorkload plain = calibration_workload(points, 2);
  const CalibrationWorkload same = calibrate_workload(points, 2, {});
  CHECK(same.ns_shapes == plain.ns_shapes);
  CHECK(same.elementwise_numels == plain.elementwise_numels);
  CHECK(same.collectives.size() == plain.collectives.size());
  // ranks 0: every point (dp_shard 2 and 4), so at least the shapes of the 2-rank points.
  const CalibrationWorkload all = calibrate_workload(points, 0, {});
  for (const NsCallShape& s : plain.ns_shapes)
    CHECK(std::find(all.ns_shapes.begin(), all.ns_shapes.end(), s) != all.ns_shapes.end());
}

TEST_CASE("the nccl header names the fields one GPU measures, not the network",
          "[core][calibrate][nccl]") {
  const std::vector<std::string> lines = calibrated_fields_header("nccl");
  const auto has = [&](const std::string& path) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.starts_with("  " + path + " "); });
  };
  for (const char* path : {"gpu.hbm_GBps", "gpu.ns_table", "gpu.ns_kernel", "gpu.elementwise_table",
                           "launch_overhead_us.kernel"})
    CHECK(has(path));
  for (const char* path : {"intra_node.bandwidth_GBps", "gpu.peak_tflops", "gpu.memory_GiB"})
    CHECK_FALSE(has(path));
  // The mpi header does not carry the nccl part of a field's text.
  for (const std::string& line : calibrated_fields_header("mpi")) {
    INFO(line);
    CHECK(line.find("calibrate (") == std::string::npos);
  }
}
