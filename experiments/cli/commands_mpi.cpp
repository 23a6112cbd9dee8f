// `muonbed mpi-worker JOB RESULT` (hidden): what `muonbed run --backend mpi` starts under mpirun
// for every rank of a point. Rank 0 reads the job (the plan and how to measure it), every rank
// executes it, rank 0 writes the result file the launching process reads back
// (backends/mpi/mpi_backend.hpp). Without MPI in the build it says so.
#include <iostream>
#include <memory>
#include <string>

#include "experiments/cli/commands.hpp"
#include "muonbed/config.hpp"

#if MUONBED_HAVE_MPI
#include "backends/mpi/mpi_backend.hpp"
#endif

namespace muonbed::cli {

void add_mpi_worker_command(CLI::App& app, int& exit_code) {
  struct Files {
    std::string job, result;
  };
  auto files = std::make_shared<Files>();
  CLI::App* cmd = app.add_subcommand("mpi-worker", "");  // no description: hidden from --help
  cmd->group("");
  cmd->add_option("job", files->job, "job file written by the launching muonbed")->required();
  cmd->add_option("result", files->result, "result file rank 0 writes")->required();
  cmd->callback([files, &exit_code] {
#if MUONBED_HAVE_MPI
    exit_code = run_mpi_worker(files->job, files->result);
#else
    std::cerr << "muonbed: error: this muonbed was built without MPI (mpi-worker is the mpi "
                 "backend's rank process)\n";
    exit_code = 1;
#endif
  });
}

}  // namespace muonbed::cli
