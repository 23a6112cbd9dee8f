// Cluster profiles: every shipped preset loads with its documented numbers, the GEMM efficiency
// curve interpolates linearly in log2(dim) (hand-checked values), names resolve to files, and
// strict parsing rejects bad profiles with the file:line:column and the fix.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <yaml-cpp/yaml.h>

#include "core/base/errors.hpp"
#include "core/config/cluster.hpp"
#include "core/config/cluster_fields.hpp"
#include "core/config/src/cluster_yaml.hpp"  // emit_cluster, for the round trip
#include "muonbed/config.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;
using Catch::Contains;

namespace {

std::string cluster_path(const std::string& name) {
  return std::string(MUONBED_SOURCE_DIR) + "/experiments/clusters/" + name + ".yaml";
}

ConfigError cluster_error(const std::string& yaml) {
  try {
    parse_cluster(YAML::Load(yaml), "c.yaml");
  } catch (const ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError for:\n" << yaml);
  throw std::logic_error("unreachable");
}

const char* kValid =
    "name: x\n"                                                           // 1
    "gpus_per_node: 8\n"                                                  // 2
    "gpu: {name: G, peak_tflops: 100, hbm_GBps: 1000, memory_GiB: 16}\n"  // 3
    "intra_node: {kind: nvswitch, bandwidth_GBps: 450, latency_us: 2}\n"  // 4
    "nic: {count_per_node: 8, bandwidth_GBps: 48, latency_us: 5}\n"       // 5
    "network: {topology: fat_tree}\n";                                    // 6

}  // namespace

TEST_CASE("shipped cluster presets load with their documented numbers", "[experiments][cluster]") {
  const ClusterSpec h100 = load_cluster_file(cluster_path("dgx-h100"));
  CHECK(h100.name == "dgx-h100");
  CHECK(h100.gpus_per_node == 8);
  CHECK(h100.nodes == 0);
  CHECK(h100.gpu.peak_tflops == 989);
  CHECK(h100.gpu.hbm_GBps == 3000);
  CHECK(h100.intra.kind == IntraNodeKind::nvswitch);
  CHECK(h100.intra.bandwidth_GBps == 450);
  CHECK(h100.nic.count_per_node == 8);
  CHECK(h100.nic.bandwidth_GBps == 50);  // the line rate; efficiency.network says what NCCL gets
  CHECK(h100.nic.rail_optimized);
  CHECK(h100.intra.nvls);
  CHECK(h100.efficiency.intra_node.ring == Approx(0.81));     // 365 of 450 GB/s
  CHECK(h100.efficiency.network.all_to_all == Approx(0.94));  // 47 of 50 GB/s
  CHECK(h100.launch_overhead.collective_us == 8);
  CHECK(h100.gpu.ns_kernel == "v2");
  CHECK(h100.gpu.ns_versions() == std::vector<std::string>{"pytorch", "v1", "v2"});
  // The measured v2 time of 4096x4096 (kernels/BENCHMARKS.md).
  CHECK(h100.gpu.ns_call_seconds(4096, 4096, 1, 5, "v2") == Approx(2.749e-3));
  CHECK(h100.measurements.size() >= 6);
  CHECK(h100.network.topology == TopologyKind::fat_tree);
  CHECK(h100.gpu.efficiency(8192) == Approx(0.80));
  // The large-GEMM end matches the 788-798 TFLOP/s measured (FACTS.md).
  CHECK(h100.gpu.sustained_flops(16384) / 1e12 == Approx(791.2));
  CHECK_FALSE(h100.source.empty());
  CHECK(h100.origin.file == cluster_path("dgx-h100"));

  const ClusterSpec h200 = load_cluster_file(cluster_path("dgx-h200"));
  CHECK(h200.gpu.hbm_GBps == 4300);
  CHECK(h200.gpu.memory_GiB > 139);
  CHECK(h200.gpu.ns_table.size() == h100.gpu.ns_table.size());  // assumed equal (see the file)
  CHECK(h200.efficiency.intra_node.nvls == h100.efficiency.intra_node.nvls);

  const ClusterSpec a100 = load_cluster_file(cluster_path("a100-pcie-4x"));
  CHECK(a100.gpus_per_node == 4);
  CHECK(a100.gpu.peak_tflops == 312);
  CHECK(a100.intra.kind == IntraNodeKind::pcie);
  CHECK(a100.nic.bandwidth_GBps < 25);

  const ClusterSpec cpu = load_cluster_file(cluster_path("local-cpu"));
  CHECK(cpu.nodes == 1);
  // Calibrated on the development VM by `muonbed calibrate` (its header says when and how).
  CHECK(cpu.calibration.backend == "mpi");
  CHECK(cpu.calibration.command.find("muonbed calibrate") == 0);
  CHECK(cpu.gpu.ns_kernel == "cpu-fp32");
  CHECK_FALSE(cpu.gpu.ns_table.empty());
  CHECK(cpu.gpu.peak_tflops > 1e-3);  // one CPU core's fp32 GEMM: 1 GFLOP/s .. 2 TFLOP/s
  CHECK(cpu.gpu.peak_tflops < 2);
  CHECK(cpu.intra.kind == IntraNodeKind::pcie);
  CHECK(cpu.intra.bandwidth_GBps > 0.01);
}

TEST_CASE("GEMM efficiency interpolates linearly in log2(dim)", "[experiments][cluster]") {
  GpuSpec gpu;
  CHECK(gpu.efficiency(123) == 1.0);  // no curve: peak
  gpu.gemm_efficiency = {{256, 0.15}, {1024, 0.45}, {2048, 0.65}, {4096, 0.78}, {8192, 0.80}};
  CHECK(gpu.efficiency(1) == Approx(0.15));  // clamped below
  CHECK(gpu.efficiency(256) == Approx(0.15));
  CHECK(gpu.efficiency(512) == Approx(0.30));  // log2 512 is halfway from 256 to 1024
  CHECK(gpu.efficiency(1024) == Approx(0.45));
  CHECK(gpu.efficiency(1024 * std::sqrt(2.0)) == Approx(0.55));  // halfway in log2
  CHECK(gpu.efficiency(3072) == Approx(0.65 + (std::log2(3072.0) - 11) * 0.13));
  CHECK(gpu.efficiency(4096) == Approx(0.78));
  CHECK(gpu.efficiency(1e6) == Approx(0.80));  // clamped above
  gpu.peak_tflops = 1000;
  CHECK(gpu.sustained_flops(512) == Approx(0.30 * 1e15));
}

TEST_CASE("cluster names resolve to files", "[experiments][cluster]") {
  const std::string found = find_cluster_file("dgx-h100", "");
  CHECK(std::filesystem::equivalent(found, cluster_path("dgx-h100")));
  // A path resolves relative to the referring file's folder.
  const std::string data = MUONBED_TEST_DATA_DIR;
  CHECK(std::filesystem::equivalent(find_cluster_file("small-cluster.yaml", data + "/exp.yaml"),
                                    data + "/small-cluster.yaml"));
  try {
    find_cluster_file("dgx-h10", "");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK_THAT(std::string(e.what()), Contains("cluster 'dgx-h10' not found"));
    CHECK_THAT(std::string(e.what()), Contains("did you mean 'dgx-h100'?"));
    CHECK_THAT(e.fix(), Contains("local-cpu"));
  }
}

TEST_CASE("a minimal cluster parses with defaults", "[experiments][cluster]") {
  const ClusterSpec c = parse_cluster(YAML::Load(kValid), "c.yaml");
  CHECK(c.nodes == 1);  // the struct's default: a fixed single node
  CHECK(c.gpu.gemm_efficiency.empty());
  CHECK(c.network.levels == 2);
  CHECK(c.network.oversubscription == 1);
  CHECK(c.origin.file == "c.yaml");
  CHECK(c.origin.line == 1);
}

namespace {

// kValid with the key at `path` ("efficiency.network.ring") set to `value`.
std::string valid_with(const std::string& path, const std::string& value) {
  YAML::Node root = YAML::Load(kValid);
  YAML::Node node = root;
  std::size_t start = 0;
  for (std::size_t dot; (dot = path.find('.', start)) != std::string::npos; start = dot + 1) {
    const std::string part = path.substr(start, dot - start);
    if (!node[part].IsDefined()) node[part] = YAML::Node(YAML::NodeType::Map);
    node.reset(node[part]);
  }
  node[path.substr(start)] = YAML::Load(value);
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

std::string emitted(const std::string& yaml) {
  YAML::Emitter out;
  emit_cluster(out, parse_cluster(YAML::Load(yaml), "c.yaml"));
  return out.c_str();
}

}  // namespace

TEST_CASE("the key reference's cluster defaults and ranges are the parser's",
          "[experiments][cluster][keys]") {
  const std::string plain = emitted(kValid);
  int defaults = 0, ranges = 0;
  for (const ClusterKeyDoc& d : cluster_key_reference()) {
    INFO(d.path << " default '" << d.default_value << "' range '" << d.range << "'");
    // Writing a key at its documented default changes nothing a profile says.
    if (!d.default_value.empty()) {
      CHECK_FALSE(d.required);
      CHECK(emitted(valid_with(d.path, d.default_value)) == plain);
      ++defaults;
    }
    if (d.range.empty()) continue;
    // "lo .. hi[ unit]": both ends parse, just past either end is refused at the key.
    const std::size_t dots = d.range.find(" .. ");
    REQUIRE(dots != std::string::npos);
    const double lo = std::stod(d.range.substr(0, dots));
    const double hi = std::stod(d.range.substr(dots + 4));
    CHECK_NOTHROW(parse_cluster(YAML::Load(valid_with(d.path, d.range.substr(0, dots))), "c"));
    CHECK_NOTHROW(parse_cluster(YAML::Load(valid_with(d.path, yaml_util::format_number(hi))), "c"));
    const double below = d.type == "integer" || lo == 0 ? lo - 1 : lo / 2;
    // Below a range that starts at 0 or 1 the parser says "must not be negative" or "must be
    // positive"; elsewhere "is out of range". Each names the key and the value.
    for (const double outside : {below, hi * 2}) {
      const std::string error =
          cluster_error(valid_with(d.path, yaml_util::format_number(outside))).what();
      CHECK_THAT(error, Contains("'" + d.path + "' = " + yaml_util::format_number(outside) + " "));
      CHECK_THAT(error, Contains("out of range") || Contains("must not be negative") ||
                            Contains("must be positive"));
    }
    ++ranges;
  }
  CHECK(defaults >= 20);  // every optional scalar: nodes, network.levels, the efficiencies, ...
  CHECK(ranges >= 25);
}

TEST_CASE("cluster numbers by path: the loader's range and unit, unknown paths refused",
          "[experiments][cluster][keys]") {
  const ClusterNumber& hbm = cluster_number("gpu.hbm_GBps");
  CHECK(hbm.unit == "GB/s");
  CHECK(hbm.range_text() == "0.1 .. 1000000 GB/s");
  CHECK(hbm.allows(0.1));
  CHECK(hbm.allows(1e6));
  CHECK_FALSE(hbm.allows(0.09));
  CHECK_FALSE(hbm.allows(std::nan("")));
  CHECK_FALSE(hbm.allows(INFINITY));
  ClusterSpec c;
  hbm.ref(c) = 123;
  CHECK(c.gpu.hbm_GBps == 123);
  cluster_number("efficiency.intra_node.p2p").ref(c) = 0.5;
  CHECK(c.efficiency.intra_node.p2p == 0.5);
  CHECK(c.efficiency.network.p2p == 1);
  CHECK_THROWS_AS(cluster_number("gpu.hbm_gbps"), std::logic_error);
  CHECK_THROWS_AS(cluster_number("gpu.name"), std::logic_error);  // text, not a number
}

TEST_CASE("cluster parsing is strict", "[experiments][cluster][errors]") {
  SECTION("missing section") {
    const ConfigError e = cluster_error("name: x\ngpus_per_node: 8\n");
    CHECK(e.where().line == 1);
    CHECK_THAT(std::string(e.what()), Contains("missing the required key 'gpu'"));
  }
  SECTION("missing key inside a section") {
    const ConfigError e = cluster_error(
        std::string(kValid).replace(std::string(kValid).find(", latency_us: 5"), 15, ""));
    CHECK(e.where().line == 5);
    CHECK_THAT(std::string(e.what()), Contains("'nic' is missing the required key 'latency_us'"));
  }
  SECTION("unknown key with suggestion") {
    const ConfigError e = cluster_error(std::string(kValid) + "nodez: 4\n");
    CHECK(e.where().line == 7);
    CHECK(e.where().column == 1);
    CHECK_THAT(std::string(e.what()), Contains("did you mean 'nodes'?"));
  }
  SECTION("unknown topology") {
    const ConfigError e = cluster_error(
        std::string(kValid).replace(std::string(kValid).find("fat_tree"), 8, "torus"));
    CHECK(e.where().line == 6);
    CHECK(e.where().column == 21);
    CHECK_THAT(std::string(e.what()), Contains("single_switch, fat_tree"));
  }
  SECTION("zero bandwidth") {
    const ConfigError e =
        cluster_error(std::string(kValid).replace(std::string(kValid).find("450"), 3, "0"));
    CHECK(e.where().line == 4);
    CHECK_THAT(std::string(e.what()), Contains("'intra_node.bandwidth_GBps' = 0 must be positive"));
  }
  SECTION("efficiency above 1") {
    const ConfigError e =
        cluster_error(std::string(kValid).replace(std::string(kValid).find("memory_GiB: 16}"), 15,
                                                  "memory_GiB: 16, gemm_efficiency: {1024: 1.5}}"));
    CHECK(e.where().line == 3);
    CHECK_THAT(std::string(e.what()), Contains("gpu.gemm_efficiency.1024' = 1.5 is out of range"));
  }
  SECTION("rail optimization needs one NIC per GPU") {
    const ConfigError e = cluster_error(
        std::string(kValid)
            .replace(std::string(kValid).find("latency_us: 5}"), 14,
                     "latency_us: 5, rail_optimized: true}")
            .replace(std::string(kValid).find("count_per_node: 8"), 17, "count_per_node: 2"));
    CHECK(e.where().line == 5);
    CHECK_THAT(std::string(e.what()), Contains("rail_optimized needs one NIC per GPU"));
  }
  SECTION("levels out of range") {
    const ConfigError e = cluster_error(std::string(kValid).replace(
        std::string(kValid).find("{topology: fat_tree}"), 20, "{topology: fat_tree, levels: 5}"));
    CHECK(e.where().line == 6);
    CHECK_THAT(std::string(e.what()), Contains("in 2..3"));
  }
}

TEST_CASE("a cluster file with a YAML syntax error", "[experiments][cluster][errors]") {
  const testing::TempDir scratch("cluster");  // unique: build trees never share it
  const std::string path = scratch / "broken-cluster.yaml";
  {
    std::ofstream out(path);
    out << "name: x\ngpu: {name: G\n";
  }
  try {
    load_cluster_file(path);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.where().file == path);
    CHECK(e.where().line >= 2);
    CHECK_THAT(std::string(e.what()), Contains("YAML syntax error"));
  }
}

TEST_CASE("calibration fields parse strictly and round-trip",
          "[experiments][cluster][calibration]") {
  const std::string full = std::string(kValid) +
                           "efficiency:\n"                                     // 7
                           "  intra_node: {ring: 0.81, nvls: 0.685}\n"         // 8
                           "  network: {all_to_all: 0.94}\n"                   // 9
                           "launch_overhead_us: {collective: 8, kernel: 5}\n"  // 10
                           "measurements:\n"                                   // 11
                           "  - {op: all_gather, gpus: 8, size_bytes: 1024, busbw_GBps: 350, "
                           "source: s}\n"  // 12
                           "  - {op: all_reduce, gpus: 8, size_bytes: 1024, time_us: 20, "
                           "algorithm: ring, source: t}\n"  // 13
                           "calibration: {tool: muonbed calibrate, date: 2026-11-24, "
                           "backend: nccl}\n";  // 14
  std::string with_table = full;
  with_table.replace(
      with_table.find("memory_GiB: 16}"), 15,
      "memory_GiB: 16, ns_kernel: v1, ns_table: [{version: v1, shape: [64, 128], "
      "ms: 0.1}, {version: v2, shape: [4, 64, 128], steps: 6, ms: 0.3, source: x}]}");
  with_table.replace(with_table.find("latency_us: 2}"), 14,
                     "latency_us: 2, nvls: true, nvls_latency_us: 10}");
  const ClusterSpec c = parse_cluster(YAML::Load(with_table), "c.yaml");
  CHECK(c.efficiency.intra_node.ring == 0.81);
  CHECK(c.efficiency.intra_node.all_to_all == 1.0);  // unset classes stay at the line rate
  CHECK(c.efficiency.intra_node.nvls == 0.685);
  CHECK(c.efficiency.network.all_to_all == 0.94);
  CHECK(c.launch_overhead.collective_us == 8);
  CHECK(c.launch_overhead.kernel_us == 5);
  REQUIRE(c.measurements.size() == 2);
  CHECK(c.measurements[1].time_us == 20);
  CHECK(c.measurements[1].algorithm == "ring");
  CHECK(c.calibration.backend == "nccl");
  CHECK(c.intra.nvls);
  CHECK(c.intra.nvls_latency_us == 10);
  REQUIRE(c.gpu.ns_table.size() == 2);
  CHECK(c.gpu.ns_table[1].batch == 4);
  CHECK(c.gpu.ns_table[1].rows == 64);
  CHECK(c.gpu.ns_table[1].steps == 6);
  CHECK(c.gpu.ns_kernel == "v1");
  // Without ns_kernel the model takes v2 when the table has it.
  std::string no_kernel = with_table;
  no_kernel.erase(no_kernel.find("ns_kernel: v1, "), 15);
  CHECK(parse_cluster(YAML::Load(no_kernel), "c.yaml").gpu.ns_kernel == "v2");

  // What the emitter writes reads back to the same profile (provenance of every record).
  YAML::Emitter out;
  emit_cluster(out, c);
  const ClusterSpec back = parse_cluster(YAML::Load(out.c_str()), "back.yaml");
  CHECK(back.efficiency.intra_node.nvls == c.efficiency.intra_node.nvls);
  CHECK(back.efficiency.network.all_to_all == c.efficiency.network.all_to_all);
  CHECK(back.launch_overhead.kernel_us == 5);
  CHECK(back.measurements.size() == 2);
  CHECK(back.calibration.tool == "muonbed calibrate");
  CHECK(back.gpu.ns_table.size() == 2);
  CHECK(back.gpu.ns_table[1].batch == 4);
  CHECK(back.gpu.ns_kernel == "v1");
  CHECK(back.intra.nvls);

  SECTION("an efficiency above 1, or of an unknown class") {
    std::string bad = full;
    bad.replace(bad.find("ring: 0.81"), 10, "ring: 1.2");
    ConfigError e = cluster_error(bad);
    CHECK(e.where().line == 8);
    CHECK_THAT(std::string(e.what()),
               Contains("efficiency.intra_node.ring' = 1.2 is out of range"));
    bad = full;
    bad.replace(bad.find("all_to_all: 0.94"), 10, "alltoall");
    e = cluster_error(bad);
    CHECK(e.where().line == 9);
    CHECK_THAT(std::string(e.what()), Contains("did you mean 'all_to_all'?"));
  }
  SECTION("an NS table entry without a valid shape") {
    std::string bad = std::string(kValid).replace(
        std::string(kValid).find("memory_GiB: 16}"), 15,
        "memory_GiB: 16, ns_table: [{version: v2, shape: [64], ms: 1}]}");
    const ConfigError e = cluster_error(bad);
    CHECK(e.where().line == 3);
    CHECK_THAT(std::string(e.what()), Contains("[rows, cols] or [batch, rows, cols]"));
  }
  SECTION("an NS kernel the table does not have") {
    std::string bad = with_table;
    bad.replace(bad.find("ns_kernel: v1"), 13, "ns_kernel: v3");
    const ConfigError e = cluster_error(bad);
    CHECK(e.where().line == 3);
    CHECK_THAT(std::string(e.what()), Contains("gpu.ns_kernel 'v3' has no entries"));
    CHECK_THAT(e.fix(), Contains("v1, v2"));
  }
  SECTION("NVLS on PCIe") {
    std::string bad = std::string(kValid).replace(std::string(kValid).find("{kind: nvswitch"), 15,
                                                  "{kind: pcie, nvls: true");
    const ConfigError e = cluster_error(bad);
    CHECK(e.where().line == 4);
    CHECK_THAT(std::string(e.what()), Contains("needs NVSwitch"));
  }
  SECTION("a measurement with neither busbw nor time") {
    std::string bad = full;
    bad.replace(bad.find("busbw_GBps: 350, "), 17, "");
    const ConfigError e = cluster_error(bad);
    CHECK(e.where().line == 12);
    CHECK_THAT(std::string(e.what()), Contains("neither busbw_GBps nor time_us"));
  }
}

TEST_CASE("the elementwise table parses strictly, round-trips and interpolates in elements",
          "[experiments][cluster][calibration]") {
  std::string text = std::string(kValid);
  text.replace(text.find("memory_GiB: 16}"), 15,
               "memory_GiB: 16, elementwise_table: [{kernel: adamw, numel: 1000, ms: 2}, "
               "{kernel: adamw, numel: 3000, ms: 4}, {kernel: momentum, numel: 500, ms: 1, "
               "source: bench}]}");
  const ClusterSpec c = parse_cluster(YAML::Load(text), "c.yaml");
  REQUIRE(c.gpu.elementwise_table.size() == 3);
  // Hand-computed: linear between (1000, 2 ms) and (3000, 4 ms); outside, the nearest entry's
  // seconds per element; no entry: negative.
  CHECK(c.gpu.elementwise_seconds("adamw", 2000) == Approx(3e-3));
  CHECK(c.gpu.elementwise_seconds("adamw", 500) == Approx(1e-3));
  CHECK(c.gpu.elementwise_seconds("adamw", 6000) == Approx(8e-3));
  CHECK(c.gpu.elementwise_seconds("momentum", 250) == Approx(0.5e-3));
  CHECK(c.gpu.elementwise_seconds("apply_update", 250) < 0);
  YAML::Emitter out;
  emit_cluster(out, c);
  const ClusterSpec back = parse_cluster(YAML::Load(out.c_str()), "back.yaml");
  REQUIRE(back.gpu.elementwise_table.size() == 3);
  CHECK(back.gpu.elementwise_table[2].source == "bench");
  CHECK(back.gpu.elementwise_seconds("adamw", 2000) == Approx(3e-3));

  SECTION("an unknown kernel, a zero size or a negative time is refused at its line") {
    for (const auto& [from, to, says] :
         {std::tuple{"kernel: momentum", "kernel: momentun", "did you mean 'momentum'?"},
          {"numel: 500", "numel: 0", "numel"},
          {"ms: 4}", "ms: -4}", "ms"}}) {
      std::string bad = text;
      bad.replace(bad.find(from), std::string(from).size(), to);
      const ConfigError e = cluster_error(bad);
      CHECK(e.where().line == 3);
      CHECK_THAT(std::string(e.what()), Contains(says));
    }
  }
}

TEST_CASE("the host cost of messages parses, round-trips and is refused out of range",
          "[experiments][cluster][calibration][host_comm]") {
  std::string text = std::string(kValid);
  text.replace(text.find("memory_GiB: 16}"), 15,
               "memory_GiB: 16, host_comm_us_per_message: 4.5, host_comm_ns_per_byte: 0.25}");
  const ClusterSpec c = parse_cluster(YAML::Load(text), "c.yaml");
  CHECK(c.gpu.host_comm_us_per_message == 4.5);
  CHECK(c.gpu.host_comm_ns_per_byte == 0.25);
  YAML::Emitter out;
  emit_cluster(out, c);
  const ClusterSpec back = parse_cluster(YAML::Load(out.c_str()), "back.yaml");
  CHECK(back.gpu.host_comm_us_per_message == 4.5);
  CHECK(back.gpu.host_comm_ns_per_byte == 0.25);
  // Absent: GPUs, nothing charged, and nothing written.
  const ClusterSpec gpu = parse_cluster(YAML::Load(std::string(kValid)), "g.yaml");
  CHECK(gpu.gpu.host_comm_ns_per_byte == 0);
  YAML::Emitter plain;
  emit_cluster(plain, gpu);
  CHECK(std::string(plain.c_str()).find("host_comm") == std::string::npos);
  for (const auto& [from, to] :
       {std::pair{"host_comm_ns_per_byte: 0.25", "host_comm_ns_per_byte: -1"},
        {"host_comm_us_per_message: 4.5", "host_comm_us_per_message: lots"},
        {"host_comm_ns_per_byte: 0.25", "host_comm_ns_per_bite: 0.25"}}) {
    std::string bad = text;
    bad.replace(bad.find(from), std::string(from).size(), to);
    const ConfigError e = cluster_error(bad);
    CHECK(e.where().line == 3);
    CHECK_THAT(std::string(e.what()), Contains("host_comm"));
  }
}
