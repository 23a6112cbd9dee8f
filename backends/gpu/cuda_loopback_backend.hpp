// The `cuda_loopback` backend: a point measured with every rank as a logical rank on ONE GPU (the
// CUDA loopback runtime, cuda_loopback.hpp), written as a record like the mpi and nccl backends'
// so that `muonbed compare` reads it. What it measures is one GPU doing all the ranks' work: their
// kernels share its SMs and their messages are copies in its memory, so its step is about the sum
// of the ranks' work, not an N-GPU step, and NVLink and the network are not exercised; the record
// says so in its notes, and compare repeats it.
//
//   CLI side (plain C++, no CUDA): register_cuda_loopback_backend's run function writes the job and
//   starts `muonbed-gpu-worker loopback-job JOB RESULT` (one process, no mpirun; beside the CLI or
//   MUONBED_GPU_WORKER), then reads the record back (backends/launch launch_local_job).
//   Worker side: run_cuda_loopback_job runs the job's warm-up and timed steps, per rank the op
//   intervals from CUDA events (eager) on the GPU's one clock, and builds the record with
//   backends/ranks/record.hpp's measured_record. A step that does not finish within the job's
//   timeout (MUONBED_MPI_TIMEOUT, 60 s) ends the worker with exit code 124 and a message, so a
//   hung GPU never leaves `muonbed run` waiting.
//
// Environment: MUONBED_CUDA_GRAPH=1 replays each step as a captured CUDA graph (no per-op times);
// MUONBED_NS_VERSION=V the Newton-Schulz kernel version (default 2).
#pragma once

#include <string>

namespace muonbed {

// Adds `cuda_loopback` (again: harmless). The CLI gets it from cuda_loopback_registration.cpp.
void register_cuda_loopback_backend();

namespace gpu {
// The worker's side: reads JOB, runs it, writes RESULT (atomically); returns the exit code, 77
// when no GPU is usable. Throws Error on a bad job.
int run_cuda_loopback_job(const std::string& job_file, const std::string& result_file);
}  // namespace gpu

}  // namespace muonbed
