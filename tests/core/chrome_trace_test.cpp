// The Chrome trace writer (core/engine/timeline.hpp chrome_trace) writes JSON text directly; it is
// checked against the same trace built as a JSON document with nlohmann-json, which escapes and
// prints numbers on its own: the parsed text must equal that document, value for value.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/engine/timeline.hpp"
#include "core/experiment/experiment.hpp"
#include "muonbed/config.hpp"
#include "tests/common/tiny_experiment.hpp"

using namespace muonbed;

namespace {

// The reference: the trace's fields, spelled as a document (the format analysis/plot.py and
// Perfetto read: metadata events naming nodes and rank streams, then complete events).
nlohmann::json reference_trace(const StepPlan& plan, const std::vector<TraceEvent>& events,
                               int traced, int gpn, int step, const std::string& note) {
  const int ns = static_cast<int>(plan.streams.size());
  nlohmann::json list = nlohmann::json::array();
  for (int node = 0; node * gpn < traced; ++node)
    list.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", node},
                    {"args", {{"name", "node " + std::to_string(node)}}}});
  for (int r = 0; r < traced; ++r)
    for (int s = 0; s < ns; ++s)
      list.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", r / gpn},
                      {"tid", r * ns + s},
                      {"args", {{"name", "rank " + std::to_string(r) + " " + plan.streams[s]}}}});
  for (const TraceEvent& e : events) {
    const Op& op = plan.ops[e.op];
    list.push_back({{"name", e.kind == TraceKind::wait ? "wait: " + op.label : op.label},
                    {"cat", e.kind == TraceKind::compute      ? "compute"
                            : e.kind == TraceKind::collective ? "collective"
                                                              : "wait"},
                    {"ph", "X"},
                    {"ts", e.start * 1e6},
                    {"dur", (e.end - e.start) * 1e6},
                    {"pid", e.rank / gpn},
                    {"tid", e.rank * ns + e.stream},
                    {"args", {{"op", e.op}, {"kind", std::string(to_string(op.kind))}}}});
  }
  return {{"displayTimeUnit", "ms"},
          {"otherData",
           {{"step", step},
            {"traced_ranks", traced},
            {"world_size", plan.mesh().world_size()},
            {"note", note}}},
          {"traceEvents", list}};
}

}  // namespace

TEST_CASE("the Chrome trace text parses to the same trace as a JSON document", "[core][trace]") {
  StepPlan plan = plan_experiment(testing::tiny_point("trace", "dgx-h100", 4, "analytic"));
  REQUIRE(plan.ops.size() >= 4);
  REQUIRE(!plan.streams.empty());
  // Labels a user's model or strategy could produce: quotes, backslashes, control characters,
  // UTF-8 (JSON escapes the first three, passes the last).
  plan.ops[0].label = "q\"uote\\back\nline\ttab\x01\x1f end";
  plan.ops[1].label = "wq.weight \xc3\xa9\xe2\x82\xac";
  plan.ops[2].label = "";
  std::mt19937_64 random(20261129);
  std::uniform_int_distribution<int> rank(0, 3), op(0, static_cast<int>(plan.ops.size()) - 1),
      stream(0, static_cast<int>(plan.streams.size()) - 1), kind(0, 2);
  std::uniform_real_distribution<double> time(0, 20);
  std::vector<TraceEvent> events;
  // Times with long decimal expansions, tiny and huge magnitudes, and whole numbers.
  const std::vector<double> odd = {0.0, 1e-12, 0.1 + 0.2, 1.0 / 3, 123456.789, 1e9, 5e-7, 2.0};
  for (int i = 0; i < 400; ++i) {
    TraceEvent e;
    e.rank = rank(random);
    e.stream = stream(random);
    e.op = i < 3 ? i : op(random);
    e.kind = static_cast<TraceKind>(kind(random));
    e.start = i < static_cast<int>(odd.size()) ? odd[i] : time(random);
    e.end = e.start + (i % 7 == 0 ? 0.0 : time(random) / 1000);
    events.push_back(e);
  }
  for (const int gpn : {1, 2, 8}) {
    const std::string note = "simulated \"worst\" step\\n";
    const std::string text = chrome_trace(plan, events, 4, gpn, 3, note);
    const nlohmann::json parsed = nlohmann::json::parse(text);  // throws on invalid JSON
    const nlohmann::json expected = reference_trace(plan, events, 4, gpn, 3, note);
    CHECK(parsed == expected);
    // Times read back as the very doubles the events hold (shortest round-trip digits).
    const auto& list = parsed.at("traceEvents");
    const std::size_t metadata = list.size() - events.size();
    for (std::size_t i = 0; i < events.size(); ++i)
      CHECK(list[metadata + i].at("ts").get<double>() == events[i].start * 1e6);
  }
  CHECK(chrome_trace(plan, events, 0, 8, 0, "").empty());
}
