// libFuzzer target over what users type: experiment YAML (parse, validate every sweep point) and
// cluster YAML, then the plan and the analytic estimate of what validates. The contract it checks:
// bad input is a muonbed::Error (ConfigError with a place), never another exception, a crash, a
// sanitizer report, a hang or runaway memory; and what validates also plans (validate must catch
// what the planner would refuse). Built by tests/fuzz/run_fuzz.sh (clang, -fsanitize=fuzzer,
// address,undefined); ctest label `fuzz`.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/base/errors.hpp"
#include "core/config/cluster.hpp"
#include "core/config/src/yaml_util.hpp"
#include "core/engine/cost_model.hpp"
#include "core/experiment/experiment.hpp"
#include "core/results/results.hpp"

namespace {

// Planning cost grows with ranks x ops; the fuzzer plans small points only (parsing and
// validation, which every input goes through, are bounded by the parser's own limits).
constexpr int kMaxFuzzWorld = 16;  // (parsing allows 256 ranks in the fuzz build)
constexpr std::size_t kMaxFuzzTensors = 400;

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FUZZ FINDING: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The experiment parser (it reads named cluster files from experiments/clusters/).
  std::vector<muonbed::Experiment> points;
  try {
    points = muonbed::parse_experiment(text, "fuzz.yaml");
  } catch (const muonbed::ConfigError& e) {
    if (e.where().file.empty()) finding("a ConfigError without a file", e.what());
  } catch (const muonbed::Error&) {
    // LayoutError, PlanError: typed and messaged
  }
  for (std::size_t i = 0; i < points.size() && i < 1; ++i) {
    const muonbed::Experiment& e = points[i];
    if (e.mesh.world_size() > kMaxFuzzWorld || e.model.params.size() > kMaxFuzzTensors) continue;
    try {
      const muonbed::StepPlan plan = muonbed::plan_experiment(e);
      const muonbed::ResultRecord record = muonbed::analytic_record(plan, e.cluster);
      (void)muonbed::result_to_json(record);  // refuses non-finite numbers
    } catch (const muonbed::Error& err) {
      finding("a validated point does not plan", std::string(err.what()) + "\n" + e.resolved_yaml);
    }
  }
  // The same text as a cluster file.
  try {
    muonbed::parse_cluster(muonbed::yaml_util::load_yaml(text, "fuzz-cluster.yaml"),
                           "fuzz-cluster.yaml");
  } catch (const muonbed::Error&) {
  }
  return 0;
}
