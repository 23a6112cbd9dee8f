// What the collective-bench tests (tests/core/collective_bench_test.cpp, tests/sim/bench_test.cpp,
// tests/sim/agreement_test.cpp) build before calling run_collective_bench: one group of the
// mesh's first dimension, and the experiment `muonbed bench collective` makes around it.
#pragma once

#include <string>

#include "core/results/collective_bench.hpp"
#include "muonbed/config.hpp"

namespace muonbed::testing {

// `op` over one group: dimension 0 of `mesh`.
inline CollectiveBenchSpec first_dim_spec(const std::string& op, const DeviceMesh& mesh) {
  CollectiveBenchSpec s;
  s.op = op;
  s.mesh = mesh;
  s.group = DimSet::of({0});
  return s;
}

// `op` over all of `gpus` GPUs, nodes of `gpus_per_node`.
inline CollectiveBenchSpec one_group_spec(const std::string& op, int gpus, int gpus_per_node) {
  return first_dim_spec(op, DeviceMesh({{"g", gpus, DimRole::replicate}}, gpus_per_node));
}

// The experiment around a bench of `spec` on `cluster`; `fidelity` is the sim's (step, flow,
// auto), the other backends ignore it.
inline Experiment bench_experiment(const ClusterSpec& cluster, const CollectiveBenchSpec& spec,
                                   const std::string& fidelity = "auto") {
  Experiment e;
  e.name = "bench_collective";
  e.cluster = cluster;
  e.mesh = spec.mesh;
  e.sim_fidelity = fidelity;
  return e;
}

}  // namespace muonbed::testing
