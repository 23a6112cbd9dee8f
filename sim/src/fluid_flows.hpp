// The fluid-flow bookkeeping both max-min fabrics share (node_fabric.hpp inside a node,
// net_fabric.hpp between nodes): flows move at constant rates between events, and a flow counts
// as done within a relative tolerance, since its remaining bytes shrink by rate x dt in floating
// point and would otherwise miss zero by a few bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace muonbed::sim {

inline constexpr double kRelativeDone = 1e-9;

// Moves every flow on from `last` to `now` at its current rate.
template <typename Flow>
void progress_flows(std::vector<Flow>& flows, double& last, double now) {
  const double dt = now - last;
  if (dt > 0)
    for (Flow& f : flows) f.remaining -= f.rate * dt;
  last = std::max(last, now);
}

// A flow of `size` bytes is done once its bytes left are at most this.
inline double finished_below(double size) {
  return std::max(1.0, kRelativeDone * size);
}
// Whether a flow of `size` bytes with `remaining` bytes left is done.
inline bool flow_finished(double remaining, double size) {
  return remaining <= finished_below(size);
}

// Appends the tokens of finished flows to `done` in the order the flows were added and keeps the
// others in that order.
template <typename Flow>
void take_finished_flows(std::vector<Flow>& flows, std::vector<std::uint64_t>& done) {
  std::size_t keep = 0;
  for (std::size_t i = 0; i < flows.size(); ++i) {
    const Flow& f = flows[i];
    if (flow_finished(f.remaining, f.size))
      done.push_back(f.token);
    else
      flows[keep++] = f;
  }
  flows.resize(keep);
}

}  // namespace muonbed::sim
