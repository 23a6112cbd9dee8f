// Clusters written by hand for tests that work their expected times out on paper. One place
// turns the few numbers such a test states (GPU rate, intra-node link, NICs, one switch) into a
// ClusterSpec, so each test shows only the figures its hand computation uses; `unit_cluster` is
// the round-number cluster the cost-model and bound tests compute against.
#pragma once

#include <string>

#include "core/config/cluster.hpp"

namespace muonbed::testing {

// `gpus_per_node` GPUs of `peak_tflops` (HBM not modelled) on `intra`, `nic` per node, every
// node behind one switch of `switch_latency_us`; as many nodes as the mesh needs.
inline ClusterSpec single_switch_cluster(const std::string& name, int gpus_per_node,
                                         double peak_tflops, const IntraNodeSpec& intra,
                                         const NicSpec& nic, double switch_latency_us) {
  ClusterSpec c;
  c.name = name;
  c.gpus_per_node = gpus_per_node;
  c.nodes = 0;
  c.gpu.name = name + "-gpu";
  c.gpu.peak_tflops = peak_tflops;
  c.intra = intra;
  c.nic = nic;
  c.network.topology = TopologyKind::single_switch;
  c.network.switch_latency_us = switch_latency_us;
  return c;
}

// Round numbers: NVSwitch of 100 GB/s (1 us), 1 TFLOP/s at any size, two NICs of 25 GB/s (5 us)
// per node behind one switch (1 us).
inline ClusterSpec unit_cluster(int gpus_per_node = 2) {
  return single_switch_cluster("unit", gpus_per_node, 1, {IntraNodeKind::nvswitch, 100, 1},
                               {2, 25, 5}, 1);
}

// `c` with NVLink SHARP on its NVSwitch, as the NVLS tests of the cost model and the simulator
// price it: NVLink latency 0.6 us, 10 us per NVLS call, NICs of 50 GB/s, and one set of ring,
// all-to-all, p2p and NVLS efficiencies (intra-node and network) for both tests.
inline ClusterSpec with_nvls(ClusterSpec c) {
  c.intra.latency_us = 0.6;
  c.intra.nvls = true;
  c.intra.nvls_latency_us = 10;
  c.nic.bandwidth_GBps = 50;
  c.efficiency.intra_node = {0.81, 0.81, 0.81, 0.685};
  c.efficiency.network = {0.9, 0.94, 0.94, 0.627};
  return c;
}

}  // namespace muonbed::testing
