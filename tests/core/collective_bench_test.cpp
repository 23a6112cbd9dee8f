// The collective benchmark harness (core/results/collective_bench.hpp) on the analytic backend:
// size ranges, the synthetic plans' buffer sizes (nccl-tests' S) for every op, the row's bus factor
// and count column, nccl-tests' line format, JSON rows, and the shipped profiles' published
// figures (each profile's `measurements`) within 10%.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "core/engine/cost_model.hpp"
#include "core/results/collective_bench.hpp"
#include "muonbed/config.hpp"
#include "tests/common/collective_bench_fixtures.hpp"

using namespace muonbed;

namespace {

ClusterSpec profile(const std::string& name) {
  return load_cluster_file(std::string(MUONBED_SOURCE_DIR) + "/experiments/clusters/" + name +
                           ".yaml");
}

// `op` over all of `gpus` GPUs on nodes of 8 (dgx-h100's).
CollectiveBenchSpec spec_of(const std::string& op, int gpus, int gpus_per_node = 8) {
  return testing::one_group_spec(op, gpus, gpus_per_node);
}

}  // namespace

TEST_CASE("size ranges double like nccl-tests' -b -e -f", "[core][bench]") {
  CHECK(parse_size_range("1K:8K") == std::vector<std::int64_t>{1024, 2048, 4096, 8192});
  CHECK(parse_size_range("8:1K:4") == std::vector<std::int64_t>{8, 32, 128, 512});
  CHECK(parse_size_range("64M") == std::vector<std::int64_t>{64LL << 20});
  CHECK(parse_size_range("1G:1G") == std::vector<std::int64_t>{1LL << 30});
  CHECK(parse_size_range("1K:1G").size() == 21);
  CHECK_THROWS_AS(parse_size_range("1K:x"), ConfigError);
  CHECK_THROWS_AS(parse_size_range("8K:1K"), ConfigError);
  CHECK_THROWS_AS(parse_size_range("1K:8K:1"), ConfigError);
  CHECK_THROWS_AS(parse_size_range(""), ConfigError);
}

TEST_CASE("every op's synthetic plan moves nccl-tests' buffer size", "[core][bench]") {
  const ClusterSpec c = profile("dgx-h100");
  const std::int64_t S = 64LL << 20;
  for (const std::string& op : collective_bench_ops()) {
    INFO(op);
    const CollectiveBenchSpec spec = spec_of(op, 8);
    const CollectiveBenchRow row =
        run_collective_bench(spec, testing::bench_experiment(c, spec), S, "analytic");
    CHECK(row.size_bytes == S);
    CHECK(row.type == "float");
    CHECK(row.group_size == 8);
    CHECK(row.gpus == 8);
    CHECK(row.nodes == 1);
    CHECK(row.instances == 1);
    CHECK(row.wrong == -1);
    CHECK(row.backend == "analytic");
    const bool per_rank = op == "all_gather" || op == "reduce_scatter" || op == "gather" ||
                          op == "scatter" || op == "all_to_all";
    CHECK(row.count == (per_rank ? S / 4 / 8 : S / 4));
    CHECK(row.redop == (op == "all_reduce" || op == "reduce_scatter" ? "sum" : "none"));
    CHECK(row.algbw_GBps == Approx(S / (row.time_us * 1e-6) / 1e9));
    const OpKind kind = op == "sendrecv" ? OpKind::send : op_kind_from_string(op);
    CHECK(row.busbw_GBps == Approx(row.algbw_GBps * bus_factor(kind, 8)));
    // The row's time is the analytic model's instance time for S.
    if (op != "sendrecv") {
      const LinkParams link = link_for_group(c, spec.mesh, {0, 1, 2, 3, 4, 5, 6, 7}, kind);
      CHECK(row.time_us * 1e-6 == Approx(collective_time(kind, 8, static_cast<double>(S), link)));
    }
  }
}

