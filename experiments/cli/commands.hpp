// The subcommands of the `muonbed` CLI. Each command file adds its subcommand to the app and runs
// it from the subcommand's callback, storing the process exit code in `exit_code`. Commands
// throw muonbed::Error for bad input; main() turns that into "muonbed: error: ..." and exit 2
// (ConfigError) or 1 (anything else).
#pragma once

#include <CLI/CLI.hpp>

namespace muonbed::cli {

void add_validate_command(CLI::App& app, int& exit_code);
void add_plan_command(CLI::App& app, int& exit_code);
void add_presets_command(CLI::App& app, int& exit_code);
void add_run_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
void add_calibrate_command(CLI::App& app, int& exit_code);
void add_compare_command(CLI::App& app, int& exit_code);
void add_keys_command(CLI::App& app, int& exit_code);
// Hidden: the process mpirun starts for each rank of an mpi point (backends/mpi/mpi_backend.hpp).
void add_mpi_worker_command(CLI::App& app, int& exit_code);

}  // namespace muonbed::cli
