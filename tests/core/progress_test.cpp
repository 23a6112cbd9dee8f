// The progress line of long runs (core/base/progress.hpp) on a fake clock: silent for short work
// and when disabled, throttled redraws, the time left at the average rate, erased at the end.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "core/base/progress.hpp"

using namespace muonbed;

namespace {

struct FakeClock {
  double now = 100;
};

ProgressLine::Options every_call() {
  ProgressLine::Options o;
  o.check_every = 1;  // read the clock on every update
  return o;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("the progress text says the fraction, the time so far and the time left", "[progress]") {
  // A quarter done after 30 s: the other three quarters at the same rate take 90 s.
  CHECK(ProgressLine::text("p [sim]", "rank-ops", 0.25, 30) ==
        "p [sim]: 25 % of rank-ops, 30.0 s, ~1 min 30 s left");
  // The percentage never rounds up to a finished 100 % before the end.
  CHECK(ProgressLine::text("p", "x", 0.999, 10).find("99 %") != std::string::npos);
  CHECK(ProgressLine::text("p", "x", 0, 10) == "p: 0 % of x, 10.0 s");  // no rate yet
  CHECK(duration_text(0.25) == "250 ms");
  CHECK(duration_text(3725) == "1 h 02 min");
}

TEST_CASE("short work and disabled lines print nothing", "[progress]") {
  FakeClock clock;
  std::ostringstream out;
  {
    ProgressLine line("p", "x", &out, every_call(), [&] { return clock.now; });
    for (int i = 1; i <= 100; ++i) {
      clock.now += 0.02;  // 2 s in all: under the 3 s delay
      line.update(i, 100);
    }
  }
  CHECK(out.str().empty());
  ProgressLine off("p", "x", nullptr, every_call(), [&] { return clock.now += 10; });
  off.update(1, 2);
  CHECK(off.redraws() == 0);
}

TEST_CASE("long work redraws in place at most twice a second and erases the line", "[progress]") {
  FakeClock clock;
  std::ostringstream out;
  ProgressLine line("p", "x", &out, every_call(), [&] { return clock.now; });
  // 10 s of work in 1,000 updates of 10 ms: drawn from 3 s on, every 0.5 s: 15 draws.
  for (int i = 1; i <= 1000; ++i) {
    clock.now += 0.01;
    line.update(i, 1000);
  }
  CHECK(line.redraws() >= 14);
  CHECK(line.redraws() <= 15);
  CHECK(count(out.str(), "\r\033[K") == line.redraws());
  CHECK(out.str().find("% of x") != std::string::npos);
  CHECK(out.str().find('\n') == std::string::npos);  // never a new line: one line redrawn
  line.finish();
  CHECK(count(out.str(), "\r\033[K") == line.redraws() + 1);  // the last one erases it
  line.finish();                                              // once
  CHECK(count(out.str(), "\r\033[K") == line.redraws() + 1);
}

TEST_CASE("the clock is read once per check_every updates", "[progress]") {
  int reads = 0;
  ProgressLine::Options o;
  o.check_every = 100;
  std::ostringstream out;
  ProgressLine line("p", "x", &out, o, [&] {
    ++reads;
    return 0.0;
  });
  for (int i = 0; i < 1000; ++i) line.update(i, 1000);
  CHECK(reads == 1 + 10);  // the start, then every 100th update
}

TEST_CASE("in a log the progress is a line of its own, seldom", "[progress]") {
  FakeClock clock;
  std::ostringstream out;
  ProgressLine::Options o = ProgressLine::for_log();
  o.check_every = 1;
  ProgressLine line("p", "x", &out, o, [&] { return clock.now; });
  // 100 s of work in 1,000 updates of 0.1 s: lines at 10, 40, 70 and 100 s (every 30 s after
  // the first 10 s), each ending in a new line, with no terminal control characters.
  for (int i = 1; i <= 1000; ++i) {
    clock.now += 0.1;
    line.update(i, 1000);
  }
  CHECK(line.redraws() >= 3);
  CHECK(line.redraws() <= 4);
  CHECK(count(out.str(), "\n") == line.redraws());
  CHECK(out.str().find('\r') == std::string::npos);
  // 10 % at 10 s: the other 90 % at that rate take 90 s.
  CHECK(out.str().rfind("p: 10 % of x, 10.", 0) == 0);
  CHECK(out.str().find("~1 min 30 s left\n") != std::string::npos);
  line.finish();  // nothing to erase in a log
  CHECK(count(out.str(), "\n") == line.redraws());
}
