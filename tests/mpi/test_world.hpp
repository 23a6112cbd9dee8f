// How each MPI test program (tests/mpi/*.cpp, started by mpirun.sh) begins: MPI initialized the
// way the measured backends' ranks do it (backends/ranks/world.hpp init_mpi, which also checks
// MPI_THREAD_FUNNELED), and this process's rank and the world's size.
#pragma once

#include <mpi.h>

#include "backends/ranks/world.hpp"

namespace muonbed::testing {

struct TestWorld {
  int rank = 0;
  int size = 1;
};

inline TestWorld start_test_world() {
  mpi::init_mpi();
  TestWorld world;
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.size);
  return world;
}

}  // namespace muonbed::testing