TEST_CASE("bench plans: bfloat16, a mesh with several groups, roots, and bad input",
          "[core][bench]") {
  const ClusterSpec c = profile("dgx-h100");
  CollectiveBenchSpec spec;
  spec.op = "all_to_all";
  spec.mesh = DeviceMesh({{"dp", 2, DimRole::replicate}, {"tp", 8, DimRole::replicate}}, 8);
  spec.group = DimSet::of({1});
  spec.dtype = DType::bf16;
  const CollectiveBenchRow row =
      run_collective_bench(spec, testing::bench_experiment(c, spec), 1 << 20, "analytic");
  CHECK(row.size_bytes == 1 << 20);
  CHECK(row.type == "bfloat16");
  CHECK(row.count == (1 << 20) / 2 / 8);
  CHECK(row.instances == 2);
  CHECK(row.gpus == 16);
  CHECK(row.nodes == 2);
  // Pieces round down to whole elements, as nccl-tests does.
  const CollectiveBenchSpec ag = spec_of("all_gather", 3);
  CHECK(run_collective_bench(ag, testing::bench_experiment(c, ag), 1000, "analytic").size_bytes ==
        996);
  CollectiveBenchSpec bcast = spec_of("broadcast", 4);
  bcast.root = 3;
  CHECK(run_collective_bench(bcast, testing::bench_experiment(c, bcast), 4096, "analytic").root ==
        3);
  bcast.root = 4;
  CHECK_THROWS_AS(collective_bench_plan(bcast, 4096), ConfigError);
  CHECK_THROWS_AS(collective_bench_plan(spec_of("all_gather", 1), 4096), ConfigError);
  CHECK_THROWS_AS(collective_bench_plan(spec_of("reduce", 8), 4096), ConfigError);
  CHECK_THROWS_WITH(run_collective_bench(ag, testing::bench_experiment(c, ag), 1024, "nccl"),
                    Catch::Contains("not built"));
}

TEST_CASE("bench rows print in nccl-tests' columns and as JSON", "[core][bench]") {
  CollectiveBenchRow row;
  row.op = "all_gather";
  row.size_bytes = 1073741824;
  row.count = 33554432;
  row.type = "float";
  row.redop = "none";
  row.root = -1;
  row.time_us = 2589.77;
  row.algbw_GBps = 414.61;
  row.busbw_GBps = 362.78;
  row.backend = "sim";
  CHECK(collective_bench_line(row) ==
        "  1073741824      33554432     float    none      -1  2589.77  414.61  362.78    N/A");
  row.wrong = 0;
  row.time_us = 14.0;
  CHECK(collective_bench_line(row) ==
        "  1073741824      33554432     float    none      -1    14.00  414.61  362.78       0");
  CHECK(collective_bench_header().find("#       size         count      type   redop    root     "
                                       "time   algbw   busbw #wrong") != std::string::npos);
  const auto j = collective_bench_json(row);
  for (const char* key :
       {"op", "size_bytes", "gpus", "time_us", "algbw_GBps", "busbw_GBps", "backend", "wrong"})
    CHECK(j.contains(key));
  CHECK(j["wrong"] == 0);
}

namespace {

// A measured backend whose iterations took known times: the bench's collective with the
// instance time of each timed iteration (step_times_s) and their mean (time_s), as the mpi
// backend's record has them (backends/mpi/src/measure.cpp).
std::vector<double> g_iteration_s;

PointRun known_iterations(const Experiment&, const StepPlan& plan, const RunSettings&) {
  PointRun run;
  run.record.backend = "known_iterations";
  run.record.fidelity = "measured";
  CollectiveResult c;
  for (const Op& op : plan.ops)
    if (op.kind != OpKind::momentum) c.kind = std::string(to_string(op.kind));
  c.group_size = plan.mesh().world_size();
  c.instances = 1;
  c.bytes = 1 << 20;
  double sum = 0;
  for (const double t : g_iteration_s) sum += t;
  c.time_s = sum / static_cast<double>(g_iteration_s.size());
  c.step_times_s = g_iteration_s;
  run.record.collectives = {c};
  run.wrong_elements = 0;
  return run;
}

}  // namespace

