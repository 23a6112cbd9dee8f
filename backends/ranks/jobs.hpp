// The job protocol of a measured backend's ranks (the other half of backends/launch/): rank 0
// gets a job (launch::Job: from the job file mpirun's worker was started with, or from the
// command it runs in a user-started world) and broadcasts it; every rank runs it with the job
// runner its backend registered; rank 0 gets the point's run.
//
// A backend whose ranks run under this protocol registers a runner in the program its ranks run
// (the mpi backend in the CLI, the nccl backend in muonbed-gpu-worker); jobs of another kind (the
// mpi backend's compute benchmark, kind "compute") register a kind runner. Failures end every
// rank (abort_world) with the message naming the rank; a world of the wrong size is an error on
// rank 0 and a quiet exit elsewhere: every rank knows both sizes, so none hangs.
#pragma once

#include <mpi.h>

#include <optional>
#include <string>

#include "backends/launch/launch.hpp"
#include "backends/ranks/measure.hpp"
#include "core/plan/plan.hpp"
#include "core/results/run_point.hpp"

namespace muonbed::mpi {

// Collective over `world`: runs a point's job (kind "plan") of its backend; the record on rank 0.
// `settings` is what the job says for every backend (steps, trace ranks, cluster, launcher, BLAS
// threads, check step, backend name); the runner adds its own (library, notes, messages_what).
using JobRunner = std::optional<Measured> (*)(const StepPlan& plan, MPI_Comm world,
                                              const launch::Job& job,
                                              const MeasureSettings& settings);
void register_job_runner(const std::string& backend, JobRunner runner);
JobRunner find_job_runner(const std::string& backend);  // null when none is registered

// Collective over `world`: a job of another kind on the ranks that serve rank 0 (rank 0 runs its
// side itself, where it wants the result).
using JobKindRunner = void (*)(const launch::Job& job, MPI_Comm world);
void register_job_kind(const std::string& kind, JobKindRunner runner);

int world_rank();
int world_size();
// True in rank 0 of a world whose other ranks serve its jobs (after mpi_command_begin).
bool leading_world();
// Rank 0 of a world it leads: `job` to every other rank.
void send_job(const launch::Job& job);
// Rank 0 of a world it leads: sends the point's job to every other rank, runs it, and returns the
// point's run (Error when this world's size is not the plan's).
PointRun lead_job(const launch::Job& job);

}  // namespace muonbed::mpi
