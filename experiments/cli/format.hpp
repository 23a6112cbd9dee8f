// Text formatting shared by the CLI commands: human-readable counts, sizes and times, and a
// small right-aligned table printer, so every command's output reads the same way.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/experiment/experiment.hpp"
#include "kernels/newton_schulz.hpp"

namespace muonbed::cli {

std::string human_count(double n);                        // 6.74 B, 124.4 M, 8.19 k, 12
std::string human_seconds(double s);                      // 12.3 ms, 45.6 us, 1.23 s
std::string mib(double bytes);                            // "123.4" (MiB, one decimal)
std::string gib(double bytes);                            // "12.34" (GiB, two decimals)
std::string join(const std::vector<std::string>& items);  // "a, b, c"
// A --shape option: "ROWSxCOLS" or "BATCHxROWSxCOLS" (bench ns, calibrate); ConfigError if not.
MatrixShape parse_shape(const std::string& text);

// A table printed with right-aligned columns, except the first `left_columns` (left-aligned).
class Table {
 public:
  explicit Table(std::vector<std::string> header, std::size_t left_columns = 1)
      : header_(std::move(header)), left_columns_(left_columns) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void add_separator() { rows_.push_back({}); }
  void print(std::ostream& out, const std::string& indent = "  ") const;

 private:
  std::vector<std::string> header_;
  std::size_t left_columns_ = 1;
  std::vector<std::vector<std::string>> rows_;
};

// "pp=4 x dp_shard=8 (32 ranks, 8 per node, 4 nodes)".
std::string mesh_text(const DeviceMesh& mesh);
// "owner (assign flop_balanced, gather hierarchical, prefetch 1, async)".
std::string strategy_text(const StrategyOptions& s);
// "[1/5] strategy.name=owner" or "" for an experiment without a sweep.
std::string point_text(const Experiment& e, std::size_t index, std::size_t count);

// A point matches a --point filter if the filter equals its label, or every "key=value" of the
// filter is one of its overrides ("strategy.name=owner" picks every point with that strategy).
bool point_matches(const Experiment& e, const std::string& filter);
// Indices of the points matching any filter (all without filters); a ConfigError listing the
// points when none matches.
std::vector<std::size_t> select_points(const std::vector<Experiment>& points,
                                       const std::vector<std::string>& filters,
                                       const std::string& file);

// `--shard I/N` of `muonbed run`: shard I (1-based) of N runs the selected points whose position
// in the selection is I-1, I-1+N, I-1+2N, ... (for job arrays, GNU parallel, several hosts).
struct Shard {
  int index = 1;  // 1..count
  int count = 1;
};
// Parses "I/N" (1 <= I <= N <= 10,000); a ConfigError naming the text and the fix otherwise.
Shard parse_shard(const std::string& text);
// The positions in `selected` that shard `shard` runs, in order.
std::vector<std::size_t> shard_points(const std::vector<std::size_t>& selected, Shard shard);

}  // namespace muonbed::cli
