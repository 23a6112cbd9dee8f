// Where one rank's step went on the GPU, from the CUDA events the executors record around every
// op of an eager step (DeviceOptions::time_ops): per stream, per op kind, and per group of
// Newton-Schulz ops of the same batches, so that the in-step NS time can be set beside the same
// batches timed alone (calibrate's timer). Plain C++ (host arithmetic only), CPU-tested: the
// worker's `--op-times` table and its JSON come from here.
//
// An op's time is end - start of its two events: the start event is recorded after the op's
// waits, so it is the op's own work (its kernels and the launch gaps between them), not the time
// it waited for other streams. Ops of one CUDA stream run one after another; the ops of
// different streams overlap, so their sums are not additive: `busy_ms` is per stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/plan/plan.hpp"
#include "core/plan/program.hpp"
#include "kernels/newton_schulz.hpp"

namespace muonbed::gpu {

// Start and end of one op on its stream, ms from the step's start event.
struct DeviceOpTime {
  int op = -1;  // plan op id
  int stream = 0;
  double start_ms = 0, end_ms = 0;
};

struct StreamTimeSummary {
  std::string stream;  // the plan stream's name
  int ops = 0;
  double busy_ms = 0;   // the union of its ops' intervals
  double first_ms = 0;  // the first op's start
  double last_ms = 0;   // the last op's end
};

struct KindTimeSummary {
  std::string stream;
  std::string kind;  // to_string(OpKind)
  int ops = 0;
  double ms = 0;      // the sum of the ops' times
  double max_ms = 0;  // the longest op
};

// Newton-Schulz ops that run the same batched calls (the executor's ns_batches of the op: one
// call per distinct matrix shape, batch = how many matrices of that shape), in the order the
// executor issues them.
struct NsGroupSummary {
  std::vector<MatrixShape> calls;
  int ops = 0;
  double ms = 0;  // the sum of the ops' times
};

struct OpTimeSummary {
  double window_ms = 0;  // first start to last end over every timed op
  int ops_timed = 0;
  int ops_dropped = 0;  // events from another step (start before the step, end before start)
  std::vector<StreamTimeSummary> streams;  // in plan stream order, streams with timed ops
  std::vector<KindTimeSummary> kinds;      // by stream, then by time, longest first
  std::vector<NsGroupSummary> ns;          // longest first
  // Every distinct call shape of `ns` (batch included), the largest first: what to time alone.
  std::vector<MatrixShape> ns_call_shapes() const;
};

// Throws ExecutionError for an op the rank's program does not hold or a stream the plan lacks.
OpTimeSummary summarize_op_times(const StepPlan& plan, const RankProgram& program,
                                 const std::vector<DeviceOpTime>& times);

}  // namespace muonbed::gpu
