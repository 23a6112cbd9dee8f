// Timeline accounting of one step, written once for every backend (analytic, simulated,
// measured): per rank, the time it computed, communicated, communicated without computing
// (exposed) and idled; per collective op, instance counts, sizes and times; and the Chrome /
// Perfetto trace of the first ranks. Backends report intervals as they start and end (in
// nondecreasing time per rank: simulated and analytic clocks do so by construction, a measured
// executor sorts its records first) and get StepMeasurement / CollectiveMeasurement rows for
// core/results/results.hpp's fill_record.
//
// Rules: compute_s is the time with at least one compute op running, communication_s with at
// least one collective, exposed_comm_s with a collective but no compute op, idle_s the step time
// minus the time with anything running, finish_s the time of the rank's last op event. So
// compute_s + exposed_comm_s + idle_s = step time on every rank.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/engine/measurement.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/training.hpp"

namespace muonbed {

enum class Activity { compute, communication };
enum class TraceKind { compute, collective, wait };  // wait: reached a collective, not started

struct TraceEvent {
  int rank = 0;
  int stream = 0;
  int op = 0;
  TraceKind kind = TraceKind::compute;
  double start = 0;  // seconds from the step's start
  double end = 0;
};

class StepTimeline {
 public:
  // `traced_ranks`: ranks 0..traced_ranks-1 keep trace events (0: none).
  StepTimeline(int world_size, int num_ops, int traced_ranks);

  void begin_step();  // clears everything

  // Busy accounting: rank starts / stops an activity at time t (step-relative seconds), for op
  // `op` (-1: not said; then no phase is counted).
  void begin(int rank, Activity activity, double t, int op = -1);
  void end(int rank, Activity activity, double t, int op = -1);
  // A training step's plan: also count, per rank, the time each StepPhase (core/plan/training.hpp)
  // has an op running and when its last op ended (StepMeasurement::phase_busy_s, phase_end_s).
  void track_phases(const StepPlan& plan);
  // An op event of the rank at time t (its finish time is the latest of them).
  void touch_finish(int rank, double t);

  bool traced(int rank) const { return rank < traced_; }
  void trace(const TraceEvent& event);  // kept only for traced ranks

  // One completed collective instance of `op` (waiting excluded from `duration`).
  void collective(int op, int group_size, double bytes, double duration, bool crosses_nodes);
  void add_flops(double flops) { flops_ += flops; }

  // The step's measurement: its time (the latest finish), per-rank breakdown, the collectives
  // that ran (ops in plan order) and the FLOPs. Traffic fields are left to the caller.
  StepMeasurement measurement(int step, int count);
  std::vector<CollectiveMeasurement> collectives() const;
  const std::vector<TraceEvent>& events() const { return events_; }

 private:
  struct RankAccount {
    double last = 0;
    int n_compute = 0;
    int n_comm = 0;
    double compute = 0, comm = 0, exposed = 0, busy = 0, finish = 0;
    std::array<int, kStepPhases> n_phase{};
    std::array<double, kStepPhases> phase_busy{};
    std::array<double, kStepPhases> phase_end{};
  };
  std::vector<int> phase_of_op_;  // empty: phases not tracked
  void touch(int rank, double t);

  int world_;
  int traced_;
  std::vector<RankAccount> ranks_;
  std::vector<CollectiveMeasurement> collectives_;  // per op
  std::vector<TraceEvent> events_;
  double flops_ = 0;
};

// A Chrome / Perfetto trace of one step, as JSON text ("" when traced_ranks is 0): one process
// per node, one thread per rank and stream, times in microseconds from the step's start. `note`
// says what the trace shows. The text ends with a newline, as the file is written (a 1,024-GPU
// trace is ~100 MB: appending the newline at write time copied it once more).
std::string chrome_trace(const StepPlan& plan, const std::vector<TraceEvent>& events,
                         int traced_ranks, int gpus_per_node, int step, const std::string& note);

}  // namespace muonbed
