// Anchor presets as data: what published systems run, as options of the built-in strategies, one
// row each with the source the options follow. `strategy: {preset: NAME}` starts from a row;
// the experiment's other strategy keys override it.
#include "core/base/errors.hpp"
#include "core/plan/strategy.hpp"

namespace muonbed {

const std::vector<StrategyPreset>& strategy_presets() {
  static const std::vector<StrategyPreset> table = {
      {.name = "keller_jordan",
       .source =
           "Keller Jordan's Muon (github.com/KellerJordan/Muon, muon.py, Muon.step): the "
           "matrices are taken in groups of world_size, rank r orthogonalizes the r-th of each "
           "group (round-robin owners) on its replicated update, then one all_gather per group "
           "gives every rank the results",
       .options = {.name = "owner_allgather", .assign = "round_robin"},
       .chunk_per_rank = true},
      {.name = "dion",
       .source =
           "Microsoft's Dion repository (github.com/microsoft/dion, its distributed Muon): "
           "matrices of one shape are batched world_size at a time, padded with zero matrices to "
           "a full batch, and one all_to_all brings each rank its matrix of the batch, NS, one "
           "all_to_all back. The padding is not modelled: it adds zero matrices that move and are "
           "orthogonalized in parallel with the real ones (bytes of a full batch on the short "
           "batches only)",
       .options = {.name = "all_to_all",
                   .assign = "round_robin",
                   .max_chunks_in_flight = 1,
                   .chunk_by_shape = true},
       .chunk_per_rank = true},
      {.name = "megatron",
       .source =
           "NVIDIA Megatron-LM's layer-wise distributed optimizer for Muon (with NVIDIA's "
           "Emerging-Optimizers): whole matrices are assigned to ranks by a "
           "longest-processing-time balance, and uneven all-to-alls bring each rank the matrices "
           "it owns and send the results back, about a layer's matrices at a time (chunks of 8) "
           "with the next exchange overlapping",
       .options = {.name = "all_to_all",
                   .assign = "flop_balanced",
                   .chunk_size = 8,
                   .max_chunks_in_flight = 2}},
      {.name = "seeds",
       .source =
           "the seeds' owner strategy (seeds 000/003/004): flop-balanced owners, TP-then-FSDP "
           "gathers, one unit prefetched, one communication stream",
       .options = {.name = "owner",
                   .assign = "flop_balanced",
                   .prefetch_count = 1,
                   .gather = "hierarchical"}},
      // Threshold 3, not 1: a TP-8 group repeats the g^3 product A.A on every member, so a matrix
      // just above the share packs better whole (1,024 GPUs, analytic: 79.8 ms splitting the
      // attention projections too, 62.0 ms with 3, 65.5 ms without split NS).
      {.name = "muonbed",
       .source =
           "muonbed's best (issue 13, experiments/scale_strategies.yaml): owners spread over "
           "nodes and rails, cross-node stage on every rail at once, 128 communication lanes (at "
           "1,024 GPUs and up the 240 largest gathers then queue at most 2 deep), largest NS "
           "first, and split Newton-Schulz of the matrices whose NS exceeds 3x the balanced "
           "per-rank share (llama-70B: the MLP matrices from 1,024 GPUs, the attention "
           "projections too from 4,096, over their node's TP group)",
       .options = {.name = "owner",
                   .assign = "topology",
                   .prefetch_count = 1,
                   .gather = "rails",
                   .comm_lanes = 128,
                   .order = "lpt",
                   .split_ns = {.enabled = true, .threshold = 3}}},
  };
  return table;
}

std::vector<std::string> strategy_preset_names() {
  std::vector<std::string> names;
  for (const StrategyPreset& p : strategy_presets()) names.push_back(p.name);
  return names;
}

StrategyOptions strategy_preset(const std::string& name, int world_size) {
  for (const StrategyPreset& p : strategy_presets()) {
    if (p.name != name) continue;
    StrategyOptions o = p.options;
    o.preset = name;
    if (p.chunk_per_rank) o.chunk_size = world_size;
    return o;
  }
  std::string known;
  for (const auto& n : strategy_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw PlanError("unknown strategy preset '" + name + "'; known presets: " + known);
}

}  // namespace muonbed
