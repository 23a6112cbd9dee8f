// Runs bare collectives back to back on a simulated platform (see harness.hpp).
#include "sim/src/harness.hpp"

#include <chrono>
#include <sstream>

#include <xbt/log.h>
#include <simgrid/s4u/Engine.hpp>

#include "core/base/errors.hpp"
#include "sim/src/isolate.hpp"
#include "sim/src/network.hpp"

namespace sg4 = simgrid::s4u;

namespace muonbed::sim {

namespace {

class Harness final : public CompletionSink, public CollectiveHost {
 public:
  Harness(const Topology& topology, const std::vector<sg4::Host*>& hosts,
          const std::vector<CollectiveSpec>& specs, const LoweringOptions& options,
          bool latency_in_links)
      : topology_(topology),
        specs_(specs),
        options_(options),
        network_(topology, hosts, options.step_fidelity, latency_in_links, *this,
                 /*net_fabric=*/true) {
    options_.pooled_rooted = network_.can_pool();
  }

  void start_next() {
    while (next_ < specs_.size()) {
      finished_ = false;
      start_ = network_.now();
      algorithm_ = make_algorithm(specs_[next_], *this, options_);
      algorithm_->start();
      if (!finished_) return;
      record();
    }
  }

  void completed(std::uint32_t, std::uint64_t tag) override {
    algorithm_->done(tag);
    if (finished_) {
      record();
      start_next();
    }
  }
  void transfer(int src, int dst, double bytes, std::uint64_t tag) override {
    network_.transfer(src, dst, bytes, 0, tag);
  }
  bool pooled_transfer(int root, const std::vector<int>& group, const std::vector<int>& remote,
                       bool to_root, double bytes, std::uint64_t tag) override {
    return network_.pooled_transfer(root, group, remote, to_root, bytes, 0, tag);
  }
  void account(int src, int dst, double bytes) override { network_.account(src, dst, bytes); }
  void delay(double seconds, std::uint64_t tag) override { network_.delay(seconds, 0, tag); }
  int new_alarm() override { return network_.new_alarm(); }
  void set_alarm(int alarm, double date, std::uint64_t tag) override {
    network_.set_alarm(alarm, date, 0, tag);
  }
  void free_alarm(int alarm) override { network_.free_alarm(alarm); }
  const Topology& topology() const override { return topology_; }
  double now() const override { return network_.now(); }
  void finished() override { finished_ = true; }

  std::vector<double> times;
  Network& network() { return network_; }

 private:
  void record() {
    times.push_back(network_.now() - start_);
    ++next_;
  }

  const Topology& topology_;
  const std::vector<CollectiveSpec>& specs_;
  LoweringOptions options_;
  Network network_;
  std::unique_ptr<CollectiveAlgorithm> algorithm_;
  std::size_t next_ = 0;
  double start_ = 0;
  bool finished_ = false;
};

// SimGrid's engine for this (child) process, quiet below warnings.
void start_engine() {
  int argc = 1;
  char name[] = "muonbed-sim-harness";
  char* argv[] = {name, nullptr};
  auto* engine = new sg4::Engine(&argc, argv);  // never destroyed: the child exits next
  (void)engine;
  xbt_log_control_set("root.thresh:warning");
}

}  // namespace

HarnessResult time_collectives(const ClusterSpec& cluster, int world_size, int gpus_per_node,
                               const std::vector<CollectiveSpec>& specs,
                               const LoweringOptions& options, const NetworkConfig& network) {
  const IsolatedRun run = run_isolated([&]() {
    const auto t0 = std::chrono::steady_clock::now();
    start_engine();
    const Topology topology(cluster, world_size, gpus_per_node);
    const auto hosts = build_platform(topology, network);
    auto* harness = new Harness(topology, hosts, specs, options,
                                network.latency_weighted_sharing);  // alive until exit
    harness->start_next();
    sg4::Engine::get_instance()->run();
    if (harness->times.size() != specs.size())
      throw Error("harness: only " + std::to_string(harness->times.size()) + " of " +
                  std::to_string(specs.size()) + " collectives finished");
    std::ostringstream out;
    out.precision(17);
    out << harness->network().simgrid_transfers() << ' ' << harness->network().node_flows() << ' '
        << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (double t : harness->times) out << ' ' << t;
    return out.str();
  });
  HarnessResult result;
  std::istringstream in(run.parts.at(0));
  in >> result.simgrid_transfers >> result.node_flows >> result.wall_s;
  double t;
  while (in >> t) result.times.push_back(t);
  return result;
}

std::string check_net_routes(const ClusterSpec& cluster, int world_size, int gpus_per_node) {
  const IsolatedRun run = run_isolated([&]() {
    start_engine();
    const Topology topology(cluster, world_size, gpus_per_node);
    const auto hosts = build_platform(topology, NetworkConfig{});
    static const std::vector<CollectiveSpec> none;
    LoweringOptions flow;
    flow.step_fidelity = false;
    auto* harness = new Harness(topology, hosts, none, flow, false);  // alive until exit
    return "result:" + harness->network().check_net_routes();
  });
  return run.parts.at(0).substr(std::string("result:").size());
}

std::string alarm_completions(const ClusterSpec& cluster) {
  const IsolatedRun run = run_isolated([&]() {
    start_engine();
    const Topology topology(cluster, 2, std::min(2, cluster.gpus_per_node));
    const auto hosts = build_platform(topology, NetworkConfig{});
    struct Recorder final : CompletionSink {
      std::ostringstream out;
      Network* network = nullptr;
      void completed(std::uint32_t owner, std::uint64_t tag) override {
        out << owner << ':' << tag << '@' << network->now() << ' ';
      }
    };
    auto* recorder = new Recorder;  // alive until exit
    auto* network = new Network(topology, hosts, false, false, *recorder, true);
    recorder->network = network;
    const int moved = network->new_alarm(), freed = network->new_alarm(),
              reused = network->new_alarm(), earlier = network->new_alarm();
    network->set_alarm(moved, 1, 1, 10);
    network->set_alarm(moved, 2, 1, 11);
    network->set_alarm(freed, 3, 2, 20);
    network->free_alarm(freed);  // its slot stays free: nothing re-arms it
    network->set_alarm(reused, 4, 3, 30);
    network->free_alarm(reused);
    const int again = network->new_alarm();  // the last freed slot: reused's
    if (again != reused) throw Error("internal: alarm slots are not reused last-freed first");
    network->set_alarm(again, 5, 3, 31);
    network->set_alarm(earlier, 6, 4, 40);
    network->set_alarm(earlier, 0.5, 4, 41);
    sg4::Engine::get_instance()->run();
    return recorder->out.str();
  });
  return run.parts.at(0);
}

}  // namespace muonbed::sim
