// owner: seeds 000/003/004. Each matrix is gathered to its owner (staged: TP then FSDP, or rails,
// or flat), orthogonalized once there and redistributed, in rounds: round j holds the j-th matrix
// of every owner, so owners work side by side (async_gpu_parallelism; without it one owner at a
// time), with prefetch_count gathers ahead of NS and comm_lanes communication streams. The large
// matrices may be split over a group of ranks (split_ns).
//
// This file is also the template for a strategy of your own: one class with a name, the options
// it reads and a Schedule of building blocks (core/plan/schedule.hpp), registered below. See
// core/policies/flat_gather_owner.cpp and README, "Writing a strategy".
#include "core/plan/strategy.hpp"

namespace muonbed {
namespace {

class Owner final : public Strategy {
 public:
  std::string name() const override { return "owner"; }
  std::string summary() const override {
    return "seeds 000/003/004: gather each matrix to its owner, NS once, redistribute, owners in "
           "parallel rounds with prefetch";
  }
  int listing_order() const override { return 30; }
  std::vector<std::string_view> options() const override {
    return {"assign",
            "explicit_owners",
            "small_param_threshold",
            "async_gpu_parallelism",
            "prefetch_count",
            "gather",
            "split_ns",
            "comm_lanes",
            "order"};
  }
  Schedule schedule(const StrategyOptions& o) const override {
    Schedule s;
    s.gather = make_gather_policy(o.gather);
    s.redistribute = make_redistribute_policy(o.gather);
    s.barrier_per_lane = !o.async_gpu_parallelism;
    s.depth = o.prefetch_count;
    s.lanes = o.comm_lanes;
    staged_order(o.gather, s.order);
    return s;
  }
  // Seed 000's "parallel" (no prefetch) and "prefetch" (2 or more) configurations.
  std::string seed_configuration(const StrategyOptions& o) const override {
    if (o.prefetch_count == 0) return "parallel";
    if (o.prefetch_count >= 2) return "prefetch";
    return "";
  }
};

const bool registered = [] {
  register_strategy([] { return std::unique_ptr<Strategy>(new Owner()); });
  return true;
}();

}  // namespace
}  // namespace muonbed
