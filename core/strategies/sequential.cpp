// sequential: seed 000's naive baseline. One matrix at a time, on one stream: gather it to its
// owner (a staged gather: hierarchical, rails or flat), Newton-Schulz, redistribute, then a
// barrier before the next matrix. Nothing overlaps: the step is the sum of every matrix's gather,
// NS and scatter, the reference the seeds' speedups are measured against.
#include "core/plan/strategy.hpp"

namespace muonbed {
namespace {

class Sequential final : public Strategy {
 public:
  std::string name() const override { return "sequential"; }
  std::string summary() const override {
    return "seed 000's baseline: one matrix at a time (gather to its owner, NS, redistribute, "
           "barrier)";
  }
  int listing_order() const override { return 10; }
  std::vector<std::string_view> options() const override {
    return {"assign", "explicit_owners", "small_param_threshold", "gather", "split_ns", "order"};
  }
  Schedule schedule(const StrategyOptions& o) const override {
    Schedule s;
    s.gather = make_gather_policy(o.gather);
    s.redistribute = make_redistribute_policy(o.gather);
    s.barrier_per_unit = true;
    s.lanes = o.comm_lanes;
    staged_order(o.gather, s.order);
    return s;
  }
  std::string seed_configuration(const StrategyOptions&) const override { return "sequential"; }
};

const bool registered = [] {
  register_strategy([] { return std::unique_ptr<Strategy>(new Sequential()); });
  return true;
}();

}  // namespace
}  // namespace muonbed
