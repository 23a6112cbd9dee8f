// The backends an experiment may name, and what each one is. A backend's facts are what its
// registration carries (core/results/run_point.hpp register_backend: its folder registers its run
// function, its availability check and these facts). The table here adds the backends this
// project ships, so that their names mean something even in a build without them: an experiment
// file validates on any machine and a missing backend is explained with its fix. A shipped
// backend registers the table's entry (backend_facts("mpi")), and a registration that disagrees
// with the table is refused; a backend the table does not know becomes known when it registers.
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
  // A measured backend that runs all N ranks of a point on ONE device (cuda_loopback): its step
  // is the sum of the ranks' work there, so `muonbed compare` never counts it as a check of an
  // N-device prediction (it is shown, marked, outside the error summaries' checked scope).
  bool ranks_share_one_device = false;
  bool operator==(const BackendFacts&) const = default;
};

// The table's backends in the order the docs list them (sim, analytic, mpi, nccl), then the
// backends registered in this process that the table does not know, in registration order.
const std::vector<BackendFacts>& known_backends();
// Called by register_backend: a name of the table must carry the table's facts (Error otherwise,
// naming both); another name is added, or its facts replaced.
void add_backend_facts(const BackendFacts& facts);
const BackendFacts* backend_facts(const std::string& name);  // null for an unknown name
std::vector<std::string> known_backend_names();
bool is_measured_backend(const std::string& name);  // false for unknown names

}  // namespace muonbed
