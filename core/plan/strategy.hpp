// Strategies build step plans. A strategy is the seeds' three-function interface carried into
// C++: it assigns owners, emits the gathers and emits the redistribution, as a composition of
// the shared building blocks of core/plan/schedule.hpp (staged gathers, all-to-alls, lanes,
// prefetch gates, chunks, split Newton-Schulz). Each strategy is one file that registers itself:
// the built-in ones are in core/strategies/ (sequential, replicated, owner, all_to_all,
// owner_allgather), a user's own goes in core/policies/ (core/policies/flat_gather_owner.cpp is
// the worked example, README "Writing a strategy"). A strategy declares the options it reads; the
// experiment validator, the summaries and the key reference ask it, so no code outside a
// strategy's file compares its name.
//
// Presets are data (core/plan/src/presets.cpp): the options published systems run.
// small_param_threshold sends matrices below that many elements down the replicated schedule in
// any strategy that reads it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/plan/plan.hpp"
#include "core/plan/schedule.hpp"

namespace muonbed {

// Seed 002: gradient synchronization levels. Parameters are split into levels by layer
// (contiguous blocks of layers, level 0 = the first block plus non-layer parameters); level i
// syncs only in steps k with k % periods[i] == 0. One level with period 1 is plain sync.
struct GradSyncOptions {
  bool enabled = false;
  std::vector<int> level_periods = {1};
};

// Split Newton-Schulz (issue 13; core/plan/split_ns.hpp): the largest matrices are orthogonalized
// by a group of ranks instead of one owner. A matrix splits when its NS on one GPU exceeds
// `threshold` times the balanced per-rank NS (the total NS work over the ranks that hold Muon
// matrices, so it splits when ranks outnumber matrices or one matrix dominates), and a group can
// split it: some of its sharding mesh dims, innermost (e.g. tp) first, whose pieces are slices
// along its long dim, whole along the short one once the other sharding dims are gathered
// (split_ns_problem). The group is the smallest such prefix, of at most `max_members` ranks, whose
// per-member share (1/k of the matrix) is within the balanced share; else the largest one. Its
// members gather only the other sharding dims (the owner's coordinates there), run
// split_newton_schulz, and scatter the result back over those dims. Staged gathers only (strategies
// owner, sequential).
struct SplitNsOptions {
  bool enabled = false;
  int max_members = 8;     // the largest split group (8: a DGX node's TP group over NVLink)
  double threshold = 1.0;  // 0: split every matrix that can split
};

struct StrategyOptions {
  std::string name = "owner";
  std::string assign = "flop_balanced";
  std::map<std::string, int> explicit_owners;  // assign == "explicit": param name -> rank
  bool async_gpu_parallelism = true;
  int prefetch_count = 1;
  std::string gather = "hierarchical";  // owner: "hierarchical" (TP, then FSDP), "rails" or "flat"
  int chunk_size = 8;                   // all_to_all: matrices per chunk
  int max_chunks_in_flight = 2;         // all_to_all
  std::int64_t small_param_threshold = 0;  // elements; 0 = off
  // Communication lanes: units (matrices or chunks) are spread over this many gather streams
  // (and as many redistribution streams), lane by lane (owner by owner), so gathers to different
  // owners run at the same time instead of one after another on one stream. 1: the seeds' single
  // communication stream. The prefetch gate (at most prefetch_count + 1 full updates per owner)
  // is unchanged: it is a dependency, not a stream order.
  int comm_lanes = 1;
  // Unit order: "plan" (parameter order) or "lpt" (largest Newton-Schulz first, so the longest
  // NS starts first and the small ones fill in behind it).
  std::string order = "plan";
  bool chunk_by_shape = false;  // all_to_all / owner_allgather chunks hold one matrix shape only
  // How chunks are cut: "count" (chunk_size matrices each, in unit order) or "ns_cost" (by NS
  // cost: chunk k holds every owner's k-th largest matrix, so every owner computes in every chunk
  // and each chunk lasts about as long as its largest NS; chunks shrink as they go, the next
  // chunk's exchange hiding behind the current chunk's NS).
  std::string chunk_sizing = "count";
  std::string preset;  // the preset these options started from (strategy_preset)
  SplitNsOptions split_ns;
  GradSyncOptions grad_sync;
  std::string to_json_text() const;
};

// The redundancy baseline's schedule (every holder all-gathers and orthogonalizes every matrix,
// no owner). It is also the path of the small matrices under small_param_threshold, whatever the
// strategy, which is why the options it reads are read by every strategy that reads the
// threshold.
Schedule replicated_schedule(const StrategyOptions& options);
const std::vector<std::string_view>& replicated_schedule_options();

// One strategy: the seeds' assign, gather and redistribute, as a Schedule of building blocks.
class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  // One line for listings (`muonbed presets`, the key reference): what it does and where from.
  virtual std::string summary() const = 0;
  // Position in listings: the built-in strategies 10..50, others after them by name.
  virtual int listing_order() const { return 1000; }
  // The keys of `strategy:` it reads, besides name, preset and grad_sync (read by every
  // strategy): an option it does not list is refused in experiments (unless left at its default)
  // and left out of summaries.
  virtual std::vector<std::string_view> options() const = 0;
  // The owners of the Muon matrices: by default the `assign` option's policy, or explicit owners.
  virtual Assignment assign(const ShardedModel& model, const StrategyOptions& options,
                            int ns_steps) const;
  // The gather, where NS runs, the redistribution and the schedule around them.
  virtual Schedule schedule(const StrategyOptions& options) const = 0;
  // Seed 000's claims compare three configurations of the seeds' strategies: "sequential",
  // "parallel" (owners without prefetch) and "prefetch" (prefetch 2 or more); "" for others.
  virtual std::string seed_configuration(const StrategyOptions&) const { return ""; }
};

