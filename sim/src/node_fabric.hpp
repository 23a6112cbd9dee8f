// Flow-fidelity model of one node's internal fabric: per-GPU NVLink (or PCIe) links into the
// node's switch, split by direction, plus the shared PCIe host bridge when the cluster has one.
// Flows between GPUs of the node share these links max-min fairly, exactly as SimGrid's CM02
// model shares the same links of the platform (platform.hpp builds the same routes), but without
// a SimGrid activity per flow.
//
// Why: these links are private to the node (traffic between nodes leaves through the NICs, never
// over NVLink), so intra-node flows of different nodes never interact, and in SimGrid 3.32 every
// activity started outside an actor costs a linear scan of all pending ones when it completes;
// tens of thousands of tensor-parallel flows per op made 1,024-GPU steps take minutes. The step
// fidelity keeps every transfer in SimGrid; tests check both fidelities agree.
#pragma once

#include <cstdint>
#include <vector>

namespace muonbed::sim {

class NodeFabric {
 public:
  // `gpus` local GPUs; per-direction link bandwidth; bridge_Bps > 0 adds a shared host bridge,
  // one budget that every flow between two GPUs of the node crosses, whatever its direction
  // (as the platform's SHARED bridge link).
  NodeFabric(int gpus, double link_Bps, double bridge_Bps);

  // A flow of `bytes` from local GPU src to dst starts sharing the links at `now` (the caller
  // has already waited out its latency). `token` is returned when it completes. The rates are
  // re-shared by share(), which the caller runs once for all the flows of an instant.
  void add(double now, int src, int dst, double bytes, std::uint64_t token);
  // Shares the links max-min fairly among the flows (progressive filling) and finds the next
  // completion.
  void share();
  // Absolute time of the next completion, or a negative value when no flow is active.
  double next_completion() const { return next_; }
  // Progresses every flow to `now`, appends the tokens of completed flows to `done` (in the
  // order the flows were added) and re-shares the links.
  void advance(double now, std::vector<std::uint64_t>& done);
  bool empty() const { return flows_.empty(); }

 private:
  struct Flow {
    int links[3];
    int nlinks;
    double remaining;
    double size;
    double rate;
    std::uint64_t token;
  };
  void progress(double now);

  int gpus_;
  double link_Bps_;
  double bridge_Bps_;
  double last_ = 0;
  double next_ = -1;
  std::vector<Flow> flows_;
  std::vector<double> capacity_;  // per link: up[g], down[g], the bridge (both directions)
  // scratch for share()
  std::vector<double> residual_;
  std::vector<int> users_;
  std::vector<char> frozen_;
  std::vector<std::vector<int>> link_flows_;  // per link, the flows crossing it in flow order
};

}  // namespace muonbed::sim
