// The ranks' MPI world (see backends/ranks/world.hpp).
#include "backends/ranks/world.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "backends/launch/launch.hpp"
#include "core/base/process.hpp"

namespace muonbed::mpi {

void check_mpi(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw ExecutionError(std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                       ": " + std::string(text, static_cast<std::size_t>(length)));
}

void init_mpi() {
  // SimGrid's library exports SMPI's MPI_* too: a program that links it before libmpi would call
  // the simulator's MPI (experiments/CMakeLists.txt links libmpi first).
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) != 0 && info.dli_fname != nullptr &&
      std::string(info.dli_fname).find("simgrid") != std::string::npos)
    throw Error(std::string("MPI_Init_thread resolves to ") + info.dli_fname +
                " (SimGrid's SMPI), not to the MPI library; fix: link libmpi before SimGrid");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  // A rank whose launcher (mpirun, orted) is killed must not run on alone (core/base/process.hpp).
  if (launch::mpi_environment().inside) exit_with_parent();
  int provided = 0;
  MUONBED_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  if (provided < MPI_THREAD_FUNNELED)
    throw Error(
        "this MPI library does not provide MPI_THREAD_FUNNELED (compute threads beside "
        "MPI on the main thread); fix: an MPI built with thread support");
}

void abort_world(const std::string& message, int code) {
  std::cerr << "muonbed: error: " << message << std::endl;
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; in case it does
}

void wait_for(MPI_Request& request, double timeout_s, const std::string& where,
              const std::string& what, WaitMode mode) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int sleep_us = 0;
  while (true) {
    int done = 0;
    MUONBED_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (waited > timeout_s)
      throw LocatedError(where + ": no progress for " + std::to_string(static_cast<int>(waited)) +
                         " s in " + what + " (timeout " + std::to_string(timeout_s) +
                         " s): another rank stopped before it (its message names it)");
    if (mode == WaitMode::spin) continue;
    sleep_us = std::min(std::max(2 * sleep_us, 10), 1000);
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  }
}

int HostMap::ranks_on_host_of(int rank) const {
  const int host = host_of.at(static_cast<std::size_t>(rank));
  return static_cast<int>(std::count(host_of.begin(), host_of.end(), host));
}

HostMap exchange_hosts(MPI_Comm world) {
  int size = 1;
  MUONBED_MPI_CHECK(MPI_Comm_size(world, &size));
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::vector<char> all(static_cast<std::size_t>(size) * sizeof name);
  MUONBED_MPI_CHECK(
      MPI_Allgather(name, sizeof name, MPI_CHAR, all.data(), sizeof name, MPI_CHAR, world));
  HostMap map;
  map.host_of.assign(static_cast<std::size_t>(size), 0);
  for (int r = 0; r < size; ++r) {
    const std::string h(all.data() + static_cast<std::size_t>(r) * sizeof name);
    const auto it = std::find(map.hosts.begin(), map.hosts.end(), h);
    map.host_of[static_cast<std::size_t>(r)] = static_cast<int>(it - map.hosts.begin());
    if (it == map.hosts.end()) map.hosts.push_back(h);
  }
  return map;
}

}  // namespace muonbed::mpi
