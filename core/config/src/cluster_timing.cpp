// The timing a cluster profile gives (core/config/cluster.hpp): the GEMM efficiency curve, the
// measured Newton-Schulz table interpolated in FLOPs (with where each time comes from), the
// measured elementwise table, and the collective classes' link efficiencies. Reading and writing
// profiles is cluster.cpp's.
#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/cluster.hpp"

namespace muonbed {

double GpuSpec::efficiency(double dim) const {
  if (gemm_efficiency.empty()) return 1.0;
  const auto& points = gemm_efficiency;
  if (!(dim > points.front().dim)) return points.front().efficiency;
  if (dim >= points.back().dim) return points.back().efficiency;
  for (std::size_t i = 1; i < points.size(); ++i) {
    if (dim <= points[i].dim) {
      // Linear in log2(dim): GEMM efficiency grows with the matrix size roughly per doubling.
      const double x0 = std::log2(points[i - 1].dim), x1 = std::log2(points[i].dim);
      const double t = (std::log2(dim) - x0) / (x1 - x0);
      return points[i - 1].efficiency + t * (points[i].efficiency - points[i - 1].efficiency);
    }
  }
  return points.back().efficiency;
}

namespace {

// Per-step FLOPs of NS on one m x n matrix (m <= n): X X^T, A A, B X.
double ns_step_flops(double m, double n) {
  return 4 * m * m * n + 2 * m * m * m;
}

struct NsPoint {
  double flops;  // per matrix, all steps
  double seconds;
};

// Piecewise-linear interpolation of seconds in FLOPs (points sorted by FLOPs, distinct).
double interpolate_ns(const std::vector<NsPoint>& p, double flops) {
  if (p.size() == 1) return p[0].seconds * flops / p[0].flops;
  if (flops <= p.front().flops) {
    // The line through the two smallest points: its intercept is the per-call overhead.
    const double slope = (p[1].seconds - p[0].seconds) / (p[1].flops - p[0].flops);
    const double t = p[0].seconds + slope * (flops - p[0].flops);
    return t > 0 && slope > 0 ? t : p[0].seconds * flops / p[0].flops;
  }
  if (flops >= p.back().flops) return p.back().seconds * flops / p.back().flops;
  for (std::size_t i = 1; i < p.size(); ++i)
    if (flops <= p[i].flops) {
      const double t = (flops - p[i - 1].flops) / (p[i].flops - p[i - 1].flops);
      return p[i - 1].seconds + t * (p[i].seconds - p[i - 1].seconds);
    }
  return p.back().seconds;
}

}  // namespace

std::string_view to_string(NsTimeSource source) {
  switch (source) {
    case NsTimeSource::table:
      return "table";
    case NsTimeSource::interpolated:
      return "interpolated";
    case NsTimeSource::extrapolated:
      return "extrapolated";
    case NsTimeSource::curve:
      return "curve";
  }
  return "?";
}

double GpuSpec::ns_call_seconds(std::int64_t rows, std::int64_t cols, std::int64_t batch, int steps,
                                const std::string& version, NsTimeSource* source) const {
  NsTimeSource ignored;
  NsTimeSource& from = source ? *source : ignored;
  from = NsTimeSource::curve;
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  const double b = static_cast<double>(std::max<std::int64_t>(1, batch));
  std::vector<const NsTiming*> mine;
  for (const NsTiming& t : ns_table)
    if (t.version == version && t.ms > 0 && t.steps > 0) mine.push_back(&t);
  if (mine.empty()) return -1;
  // Same shape: the entry whose batch is nearest (in ratio), scaled.
  const NsTiming* same = nullptr;
  for (const NsTiming* t : mine) {
    if (std::min(t->rows, t->cols) != std::min(rows, cols) ||
        std::max(t->rows, t->cols) != std::max(rows, cols))
      continue;
    const auto distance = [&](const NsTiming* e) {
      return std::abs(std::log(static_cast<double>(e->batch) / b));
    };
    if (same == nullptr || distance(t) < distance(same)) same = t;
  }
  if (same != nullptr) {
    from = NsTimeSource::table;
    return same->ms * 1e-3 * (b / static_cast<double>(same->batch)) *
           (static_cast<double>(steps) / same->steps);
  }
  // Other shapes: per-matrix points of batched entries for a batched call (when there are any),
  // of single calls otherwise.
  const bool batched = batch > 1;
  bool any_kind = false;
  for (const NsTiming* t : mine) any_kind = any_kind || ((t->batch > 1) == batched);
  std::vector<NsPoint> points;
  for (const NsTiming* t : mine) {
    if (any_kind && (t->batch > 1) != batched) continue;
    const double tm = static_cast<double>(std::min(t->rows, t->cols));
    const double tn = static_cast<double>(std::max(t->rows, t->cols));
    points.push_back(
        {ns_step_flops(tm, tn) * t->steps, t->ms * 1e-3 / static_cast<double>(t->batch)});
  }
  std::sort(points.begin(), points.end(),
            [](const NsPoint& a, const NsPoint& c) { return a.flops < c.flops; });
  // Equal FLOPs (two shapes of one size): keep their mean.
  std::vector<NsPoint> distinct;
  std::vector<int> count;
  for (const NsPoint& q : points) {
    if (!distinct.empty() && distinct.back().flops == q.flops) {
      distinct.back().seconds += q.seconds;
      ++count.back();
    } else {
      distinct.push_back(q);
      count.push_back(1);
    }
  }
  for (std::size_t i = 0; i < distinct.size(); ++i) distinct[i].seconds /= count[i];
  const double flops = ns_step_flops(m, n) * steps;
  const double lo = distinct.front().flops, hi = distinct.back().flops;
  if (flops >= lo && flops <= hi) {
    from = NsTimeSource::interpolated;
  } else if (flops * kNsExtrapolationLimit >= lo && flops <= hi * kNsExtrapolationLimit) {
    from = NsTimeSource::extrapolated;
  } else {
    // Past the table by more than 2x: the work at the GEMM-efficiency curve's rate for the
    // matrix's smallest dimension, plus the per-call overhead the table measured (the intercept
    // of the line through its two smallest entries, when positive): never a far entry's rate.
    from = NsTimeSource::curve;
    const double rate = sustained_flops(m);
    if (!(rate > 0)) return -1;
    double overhead = 0;
    if (distinct.size() >= 2) {
      const NsPoint& p0 = distinct[0];
      const NsPoint& p1 = distinct[1];
      const double slope = (p1.seconds - p0.seconds) / (p1.flops - p0.flops);
      overhead = std::max(0.0, p0.seconds - slope * p0.flops);
    }
    return b * flops / rate + overhead;
  }
  return b * interpolate_ns(distinct, flops);
}

double GpuSpec::elementwise_seconds(std::string_view kernel, std::int64_t numel) const {
  std::vector<std::pair<double, double>> points;  // (elements, seconds)
  for (const ElementwiseTiming& t : elementwise_table)
    if (t.kernel == kernel && t.numel > 0 && t.ms > 0)
      points.emplace_back(static_cast<double>(t.numel), t.ms * 1e-3);
  if (points.empty()) return -1;
  std::sort(points.begin(), points.end());
  const double n = static_cast<double>(std::max<std::int64_t>(0, numel));
  if (n <= points.front().first) return points.front().second * n / points.front().first;
  for (std::size_t i = 1; i < points.size(); ++i)
    if (n <= points[i].first) {
      const auto& [n0, t0] = points[i - 1];
      const auto& [n1, t1] = points[i];
      return n1 == n0 ? std::max(t0, t1) : t0 + (n - n0) / (n1 - n0) * (t1 - t0);
    }
  return points.back().second * n / points.back().first;
}

const std::vector<std::string>& elementwise_table_kernels() {
  static const std::vector<std::string> kinds = {"momentum", "apply_update", "adamw"};
  return kinds;
}

std::vector<std::string> GpuSpec::ns_versions() const {
  std::vector<std::string> out;
  for (const NsTiming& t : ns_table)
    if (std::find(out.begin(), out.end(), t.version) == out.end()) out.push_back(t.version);
  return out;
}

std::string_view to_string(CollectiveClass cls) {
  switch (cls) {
    case CollectiveClass::ring:
      return "ring";
    case CollectiveClass::all_to_all:
      return "all_to_all";
    case CollectiveClass::p2p:
      return "p2p";
    case CollectiveClass::nvls:
      return "nvls";
  }
  return "?";
}

double LinkEfficiency::of(CollectiveClass cls) const {
  switch (cls) {
    case CollectiveClass::ring:
      return ring;
    case CollectiveClass::all_to_all:
      return all_to_all;
    case CollectiveClass::p2p:
      return p2p;
    case CollectiveClass::nvls:
      return nvls;
  }
  return 1.0;
}

}  // namespace muonbed
