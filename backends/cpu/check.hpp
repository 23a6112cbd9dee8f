// The equivalence check of an executed plan: every rank's parameter and optimizer-state pieces
// against the single-device reference (kernels/reference_optimizer.hpp, NS in fp32, updates
// rounded to the comm dtype, parameters and state stored in the plan's dtypes) fed the same seeded
// data (backends/cpu/data.hpp), bit for bit. Each
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
  const ModelTensors<float>& initial_params() const { return initial_; }

 private:
  const StepPlan& plan_;
  std::uint64_t seed_;
  ReferenceOptimizer<float> optimizer_;
  ModelTensors<float> params_;
  ModelTensors<float> initial_;  // before step 0: what a parameter's movement is measured from
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
// `tolerance` > 0: the first that is not finite or differs by more than `tolerance` (absolute).
std::optional<Mismatch> first_mismatch(const StepPlan& plan, const RankStore& store,
                                       const ReferenceRun& reference, double tolerance = 0);

// How far an executor may be from the reference, per role, for executors whose Newton-Schulz is
// not the reference's (the GPU's bf16 kernels, split Newton-Schulz's Gram sums in another order).
struct CheckTolerance {
  double absolute = 0;  // every role: |got - want| <= absolute passes (0: bits must be equal)
  // Parameters only: |got - want| <= movement * max |want - initial| over the whole parameter
  // (its largest movement since step 0 in the reference). Scale-free: a parameter that moves
  // little, or a large learning-rate multiplier, gets a bound of its own size.
  double movement = 0;
  // Where the above allow a difference: plus this many units in the last place of the tensor's
  // dtype (at the larger of the two values) per step taken. Both sides round to the dtype at every
  // step, which can turn a difference within the bound into one unit more, and the next step
  // starts from it (a bf16 parameter near 0.1 has units of 2^-11 ~ 4.9e-4).
  int rounding_units = 0;
};
std::optional<Mismatch> first_mismatch(const StepPlan& plan, const RankStore& store,
                                       const ReferenceRun& reference,
                                       const CheckTolerance& tolerance);

// The check for executors whose Newton-Schulz runs in bf16 (the GPU kernels: bf16 storage, fp32
// accumulation) against this fp32 reference. Optimizer state never passes through NS, so it must
// equal the reference bit for bit (the GPU's elementwise kernels are bitwise the CPU's: the
// data-movement tests). A parameter's movement comes from NS's output O: bf16 and fp32 NS differ
// by up to 6.8 % of max |O| per element (kernels' CPU bf16 emulation vs fp32, 199 random draws
// each of 9x1, 5x3, 8x6 and 64x64: 3.1, 6.8, 5.3, 2.8 %; the quintic iteration does not
// converge, so rounding moves its result), and the errors of successive steps add as the
// movements do. 0.1 leaves room above 6.8 % while a missing, doubled or misplaced update (100 %
// of its movement) fails. Parameters stored in bf16 round at every step, on both sides: one unit
// per step on top.
inline constexpr CheckTolerance kBf16NsCheck{0, 0.1, 1};

}  // namespace muonbed::cpu
