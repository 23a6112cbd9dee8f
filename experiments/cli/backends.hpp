// What to do about a backend this build does not have. The backends compiled in register
// themselves (each backend folder's registration, linked whole: cmake/MuonbedBackends.cmake).
#pragma once

#include <string>

namespace muonbed::cli {

// Throws ConfigError at `file` when `backend` cannot run here (core/results/run_point.hpp
// backend_unavailable: not built, or built but unusable on this machine), with the fix. Commands
// call it for every backend before any work starts.
void require_backend(const std::string& backend, const std::string& file);

}  // namespace muonbed::cli
