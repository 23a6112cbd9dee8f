// The `nccl` backend of core/results/run_point.hpp's registry, as the CLI sees it: its run
// function starts the point's ranks with backends/launch/ (mpirun, one process per GPU) as
// muonbed-gpu-worker (beside the CLI, or MUONBED_GPU_WORKER), which links CUDA and NCCL so that
// the CLI does not, and runs NcclExecutor under the ranks' job protocol (nccl_executor.hpp
// register_nccl_job_runner). This side is plain C++: no CUDA, NCCL or MPI header or library.
//
// Environment, besides the launcher's (backends/launch/launch.hpp):
//   MUONBED_NCCL_GRAPH=1      capture each step pattern once as a CUDA graph, then replay it
//   MUONBED_NS_VERSION=V      the Newton-Schulz kernel version (default 2)
//   MUONBED_GPU_WORKER=PATH   the worker program to start
#pragma once

namespace muonbed {

// Adds `nccl` (again: harmless). The CLI gets it from backends/gpu/nccl_registration.cpp.
void register_nccl_backend();

}  // namespace muonbed
