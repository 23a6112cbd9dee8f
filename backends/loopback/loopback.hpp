// The in-process loopback executor: every rank of a plan in one process, with real data and real
// Newton-Schulz, driven by the one execution engine of core/engine/engine.hpp (no second
// interpreter of the plan's semantics). Each rank runs its lowered program (core/plan/program.hpp)
// on its own store; the engine's start_compute runs the CPU handler (backends/cpu/handlers.hpp) and
// completes at once; start_collective moves each phase's messages between the members' stores in
// the wire dtype (what the plan says moves, counted per op and pair) and completes. Step k uses the
// plan's period pattern of step k; data come from backends/cpu/data.hpp's seeds.
//
// It is the reference executor for equivalence: after S steps, backends/cpu/check.hpp compares
// every rank's pieces with the single-device reference.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "backends/cpu/handlers.hpp"
#include "backends/cpu/store.hpp"
#include "core/engine/engine.hpp"
#include "core/plan/program.hpp"

namespace muonbed {

struct LoopbackOptions {
  std::uint64_t seed = 1;
  LowerOptions lower;
  // What compute ops do (default: cpu::run_compute, the optimizer). Tests swap in other numerics
  // to trace data movement.
  std::function<void(const RankOp&, cpu::RankStore&, const cpu::StepContext&)> compute;
  // Fills a rank's inputs at the start of a step (default: cpu::fill_gradients), and its initial
  // state once (default: cpu::fill_parameters).
  std::function<void(const RankProgram&, cpu::RankStore&, int step)> inputs;
  std::function<void(const RankProgram&, cpu::RankStore&)> initial;
  // Negative controls: edits each lowered program before anything runs (e.g. drops the messages
  // of a split Newton-Schulz's Gram all-reduce), so a test can prove the check catches the fault.
  std::function<void(RankProgram&)> edit_program;
};

class LoopbackExecutor {
 public:
  // Lowers every rank's program; throws PlanError / ExecutionError before running anything when
  // the plan cannot run here.
  explicit LoopbackExecutor(const StepPlan& plan, LoopbackOptions options = {});
  ~LoopbackExecutor();

  // Runs the next step (step index steps_done()); throws ExecutionError naming the stalled ops if
  // the step cannot finish.
  void run_step();
  void run(int steps) {
    for (int i = 0; i < steps; ++i) run_step();
  }
  int steps_done() const { return steps_; }

  const StepPlan& plan() const { return plan_; }
  const RankProgram& program(int rank) const { return programs_.at(rank); }
  const cpu::RankStore& store(int rank) const { return *stores_.at(rank); }
  cpu::RankStore& store(int rank) { return *stores_.at(rank); }

  // Bytes rank `from` sent rank `to` in op `op`, summed over the steps run.
  std::int64_t bytes_moved(int op, int from, int to) const;
  // How many times each op ran on each rank (compute) or instance (collective), for checks.
  std::int64_t ran(int op) const { return ran_.at(op); }

 private:
  class Handler;
  const StepPlan& plan_;
  LoopbackOptions options_;
  std::vector<RankProgram> programs_;
  std::vector<std::unique_ptr<cpu::RankStore>> stores_;
  PlanIndex index_;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<Engine> engine_;
  std::map<std::tuple<int, int, int>, std::int64_t> moved_;
  std::vector<std::int64_t> ran_;
  int steps_ = 0;
};

}  // namespace muonbed
