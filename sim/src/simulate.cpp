// The facade of sim/simulate.hpp: checks, fidelity, engine set-up in an isolated process, and
// the results record from the replay's measurements.
#include "sim/simulate.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <limits>
#include <sstream>

#include <xbt/log.h>
#include <simgrid/s4u/Engine.hpp>

#include <simgrid/version.h>  // after xbt's headers: it uses their macros

#include <nlohmann/json.hpp>

#include "core/base/errors.hpp"
#include "core/experiment/experiment.hpp"
#include "core/results/run_point.hpp"
#include "sim/src/beside.hpp"
#include "sim/src/fidelity.hpp"
#include "sim/src/isolate.hpp"
#include "sim/src/platform.hpp"
#include "sim/src/replay.hpp"

namespace sg4 = simgrid::s4u;

namespace muonbed {

namespace {

int physical_gpus_per_node(const ClusterSpec& cluster, const DeviceMesh& mesh) {
  return cluster.gpus_per_node > 0 ? cluster.gpus_per_node : std::max(1, mesh.gpus_per_node());
}

std::string stats_to_text(const SimulationStats& s) {
  nlohmann::ordered_json j{{"fidelity", s.fidelity},
                           {"wall_s", s.wall_s},
                           {"peak_rss_bytes", s.peak_rss_bytes},
                           {"simgrid_transfers", s.simgrid_transfers},
                           {"node_flows", s.node_flows},
                           {"timers", s.timers},
                           {"computes", s.computes}};
  return j.dump();
}
SimulationStats stats_from_text(const std::string& text) {
  const auto j = nlohmann::json::parse(text);
  SimulationStats s;
  s.fidelity = j.at("fidelity").get<std::string>();
  s.wall_s = j.at("wall_s").get<double>();
  s.peak_rss_bytes = j.at("peak_rss_bytes").get<double>();
  s.simgrid_transfers = j.at("simgrid_transfers").get<std::int64_t>();
  s.node_flows = j.at("node_flows").get<std::int64_t>();
  s.timers = j.at("timers").get<std::int64_t>();
  s.computes = j.at("computes").get<std::int64_t>();
  return s;
}

// One simulation in this process. SimGrid's engine is never destroyed: 3.32 cannot be
// re-initialized anyway, and the isolated child exits right after.
SimulationResult simulate_here(const StepPlan& plan, const ClusterSpec& cluster,
                               const SimOptions& options, const std::string& fidelity,
                               const std::string& auto_note) {
  static bool used = false;
  if (used)
    throw Error(
        "sim: SimGrid's engine can run one simulation per process; fix: keep "
        "SimOptions::isolate = true (the default) to run each simulation in a child process");
  used = true;
  const auto t0 = std::chrono::steady_clock::now();

  int argc = 1;
  char name[] = "muonbed-sim";
  char* argv[] = {name, nullptr};
  auto* engine = new sg4::Engine(&argc, argv);
  (void)engine;
  xbt_log_control_set("root.thresh:warning");

  const DeviceMesh& mesh = plan.mesh();
  const sim::Topology topology(cluster, mesh.world_size(), physical_gpus_per_node(cluster, mesh));
  sim::NetworkConfig network;
  network.model = options.network_model;
  network.latency_weighted_sharing = options.latency_weighted_sharing;
  network.tcp_gamma = options.tcp_gamma;
  network.crosstraffic = options.crosstraffic;
  network.extra = options.simgrid_config;
  const auto hosts = sim::build_platform(topology, network);

  sim::ReplayOptions replay;
  replay.step_fidelity = fidelity == "step";
  replay.latency_in_links = options.latency_weighted_sharing;
  replay.net_fabric = options.flow_net_fabric;
  replay.trace_max_ranks = options.trace_max_ranks;
  replay.progress_label = options.progress_label;
  replay.progress_in_place = isatty(STDERR_FILENO) != 0;
  replay.lowering.step_fidelity = replay.step_fidelity;
  replay.lowering.broadcast_chunk_bytes = options.broadcast_chunk_bytes;
  replay.lowering.broadcast_max_chunks = options.broadcast_max_chunks;
  replay.lowering.a2a_rounds = options.flow_all_to_all_rounds;
  replay.lowering.rooted_bundles = options.flow_rooted_bundles;
  replay.lowering.pooled_members = options.flow_pooled_members;

  SimulationResult result;
  result.stats.fidelity = fidelity;
  // The record's figures that need no simulation, made beside it where a core is idle.
  std::future<PlanFigures> figures =
      sim::beside([&plan, &cluster]() { return plan_figures(plan, cluster); }, true);
  sim::ReplayOutput out = sim::replay_plan(plan, cluster, topology, hosts, replay, result.stats);

  ResultRecord& record = result.record;
  record.backend = "sim";
  record.fidelity = fidelity;
  record.traffic.model = "algorithm";
  record.provenance = make_provenance(nullptr, simgrid_version());
  const PlanFigures plan_figures_made = figures.get();
  fill_record(record, plan, cluster, out.steps, out.collectives, &plan_figures_made);
  // How a gather's or scatter's senders to their root move at flow fidelity.
  const bool per_member = options.flow_rooted_bundles == std::numeric_limits<int>::max();
  const bool pooling = options.flow_net_fabric && !options.latency_weighted_sharing &&
                       options.flow_pooled_members != std::numeric_limits<int>::max();
  const std::string rooted = (per_member ? std::string("one flow per sender to a root")
                                         : "one flow per bundle of senders to a root (at most " +
                                               std::to_string(options.flow_rooted_bundles) + ")") +
                             (pooling ? ", a gather or scatter with more than " +
                                            std::to_string(options.flow_pooled_members) +
                                            " members off the root's node as one pooled flow"
                                      : std::string());
  const std::string all_to_all =
      options.flow_all_to_all_transfers == std::numeric_limits<long>::max()
          ? std::string("every all-to-all round kept")
          : "all-to-all in at most " + std::to_string(options.flow_all_to_all_rounds) + "-" +
                std::to_string(options.flow_all_to_all_transfers) + " / members merged rounds";
  std::ostringstream note;
  note << "sim: SimGrid " << simgrid_version() << ", network model " << options.network_model
       << " (crosstraffic " << (options.crosstraffic ? 1 : 0) << ", TCP-gamma " << options.tcp_gamma
       << (options.latency_weighted_sharing
               ? ", latency-weighted sharing"
               : ", latency paid before the flow, links shared equally")
       << "), fidelity " << fidelity << ": "
       << (fidelity == "step"
               ? "every ring step, all-to-all round and broadcast chunk is a transfer"
               : "one flow per ring edge and channel, " + rooted + ", " + all_to_all +
                     ", skipped latencies added analytically, broadcast in "
                     "chunks; intra-node links shared by a per-node max-min model" +
                     (options.flow_net_fabric && !options.latency_weighted_sharing
                          ? std::string(", links between nodes by a max-min model over the "
                                        "platform's routes")
                          : std::string()));
  record.notes.push_back(note.str());
  if (!auto_note.empty()) record.notes.push_back(auto_note);
  if (fidelity == "flow") {
    int largest_merged = 0, rounds = 0;
    for (const CollectiveResult& c : record.collectives) {
      if (c.kind != "all_to_all") continue;
      const int kept = sim::all_to_all_rounds(c.group_size, replay.lowering);
      if (kept < c.group_size - 1 && c.group_size > largest_merged) {
        largest_merged = c.group_size;
        rounds = kept;
      }
    }
    if (largest_merged > 0)
      record.notes.push_back(
          "warning: flow fidelity merged the pairwise rounds of all-to-all groups of up to " +
          std::to_string(largest_merged) + " members into " + std::to_string(rounds) +
          "; merged rounds change how neighbouring rounds overlap as members drift apart "
          "(experiments/BENCHMARKS.md); fix: use sim.fidelity: step for this plan");
  }
  result.trace = out.trace.get();

  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  result.stats.peak_rss_bytes = static_cast<double>(usage.ru_maxrss) * 1024.0;
  result.stats.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace

std::string simgrid_version() {
  return std::to_string(SIMGRID_VERSION_MAJOR) + "." + std::to_string(SIMGRID_VERSION_MINOR) + "." +
         std::to_string(SIMGRID_VERSION_PATCH);
}

namespace {

sim::FidelityChoice resolve_choice(const SimOptions& options, const StepPlan& plan,
                                   const ClusterSpec& cluster) {
  const int world_size = plan.mesh().world_size();
  if (options.fidelity == "step" && world_size > kMaxStepFidelityRanks)
    throw Error("sim: step fidelity models every transfer, and " + std::to_string(world_size) +
                " ranks would take hours (the limit is " + std::to_string(kMaxStepFidelityRanks) +
                "); fix: use flow or auto");
  if (options.fidelity != "step" && options.fidelity != "flow" && options.fidelity != "auto")
    throw Error("sim: unknown fidelity '" + options.fidelity +
                "'; fix: use step, flow or auto (sim.fidelity in the experiment)");
  return sim::pick_fidelity(plan, cluster, options);
}

}  // namespace

std::string resolve_fidelity(const SimOptions& options, const StepPlan& plan,
                             const ClusterSpec& cluster, std::string* why) {
  const sim::FidelityChoice choice = resolve_choice(options, plan, cluster);
  if (why) *why = choice.reason;
  return choice.fidelity;
}

void check_simulable(const StepPlan& plan, const ClusterSpec& cluster) {
  if (plan.ops.empty()) throw PlanError("sim: the plan has no ops; nothing to simulate");
  const DeviceMesh& mesh = plan.mesh();
  // The topology's constructor checks node count and bandwidths, with the fix in the message.
  const sim::Topology topology(cluster, mesh.world_size(), physical_gpus_per_node(cluster, mesh));
  (void)topology;
  bool computes = false;
  for (const Op& op : plan.ops) computes = computes || is_compute(op.kind);
  if (computes && !(cluster.gpu.peak_tflops > 0))
    throw PlanError("sim: cluster '" + cluster.name +
                    "' gives the GPU no compute rate; fix: set gpu.peak_tflops");
}

namespace {

// One simulation ready to run: its fidelity chosen and checked before any process starts.
struct PreparedSimulation {
  const StepPlan* plan = nullptr;
  SimOptions options;
  std::string fidelity;
  std::string auto_note;
};

PreparedSimulation prepare(const StepPlan& plan, const ClusterSpec& cluster,
                           const SimOptions& requested) {
  check_simulable(plan, cluster);
  const sim::FidelityChoice choice = resolve_choice(requested, plan, cluster);
  PreparedSimulation prepared;
  prepared.plan = &plan;
  prepared.fidelity = choice.fidelity;
  prepared.options = sim::options_for(choice, requested);
  // auto says what it picked and why, in the record and (muonbed run) under the run line.
  if (prepared.options.fidelity == "auto")
    prepared.auto_note = std::string(kAutoFidelityNote) + choice.fidelity + ": " + choice.reason;
  return prepared;
}

SimulationResult run_here(const PreparedSimulation& p, const ClusterSpec& cluster) {
  return simulate_here(*p.plan, cluster, p.options, p.fidelity, p.auto_note);
}

// What the child sends back, part by part (the trace as it is: no copy of its ~100 MB).
std::vector<std::string> encode(SimulationResult&& r) {
  std::vector<std::string> parts;
  parts.push_back(result_to_json(r.record));
  parts.push_back(std::move(r.trace));
  parts.push_back(stats_to_text(r.stats));
  return parts;
}

SimulationResult decode(sim::IsolatedRun&& run) {
  if (run.parts.size() != 3)
    throw Error("internal: the simulation process sent " + std::to_string(run.parts.size()) +
                " parts instead of 3 (record, trace, stats)");
  SimulationResult result;
  result.record = result_from_json(run.parts[0]);
  result.trace = std::move(run.parts[1]);
  result.stats = stats_from_text(run.parts[2]);
  result.stats.peak_rss_bytes = std::max(result.stats.peak_rss_bytes, run.peak_rss_bytes);
  return result;
}

}  // namespace

SimulationResult simulate(const StepPlan& plan, const ClusterSpec& cluster,
                          const SimOptions& requested) {
  return std::move(simulate_each({&plan}, cluster, {requested}).front());
}

std::vector<SimulationResult> simulate_each(const std::vector<const StepPlan*>& plans,
                                            const ClusterSpec& cluster,
                                            const std::vector<SimOptions>& options) {
  if (plans.size() != options.size())
    throw Error("simulate_each: " + std::to_string(plans.size()) + " plans but " +
                std::to_string(options.size()) + " option sets");
  // Every plan is checked before any simulation starts: a bad twin fails the point at once.
  std::vector<PreparedSimulation> prepared;
  for (std::size_t i = 0; i < plans.size(); ++i)
    prepared.push_back(prepare(*plans[i], cluster, options[i]));
  std::vector<SimulationResult> results;
  bool isolate = true;
  for (const SimOptions& o : options) isolate = isolate && o.isolate;
  if (!isolate) {
    for (const PreparedSimulation& p : prepared) results.push_back(run_here(p, cluster));
    return results;
  }
  std::vector<sim::IsolatedBody> bodies;
  for (const PreparedSimulation& p : prepared)
    bodies.push_back([&cluster, &p]() { return encode(run_here(p, cluster)); });
  for (sim::IsolatedRun& run : sim::run_isolated_each(bodies, sim::usable_cores()))
    results.push_back(decode(std::move(run)));
  return results;
}

}  // namespace muonbed
