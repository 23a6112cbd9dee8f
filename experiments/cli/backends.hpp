// The backends compiled into this muonbed: the one place that lists them, registers each with
// core/results/run_point.hpp's registry, and says what to do about a backend this build does not
// have.
#pragma once

#include <string>

namespace muonbed::cli {

// Registers every backend this build has (feature macros of muonbed/config.hpp). Call once,
// before any command runs.
void register_compiled_backends();

// Throws ConfigError at `file` when `backend` cannot run here (core/results/run_point.hpp
// backend_unavailable: not built, or built but unusable on this machine), with the fix. Commands
// call it for every backend before any work starts.
void require_backend(const std::string& backend, const std::string& file);

}  // namespace muonbed::cli
