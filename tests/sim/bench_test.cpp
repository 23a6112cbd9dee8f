// `muonbed bench collective` on the simulator: the harness of core/results/collective_bench.hpp
// runs the synthetic plans through the "sim" backend, and the shipped profiles meet their published
// figures (each profile's `measurements` that use NCCL's default algorithm) within 10%.
#include <catch2/catch.hpp>

#include <string>

#include "core/engine/cost_model.hpp"
#include "core/results/collective_bench.hpp"
#include "muonbed/config.hpp"
#include "sim/simulate.hpp"
#include "tests/common/collective_bench_fixtures.hpp"

using namespace muonbed;

TEST_CASE("the simulator meets the shipped profiles' published figures within 10%",
          "[sim][bench][calibration]") {
  register_sim_backend();
  for (const char* name : {"dgx-h100", "dgx-h200"}) {
    const ClusterSpec c = load_cluster_file(std::string(MUONBED_SOURCE_DIR) +
                                            "/experiments/clusters/" + name + ".yaml");
    for (const MeasuredCollective& m : c.measurements) {
      if (!m.algorithm.empty()) continue;  // a forced algorithm: the analytic test checks it
      const CollectiveBenchSpec spec = testing::one_group_spec(m.op, m.gpus, c.gpus_per_node);
      const CollectiveBenchRow row = run_collective_bench(
          spec, testing::bench_experiment(c, spec, "step"), m.size_bytes, "sim");
      INFO(name << ": " << m.op << " on " << m.gpus << " GPUs, " << m.size_bytes << " B ("
                << m.source << "): simulated " << row.busbw_GBps << " GB/s, published "
                << m.busbw_GBps);
      CHECK(row.fidelity == "step");
      CHECK(row.busbw_GBps == Approx(m.busbw_GBps).epsilon(0.10));
    }
  }
}