using StrategyFactory = std::unique_ptr<Strategy> (*)();
// Adds a strategy under its name(), replacing one of the same name; call it from a static
// initializer in the strategy's own file (see core/strategies/owner.cpp).
void register_strategy(StrategyFactory factory);
// The registered strategy of this name; throws PlanError listing the registered ones.
const Strategy& find_strategy(const std::string& name);
const Strategy* find_strategy_or_null(const std::string& name);
// Registered names in listing order.
std::vector<std::string> strategy_names();

// Which strategy options a strategy reads: whether `option` (a key of `strategy:` in an
// experiment, e.g. "chunk_sizing") can change the plan of strategy `s.name` given s's other
// options. An option no point of an experiment reads is an error
// (core/experiment/src/experiment.cpp), and the summaries show an option only where it applies.
// Besides each strategy's own list: chunk_size is dead under chunk_sizing: ns_cost; with
// small_param_threshold > 0 the small matrices run the replicated schedule, which reads
// replicated_schedule_options() whatever the strategy.
bool strategy_reads_option(const StrategyOptions& s, std::string_view option);
// The strategies that read `option` at all, for messages: "owner, all_to_all".
std::string strategies_reading_option(std::string_view option);
// Every key of `strategy:` an option table knows (name and preset included).
const std::vector<std::string_view>& strategy_option_keys();
// Whether `option` of `s` has the value a StrategyOptions{} has (a default value that nothing
// reads is no setting at all; a non-default one would be silently ignored).
bool strategy_option_is_default(const StrategyOptions& s, std::string_view option);
// Every option `s.name` does not read, set to its default: a point carries only the settings
// that apply to it (its resolved configuration, summaries and plan show nothing else).
void reset_unread_options(StrategyOptions& s);

// Anchor presets: what published systems run, as options of the built-in strategies, so one
// experiment compares them with muonbed's own best on the same model and cluster. One row each,
// with its source (core/plan/src/presets.cpp).
struct StrategyPreset {
  std::string name;
  std::string source;  // what the options follow, cited
  StrategyOptions options;
  bool chunk_per_rank = false;  // chunk_size = world_size (one matrix per rank per batch)
};
const std::vector<StrategyPreset>& strategy_presets();
std::vector<std::string> strategy_preset_names();
// The preset's options on a mesh of `world_size` ranks; throws PlanError listing the names.
StrategyOptions strategy_preset(const std::string& name, int world_size);

// Builds the plan of one optimizer step. Throws PlanError when the strategy cannot apply (the
// message says which option or layout to change).
StepPlan build_plan(const ShardedModel& model, const StrategyOptions& options,
                    const PlanSettings& settings);

}  // namespace muonbed
