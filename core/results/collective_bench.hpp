// `muonbed bench collective` as a library: nccl-tests' table (size, count, type, redop, root,
// time, algbw, busbw, #wrong) for one collective on any registered backend. Each size becomes a
// tiny synthetic plan holding that one collective over the bench's groups (a synthetic model
// whose pieces give nccl-tests' buffer size S for the op; before it, for ops that move updates, a
// momentum op that makes them, so a real executor has data to send), run through the point
// runner of core/results/run_point.hpp like any experiment point; the row reads the collective's
// instance time from the result's collective entry. So a backend appears here by registering
// (analytic, sim, mpi; nccl when its executor registers), and a real backend runs its own timed
// loop with the warmup and iteration counts of RunSettings, then one untimed pass whose messages
// carry a known pattern that every receiver checks (RunSettings::check_data: the #wrong column).
//
// Buffers (S = the size asked for, e = the element size, n = the group size; pieces are rounded
// down to whole elements, as nccl-tests does, so the printed size is what moves):
//   all_gather, reduce_scatter, gather, scatter  one tensor sharded over the group: each member
//                                                holds S/n (reduce_scatter and scatter start
//                                                from the whole S)
//   all_reduce, broadcast                        one replicated tensor of S
//   all_to_all                                   n tensors of S, tensor j owned by member j and
//                                                sharded over the group: each member sends S/n
//                                                to every member (nccl-tests' S per rank)
//   sendrecv                                     every member sends S to the next one and
//                                                receives S from the previous one, at once (n
//                                                send ops on their own streams)
// The count column follows nccl-tests: elements per rank for all_gather, reduce_scatter,
// gather, scatter and all_to_all (per peer), of the whole buffer otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/experiment/experiment.hpp"
#include "core/plan/plan.hpp"
#include "core/results/run_point.hpp"

namespace muonbed {

// The ops the bench knows, by nccl-tests' names: all_gather, reduce_scatter, all_reduce,
// all_to_all, broadcast, gather, scatter, sendrecv.
const std::vector<std::string>& collective_bench_ops();

struct CollectiveBenchSpec {
  std::string op = "all_gather";  // one of collective_bench_ops()
  DeviceMesh mesh;                // the ranks (cluster placement: rank r on GPU r)
  DimSet group;                   // dims the collective spans (1 or 2 dims)
  int root = 0;                   // broadcast, gather, scatter: group-local root
  DType dtype = DType::fp32;      // nccl-tests' default type is float
};

// "1K:1G" (doubling, nccl-tests' -b 1K -e 1G -f 2), "1K:1G:4" (factor 4) or one size "64M";
// suffixes K, M, G (powers of 1024) or none. Throws ConfigError with the fix.
std::vector<std::int64_t> parse_size_range(const std::string& text);

// The synthetic plan of one bench size. Throws ConfigError for an op, group, root or size the
// bench cannot build (with the fix).
StepPlan collective_bench_plan(const CollectiveBenchSpec& spec, std::int64_t size_bytes);

struct CollectiveBenchRow {
  std::string op;
  std::int64_t size_bytes = 0;  // what the plan moves (nccl-tests' S)
  std::int64_t count = 0;       // nccl-tests' count column
  std::string type;             // "float", "bfloat16", "half"
  std::string redop;            // "sum" or "none"
  int root = -1;                // -1 where the op has none
  int gpus = 0;                 // ranks of the mesh
  int nodes = 0;
  int group_size = 0;
  int instances = 0;  // concurrent group instances
  double time_us = 0;
  double algbw_GBps = 0;
  double busbw_GBps = 0;    // algbw x bus_factor (core/engine/cost_model.hpp)
  std::int64_t wrong = -1;  // elements a real backend found wrong; -1: not checked (N/A)
  std::string backend;
  std::string fidelity;
  // Measured backends: the instance time of each timed iteration (time_us is their mean) and
  // its min, median and max; empty and 0 for predictions (one deterministic, modelled time).
  std::vector<double> iteration_us;
  // Measured rows with a speed probe (RunSettings::speed_probe_from_profile): the probe's
  // shape, its predicted time and its times before and after the row's iterations; 0: none.
  std::string probe_shape;
  double probe_predicted_s = 0;
  double probe_before_s = 0;
  double probe_after_s = 0;
  double min_us = 0;
  double median_us = 0;
  double max_us = 0;
};

// The min, median (the mean of the middle two of an even count) and max of iteration times;
// all 0 for none.
struct IterationSpread {
  double min = 0;
  double median = 0;
  double max = 0;
};
IterationSpread iteration_spread(std::vector<double> times);

// A measured size whose slowest iteration took more than this times its fastest is noisy: the
// machine did other work meanwhile (rerun on a quiet machine, or with more --iters).
constexpr double kNoisySpread = 1.5;
// Measured rows only: max_us / min_us > kNoisySpread (or a fastest iteration of 0 beside a
// slower one).
bool noisy(const CollectiveBenchRow& row);

// Runs one size on `backend` (registered) with the experiment's cluster and settings; the
// experiment's mesh must be the spec's.
CollectiveBenchRow run_collective_bench(const CollectiveBenchSpec& spec,
                                        const Experiment& experiment, std::int64_t size_bytes,
                                        const std::string& backend,
                                        const RunSettings& settings = {});

// nccl-tests' column header (the "out-of-place" block) and one row, exactly its widths.
// `measured`: three more columns, min, median and max over the timed iterations (us); a
// measured row (one with iteration times) prints them, and "noisy: rerun on a quiet machine"
// after them when noisy(row).
std::string collective_bench_header(bool measured = false);
std::string collective_bench_line(const CollectiveBenchRow& row);
// One JSON object per row: op, size_bytes, count, type, redop, root, gpus, nodes, group_size,
// instances, time_us, algbw_GBps, busbw_GBps, wrong (null: not checked), backend, fidelity;
// measured rows add min_time_us, median_time_us, max_time_us, iterations and noisy.
nlohmann::ordered_json collective_bench_json(const CollectiveBenchRow& row);

}  // namespace muonbed
