// What a backend measured or predicted for one step, before it becomes a result record: the
// per-rank time breakdown, per-pattern and per-collective measurements, and the distinct step
// patterns of a plan's hyper-period. The engine (timeline.hpp, cost_model.hpp) produces these
// rows; core/results/results.hpp's fill_record turns them into the record schema, which
// includes this header, so the engine never includes the results room.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/plan/plan.hpp"
#include "core/plan/training.hpp"

namespace muonbed {

// One rank's step (core/engine/timeline.hpp states the rules): busy time on compute ops, time
// inside collective instances, the part of it not overlapped by compute, step time minus busy
// time, completion of the rank's last op.
struct TimeBreakdown {
  double compute_s = 0;
  double communication_s = 0;
  double exposed_comm_s = 0;
  double idle_s = 0;
  double finish_s = 0;
};

// What a backend measured or predicted for one distinct step pattern.
struct StepMeasurement {
  int step = 0;
  int count = 0;
  double time_s = 0;
  std::vector<TimeBreakdown> ranks;  // per rank
  std::vector<double> bytes_sent;    // per rank (empty: unknown)
  std::vector<double> bytes_received;
  double intra_node_bytes = 0;
  double network_bytes = 0;
  double flops = 0;  // optimizer FLOPs of all ranks in this step
  // A training step's plan (core/plan/training.hpp): per rank, the time each StepPhase had an op
  // running, and when its last op of that phase ended; empty otherwise.
  std::vector<std::array<double, kStepPhases>> phase_busy_s;
  std::vector<std::array<double, kStepPhases>> phase_end_s;
};

// Per collective op and step pattern: instance times and sizes, accumulated by the backend.
struct CollectiveMeasurement {
  int op = -1;
  int group_size = 0;
  int instances = 0;
  double bytes_sum = 0;
  double time_sum = 0;
  double time_max = 0;
  bool crosses_nodes = false;
};

// The distinct step patterns of a plan's hyper-period: the first step k of each pattern (the set
// of ops active in k) and how many steps of the hyper-period share it. Steps are counted up to
// 2^20 (a longer hyper-period is averaged over its first 2^20 steps, as estimate() does).
struct StepPatternSpec {
  int step = 0;
  int count = 0;
};
std::vector<StepPatternSpec> step_patterns(const StepPlan& plan);
// Total number of steps the patterns cover (their counts' sum).
std::int64_t pattern_steps(const std::vector<StepPatternSpec>& patterns);

}  // namespace muonbed
