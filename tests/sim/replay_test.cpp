// Plan replay on simulated clusters: compute timing, agreement with the analytic model where
// nothing contends, step vs flow on whole plans, the owner strategy's speedup on a compute-bound
// case, level-scheduled steps, determinism, traces, and the platform's latencies.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/engine/cost_model.hpp"
#include "core/experiment/experiment.hpp"
#include "muonbed/config.hpp"
#include "sim/simulate.hpp"
#include "sim/src/harness.hpp"

using namespace muonbed;

namespace {

std::string experiments_file(const std::string& name) {
  return std::string(MUONBED_SOURCE_DIR) + "/experiments/" + name;
}

Experiment point(const std::string& yaml) {
  auto points = parse_experiment(yaml, experiments_file("sim_test.yaml"));
  REQUIRE(points.size() == 1);
  return points[0];
}

// A quiet cluster: one switch, so the analytic model's hop count is the simulator's.
ClusterSpec quiet(ClusterSpec c) {
  c.network.topology = TopologyKind::single_switch;
  return c;
}

SimOptions with_fidelity(const std::string& fidelity) {
  SimOptions o;
  o.fidelity = fidelity;
  o.trace_max_ranks = 0;
  return o;
}

}  // namespace

TEST_CASE("a compute op takes its FLOPs at the GPU's sustained rate", "[sim][replay]") {
  Experiment e = point(R"(
name: one_ns
cluster: dgx-h100
mesh: {dims: {dp_shard: 1}}
model: {params: [{name: w, shape: [1024, 4096]}]}
strategy: {name: owner}
)");
  e.cluster.gpu.hbm_GBps = 0;  // compute-bound only: time = FLOPs / rate
  const StepPlan plan = plan_experiment(e);
  double expected = 0;
  for (const Op& op : plan.ops)
    if (is_compute(op.kind)) expected += compute_time(plan, op, 0, e.cluster);
  const double ns_flops = newton_schulz_flops(1024, 4096, 5);
  const double ns_rate = e.cluster.gpu.sustained_flops(1024);
  REQUIRE(expected >= ns_flops / ns_rate);
  for (const char* fidelity : {"step", "flow"}) {
    const SimulationResult r = simulate(plan, e.cluster, with_fidelity(fidelity));
    INFO(fidelity);
    CHECK(r.record.step.average_s == Approx(expected).epsilon(1e-6));
    CHECK(r.record.ranks[0].average.compute_s == Approx(expected).epsilon(1e-6));
  }
}

