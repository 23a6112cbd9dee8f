// The MPI world a measured backend's ranks form (started by backends/launch/): what every executor
// under it shares, whatever runs the rank's ops (the MPI executor's CPU handlers, the NCCL
// executor's GPU): starting MPI, checking its calls, waiting for a request under a watchdog,
// ending every rank on a failure, and which ranks share a host.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "core/base/errors.hpp"

namespace muonbed::mpi {

// Throws ExecutionError with the call's text, file:line and MPI's error string.
void check_mpi(int code, const char* call, const char* file, int line);
#define MUONBED_MPI_CHECK(call) ::muonbed::mpi::check_mpi((call), #call, __FILE__, __LINE__)

// An error whose message already names the rank, step and op: passed on as it is.
class LocatedError : public ExecutionError {
 public:
  using ExecutionError::ExecutionError;
};

// Initializes MPI with MPI_THREAD_FUNNELED (once; again: nothing), after making sure the MPI
// functions are the MPI library's (not SimGrid's SMPI) and, inside a launcher's world, that the
// process ends with its launcher (core/base/process.hpp exit_with_parent).
void init_mpi();

// How `wait_for` and a step loop wait for MPI. Open MPI moves data only inside MPI calls (the
// shared-memory transport's single copy runs in the receiver's MPI_Test), so a rank that sleeps
// between tests delays every message by its sleep: `spin` keeps testing, for a rank whose core
// has nothing else to do; `sleep` backs off, leaving the core to another rank or to compute.
enum class WaitMode { sleep, spin };

// Tests `request` until it completes; throws LocatedError "`where`: no progress for T s in
// `what`" after `timeout_s`.
void wait_for(MPI_Request& request, double timeout_s, const std::string& where,
              const std::string& what, WaitMode mode = WaitMode::sleep);

// Prints "muonbed: error: `message`" on stderr and ends every rank with MPI_Abort.
[[noreturn]] void abort_world(const std::string& message, int code = 1);

// Collective over `world`: the host of every rank (hosts numbered in order of their first rank)
// and the host names, from every rank's gethostname.
struct HostMap {
  std::vector<int> host_of;
  std::vector<std::string> hosts;
  int ranks_on_host_of(int rank) const;  // ranks sharing `rank`'s host, itself included
};
HostMap exchange_hosts(MPI_Comm world);

}  // namespace muonbed::mpi
