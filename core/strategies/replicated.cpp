// replicated: the redundancy baseline. Every rank that holds a matrix all-gathers its whole update
// and orthogonalizes it itself (PyTorch's full_tensor(), Motif's small-parameter path): no owner,
// no redistribution, every rank doing every matrix's NS. Its schedule is the building block
// every strategy's small matrices share (replicated_schedule, small_param_threshold).
#include "core/plan/strategy.hpp"

namespace muonbed {
namespace {

class Replicated final : public Strategy {
 public:
  std::string name() const override { return "replicated"; }
  std::string summary() const override {
    return "every holder all-gathers each update and orthogonalizes it itself (full_tensor): "
           "the redundancy baseline";
  }
  int listing_order() const override { return 20; }
  std::vector<std::string_view> options() const override {
    return {"prefetch_count", "comm_lanes"};
  }
  // Nobody owns a matrix: every holder runs its NS.
  Assignment assign(const ShardedModel& model, const StrategyOptions&, int) const override {
    Assignment a;
    a.owner.assign(model.params.size(), Assignment::kNoOwner);
    return a;
  }
  Schedule schedule(const StrategyOptions& o) const override { return replicated_schedule(o); }
};

const bool registered = [] {
  register_strategy([] { return std::unique_ptr<Strategy>(new Replicated()); });
  return true;
}();

}  // namespace
}  // namespace muonbed
