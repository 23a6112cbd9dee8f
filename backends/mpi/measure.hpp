// The MPI executor measured (backends/ranks/measure.hpp's loop and record over
// backends/mpi/executor.hpp), and the compute side of `muonbed calibrate` on CPU ranks.
#pragma once

#include <mpi.h>

#include <optional>
#include <vector>

#include "backends/mpi/executor.hpp"
#include "backends/ranks/measure.hpp"
#include "core/results/calibration.hpp"

namespace muonbed::mpi {

// Collective over `world`: runs the steps and returns the record on rank 0 (nullopt elsewhere).
// With `twin` (a training point's AdamW twin), a second executor runs it beside the first and the
// two plans' timed steps interleave (backends/ranks/measure.hpp measure_paired); the twin runs
// without `options.fault`, whose op numbers are the point's plan's.
std::optional<Measured> measure(const StepPlan& plan, MPI_Comm world,
                                const ExecutorOptions& options, const MeasureSettings& settings,
                                const StepPlan* twin = nullptr);

// Collective over `world`: the compute half of `muonbed calibrate`. Each plan is a
// compute_bench_plan (core/results/calibration.hpp); every rank runs its momentum, newton_schulz
// and apply_update ops with backends/cpu's handlers, an fp32 GEMM of the matrix's X X^T and the
// packing of the matrix to bf16: `warmup` untimed calls, then `repeats` rounds of back-to-back
// calls, each round after a barrier, the ranks taking turns (`concurrent` false: each has the
// machine's cores to itself, as when ranks have cores of their own) or all at once (`concurrent`:
// they share cores, caches and memory bandwidth). Rank 0 gets per plan and kernel the median over
// rounds of the slowest rank's mean call (other ranks an empty list). `newton_schulz_only`: the
// newton_schulz rows alone (no other kernel, no host-comm rows).
std::vector<ComputeBenchRow> compute_bench(const std::vector<StepPlan>& plans, MPI_Comm world,
                                           int warmup, int repeats, double timeout_s,
                                           bool concurrent, bool newton_schulz_only = false);

// Collective: the machine-speed probe of a measured point (core/results/calibration.hpp
// speed_probe). Seconds per Newton-Schulz call of the probe plan's matrix, measured as calibrate
// measures gpu.ns_table (the ranks taking turns, the median round of the slowest rank) but with
// fewer rounds; rank 0 gets it, other ranks 0.
double time_newton_schulz(const StepPlan& probe_plan, MPI_Comm world, double timeout_s);

}  // namespace muonbed::mpi
