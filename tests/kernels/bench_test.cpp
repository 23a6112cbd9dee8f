// The NS benchmark's CPU path end to end on tiny shapes (it validates, prints, writes JSON), its
// option checks, and the Muon shape groups of llama-7b (shapes only, nothing allocated).
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/base/errors.hpp"
#include "core/model/model.hpp"
#include "kernels/bench.hpp"

using namespace muonbed;

TEST_CASE("bench ns runs on the CPU and says so", "[bench]") {
  NsBenchOptions options;
  options.device = "cpu";
  options.shapes = {{1, 64, 96}, {2, 48, 32}};
  options.warmup = 0;
  options.repeats = 1;
  options.json_path = "kernels_bench_test.json";
  std::ostringstream out;
  REQUIRE(run_ns_benchmark(options, out) == 0);
  const std::string text = out.str();
  INFO(text);
  CHECK(text.find("ran on the CPU") != std::string::npos);
  CHECK(text.find("OK") != std::string::npos);
  CHECK(text.find("64x96") != std::string::npos);

  std::ifstream file(options.json_path);
  const nlohmann::json j = nlohmann::json::parse(file);
  CHECK(j.at("device") == "cpu");
  REQUIRE(j.at("results").size() == 2);
  CHECK(j.at("results")[1].at("batch") == 2);
  // 2 matrices x 5 steps x (4 * 32^2 * 48 + 2 * 32^3) = 2_621_440 FLOPs.
  CHECK(j.at("results")[1].at("flops") == 2621440.0);
  CHECK(j.at("results")[0].at("median_ms").get<double>() > 0.0);
  // Rows name what they measured (the row form of `muonbed bench collective --json`).
  CHECK(j.at("results")[0].at("bench") == "ns");
  CHECK(j.at("results")[0].at("device") == "cpu");
  CHECK(j.at("results")[0].at("time_us").get<double>() ==
        Approx(1e3 * j.at("results")[0].at("median_ms").get<double>()));
  std::remove(options.json_path.c_str());
}

TEST_CASE("bench ns rejects bad options", "[bench]") {
  std::ostringstream out;
  NsBenchOptions bad_device;
  bad_device.device = "tpu";
  CHECK(run_ns_benchmark(bad_device, out) == 2);
  NsBenchOptions bad_set;
  bad_set.device = "cpu";
  bad_set.coefficients = "newton";
  CHECK(run_ns_benchmark(bad_set, out) == 2);
  CHECK(out.str().find("error:") != std::string::npos);
  // Options outside the limits are refused before anything is allocated or run (an absurd
  // shape allocated tens of GB, --steps 0 printed a 309-digit bound, --repeats 1e9 ran forever).
  NsBenchOptions bad_shape;
  bad_shape.device = "cpu";
  bad_shape.shapes = {{1, 0, 4}};
  CHECK_THROWS_AS(run_ns_benchmark(bad_shape, out), ConfigError);
  const auto refused = [](NsBenchOptions o, const std::string& words) {
    INFO(words);
    CHECK_THROWS_WITH(check_ns_bench_options(o, false), Catch::Contains(words));
  };
  NsBenchOptions o;
  o.device = "cpu";
  o.steps = 0;
  refused(o, "--steps 0 is outside 1..100");
  o.steps = 1000000000;
  refused(o, "--steps 1000000000 is outside 1..100");
  o.steps = 5;
  o.repeats = 1000000000;
  refused(o, "--repeats 1000000000 is outside 1..10000");
  o.repeats = 0;
  refused(o, "--repeats 0 is outside 1..10000");
  o.repeats = -1;
  o.warmup = 5000;
  refused(o, "--warmup 5000 is outside 0..1000");
  o.warmup = -1;
  o.shapes = {{1, 100000, 100000}};
  refused(o, "has a size outside 1..65536");
  o.shapes = {{65536, 65536, 4}};
  refused(o, "more than 2^31 elements");
  o.shapes = {{1, 16384, 16384}};
  o.repeats = 1000;
  refused(o, "FLOP, more than the 2.00e+14 FLOP a CPU benchmark may take");
  // On a GPU the same work is allowed; within the limits nothing is refused.
  CHECK_NOTHROW(check_ns_bench_options(o, true));
  NsBenchOptions fine;
  CHECK_NOTHROW(check_ns_bench_options(fine, false));
}

TEST_CASE("llama-7b's Muon set groups into three shapes", "[bench]") {
  const std::optional<Model> model = find_preset("llama-7b");
  REQUIRE(model);
  const std::vector<MatrixShape> groups = muon_shape_groups(*model);
  // 32 layers: q, k, v, o [4096, 4096]; gate, up [11008, 4096]; down [4096, 11008].
  // Embedding and lm_head go to AdamW. Sorted by FLOPs per step, largest first.
  REQUIRE(groups.size() == 3);
  CHECK(groups[0].batch == 64);
  CHECK(groups[0].rows == 11008);
  CHECK(groups[0].cols == 4096);
  CHECK(groups[1].batch == 128);
  CHECK(groups[1].rows == 4096);
  CHECK(groups[2].batch == 32);
  CHECK(groups[2].cols == 11008);
}
