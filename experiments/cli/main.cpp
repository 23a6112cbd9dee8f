// Entry point of the `muonbed` command line: validate experiment files, print step plans with an
// analytic time estimate, run experiments on the simulator, list presets, and benchmark
// Newton-Schulz. Every failure ends as one "muonbed: error: ..." message on stderr with exit code
// 2 for bad input (config files, command line) and 1 for anything else; no exception escapes.
#include <algorithm>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/base/errors.hpp"
#include "core/base/suggest.hpp"
#include "experiments/cli/backends.hpp"
#include "experiments/cli/commands.hpp"
#include "muonbed/config.hpp"

namespace {

constexpr const char* kFooter = R"(Start here:
  muonbed presets                               models, clusters, strategies you can name
  muonbed keys [strategy]                       every key of an experiment file (docs/KEYS.md)
  muonbed validate experiments/quickstart.yaml  check an experiment file (every sweep point)
  muonbed plan experiments/quickstart.yaml      per-rank work, traffic, memory and step time
  muonbed run experiments/quickstart.yaml       simulate every sweep point, write results, plot
  muonbed plan experiments/quickstart.yaml --point strategy.name=owner --json plans/
  muonbed bench ns --device cpu                 validate and time Newton-Schulz kernels
  muonbed calibrate --backend mpi --out my.yaml measure this machine into a cluster profile
  muonbed compare experiments/validate_cpu.yaml measured beside predicted, per point
Experiment files: experiments/*.yaml (the header comment of each says what it studies);
clusters: experiments/clusters/*.yaml. 'muonbed COMMAND --help' shows a command's options.)";

// ConfigError's message already reads "FILE:LINE:COL: error: WHAT\n  fix: ..."; print it after
// "muonbed: error: " without repeating "error:".
std::string strip_error_prefix(const std::string& message) {
  const std::string marker = "error: ";
  const std::size_t at = message.find(marker);
  const std::size_t newline = message.find('\n');
  if (at == std::string::npos || (newline != std::string::npos && at > newline)) return message;
  return message.substr(0, at) + message.substr(at + marker.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"muonbed " MUONBED_VERSION
               ": plan, simulate and measure distributed Muon optimizer steps"};
  app.name("muonbed");
  app.footer(kFooter);
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("muonbed ") + MUONBED_VERSION);
  int exit_code = 0;
  try {
    muonbed::cli::add_validate_command(app, exit_code);
    muonbed::cli::add_plan_command(app, exit_code);
    muonbed::cli::add_presets_command(app, exit_code);
    muonbed::cli::add_run_command(app, exit_code);
    muonbed::cli::add_bench_command(app, exit_code);
    muonbed::cli::add_calibrate_command(app, exit_code);
    muonbed::cli::add_compare_command(app, exit_code);
    muonbed::cli::add_keys_command(app, exit_code);
    muonbed::cli::add_mpi_worker_command(app, exit_code);
    // An unknown first word would otherwise read "A subcommand is required".
    const std::vector<CLI::App*> commands = app.get_subcommands({});
    const bool known_command =
        argc > 1 && std::any_of(commands.begin(), commands.end(),
                                [&](const CLI::App* c) { return c->get_name() == argv[1]; });
    if (argc > 1 && argv[1][0] != '-' && !known_command) {
      std::vector<std::string> names;
      std::string known;
      for (const CLI::App* sub : commands) {
        names.push_back(sub->get_name());
        known += (known.empty() ? "" : ", ") + sub->get_name();
      }
      std::cerr << "muonbed: error: unknown command '" << argv[1] << "'"
                << muonbed::did_you_mean(argv[1], names) << "\n  fix: use one of: " << known
                << " (muonbed --help shows examples)\n";
      return 2;
    }
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "muonbed: error: " << e.what() << "\n  run 'muonbed --help' (or 'muonbed "
              << "COMMAND --help') for usage and examples\n";
    return 2;
  } catch (const muonbed::ConfigError& e) {
    std::cerr << "muonbed: error: " << strip_error_prefix(e.what()) << "\n";
    return 2;
  } catch (const muonbed::Error& e) {
    std::cerr << "muonbed: error: " << e.what() << "\n";
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // Every path muonbed uses is checked first; this is the net for one that fails later.
    std::cerr << "muonbed: error: " << e.code().message() << ": '" << e.path1().string() << "'"
              << "\n  fix: " << muonbed::path_error_fix(e.code().value(), true) << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "muonbed: error: out of memory\n  fix: use a smaller mesh, model or sweep "
                 "(README, 'Limits')\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "muonbed: error: internal error: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::cerr << "muonbed: error: internal error (unknown exception)\n";
    return 1;
  }
  return exit_code;
}