TEST_CASE("measured rows report min, median and max over the iterations; modelled rows one time",
          "[core][bench][spread]") {
  // Hand-computed: {40, 10, 30, 20, 100} us sorted is 10 20 30 40 100: min 10, median 30 (the
  // middle one), max 100; without the 100 the median is (20 + 30) / 2 = 25.
  const IterationSpread odd = iteration_spread({40, 10, 30, 20, 100});
  CHECK(odd.min == 10);
  CHECK(odd.median == 30);
  CHECK(odd.max == 100);
  const IterationSpread even = iteration_spread({40, 10, 30, 20});
  CHECK(even.min == 10);
  CHECK(even.median == 25);
  CHECK(even.max == 40);
  const IterationSpread none = iteration_spread({});
  CHECK((none.min == 0 && none.median == 0 && none.max == 0));

  // Through the harness: a backend whose four iterations took 30, 10, 20 and 12 us.
  register_backend({{.name = "known_iterations", .description = "test: known iteration times"},
                    &known_iterations});
  g_iteration_s = {30e-6, 10e-6, 20e-6, 12e-6};
  const ClusterSpec c = profile("dgx-h100");
  const CollectiveBenchSpec spec = spec_of("all_gather", 2);
  Experiment e = testing::bench_experiment(c, spec);
  e.backends = {"known_iterations"};
  CollectiveBenchRow row = run_collective_bench(spec, e, 1 << 20, "known_iterations");
  REQUIRE(row.iteration_us.size() == 4);
  CHECK(row.time_us == Approx(18));  // the mean, as nccl-tests reports
  CHECK(row.min_us == Approx(10));
  CHECK(row.median_us == Approx(16));  // (12 + 20) / 2
  CHECK(row.max_us == Approx(30));
  CHECK(noisy(row));  // 30 / 10 = 3 > 1.5
  const std::string line = collective_bench_line(row);
  CHECK_THAT(line, Catch::Contains("    10.00    16.00    30.00") &&
                       Catch::Contains("noisy (max/min 3.00): rerun on a quiet machine"));
  auto j = collective_bench_json(row);
  CHECK(j["min_time_us"].get<double>() == Approx(10));
  CHECK(j["median_time_us"].get<double>() == Approx(16));
  CHECK(j["max_time_us"].get<double>() == Approx(30));
  CHECK(j["iterations"] == 4);
  CHECK(j["noisy"] == true);
  CHECK(collective_bench_header(true).find("#wrong      min   median      max") !=
        std::string::npos);

  // A steady size: 14 / 10 = 1.4 is within the 1.5 allowed.
  g_iteration_s = {10e-6, 14e-6, 12e-6};
  row = run_collective_bench(spec, e, 1 << 20, "known_iterations");
  CHECK(row.median_us == Approx(12));
  CHECK_FALSE(noisy(row));
  CHECK(collective_bench_line(row).find("noisy") == std::string::npos);
  CHECK(collective_bench_json(row)["noisy"] == false);

  // The analytic backend models one deterministic time: no spread columns, no spread keys.
  e.backends = {"analytic"};
  const CollectiveBenchRow modelled = run_collective_bench(spec, e, 1 << 20, "analytic");
  CHECK(modelled.iteration_us.empty());
  CHECK_FALSE(noisy(modelled));
  // A measured line is nccl-tests' line with the spread after it.
  CollectiveBenchRow plain = row;
  plain.iteration_us.clear();
  CHECK(collective_bench_line(row).rfind(collective_bench_line(plain) + "  ", 0) == 0);
  CHECK(collective_bench_line(row).size() == collective_bench_line(plain).size() + 27);
  CHECK_FALSE(collective_bench_json(modelled).contains("min_time_us"));
}

TEST_CASE("the analytic model meets the shipped profiles' published figures within 10%",
          "[core][bench][calibration]") {
  for (const char* name : {"dgx-h100", "dgx-h200"}) {
    const ClusterSpec c = profile(name);
    REQUIRE_FALSE(c.measurements.empty());
    for (const MeasuredCollective& m : c.measurements) {
      const CollectiveBenchSpec spec = spec_of(m.op, m.gpus, c.gpus_per_node);
      double busbw = 0;
      if (m.algorithm.empty()) {
        busbw =
            run_collective_bench(spec, testing::bench_experiment(c, spec), m.size_bytes, "analytic")
                .busbw_GBps;
      } else {  // a forced all-reduce algorithm
        REQUIRE(m.op == "all_reduce");
        std::vector<int> members(m.gpus);
        for (int i = 0; i < m.gpus; ++i) members[i] = i;
        const LinkParams link = link_for_group(c, spec.mesh, members, OpKind::all_reduce);
        const AllReduceAlgorithm a = m.algorithm == "ring"   ? AllReduceAlgorithm::ring
                                     : m.algorithm == "nvls" ? AllReduceAlgorithm::nvls
                                                             : AllReduceAlgorithm::nvls_tree;
        const double S = static_cast<double>(m.size_bytes);
        busbw =
            S / all_reduce_time(a, m.gpus, S, link) / 1e9 * bus_factor(OpKind::all_reduce, m.gpus);
      }
      INFO(name << ": " << m.op << " on " << m.gpus << " GPUs, " << m.size_bytes << " B ("
                << m.source << "): predicted " << busbw << " GB/s, published " << m.busbw_GBps);
      CHECK(busbw == Approx(m.busbw_GBps).epsilon(0.10));
    }
  }
}
