// The table of backend facts (core/experiment/backends.hpp).
#include "core/experiment/backends.hpp"

#include "core/base/errors.hpp"

namespace muonbed {

namespace {

const std::vector<BackendFacts>& shipped_backends() {
  static const std::vector<BackendFacts> table = {
      {.name = "sim",
       .description = "SimGrid replay of the plan on the modelled cluster (sim/)",
       .measures = false,
       .needs = "SimGrid (3.32, MUONBED_WITH_SIMGRID)",
       .install = "install libsimgrid-dev (bash scripts/install-deps) and rebuild"},
      {.name = "analytic",
       .description = "closed-form cost model on the execution engine (core/engine)",
       .measures = false},
      {.name = "mpi",
       .description = "measured: one Open MPI process per rank on CPU ranks (backends/mpi)",
       .measures = true,
       .needs = "MPI (Open MPI, MUONBED_WITH_MPI)",
       .install = "install libopenmpi-dev and openmpi-bin (bash scripts/install-deps) and rebuild"},
      {.name = "nccl",
       .description = "measured: NCCL and CUDA kernels, one GPU per rank (backends/gpu)",
       .measures = true,
       .needs = "CUDA, NCCL and MPI (MUONBED_WITH_CUDA, MUONBED_WITH_MPI)",
       .install = "install the CUDA Toolkit with NCCL and libopenmpi-dev and rebuild"},
      {.name = "cuda_loopback",
       .description = "measured: every rank as a logical rank on ONE GPU, messages as device "
                      "copies; the sum of the ranks' work, not an N-GPU step (backends/gpu)",
       .measures = true,
       .needs = "CUDA and MPI (MUONBED_WITH_CUDA, MUONBED_WITH_MPI)",
       .install = "install the CUDA Toolkit and libopenmpi-dev and rebuild",
       .ranks_share_one_device = true},
  };
  return table;
}

std::vector<BackendFacts>& all_backends() {
  static std::vector<BackendFacts> all = shipped_backends();
  return all;
}

std::string describe(const BackendFacts& f) {
  return "'" + f.description + "', " + (f.measures ? "measured" : "predicted") + ", needs '" +
         f.needs + "', install '" + f.install + "'";
}

}  // namespace

const std::vector<BackendFacts>& known_backends() {
  return all_backends();
}

void add_backend_facts(const BackendFacts& facts) {
  for (const BackendFacts& shipped : shipped_backends())
    if (shipped.name == facts.name) {
      if (facts == shipped) return;
      throw Error("backend '" + facts.name + "' registers the facts " + describe(facts) +
                  ", but core/experiment/src/backends.cpp's table says " + describe(shipped) +
                  "; fix: register backend_facts(\"" + facts.name +
                  "\") (the table's entry), or change the table");
    }
  for (BackendFacts& known : all_backends())
    if (known.name == facts.name) {
      known = facts;
      return;
    }
  all_backends().push_back(facts);
}

const BackendFacts* backend_facts(const std::string& name) {
  for (const BackendFacts& b : known_backends())
    if (b.name == name) return &b;
  return nullptr;
}

std::vector<std::string> known_backend_names() {
  std::vector<std::string> names;
  for (const BackendFacts& b : known_backends()) names.push_back(b.name);
  return names;
}

bool is_measured_backend(const std::string& name) {
  const BackendFacts* b = backend_facts(name);
  return b != nullptr && b->measures;
}

}  // namespace muonbed
