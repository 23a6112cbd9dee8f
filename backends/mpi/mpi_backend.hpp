// The `mpi` backend of core/results/run_point.hpp's registry: real execution of a plan with one
// process per rank under Open MPI (backends/mpi/executor.hpp), measured (backends/ranks/
// measure.hpp). This header is the CLI's whole view of it and includes no MPI header.
//
// Two ways to run, one code path. A point runs as a *job* (backends/launch/launch.hpp: the plan,
// the experiment's warm-up and timed steps and seed, the watchdog's timeout, a fault to inject)
// that rank 0 broadcasts and every rank executes (backends/ranks/jobs.hpp); rank 0 gets the record.
//   * `muonbed run EXP --backend mpi` outside MPI: the backend's run function starts
//     `mpirun -np N [--oversubscribe] [--allow-run-as-root] --bind-to none muonbed mpi-worker
//     JOB RESULT` for each point (N from the mesh; backends/launch/), waits, and reads the record
//     back; the CLI around it (progress, atomic results, resume, manifests, plots) is the
//     simulator's.
//   * `mpirun -np N muonbed run EXP` or `srun -n N muonbed run EXP` (a multi-node cluster): every
//     process starts the command; mpi_command_begin (backends/ranks/worker.hpp) initializes MPI,
//     ranks other than 0 serve rank 0's jobs until it ends the command; rank 0 runs the command
//     as usual and its mpi points run on the world it is part of. A point whose mesh needs another
//     world size is an error on rank 0 (the other points still run), never a hang.
//
// Environment (read by the process that starts a point: the launcher, or rank 0), besides the
// launcher's (backends/launch/launch.hpp: MUONBED_MPI_TIMEOUT, MUONBED_MPI_FAULT,
// MUONBED_BLAS_THREADS, MUONBED_MPIRUN):
//   MUONBED_MPI_EXCHANGE=alltoallv every data phase as MPI_Ialltoallv (a cross-check)
//   MUONBED_MPI_COMPUTE=MODE       where compute runs (executor.hpp ComputeMode)
//   MUONBED_MPI_SPEED_PROBE=off    no machine-speed probe around the steps
#pragma once

#include <string>
#include <vector>

#include "backends/launch/launch.hpp"
#include "backends/ranks/worker.hpp"
#include "core/plan/plan.hpp"
#include "core/results/calibration.hpp"

namespace muonbed {

// Adds `mpi` to the backend registry (core/results/run_point.hpp) and its job runner to the
// ranks' (backends/ranks/jobs.hpp); again: harmless. Programs that run experiments get it from
// the backend's registration (backends/mpi/registration.cpp).
void register_mpi_backend();
// `muonbed calibrate`: the compute benchmark (backends/mpi/measure.hpp's compute_bench) on every
// rank of the world this process leads (rank 0 after mpi_command_begin), the ranks one at a time
// or, `concurrent`, all at once; rows on rank 0.
std::vector<ComputeBenchRow> run_compute_bench(const std::vector<StepPlan>& plans, int warmup,
                                               int repeats, bool concurrent);
// MPI_Get_library_version's first line.
std::string mpi_library_version();

}  // namespace muonbed
