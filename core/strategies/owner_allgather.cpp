// owner_allgather: Keller Jordan's Muon and Megatron's layer-wise optimizer on replicated
// updates (DDP, ZeRO-1). Gradients are all-reduced so every rank holds them whole; each owner
// keeps its matrices' momentum whole, orthogonalizes its share of a chunk, and one all-gather per
// chunk gives every rank the results. Nothing is gathered before NS.
#include "core/plan/strategy.hpp"

namespace muonbed {
namespace {

class OwnerAllGather final : public Strategy {
 public:
  std::string name() const override { return "owner_allgather"; }
  std::string summary() const override {
    return "Keller Jordan/Megatron (ZeRO-1): owners hold whole momentum, orthogonalize their "
           "share, one all-gather of the results per chunk";
  }
  int listing_order() const override { return 50; }
  std::vector<std::string_view> options() const override {
    return {"assign", "explicit_owners", "small_param_threshold", "prefetch_count", "comm_lanes",
            "order",  "chunk_size",      "chunk_by_shape",        "chunk_sizing"};
  }
  Schedule schedule(const StrategyOptions& o) const override {
    Schedule s;
    s.gather = make_gather_policy("none");
    s.redistribute = make_redistribute_policy("all_gather_owned");
    s.ns = NsPlacement::owners_of_chunk;
    s.chunked = true;
    s.depth = o.prefetch_count;
    s.lanes = o.comm_lanes;
    s.owner_holds_full_state = true;
    return s;
  }
};

const bool registered = [] {
  register_strategy([] { return std::unique_ptr<Strategy>(new OwnerAllGather()); });
  return true;
}();

}  // namespace
}  // namespace muonbed
