// Example of a user-defined strategy, and the walk-through of README "Writing a strategy": this
// one file is compiled into every muonbed program and registers itself at start-up, so
// `strategy: {name: flat_gather_owner}` works in any experiment, on every backend (analytic, sim,
// loopback, mpi), and the invariant and equivalence tests pick it up, with no other file changed.
//
// flat_gather_owner: owners as in `owner`, but the two directions take different shapes. The
// gather is flat: every holder sends its piece straight to the owner in one collective over all
// sharding dims (one launch, every piece through the owner's links at once). The redistribution is
// hierarchical: the owner scatters to its node's peers over the network first, then each node
// splits its share over NVLink (each node's share crosses the network once). A researcher asking
// whether gathers and scatters want different shapes writes exactly this.
#include "core/plan/strategy.hpp"

namespace muonbed {
namespace {

class FlatGatherOwner final : public Strategy {
 public:
  // The name experiments use (strategy: {name: flat_gather_owner}).
  std::string name() const override { return "flat_gather_owner"; }
  std::string summary() const override {
    return "example (core/policies/flat_gather_owner.cpp): owner with a flat gather and a "
           "hierarchical redistribution";
  }
  // The keys of `strategy:` it reads: an experiment that sets another one (say gather: rails)
  // is refused at that key, and summaries show only these. Owners come from `assign` (the
  // default Strategy::assign), small matrices take the replicated path, and the schedule below
  // reads prefetch_count, comm_lanes and order.
  std::vector<std::string_view> options() const override {
    return {"assign",         "explicit_owners", "small_param_threshold",
            "prefetch_count", "comm_lanes",      "order"};
  }
  // The three functions as building blocks (core/plan/schedule.hpp): the owner assigned above,
  // a flat gather to it, NS on the owner, a hierarchical redistribution, `prefetch_count` gathers
  // ahead on `comm_lanes` streams.
  Schedule schedule(const StrategyOptions& o) const override {
    Schedule s;
    s.gather = make_gather_policy("flat");
    s.redistribute = make_redistribute_policy("hierarchical");
    s.ns = NsPlacement::owner;
    s.depth = o.prefetch_count;
    s.lanes = o.comm_lanes;
    return s;
  }
};

// Registration runs before main().
const bool registered = [] {
  register_strategy([] { return std::unique_ptr<Strategy>(new FlatGatherOwner()); });
  return true;
}();

}  // namespace
}  // namespace muonbed
