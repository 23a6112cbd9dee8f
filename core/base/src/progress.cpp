// ProgressLine (core/base/progress.hpp): throttled, erasable progress text on a terminal.
#include "core/base/progress.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace muonbed {

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string duration_text(double seconds) {
  char text[48];
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  if (seconds < 1) {
    std::snprintf(text, sizeof text, "%.0f ms", seconds * 1e3);
  } else if (seconds < 60) {
    std::snprintf(text, sizeof text, "%.1f s", seconds);
  } else if (seconds < 3600) {
    const long s = std::lround(seconds);
    std::snprintf(text, sizeof text, "%ld min %02ld s", s / 60, s % 60);
  } else {
    const long m = std::lround(seconds / 60);
    std::snprintf(text, sizeof text, "%ld h %02ld min", m / 60, m % 60);
  }
  return text;
}

ProgressLine::ProgressLine(std::string label, std::string what, std::ostream* out)
    : ProgressLine(std::move(label), std::move(what), out, Options{}, &steady_seconds) {}

ProgressLine::ProgressLine(std::string label, std::string what, std::ostream* out, Options options,
                           Clock clock)
    : label_(std::move(label)),
      what_(std::move(what)),
      out_(out),
      options_(options),
      clock_(clock ? std::move(clock) : Clock(&steady_seconds)),
      calls_left_(std::max(1, options_.check_every)) {
  if (out_) start_ = clock_();
}

ProgressLine::~ProgressLine() {
  finish();
}

ProgressLine::Options ProgressLine::for_log() {
  Options o;
  o.delay_s = 10;
  o.interval_s = 30;
  o.in_place = false;
  return o;
}

std::string ProgressLine::text(const std::string& label, const std::string& what, double fraction,
                               double elapsed_s) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  char percent[16];
  std::snprintf(percent, sizeof percent, "%.0f %%", std::floor(fraction * 100));
  std::string line = label + ": " + percent + " of " + what + ", " + duration_text(elapsed_s);
  if (fraction > 0 && fraction < 1)
    line += ", ~" + duration_text(elapsed_s * (1 - fraction) / fraction) + " left";
  return line;
}

void ProgressLine::update(std::int64_t done, std::int64_t total) {
  if (!out_ || total <= 0) return;
  if (--calls_left_ > 0) return;
  calls_left_ = std::max(1, options_.check_every);
  const double now = clock_();
  const double elapsed = now - start_;
  if (elapsed < options_.delay_s) return;
  if (last_draw_ >= 0 && now - last_draw_ < options_.interval_s) return;
  last_draw_ = now;
  const double fraction = static_cast<double>(done) / static_cast<double>(total);
  std::string line = text(label_, what_, fraction, elapsed);
  // One terminal line: a long label is cut, never the figures after it.
  constexpr std::size_t kWidth = 118;
  if (line.size() > kWidth) {
    const std::size_t tail = line.size() - label_.size();
    const std::size_t keep = kWidth > tail + 13 ? kWidth - tail - 3 : 10;
    line = text(label_.substr(0, keep) + "...", what_, fraction, elapsed);
  }
  if (!options_.in_place) {
    *out_ << line << "\n" << std::flush;
    ++redraws_;
    return;
  }
  *out_ << "\r\033[K" << line << std::flush;
  drawn_ = true;
  ++redraws_;
}

void ProgressLine::finish() {
  if (out_ && drawn_) *out_ << "\r\033[K" << std::flush;
  drawn_ = false;
}

}  // namespace muonbed
