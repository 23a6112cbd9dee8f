// Max-min fair sharing of a node's internal links by progressive filling (see node_fabric.hpp).
#include "sim/src/node_fabric.hpp"
#include "sim/src/fluid_flows.hpp"

#include <algorithm>
#include <limits>

namespace muonbed::sim {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// A flow whose remaining bytes fall below this share of its size (or one byte) is done:
// progress is computed in floating point, so exact zeros are not guaranteed.
}  // namespace

NodeFabric::NodeFabric(int gpus, double link_Bps, double bridge_Bps)
    : gpus_(gpus), link_Bps_(link_Bps), bridge_Bps_(bridge_Bps) {
  capacity_.assign(2 * gpus_ + 1, link_Bps_);
  capacity_[2 * gpus_] = bridge_Bps_;
}

void NodeFabric::add(double now, int src, int dst, double bytes, std::uint64_t token) {
  progress(now);
  Flow f{};
  f.links[0] = src;          // src's link toward the switch
  f.links[1] = gpus_ + dst;  // the switch's link toward dst
  f.nlinks = 2;
  if (bridge_Bps_ > 0) f.links[f.nlinks++] = 2 * gpus_;  // both directions: one budget
  f.remaining = bytes;
  f.size = bytes;
  f.rate = 0;
  f.token = token;
  flows_.push_back(f);
}

void NodeFabric::progress(double now) {
  progress_flows(flows_, last_, now);
}

void NodeFabric::advance(double now, std::vector<std::uint64_t>& done) {
  progress(now);
  take_finished_flows(flows_, done);
  share();
}

// Progressive filling: repeatedly find the link with the smallest fair share among its
// unfrozen flows, give that share to those flows and freeze them.
void NodeFabric::share() {
  const int nlinks = static_cast<int>(capacity_.size());
  residual_ = capacity_;
  users_.assign(nlinks, 0);
  frozen_.assign(flows_.size(), 0);
  link_flows_.resize(static_cast<std::size_t>(nlinks));
  for (auto& of : link_flows_) of.clear();
  for (std::size_t i = 0; i < flows_.size(); ++i)
    for (int k = 0; k < flows_[i].nlinks; ++k) {
      ++users_[flows_[i].links[k]];
      link_flows_[static_cast<std::size_t>(flows_[i].links[k])].push_back(static_cast<int>(i));
    }
  std::size_t left = flows_.size();
  while (left > 0) {
    int best = -1;
    double best_share = kInf;
    for (int l = 0; l < nlinks; ++l) {
      if (users_[l] == 0) continue;
      const double s = residual_[l] / users_[l];
      if (s < best_share) {
        best_share = s;
        best = l;
      }
    }
    if (best < 0) break;
    // The flows on it, in flow order (as a scan of every flow would meet them).
    for (int i : link_flows_[static_cast<std::size_t>(best)]) {
      Flow& f = flows_[static_cast<std::size_t>(i)];
      if (frozen_[static_cast<std::size_t>(i)]) continue;
      f.rate = best_share;
      frozen_[static_cast<std::size_t>(i)] = 1;
      --left;
      for (int k = 0; k < f.nlinks; ++k) {
        residual_[f.links[k]] -= best_share;
        --users_[f.links[k]];
      }
    }
  }
  next_ = -1;
  for (const Flow& f : flows_) {
    const double t = f.rate > 0 ? last_ + std::max(0.0, f.remaining) / f.rate : kInf;
    if (next_ < 0 || t < next_) next_ = t;
  }
}

}  // namespace muonbed::sim
