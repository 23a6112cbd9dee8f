// Simulation processes (sim/src/isolate.hpp): several bodies run side by side in children of
// their own, their outputs come back in order, and a failing body fails the call only after
// every child has ended.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "core/base/errors.hpp"
#include "sim/src/isolate.hpp"
#include "tests/common/temp_dir.hpp"

using namespace muonbed;

namespace {

// Waits up to 30 s for `path` to exist: a hand-shake between two children, not a timing.
bool wait_for(const std::filesystem::path& path) {
  for (int i = 0; i < 3000; ++i) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// No child of this process is left (running or unreaped).
bool no_children_left() {
  return ::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD;
}

// A body of one text.
sim::IsolatedBody one_text(std::function<std::string()> body) {
  return [body = std::move(body)]() { return std::vector<std::string>{body()}; };
}

// `size` bytes that differ from any shifted copy of themselves (a lost or doubled chunk shows).
std::string pattern(std::size_t size, unsigned seed) {
  std::string text(size, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (char& c : text) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
  return text;
}

}  // namespace

TEST_CASE("isolated bodies run side by side and return in order", "[sim][isolate]") {
  const testing::TempDir dir("isolate");
  const auto a_seen = dir.path() / "a", b_seen = dir.path() / "b";
  // Each body waits for the other's mark: only bodies running at the same time both finish.
  const auto first = one_text([&]() {
    std::ofstream(a_seen.string()) << "a";
    return std::string(wait_for(b_seen) ? "first saw second" : "first ran alone");
  });
  const auto second = one_text([&]() {
    std::ofstream(b_seen.string()) << "b";
    return std::string(wait_for(a_seen) ? "second saw first" : "second ran alone");
  });
  const auto runs = sim::run_isolated_each({first, second}, 2);
  REQUIRE(runs.size() == 2);
  CHECK(runs[0].parts.at(0) == "first saw second");
  CHECK(runs[1].parts.at(0) == "second saw first");
  CHECK(runs[0].peak_rss_bytes > 0);
  CHECK(no_children_left());
  // One at a time, they run in order: the first ends before the second starts.
  std::filesystem::remove(a_seen);
  std::filesystem::remove(b_seen);
  const auto quick_first = one_text([&]() {
    std::ofstream(a_seen.string()) << "a";
    return std::string(std::filesystem::exists(b_seen) ? "second already ran" : "first");
  });
  const auto in_turn = sim::run_isolated_each({quick_first, second}, 1);
  CHECK(in_turn[0].parts.at(0) == "first");
  CHECK(in_turn[1].parts.at(0) == "second saw first");
  CHECK(sim::usable_cores() >= 1);
}

TEST_CASE("a failing isolated body fails the call after every child ended", "[sim][isolate]") {
  const auto ok = one_text([]() { return std::string("fine"); });
  const auto plan_error = one_text(
      []() -> std::string { throw PlanError("the plan does not fit; fix: fewer layers"); });
  const auto other = one_text([]() -> std::string { throw std::runtime_error("second failure"); });
  const auto dies = one_text([]() -> std::string { ::_exit(3); });
  // The first failing body's error, in the bodies' order, with its type.
  CHECK_THROWS_AS(sim::run_isolated_each({ok, plan_error, other}, 2), PlanError);
  CHECK(no_children_left());
  CHECK_THROWS_WITH(sim::run_isolated_each({ok, other, plan_error}, 3),
                    Catch::Contains("second failure"));
  CHECK(no_children_left());
  CHECK_THROWS_WITH(sim::run_isolated_each({dies, ok}, 2),
                    Catch::Contains("exited (status 3) without a result"));
  CHECK(no_children_left());
  CHECK(sim::run_isolated_each({}, 2).empty());
}

TEST_CASE("isolated bodies send their parts back exactly, side by side", "[sim][isolate]") {
  // Parts larger than the pipe's buffer and the parent's reads, empty parts, and two children
  // writing at once, so that the parent reads each in many pieces, interleaved.
  const std::vector<std::string> a = {pattern(3'000'001, 1), "", pattern(70'000, 2), "x"};
  const std::vector<std::string> b = {"", "", pattern(5'000'000, 3)};
  const auto runs = sim::run_isolated_each(
      {[&]() { return a; }, [&]() { return b; }, []() { return std::vector<std::string>{}; }}, 3);
  REQUIRE(runs.size() == 3);
  CHECK(runs[0].parts == a);
  CHECK(runs[1].parts == b);
  CHECK(runs[2].parts.empty());
  CHECK(no_children_left());
  // A failure's message comes back whole as well.
  const std::string long_reason = "fix: " + std::string(200'000, 'y');
  CHECK_THROWS_WITH(sim::run_isolated_each(
                        {[&]() -> std::vector<std::string> { throw PlanError(long_reason); }}, 1),
                    long_reason);
  CHECK(no_children_left());
}
