// NetFabric (sim/src/net_fabric.hpp), the flow fidelity's max-min sharing of the links between
// nodes: completion times of a hand-solved case, and the incremental solve for plain flows
// (kept link lists and sorted keys) against the full rebuild the fabric runs while a pooled flow
// is live, to the bit, over flows that start and end at many instants.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "sim/src/net_fabric.hpp"

using muonbed::sim::NetFabric;

namespace {

struct Arrival {
  double at;
  std::vector<int> links;
  double bytes;
};

// Runs the fabric's event loop until every arrival has finished: flows arrive at their times, the
// links are re-shared once per instant with changes, and every completion is recorded as
// (token, time) in the order reported.
std::vector<std::pair<std::uint64_t, double>> run(NetFabric& fabric,
                                                  const std::vector<Arrival>& arrivals) {
  std::vector<std::pair<std::uint64_t, double>> finished;
  std::vector<std::uint64_t> done;
  std::size_t next = 0;
  double now = 0;
  while (finished.size() < arrivals.size()) {
    while (next < arrivals.size() && arrivals[next].at <= now) {
      const Arrival& a = arrivals[next];
      fabric.add(now, a.links.data(), static_cast<int>(a.links.size()), a.bytes, 1, -1, next);
      ++next;
    }
    fabric.share();
    const double completion = fabric.next_completion();
    const double arrival = next < arrivals.size() ? arrivals[next].at : -1;
    REQUIRE((completion >= 0 || arrival >= 0));
    if (arrival >= 0 && (completion < 0 || arrival < completion)) {
      now = arrival;
      continue;
    }
    now = completion;
    done.clear();
    fabric.advance(now, done);
    for (std::uint64_t token : done) finished.emplace_back(token, now);
  }
  return finished;
}

}  // namespace

TEST_CASE("net fabric: max-min completions of a hand-solved case", "[sim][net_fabric]") {
  // Link A (10 MB/s) carries flows 0 and 1, link B (4 MB/s) flows 1 and 2. B saturates first: 1
  // and 2 get 2 MB/s each, 0 gets A's remaining 8 MB/s. Flow 1 (2 MB) ends at t = 1; then 0 has
  // 8 MB left at 10 MB/s (t = 1.8) and 2 has 4 MB left at 4 MB/s (t = 2). (Megabytes: a flow
  // within a byte of its end counts as done.)
  NetFabric fabric;
  const int a = fabric.add_link(10e6), b = fabric.add_link(4e6);
  const std::vector<Arrival> arrivals = {{0, {a}, 16e6}, {0, {a, b}, 2e6}, {0, {b}, 6e6}};
  const auto finished = run(fabric, arrivals);
  CHECK(fabric.empty());
  REQUIRE(finished.size() == 3);
  CHECK(finished[0].first == 1);
  CHECK(finished[0].second == Approx(1.0));
  CHECK(finished[1].first == 0);
  CHECK(finished[1].second == Approx(1.8));
  CHECK(finished[2].first == 2);
  CHECK(finished[2].second == Approx(2.0));
}

TEST_CASE("net fabric: the incremental solve matches the full one to the bit",
          "[sim][net_fabric]") {
  // Plain flows over a random two-level fabric (NIC links, leaf uplinks, equal capacities so
  // that ties are common), arriving in bursts; every fourth flow also crosses a long chain of
  // spine links, longer than the routes the fabric keeps beside each flow (kInlineLinks), so
  // that both places a route is read from are used. The second fabric also carries a pooled flow on
  // links of its own that never finishes, so every one of its solves is the full rebuild. The
  // pooled flow shares no link with the others, so max-min gives them the same rates either way.
  std::mt19937 rng(7);
  constexpr int kNics = 48, kUplinks = 6, kSpines = 16, kChain = 11;
  std::vector<Arrival> arrivals;
  double at = 0;
  for (int burst = 0; burst < 60; ++burst) {
    at += std::uniform_int_distribution<int>(0, 3)(rng) * 0.25;  // several flows per instant
    const int flows = std::uniform_int_distribution<int>(1, 12)(rng);
    for (int f = 0; f < flows; ++f) {
      const int src = std::uniform_int_distribution<int>(0, kNics - 1)(rng);
      int dst = std::uniform_int_distribution<int>(0, kNics - 2)(rng);
      if (dst >= src) ++dst;
      // links 0..kNics-1 send, kNics..2 kNics-1 receive, then the uplinks
      std::vector<int> links = {src};
      if (src % kUplinks != dst % kUplinks) {
        links.push_back(2 * kNics + src % kUplinks);
        links.push_back(2 * kNics + kUplinks + dst % kUplinks);
      }
      if (f % 4 == 0) {  // kChain distinct spines: a route of up to kChain + 3 links
        const int first = std::uniform_int_distribution<int>(0, kSpines - 1)(rng);
        for (int k = 0; k < kChain; ++k)
          links.push_back(2 * kNics + 2 * kUplinks + (first + k) % kSpines);
      }
      links.push_back(kNics + dst);
      const double bytes = std::uniform_int_distribution<int>(1, 8)(rng) * 1e6;
      arrivals.push_back({at, links, bytes});
    }
  }
  const auto build = [&](NetFabric& fabric) {
    // capacities that no share divides evenly, so that the order of operations shows in the bits
    for (int l = 0; l < 2 * kNics; ++l) fabric.add_link(l % 3 == 0 ? 1e8 / 7 : 1e8 / 3);
    for (int l = 0; l < 2 * kUplinks; ++l) fabric.add_link(2e8 / 3);
    for (int l = 0; l < kSpines; ++l) fabric.add_link(4e8 / 7);
  };
  NetFabric incremental, full;
  build(incremental);
  build(full);
  // The pooled flow: 4 members through a root link of its own, weight 4, its pool of 4 links.
  std::vector<int> pool_links;
  for (int m = 0; m < 4; ++m) pool_links.push_back(full.add_link(10e6));
  const int root = full.add_link(10e6);
  const int pool = full.add_pool(pool_links);
  full.add(0, &root, 1, 1e30, 4, pool, 1u << 30);

  const auto plain = run(incremental, arrivals);
  const auto shared = run(full, arrivals);
  REQUIRE(plain.size() == arrivals.size());
  REQUIRE(shared.size() == arrivals.size());
  CHECK(incremental.empty());
  CHECK_FALSE(full.empty());  // the pooled flow is still under way
  for (std::size_t i = 0; i < plain.size(); ++i) {
    INFO("completion " << i);
    CHECK(plain[i].first == shared[i].first);
    CHECK(plain[i].second == shared[i].second);  // exact: the same arithmetic in the same order
  }
}
