// A progress line for work that runs long (a simulation of thousands of ranks): "LABEL: 43 % of
// WHAT, 12 s, ~16 s left", first after `delay_s` of work, then at most once per `interval_s`.
// On a terminal (`in_place`) the line is redrawn in place and erased when the work ends; in a log
// (a batch job's stderr) each update is a line of its own, so the options for logs wait longer
// and write seldom (for_log()). Result files never see it. The caller says how far it is, as
// done / total of work it can count (a simulation: the plan's rank-ops reached); the time left
// assumes the rest goes at the average rate so far.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

namespace muonbed {

class ProgressLine {
 public:
  using Clock = std::function<double()>;  // seconds on a monotonic clock
  struct Options {
    double delay_s = 3;       // nothing for work that ends sooner
    double interval_s = 0.5;  // at most one redraw per interval
    int check_every = 1024;   // update() reads the clock once per this many calls
    bool in_place = true;     // a terminal: redraw one line; false: one line per update
  };
  // For a stream that is no terminal: a line after 10 s, then one every 30 s.
  static Options for_log();

  // `out` null: disabled (not asked for). `clock` (empty: steady_clock) is for tests.
  ProgressLine(std::string label, std::string what, std::ostream* out);
  ProgressLine(std::string label, std::string what, std::ostream* out, Options options,
               Clock clock = {});
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  ~ProgressLine();

  // Cheap enough to call per unit of work: the clock is read once per check_every calls.
  void update(std::int64_t done, std::int64_t total);
  // Erases the line if one was drawn (the destructor does too).
  void finish();
  int redraws() const { return redraws_; }

  // The line's text (no control characters): what update() draws.
  static std::string text(const std::string& label, const std::string& what, double fraction,
                          double elapsed_s);

 private:
  std::string label_;
  std::string what_;
  std::ostream* out_;
  Options options_;
  Clock clock_;
  double start_ = 0;
  double last_draw_ = -1;
  std::int64_t calls_left_;  // update() calls until the next clock read (no division per call)
  int redraws_ = 0;
  bool drawn_ = false;
};

// "850 ms", "12.3 s", "4 min 05 s", "2 h 03 min": durations for progress text.
std::string duration_text(double seconds);

}  // namespace muonbed
