// The `mpi` backend of core/results/run_point.hpp's registry: real execution of a plan with one
// process per rank under Open MPI (backends/mpi/executor.hpp), measured (backends/mpi/measure.hpp).
// This header is the CLI's whole view of it and includes no MPI header.
//
// Two ways to run, one code path. A point runs as a *job* (the plan, the experiment's warm-up and
// timed steps and seed, the watchdog's timeout, a fault to inject) that rank 0 broadcasts and
// every rank executes; rank 0 gets the record.
//   * `muonbed run EXP --backend mpi` outside MPI: the backend's run function starts
//     `mpirun -np N [--oversubscribe] [--allow-run-as-root] --bind-to none muonbed mpi-worker
//     JOB RESULT` for each point (N from the mesh), waits, and reads the record back; the CLI
//     around it (progress, atomic results, resume, manifests, plots) is the simulator's.
//   * `mpirun -np N muonbed run EXP` or `srun -n N muonbed run EXP` (a multi-node cluster): every
//     process starts the command; mpi_command_begin initializes MPI, ranks other than 0 serve
//     rank 0's jobs until it ends the command; rank 0 runs the command as usual and its mpi
//     points run on the world it is part of. A point whose mesh needs another world size is an
//     error on rank 0 (the other points still run), never a hang.
//
// Environment (read by the process that starts a point: the launcher, or rank 0):
//   MUONBED_MPI_TIMEOUT=SECONDS   the watchdog (default 60): every rank exits non-zero within it
//                                 when a rank stops (see executor.hpp)
//   MUONBED_MPI_FAULT=R:S:OP:KIND fault injection for tests: rank R exits / throws / hangs
//                                 (KIND exit | throw | hang) when it reaches plan op OP in step S
//   MUONBED_MPI_EXCHANGE=alltoallv every data phase as MPI_Ialltoallv (a cross-check)
//   MUONBED_BLAS_THREADS=N        OpenBLAS threads per rank (default 1)
//   MUONBED_MPIRUN=PATH           the mpirun to start (default: the one found at configure time,
//                                 else `mpirun` on PATH)
#pragma once

#include <string>
#include <vector>

#include "core/plan/plan.hpp"
#include "core/results/calibration.hpp"

namespace muonbed {

// Adds `mpi` to the backend registry (core/results/run_point.hpp).
void register_mpi_backend();
// Adds `nccl`: the same launcher and worker protocol, with the ranks run by the GPU worker program
// (muonbed-gpu-worker, beside the CLI, or MUONBED_GPU_WORKER), which links CUDA and NCCL so that
// the CLI does not. Registered by a CLI built with CUDA, NCCL and MPI.
void register_nccl_backend();

// The MPI world this process was started in, from its launcher's environment (Open MPI's mpirun,
// PMIx, PMI-1/2 as MPICH and srun --mpi=pmi2 set it, Slurm's srun), without calling MPI.
struct MpiEnvironment {
  bool inside = false;
  int rank = 0;
  int size = 0;  // 0 when the launcher does not say (MPI_Comm_size tells after MPI_Init)
  std::string launcher;
};
MpiEnvironment mpi_environment();

// For a command that may run the mpi backend (`muonbed run`), at its start. Outside an MPI world
// it does nothing and returns -1. Inside one it initializes MPI; rank 0 returns -1 and goes on
// with the command; every other rank serves rank 0's jobs until rank 0 calls mpi_command_end,
// then returns the exit code to end with (0). Call mpi_command_end on every rank that got -1
// (the CLI does so when the command returns or throws).
int mpi_command_begin();
void mpi_command_end();

// The hidden `muonbed mpi-worker JOB RESULT` that the launcher starts under mpirun: rank 0 reads
// the job file and broadcasts it, every rank executes it, rank 0 writes the result file. Returns
// the exit code (a failure ends every rank through MPI_Abort before returning).
int run_mpi_worker(const std::string& job_file, const std::string& result_file);

// `muonbed calibrate`: the compute benchmark (backends/mpi/measure.hpp's compute_bench) on every
// rank of the world this process leads (rank 0 after mpi_command_begin), the ranks one at a time
// or, `concurrent`, all at once; rows on rank 0.
std::vector<ComputeBenchRow> run_compute_bench(const std::vector<StepPlan>& plans, int warmup,
                                               int repeats, bool concurrent);
// Starts this program under mpirun with `ranks` ranks (--oversubscribe beyond the cores,
// --allow-run-as-root as root, --bind-to none) and `args`, its output passed through; returns
// the exit code.
int relaunch_under_mpirun(int ranks, const std::vector<std::string>& args);
// True in rank 0 of an MPI world after mpi_command_begin (the process that runs the command).
bool mpi_leader();
// MPI_Get_library_version's first line.
std::string mpi_library_version();

}  // namespace muonbed
