// The programs' entry points into the ranks' job protocol (backends/ranks/jobs.hpp), without an
// MPI header: the CLI's `muonbed mpi-worker JOB RESULT` and `muonbed-gpu-worker mpi-worker`, and
// the ranks of a user-started world (`mpirun -np N muonbed run EXP`).
#pragma once

#include <string>

namespace muonbed {

// For a command that may run a measured backend (`muonbed run`), at its start. Outside an MPI
// world it does nothing and returns -1. Inside one it initializes MPI; rank 0 returns -1 and goes
// on with the command; every other rank serves rank 0's jobs until rank 0 calls mpi_command_end,
// then returns the exit code to end with (0). Call mpi_command_end on every rank that got -1
// (the CLI does so when the command returns or throws).
int mpi_command_begin();
void mpi_command_end();
// True in rank 0 of an MPI world after mpi_command_begin (the process that runs the command).
bool mpi_leader();

// The hidden `mpi-worker JOB RESULT` that backends/launch/'s launch_job starts under mpirun:
// rank 0 reads the job file and broadcasts it, every rank runs it, rank 0 writes the result file
// (launch::run_to_json). Returns the exit code (a failure ends every rank through MPI_Abort before
// returning).
int run_mpi_worker(const std::string& job_file, const std::string& result_file);

}  // namespace muonbed
