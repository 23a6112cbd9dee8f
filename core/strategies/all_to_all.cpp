// all_to_all: Motif, Dion, torchtitan, Megatron. Matrices travel in chunks: one all-to-all brings
// each owner its matrices' shards (packed into one buffer), every owner orthogonalizes its
// matrices of the chunk, one all-to-all sends the results back; at most max_chunks_in_flight
// chunks are in flight. Chunks hold chunk_size matrices, or are cut by NS cost (chunk_sizing:
// ns_cost), optionally of one shape each (chunk_by_shape).
#include "core/plan/strategy.hpp"

namespace muonbed {
namespace {

class AllToAll final : public Strategy {
 public:
  std::string name() const override { return "all_to_all"; }
  std::string summary() const override {
    return "Motif/Dion/Megatron: chunks of matrices, one all-to-all to their owners, NS, one "
           "all-to-all back, chunks pipelined";
  }
  int listing_order() const override { return 40; }
  std::vector<std::string_view> options() const override {
    return {"assign",         "explicit_owners", "small_param_threshold",
            "comm_lanes",     "order",           "chunk_size",
            "chunk_by_shape", "chunk_sizing",    "max_chunks_in_flight"};
  }
  Schedule schedule(const StrategyOptions& o) const override {
    Schedule s;
    s.gather = make_gather_policy("all_to_all");
    s.redistribute = make_redistribute_policy("all_to_all");
    s.ns = NsPlacement::owners_of_chunk;
    s.chunked = true;
    s.depth = o.max_chunks_in_flight - 1;
    s.lanes = o.comm_lanes;
    return s;
  }
};

const bool registered = [] {
  register_strategy([] { return std::unique_ptr<Strategy>(new AllToAll()); });
  return true;
}();

}  // namespace
}  // namespace muonbed
