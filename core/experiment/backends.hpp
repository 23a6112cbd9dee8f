// The backends an experiment may name, and what each one is: the one table of backend facts.
// Whether this build has a backend (and can run it here) is the registry's business
// (core/results/run_point.hpp: each backend library registers its run function and its
// availability check); this table says what every name means even where it is not built, so an
// experiment file validates on any machine and a missing backend is explained with its fix.
#pragma once

#include <string>
#include <vector>

namespace muonbed {

struct BackendFacts {
  std::string name;         // as experiments name it (backend: [...])
  std::string description;  // one line
  bool measures = false;    // measured on real ranks (mpi, nccl), or predicted (analytic, sim)
  // What a build lacks without it ("built without MPI (Open MPI, MUONBED_WITH_MPI)") and how to
  // get it, for "not built" messages; empty for the core's own (analytic).
  std::string needs;
  std::string install;
};

// In the order the docs list them: sim, analytic, mpi, nccl.
const std::vector<BackendFacts>& known_backends();
const BackendFacts* backend_facts(const std::string& name);  // null for an unknown name
std::vector<std::string> known_backend_names();
bool is_measured_backend(const std::string& name);  // false for unknown names

}  // namespace muonbed
