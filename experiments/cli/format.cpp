// Number, size and time formatting and the table printer of the CLI (see format.hpp).
#include "experiments/cli/format.hpp"

#include <algorithm>
#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include "core/base/errors.hpp"

namespace muonbed::cli {

std::string human_count(double n) {
  const double a = std::fabs(n);
  if (!std::isfinite(n)) return fmt::format("{}", n);
  if (a >= 1e15) return fmt::format("{:.3g}", n);
  if (a >= 1e12) return fmt::format("{:.2f} T", n / 1e12);
  if (a >= 1e9) return fmt::format("{:.2f} B", n / 1e9);
  if (a >= 1e6) return fmt::format("{:.1f} M", n / 1e6);
  if (a >= 1e4) return fmt::format("{:.1f} k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string human_seconds(double s) {
  // Any double gives a short text: extreme (but valid) clusters make steps of 1e-12 to 1e12 s.
  const double a = std::fabs(s);
  if (!std::isfinite(s)) return fmt::format("{} s", s);
  if (a >= 1e6) return fmt::format("{:.3e} s", s);
  if (a >= 1) return fmt::format("{:.3f} s", s);
  if (a >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  if (a >= 1e-6 || a == 0) return fmt::format("{:.1f} us", s * 1e6);
  if (a >= 1e-9) return fmt::format("{:.1f} ns", s * 1e9);
  return fmt::format("{:.3e} s", s);
}

std::string mib(double bytes) {
  return fmt::format("{:.1f}", bytes / (1024.0 * 1024.0));
}
std::string gib(double bytes) {
  return fmt::format("{:.2f}", bytes / (1024.0 * 1024.0 * 1024.0));
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

void Table::print(std::ostream& out, const std::string& indent) const {
  std::vector<std::size_t> width(header_.size(), 0);
  for (std::size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
  for (const auto& row : rows_)
    for (std::size_t c = 0; c < row.size() && c < width.size(); ++c)
      width[c] = std::max(width[c], row[c].size());
  auto line = [&](const std::vector<std::string>& row) {
    std::string text = indent;
    for (std::size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      if (c > 0) text += "  ";
      text += c < left_columns_ ? fmt::format("{:<{}}", cell, width[c])
                                : fmt::format("{:>{}}", cell, width[c]);
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out << text << "\n";
  };
  line(header_);
  std::size_t total = 0;
  for (std::size_t w : width) total += w + 2;
  const std::string rule = indent + std::string(total > 2 ? total - 2 : 0, '-');
  out << rule << "\n";
  for (const auto& row : rows_) {
    if (row.empty())
      out << rule << "\n";
    else
      line(row);
  }
}

std::string mesh_text(const DeviceMesh& mesh) {
  std::string dims;
  for (const MeshDim& d : mesh.dims())
    dims += (dims.empty() ? "" : " x ") + d.name + "=" + std::to_string(d.size);
  return fmt::format("{} ({} ranks, {} per node, {} node{})", dims, mesh.world_size(),
                     mesh.gpus_per_node(), mesh.num_nodes(), mesh.num_nodes() == 1 ? "" : "s");
}

// The strategy and the options it reads (strategy_reads_option): an option a point's strategy
// ignores is never shown as if it applied.
std::string strategy_text(const StrategyOptions& s) {
  const auto reads = [&](std::string_view option) { return strategy_reads_option(s, option); };
  std::string text = (s.preset.empty() ? "" : "preset " + s.preset + ": ") + s.name;
  std::vector<std::string> parts;
  if (reads("assign")) parts.push_back("assign " + s.assign);
  if (reads("gather")) parts.push_back("gather " + s.gather);
  if (reads("prefetch_count")) parts.push_back(fmt::format("prefetch {}", s.prefetch_count));
  if (reads("async_gpu_parallelism"))
    parts.push_back(s.async_gpu_parallelism ? "async" : "synchronous rounds");
  if (reads("chunk_size")) parts.push_back(fmt::format("chunks of {}", s.chunk_size));
  if (reads("max_chunks_in_flight"))
    parts.push_back(fmt::format("{} in flight", s.max_chunks_in_flight));
  if (s.chunk_by_shape && reads("chunk_by_shape")) parts.push_back("one shape per chunk");
  if (s.chunk_sizing == "ns_cost" && reads("chunk_sizing"))
    parts.push_back("chunks by NS cost (one matrix per owner)");
  if (s.comm_lanes != 1 && reads("comm_lanes"))
    parts.push_back(fmt::format("{} comm lanes", s.comm_lanes));
  if (s.order != "plan" && reads("order")) parts.push_back("order " + s.order);
  if (s.small_param_threshold > 0 && reads("small_param_threshold"))
    parts.push_back("replicate below " + human_count(static_cast<double>(s.small_param_threshold)));
  if (s.split_ns.enabled && reads("split_ns")) parts.push_back("split NS");
  if (s.grad_sync.enabled) {
    std::string periods;
    for (int p : s.grad_sync.level_periods)
      periods += (periods.empty() ? "" : ",") + std::to_string(p);
    parts.push_back("grad sync periods [" + periods + "]");
  }
  std::string joined;
  for (const std::string& p : parts) joined += (joined.empty() ? "" : ", ") + p;
  return text + (joined.empty() ? "" : " (" + joined + ")");
}

std::string point_text(const Experiment& e, std::size_t index, std::size_t count) {
  if (e.point_label.empty()) return "";
  return fmt::format("[{}/{}] {}", index + 1, count, e.point_label);
}

bool point_matches(const Experiment& e, const std::string& filter) {
  if (filter == e.point_label) return true;
  std::size_t start = 0;
  while (start <= filter.size()) {
    const std::size_t comma = filter.find(',', start);
    const std::string part =
        filter.substr(start, comma == std::string::npos ? comma : comma - start);
    const std::size_t eq = part.find('=');
    if (eq == std::string::npos) return false;
    const auto it = e.overrides.find(part.substr(0, eq));
    if (it == e.overrides.end() || it->second != part.substr(eq + 1)) return false;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

std::vector<std::size_t> select_points(const std::vector<Experiment>& points,
                                       const std::vector<std::string>& filters,
                                       const std::string& file) {
  std::vector<std::size_t> selected;
  for (std::size_t i = 0; i < points.size(); ++i) {
    bool keep = filters.empty();
    for (const std::string& f : filters) keep = keep || point_matches(points[i], f);
    if (keep) selected.push_back(i);
  }
  if (selected.empty()) {
    std::string labels;
    constexpr std::size_t kShown = 20;  // a 10,000-point sweep must not print 10,000 lines
    for (std::size_t i = 0; i < points.size() && i < kShown; ++i)
      labels += "\n    " + points[i].point_label;
    if (points.size() > kShown)
      labels += "\n    ... and " + std::to_string(points.size() - kShown) +
                " more ('muonbed validate " + file + "' lists them all)";
    throw ConfigError(SourceLocation{file, 0, 0}, "no sweep point matches --point",
                      "use a full label or key=value pairs; the points are:" + labels);
  }
  return selected;
}

Shard parse_shard(const std::string& text) {
  constexpr int kMaxShards = 10000;  // as many as a sweep has points at most
  const std::string fix =
      "write --shard I/N with 1 <= I <= N <= " + std::to_string(kMaxShards) +
      ": shards count from 1 (--shard 1/4 .. --shard 4/4; with 0-based job array ids use "
      "$((SLURM_ARRAY_TASK_ID + 1)))";
  const std::size_t slash = text.find('/');
  const auto number = [&](const std::string& part, int& out) {
    if (part.empty() || part.size() > 5 ||
        part.find_first_not_of("0123456789") != std::string::npos)
      return false;
    out = std::stoi(part);
    return true;
  };
  Shard shard;
  if (slash == std::string::npos || !number(text.substr(0, slash), shard.index) ||
      !number(text.substr(slash + 1), shard.count))
    throw ConfigError(SourceLocation{}, "--shard '" + text + "' is not I/N", fix);
  if (shard.count < 1 || shard.count > kMaxShards)
    throw ConfigError(SourceLocation{},
                      "--shard '" + text + "': N = " + std::to_string(shard.count) +
                          " shards is outside 1.." + std::to_string(kMaxShards),
                      fix);
  if (shard.index < 1 || shard.index > shard.count)
    throw ConfigError(SourceLocation{},
                      "--shard '" + text + "': shard " + std::to_string(shard.index) +
                          " does not exist (shards are 1.." + std::to_string(shard.count) + ")",
                      fix);
  return shard;
}

std::vector<std::size_t> shard_points(const std::vector<std::size_t>& selected, Shard shard) {
  std::vector<std::size_t> out;
  for (std::size_t i = static_cast<std::size_t>(shard.index - 1); i < selected.size();
       i += static_cast<std::size_t>(shard.count))
    out.push_back(selected[i]);
  return out;
}

MatrixShape parse_shape(const std::string& text) {
  std::vector<std::int64_t> dims;
  std::size_t pos = 0;
  while (true) {
    const std::size_t x = text.find('x', pos);
    const std::string part = text.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || value < 1)
      throw ConfigError(SourceLocation{}, "bad shape '" + text + "'",
                        "write ROWSxCOLS or BATCHxROWSxCOLS with positive sizes, e.g. 4096x4096");
    dims.push_back(value);
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  if (dims.size() == 2) return {1, dims[0], dims[1]};
  if (dims.size() == 3) return {dims[0], dims[1], dims[2]};
  throw ConfigError(SourceLocation{}, "bad shape '" + text + "'",
                    "write ROWSxCOLS or BATCHxROWSxCOLS, e.g. 4096x4096 or 8x1024x4096");
}

}  // namespace muonbed::cli
