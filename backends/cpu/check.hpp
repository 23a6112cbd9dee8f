// The equivalence check of an executed plan: every rank's parameter and optimizer-state pieces
// against the single-device reference (kernels/reference_optimizer.hpp, NS in fp32, updates
// rounded to the comm dtype) fed the same seeded data (backends/cpu/data.hpp), bit for bit. Each
// rank can check itself: the loopback executor checks all of its ranks, an MPI rank its own pieces
// against a reference it computes locally.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backends/cpu/store.hpp"
#include "kernels/reference_optimizer.hpp"

namespace muonbed::cpu {

// The reference run of a plan's steps from the same seed.
class ReferenceRun {
 public:
  // The model and routing the plan was built from (tests pass the originals).
  ReferenceRun(const StepPlan& plan, Model model, RoutingRules routing, std::uint64_t seed);
  // Model and routing rebuilt from the plan (source_model, source_routing): what an executor that
  // only has the plan's JSON uses.
  ReferenceRun(const StepPlan& plan, std::uint64_t seed);

  // Runs steps until `steps` have been taken (step k gets summed_gradients(plan, model, seed, k)).
  void run_to(int steps);
  int steps() const { return steps_; }
  const ReferenceOptimizer<float>& optimizer() const { return optimizer_; }
  const ModelTensors<float>& params() const { return params_; }

 private:
  const StepPlan& plan_;
  std::uint64_t seed_;
  ReferenceOptimizer<float> optimizer_;
  ModelTensors<float> params_;
  int steps_ = 0;
};

struct Mismatch {
  int rank = -1;
  int param = -1;
  std::string tensor;         // "parameter of 'layers.0.attn.q'"
  std::int64_t element = -1;  // full index in the plan param
  float got = 0, want = 0;
  std::string message;  // names the rank, tensor, element (multi-index) and both values
};

// The first piece element of `store` (rank, then param, then parameter / momentum / adam_m /
// adam_v, then packed order) that differs in its bits from the reference, if any. With
// `tolerance` > 0: the first that is not finite or differs by more than `tolerance` (absolute),
// for executors whose Newton-Schulz is not the reference's (the GPU's bf16 kernels).
std::optional<Mismatch> first_mismatch(const StepPlan& plan, const RankStore& store,
                                       const ReferenceRun& reference, double tolerance = 0);

}  // namespace muonbed::cpu
