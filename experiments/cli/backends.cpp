// What to do about a backend this build does not have (see backends.hpp).
#include "experiments/cli/backends.hpp"

#include "core/base/errors.hpp"
#include "core/results/run_point.hpp"

namespace muonbed::cli {

void require_backend(const std::string& backend, const std::string& file) {
  // Asked before any work (for nccl this loads the CUDA module, as only a GPU command does).
  const std::string why = backend_unavailable(backend, file);
  if (why.empty()) return;
  const std::size_t fix = why.find("; fix: ");
  throw ConfigError(SourceLocation{file, 0, 0}, why.substr(0, fix),
                    fix == std::string::npos ? "" : why.substr(fix + 7));
}

}  // namespace muonbed::cli