TEST_CASE("the analytic model and the simulator agree when nothing contends",
          "[sim][replay][analytic]") {
  // Sequential: one matrix at a time, so no two collectives share a link; one switch, so
  // latencies agree.
  for (const char* mesh : {"{dims: {dp_shard: 8}}",
                           "{dims: [{name: dp_shard, size: 2}, "
                           "{name: tp, size: 8}]}"}) {
    Experiment e = point(std::string(R"(
name: quiet
cluster: dgx-h100
mesh: )") + mesh + R"(
model: {dense: {hidden: 1024, layers: 2, heads: 8, kv_heads: 8, ffn: 4096, vocab: 4096}}
strategy: {name: sequential}
)");
    e.cluster = quiet(e.cluster);
    const StepPlan plan = plan_experiment(e);
    const ResultRecord analytic = analytic_record(plan, e.cluster);
    const SimulationResult sim = simulate(plan, e.cluster, with_fidelity("step"));
    INFO(mesh << ": analytic " << analytic.step.average_s << " s, sim " << sim.record.step.average_s
              << " s");
    CHECK(sim.record.step.average_s == Approx(analytic.step.average_s).epsilon(0.01));
    CHECK(sim.record.throughput.compute_time_s.average ==
          Approx(analytic.throughput.compute_time_s.average).epsilon(1e-6));
  }
}

TEST_CASE("split Newton-Schulz: the analytic model and the simulator agree when nothing contends",
          "[sim][replay][analytic][split_ns]") {
  // One matrix at a time; each split NS is the members' compute plus an all-reduce of the norms
  // and one of the Grams per NS step over the TP group (the simulator runs them on its all_reduce
  // algorithm, the analytic model adds its all-reduce times).
  Experiment e = point(R"(
name: quiet_split
cluster: dgx-h100
mesh: {dims: [{name: dp_shard, size: 2}, {name: tp, size: 8}]}
model: {dense: {hidden: 1024, layers: 2, heads: 8, kv_heads: 8, ffn: 4096, vocab: 4096}}
strategy: {name: sequential, split_ns: {threshold: 0}}
)");
  e.cluster = quiet(e.cluster);
  const StepPlan plan = plan_experiment(e);
  int split = 0;
  for (const Op& op : plan.ops) split += op.kind == OpKind::split_newton_schulz ? 1 : 0;
  REQUIRE(split > 0);
  const ResultRecord analytic = analytic_record(plan, e.cluster);
  const SimulationResult sim = simulate(plan, e.cluster, with_fidelity("step"));
  INFO(split << " split NS ops: analytic " << analytic.step.average_s << " s, sim "
             << sim.record.step.average_s << " s");
  CHECK(sim.record.step.average_s == Approx(analytic.step.average_s).epsilon(0.01));
  CHECK(sim.record.throughput.compute_time_s.average ==
        Approx(analytic.throughput.compute_time_s.average).epsilon(0.01));
}

TEST_CASE("step and flow fidelity agree on whole plans", "[sim][replay][fidelity]") {
  Experiment e = point(R"(
name: fsdp_tp_small
cluster: dgx-h100
mesh: {dims: [{name: dp_shard, size: 4}, {name: tp, size: 8}]}
model: {dense: {hidden: 2048, layers: 4, heads: 16, kv_heads: 8, ffn: 8192, vocab: 8192}}
strategy: {name: owner, prefetch_count: 1}
)");
  const StepPlan plan = plan_experiment(e);
  const SimulationResult step = simulate(plan, e.cluster, with_fidelity("step"));
  const SimulationResult flow = simulate(plan, e.cluster, with_fidelity("flow"));
  INFO("step " << step.record.step.average_s << " s, flow " << flow.record.step.average_s);
  CHECK(flow.record.step.average_s == Approx(step.record.step.average_s).epsilon(0.03));
  CHECK(flow.record.traffic.network_bytes.average ==
        Approx(step.record.traffic.network_bytes.average).epsilon(1e-9));
}

namespace {

// muonbed's preset (topology owners, rails gathers, communication lanes, LPT order) on `nodes`
// DGX nodes: many rooted gathers and scatters over every node in flight at once.
StepPlan lanes_plan(int nodes, int lanes, Experiment& e) {
  e = point(R"(
name: lanes
cluster: dgx-h100
mesh: {dims: [{name: dp_shard, size: )" +
            std::to_string(nodes) + R"(}, {name: tp, size: 8}]}
model: {dense: {hidden: 8192, layers: 2, heads: 64, kv_heads: 8, ffn: 28672, vocab: 8192}}
strategy: {preset: muonbed, comm_lanes: )" +
            std::to_string(lanes) + R"(}
)");
  return plan_experiment(e);
}

// Flow fidelity with one flow per remote member of a gather or scatter (no bundles, no pools).
SimOptions fine_flow_options(bool net_fabric) {
  SimOptions o = with_fidelity("flow");
  o.flow_net_fabric = net_fabric;
  o.flow_rooted_bundles = 1 << 20;
  o.flow_pooled_members = 1 << 20;
  return o;
}

}  // namespace

TEST_CASE("the inter-node fabric shares links as SimGrid does", "[sim][replay][fidelity]") {
  // No bundles (one flow per remote member) and equal weights: the NetFabric's max-min rates
  // over the platform's routes must reproduce SimGrid's CM02 sharing of the same links, up to
  // SimGrid's solver precision (maxmin/precision 1e-5).
  Experiment e;
  const StepPlan plan = lanes_plan(4, 16, e);
  const SimulationResult simgrid = simulate(plan, e.cluster, fine_flow_options(false));
  const SimulationResult fabric = simulate(plan, e.cluster, fine_flow_options(true));
  INFO("SimGrid " << simgrid.record.step.average_s << " s, fabric " << fabric.record.step.average_s
                  << " s");
  CHECK(simgrid.stats.simgrid_transfers > 0);
  CHECK(fabric.stats.simgrid_transfers == 0);
  CHECK(fabric.record.step.average_s == Approx(simgrid.record.step.average_s).epsilon(1e-4));
  for (std::size_t r = 0; r < fabric.record.ranks.size(); ++r)
    CHECK(fabric.record.ranks[r].average.communication_s ==
          Approx(simgrid.record.ranks[r].average.communication_s).epsilon(1e-3));
  CHECK(fabric.record.traffic.network_bytes.average ==
        simgrid.record.traffic.network_bytes.average);
}

TEST_CASE("pooled rooted collectives keep the fine model's step", "[sim][replay][fidelity]") {
  // The coarse model (a gather or scatter with more than flow_pooled_members remote members as
  // one pooled flow, sim/src/net_fabric.hpp) against the fine one (one SimGrid flow per remote
  // member), on schedules that keep many gathers and scatters over every node in flight, with
  // NS or the network setting the step: within 1 % (0.2 % measured).
  for (const auto& [nodes, lanes, nic_GBps] :
       {std::tuple{16, 32, 50.0}, std::tuple{32, 128, 50.0}, std::tuple{16, 32, 5.0},
        std::tuple{32, 128, 5.0}, std::tuple{32, 8, 5.0}}) {
    Experiment e;
    const StepPlan plan = lanes_plan(nodes, lanes, e);
    e.cluster.nic.bandwidth_GBps = nic_GBps;  // 5: the network, not NS, sets the step
    const SimulationResult fine = simulate(plan, e.cluster, fine_flow_options(false));
    const SimulationResult coarse = simulate(plan, e.cluster, with_fidelity("flow"));
    INFO(nodes << " nodes, " << lanes << " lanes, NIC " << nic_GBps << " GB/s: fine "
               << fine.record.step.average_s << " s, coarse " << coarse.record.step.average_s
               << " s; comm " << fine.record.throughput.comm_time_s.average << " / "
               << coarse.record.throughput.comm_time_s.average << " s; flows "
               << fine.stats.simgrid_transfers << " / " << coarse.stats.node_flows);
    CHECK(coarse.stats.node_flows < fine.stats.simgrid_transfers);
    CHECK(coarse.record.step.average_s == Approx(fine.record.step.average_s).epsilon(0.01));
    CHECK(coarse.record.traffic.network_bytes.average ==
          Approx(fine.record.traffic.network_bytes.average).epsilon(1e-12));
  }
}

TEST_CASE(
    "owner with async parallelism beats sequential by about the rank count when compute "
    "dominates",
    "[sim][replay][strategy]") {
  // 16 equal matrices on 8 GPUs with a fast fabric: the owner strategy runs 8 NS at a time.
  std::string params;
  for (int i = 0; i < 16; ++i)
    params +=
        std::string(i ? ", " : "") + "{name: w" + std::to_string(i) + ", shape: [2048, 2048]}";
  const std::string base = R"(
name: compute_bound
cluster: dgx-h100
mesh: {dims: {dp_shard: 8}}
model: {params: [)" + params +
                           R"(]}
)";
  double times[2] = {0, 0};
  int i = 0;
  for (const char* strategy :
       {"{name: sequential}", "{name: owner, async_gpu_parallelism: true}"}) {
    Experiment e = point(base + "strategy: " + strategy + "\n");
    e.cluster.intra.bandwidth_GBps = 1e5;  // communication negligible next to NS
    e.cluster.intra.latency_us = 0.1;
    e.cluster.launch_overhead = {};  // per-call overheads too (8 + 5 us a call on dgx-h100)
    times[i++] =
        simulate(plan_experiment(e), e.cluster, with_fidelity("step")).record.step.average_s;
  }
  const double speedup = times[0] / times[1];
  INFO("sequential " << times[0] << " s, owner " << times[1] << " s, speedup " << speedup);
  CHECK(speedup > 7.0);
  CHECK(speedup < 8.05);
}

TEST_CASE("level-scheduled gradient sync: average and worst step differ", "[sim][replay]") {
  Experiment e = point(R"(
name: levels
cluster: dgx-h100
mesh: {dims: [{name: dp_replicate, size: 2}, {name: dp_shard, size: 4}]}
model: {dense: {hidden: 1024, layers: 4, heads: 8, kv_heads: 8, ffn: 4096, vocab: 4096}}
strategy: {name: owner, grad_sync: {enabled: true, level_periods: [1, 4]}}
)");
  e.cluster.gpus_per_node = 4;
  const StepPlan plan = plan_experiment(e);
  REQUIRE(plan.hyper_period() == 4);
  const SimulationResult r = simulate(plan, e.cluster, with_fidelity("step"));
  REQUIRE(r.record.step.patterns.size() == 2);
  CHECK(r.record.step.patterns[0].count + r.record.step.patterns[1].count == 4);
  CHECK(r.record.step.worst_s > r.record.step.average_s);
  CHECK(r.record.step.worst_step == 0);  // every level syncs in step 0
  CHECK(r.record.throughput.params_per_s_per_gpu.worst <
        r.record.throughput.params_per_s_per_gpu.average);
}

TEST_CASE("simulations are deterministic and many run in one process", "[sim][replay]") {
  Experiment e = point(R"(
name: determinism
cluster: dgx-h100
mesh: {dims: [{name: dp_shard, size: 2}, {name: tp, size: 8}]}
model: {dense: {hidden: 1024, layers: 2, heads: 8, kv_heads: 8, ffn: 4096, vocab: 4096}}
strategy: {name: all_to_all}
)");
  const StepPlan plan = plan_experiment(e);
  SimOptions o = with_fidelity("step");
  o.trace_max_ranks = 16;
  const SimulationResult a = simulate(plan, e.cluster, o);
  const SimulationResult b = simulate(plan, e.cluster, o);
  CHECK(result_to_json(a.record) == result_to_json(b.record));
  CHECK(a.trace == b.trace);
  // The trace covers the capped ranks only, with Chrome's complete events.
  int complete = 0;
  const nlohmann::json trace = nlohmann::json::parse(a.trace);
  for (const auto& ev : trace.at("traceEvents")) {
    if (ev.at("ph") != "X") continue;
    ++complete;
    CHECK(ev.at("tid").get<int>() < 16 * static_cast<int>(plan.streams.size()));
  }
  CHECK(complete > 0);
}

TEST_CASE("path latencies of the platform are what the lowering assumes", "[sim][platform]") {
  // A 1 kB send costs latency + 1 kB / bandwidth; compare with Topology::path for pairs under
  // one leaf, across leaves of a 2-level tree and across pods of a 3-level tree. With latencies
  // in SimGrid's links this checks the platform's routes; by default they are timers.
  for (int levels : {2, 3}) {
    ClusterSpec c;
    c.name = "tree";
    c.gpus_per_node = 2;
    c.nodes = 0;
    c.gpu.peak_tflops = 100;
    c.intra = {IntraNodeKind::nvswitch, 400, 1.5, 0};
    c.nic = {2, 25, 3, true};
    c.network.topology = TopologyKind::fat_tree;
    c.network.levels = levels;
    c.network.nodes_per_leaf = 2;
    c.network.switch_latency_us = 0.7;
    const int world = 16;  // 8 nodes: 4 leaves; in 3 levels, 2 pods of 2 leaves
    const sim::Topology topo(c, world, 2);
    std::vector<sim::CollectiveSpec> specs;
    const std::vector<std::pair<int, int>> pairs = {{0, 1}, {0, 2}, {0, 4}, {0, 9}, {3, 14}};
    for (const auto& [a, b] : pairs) {
      sim::CollectiveSpec s;
      s.kind = OpKind::send;
      s.members = {a, b};
      s.root = 0;
      s.peer = 1;
      s.pieces = {1000, 0};
      specs.push_back(s);
    }
    sim::LoweringOptions o;
    // Latencies in SimGrid's links (the platform's routes are measured) and as timers.
    for (bool in_links : {true, false}) {
      sim::NetworkConfig network;
      network.latency_weighted_sharing = in_links;
      const auto times = sim::time_collectives(c, world, 2, specs, o, network).times;
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        const sim::PathInfo p = topo.path(pairs[i].first, pairs[i].second);
        INFO("levels " << levels << ", ranks " << pairs[i].first << " -> " << pairs[i].second
                       << (in_links ? ", latency in links" : ", latency as timers"));
        CHECK(times[i] == Approx(p.latency_s + 1000 / p.bandwidth_Bps).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("inter-node routes composed from node parts are SimGrid's routes", "[sim][platform]") {
  // Flow fidelity asks SimGrid for a GPU's links to its node's gateway and for the fabric's route
  // between two nodes once each, and composes the routes of all rank pairs from them. Every pair
  // on different nodes must get exactly SimGrid's own route, link for link and in order: on the
  // shipped DGX H100 at 66 nodes (leaves of 32 nodes, the third part-full; its pods are too big
  // to cross here, so small trees of 2 and 3 levels follow), under a single switch, and with
  // NICs shared by two GPUs.
  const ClusterSpec h100 =
      load_cluster_file(std::string(MUONBED_SOURCE_DIR) + "/experiments/clusters/dgx-h100.yaml");
  CHECK(sim::check_net_routes(h100, 8 * 66, 8) == "");
  for (const TopologyKind kind : {TopologyKind::fat_tree, TopologyKind::single_switch})
    for (int levels : {2, 3})
      for (int nics : {4, 2}) {
        ClusterSpec c;
        c.name = "routes";
        c.gpus_per_node = 4;
        c.nodes = 0;
        c.gpu.peak_tflops = 100;
        c.intra = {IntraNodeKind::nvswitch, 400, 1.5, 0};
        c.nic = {nics, 25, 3, nics == 4};
        c.network.topology = kind;
        c.network.levels = levels;
        c.network.nodes_per_leaf = 2;
        c.network.switch_latency_us = 0.7;
        INFO((kind == TopologyKind::fat_tree ? "fat tree, " : "single switch, ")
             << levels << " levels, " << nics << " NICs per node");
        CHECK(sim::check_net_routes(c, 4 * 11, 4) == "");  // 11 nodes: the last leaf is part-full
      }
}

TEST_CASE("a moved or freed alarm never completes at its old date", "[sim][platform]") {
  // All-to-all members wake themselves with alarms (collectives.cpp, Rounds::run_kind) and move
  // them as rounds complete; a finished collective frees them, and the replay gives its owner
  // index to the next collective. An old alarm event arriving there crashed the simulator (dion
  // at 1,024 GPUs) or would hand a wake-up to another collective. Expected by hand: the moved
  // alarm at its new date only, nothing from the freed ones, the reused slot at its own date.
  const ClusterSpec h100 =
      load_cluster_file(std::string(MUONBED_SOURCE_DIR) + "/experiments/clusters/dgx-h100.yaml");
  CHECK(sim::alarm_completions(h100) == "4:41@0.5 1:11@2 3:31@5 ");
}

TEST_CASE("the simulator says what is wrong before simulating", "[sim][replay]") {
  Experiment e = point(R"(
name: too_small
cluster: {preset: dgx-h100, nodes: 2}
mesh: {dims: {dp_shard: 16}}
model: {preset: tiny-dense}
strategy: {name: owner}
)");
  const StepPlan plan = plan_experiment(e);
  e.cluster.nodes = 1;
  CHECK_THROWS_WITH(simulate(plan, e.cluster), Catch::Contains("cluster.nodes"));
  SimOptions bad;
  bad.fidelity = "fine";
  e.cluster.nodes = 2;
  CHECK_THROWS_WITH(simulate(plan, e.cluster, bad), Catch::Contains("step, flow or auto"));
}

TEST_CASE("CPU ranks' message handling: the analytic model and the simulator charge it alike",
          "[sim][replay][analytic][host_comm]") {
  // Owner on local-cpu-like ranks: gathers and scatters flow while owners compute, so the host
  // work of each message lengthens compute (cost_model.hpp HostCommCharge); both backends take
  // the rule from the one class, and both steps grow over the same plan without it.
  Experiment e = point(R"(
name: host_comm
cluster: dgx-h100
mesh: {dims: {dp_shard: 2}}
model: {dense: {hidden: 1024, layers: 2, heads: 8, kv_heads: 8, ffn: 4096, vocab: 4096}}
strategy: {name: owner, prefetch_count: 1}
)");
  e.cluster = quiet(e.cluster);
  const StepPlan plan = plan_experiment(e);
  const ResultRecord plain = analytic_record(plan, e.cluster);
  ClusterSpec cpu = e.cluster;
  cpu.gpu.host_comm_us_per_message = 50;
  cpu.gpu.host_comm_ns_per_byte = 2;
  const ResultRecord analytic = analytic_record(plan, cpu);
  const SimulationResult sim = simulate(plan, cpu, with_fidelity("step"));
  INFO("analytic " << plain.step.average_s << " -> " << analytic.step.average_s << " s, sim "
                   << sim.record.step.average_s << " s");
  CHECK(analytic.step.average_s > plain.step.average_s * 1.01);
  CHECK(analytic.throughput.compute_time_s.average >
        plain.throughput.compute_time_s.average * 1.01);
  CHECK(sim.record.step.average_s == Approx(analytic.step.average_s).epsilon(0.01));
  CHECK(sim.record.throughput.compute_time_s.average ==
        Approx(analytic.throughput.compute_time_s.average).epsilon(0.01));
}
