// CPU op handlers for rank programs (core/plan/program.hpp), shared by every executor that keeps a
// rank's data on the CPU: the in-process loopback executor and an MPI one. Compute ops run here
// whole; a collective is split so that the data movement stays with the executor's transport:
//
//   1. begin_phase      reads what the rank sends (one message per peer, in the wire dtype) and
//                       its own part, before anything of the phase is written;
//   2. the transport    delivers message (s -> j) to j: in-process copies, MPI, ...;
//   3. finish_phase     writes the rank's own part, then every received message (reducing
//                       phases: the own part, then each message added in fp32, peers in group
//                       order).
// A phase's messages must all be read (step 1 on every member) before any is written (step 3),
// since outputs may overlap inputs (an in-place reduce-scatter into the gradient slot).
//
// Numerics follow the single-device reference (kernels/reference_optimizer.hpp with NS in fp32,
// rounding to the comm dtype and storage in the plan's dtypes): every op reads its operands from
// the store (widened to fp32), computes in fp32 and stores its outputs rounded to their tensors'
// dtypes (parameters in theirs, momentum and moments in the state dtype, backends/cpu/store.hpp);
// momentum in fp32, the update rounded to the comm dtype,
// Newton-Schulz in fp32 on the whole matrix (stacks matrix by matrix), its result rounded to the
// comm dtype, the update applied with decoupled weight decay and Muon's per-shape learning-rate
// scale, AdamW with step count k + 1, QK-clip after the op that updates an attn_q / attn_k
// matrix, with the seeded logits of backends/cpu/data.hpp. A training step's forward and backward
// ops (core/plan/program.hpp's TrainingGemmTask) run real fp32 GEMMs with the rank's parameter
// piece against seeded activations kept per thread; their outputs go to scratch, so they change
// no data the optimizer reads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backends/cpu/store.hpp"
#include "kernels/newton_schulz.hpp"

namespace muonbed::cpu {

// What compute ops need beyond their program: the step and the seed of its data.
struct StepContext {
  const StepPlan* plan = nullptr;
  std::uint64_t seed = 0;
  int step = 0;  // from 0; AdamW counts step + 1
  NsConfig ns;   // make_ns_config(plan->settings.optimizer.muon)
  // Where forward and backward ops add the FLOPs of the GEMMs they ran (2 m n k each), counted
  // as they run, to check against the plan's op_flops; null: not counted.
  std::atomic<double>* gemm_flops = nullptr;
};
StepContext make_step_context(const StepPlan& plan, std::uint64_t seed, int step);

// Throws ExecutionError when the CPU cannot run the plan (fp16 is not emulated: not as the comm
// dtype, the state dtype or a parameter's dtype).
void check_can_run(const StepPlan& plan);

// Runs compute op `op` (momentum, newton_schulz, apply_update, adamw, pack, unpack, forward,
// backward) and its keep
// copies on the rank's store.
void run_compute(const RankOp& op, RankStore& store, const StepContext& context);
// Runs the keep copies of a collective once its phases are done.
void run_keep(const RankOp& op, RankStore& store);

// One phase of a collective on one rank (see the header comment).
struct PhaseMessages {
  std::vector<std::vector<std::byte>> sends;  // per phase.sends entry, in the wire dtype
  std::vector<float> own;                     // the rank's own part
};
PhaseMessages begin_phase(const RankStore& store, const ExchangePhase& phase, DType wire);
// `received[i]` is the message of phase.recvs[i] (its size is checked).
void finish_phase(RankStore& store, const ExchangePhase& phase, DType wire,
                  const PhaseMessages& mine,
                  const std::vector<const std::vector<std::byte>*>& received);

// The same two steps with the messages back to back, as MPI's v-collectives take them: every
// send encoded into one buffer at byte offset Transfer::displacement x the wire dtype's size, and
// the received messages as views into the receive buffer (no copy per message).
struct PackedPhase {
  std::vector<std::byte> sends;
  std::vector<std::byte> own;  // the rank's own part, in the wire dtype as a message carries it
};
// `first_send_only`: encode phase.sends[0] alone (at its displacement), for transports that send
// one buffer to every peer (a broadcast's root, an all-gather member) when all sends carry the
// same elements.
PackedPhase begin_phase_packed(const RankStore& store, const ExchangePhase& phase, DType wire,
                               bool first_send_only = false);
// The same into `out`, reusing its storage: an executor that keeps one PackedPhase per collective
// in flight allocates (and the OS zero-fills) no pages per message, as the calibration's message
// benchmark does not (backends/mpi/src/compute_bench.cpp).
void begin_phase_packed(const RankStore& store, const ExchangePhase& phase, DType wire,
                        bool first_send_only, PackedPhase& out);
void finish_phase(RankStore& store, const ExchangePhase& phase, DType wire,
                  const std::vector<float>& own,
                  const std::vector<std::span<const std::byte>>& received);
void finish_phase(RankStore& store, const ExchangePhase& phase, DType wire, const PackedPhase& mine,
                  const std::vector<std::span<const std::byte>>& received);

// split_newton_schulz (core/plan/program.hpp's SplitNsTask): the member's compute between the
// all-reduces of its phases, which the executor runs over its own transport like any collective's:
//
//   state = split_ns_begin(...)          allocates the workspace, reads the slices, writes the
//                                        squared norms (fp64 sums, as newton_schulz's norm)
//   for round r in 0 .. split_ns_rounds(context) - 1:
//     phases split_ns_phase(r, 0) and split_ns_phase(r, 1) in wire dtype split_ns_wire(op, r)
//     split_ns_after_round(state, r, ...) round 0 scales by the reduced norm; every round then
//                                        writes the next partial Gram, or after the last step the
//                                        result (rounded to the comm dtype), frees the workspace
//                                        and runs the op's keep copies.
// The reduced Gram is rounded to the wire dtype on every member (the chunk each member summed
// stays fp32 otherwise, while the others receive it in the wire dtype), so all members iterate
// with the same Gram.
struct SplitNsState {
  std::vector<std::vector<float>> x;  // per task: the slice in the wide orientation [gram, part]
};
int split_ns_rounds(const StepContext& context);
std::size_t split_ns_phase(int round, int index);
DType split_ns_wire(const RankOp& op, int round);
SplitNsState split_ns_begin(const RankOp& op, RankStore& store, const StepContext& context);
void split_ns_after_round(SplitNsState& state, int round, const RankOp& op, RankStore& store,
                          const StepContext& context);

// Wire format: fp32 as is, bf16 as the high 16 bits (kernels/bf16.hpp's rounding).
std::vector<std::byte> encode(const float* values, std::int64_t count, DType wire);
void encode_into(const float* values, std::int64_t count, DType wire, std::byte* out);
void decode(std::span<const std::byte> bytes, DType wire, float* values, std::int64_t count);

}  // namespace muonbed::cpu
