// Results every backend writes (analytic, sim, and later mpi/nccl): one JSON record per
// experiment point and backend, so predicted and measured lines up field by field. This header is
// backend-neutral (no SimGrid, CUDA or MPI); core/results/src/record.cpp assembles a record and
// core/results/src/result_json.cpp reads and writes its JSON.
//
// Schema (version 2). Times in seconds, sizes in bytes, bandwidths in GB/s (1e9 B/s). Keys appear
// in this order; the same input gives a byte-identical file except "timestamp" (and "checksum",
// which covers it). Every number is finite: a backend result with NaN or infinity is refused
// at write time, never stored as JSON null. Version 2 added provenance.point_id and checksum;
// version 1 files are not read (rerun the experiment).
//
//   schema_version   2
//   backend          "analytic" | "sim" (later "mpi" | "nccl")
//   fidelity         sim: "step" | "flow"; analytic: "closed_form"
//   timestamp        UTC ISO-8601 time the record was made: the one nondeterministic field
//   provenance       muonbed_version, git_hash (HEAD of the sources the binary was built from, plus
//                    "-dirty-<12 hex of the diff's SHA-1>" when tracked files had uncommitted
//                    changes; "unknown" without git), simgrid_version ("" when the backend does not
//                    use SimGrid), host_name, experiment (name), experiment_file, point (the sweep
//                    label), resolved_config (Experiment::resolved_yaml: the complete input),
//                    point_id (point_identity(): 16 hex digits naming the experiment, point,
//                    backend and configuration; muonbed-run.json lists the ids of the current
//                    sweep, so results of another configuration are never taken for its own)
//   setup            strategy, cluster, model, mesh (DeviceMesh::describe), world_size, nodes,
//                    gpus_per_node, params (elements of all parameters), muon_matrices,
//                    hyper_period (steps after which the level-sync pattern repeats), rank_kind
//                    ("gpu", or "cpu": ranks of a profile calibrated on CPU ranks; absent from
//                    files written before it)
//   step             average_s (over one hyper-period, each distinct step pattern weighted by
//                    how many steps have it), worst_s, worst_step (first step with the worst
//                    time), patterns: [{step, count, time_s}] one per distinct set of active ops
//                    (seed 002: level-scheduled gradient sync makes average and worst differ).
//                    Measured backends (mpi): patterns holds every timed step (its index counted
//                    from the first warm-up step, count 1), average_s is their mean and worst_s
//                    the slowest, and these keys follow (absent from simulated and analytic
//                    records): warmup_steps, timed_steps (the experiment's `steps` and
//                    `repeats`), median_s, p95_s (nearest rank), stddev_s (population), min_s
//   bound            T_bound, the lower bound of core/engine/bound.hpp, and how far the step is
//   from it:
//                    step_s (T_bound), ratio (step average_s / step_s), binding ("balanced":
//                    total NS work over the ranks that may own, or "longest": the longest single
//                    NS), ns_total_s, ns_balanced_s, ns_longest_s, gather_s and scatter_s (the
//                    unhideable first gather and last scatter of the binding term), owner_ranks,
//                    longest (the matrix of the longest NS). Added after schema 1's first files:
//                    a record without it reads back with zeros.
//   throughput       seed 002's honest per-GPU reporting, each as {average, worst}, where
//                    "average" uses the hyper-period average and "worst" the worst step:
//                      params_per_s_per_gpu      elements updated per second per GPU (the model's
//                                                parameters / step time / GPUs): end to end
//                      computation: time_s (mean over GPUs of busy compute time per step),
//                                   tflops_per_gpu (optimizer FLOPs / step time / GPUs),
//                                   useful_tflops_per_gpu (the same counting each matrix's
//                                   FLOPs once: replicated work does not count; absent from
//                                   files written before it),
//                                   utilization (tflops_per_gpu / the GPU's peak)
//                      communication: time_s (mean over GPUs of time inside collectives),
//                                   exposed_time_s (of that, not overlapped by compute),
//                                   GBps_per_gpu (bytes a GPU sends per second of step time)
//   traffic          bytes moved per step by the backend's collective algorithms, split by link
//                    class: intra_node (NVLink / PCIe) and network (NICs), as {average, worst};
//                    model: "algorithm" (sim: the lowered transfers) or "closed_form" (analytic:
//                    per-algorithm formulas)
//   collectives      one entry per collective op of the plan that ran in a simulated step: op,
//                    label, kind, group_size, instances (per step it runs in), steps (how many
//                    steps of the hyper-period run it), bytes (nccl-tests' S of an instance,
//                    mean over instances), time_s (mean instance time from the last member's
//                    arrival to completion, waiting excluded), max_time_s, algbw_GBps
//                    (bytes / time_s), busbw_GBps (algbw x core/engine/cost_model.hpp's
//                    bus_factor), crosses_nodes (some instance spans nodes); measured backends add
//                    step_times_s (per timed step, that step's mean instance time: the spread
//                    behind time_s, which `bench collective` reports as min / median / max)
//   ranks            one entry per rank: rank, node, average and worst (each {compute_s,
//                    communication_s, exposed_comm_s, idle_s, finish_s}: busy time on compute
//                    ops, time inside collective instances, the part of it not overlapped by
//                    compute, step time minus busy time, completion of the rank's last op;
//                    average over the hyper-period, worst = in the worst step), bytes_sent and
//                    bytes_received (per average step, by the algorithms), memory
//                    {static_bytes, peak_transient_bytes, peak_bytes} from rank_memory(plan),
//                    and from measured backends measured_peak_bytes: the executor pool's peak of
//                    the plan's tensors in their dtypes (absent in files written before it)
//   execution        measured backends only (absent otherwise): what ran and where (library:
//                    MPI_Get_library_version's first line, mpi_standard, launcher, hosts in
//                    order of their first rank, ranks_per_host, oversubscribed, blas and
//                    blas_threads per rank, compute_threads per rank, compute_mode: "threads"
//                    (compute on worker threads), "progress_points" (on the MPI thread, which
//                    progresses messages between kernel pieces) or "inline" (on the MPI thread,
//                    no progress during compute: a cross-check); "" in files written before it)
//                    and the executor's own
//                    host time per step, mean over timed steps of the slowest rank's:
//                    engine_s (the engine and op bookkeeping), handlers_s (message packing and
//                    unpacking, alloc/release, keep copies), mpi_s (inside MPI calls), and
//                    overhead_fraction = (engine_s + handlers_s) / step average_s;
//                    speed_probe (absent when not taken: GPU backends, plans without
//                    Newton-Schulz, files written before it): {shape: [batch, rows, cols],
//                    predicted_s, before_s, after_s}: one Newton-Schulz call of the plan's
//                    costliest shape timed as calibrate times gpu.ns_table, right before the
//                    warm-up steps and right after the timed ones, beside the time the cluster
//                    profile gives it (core/results/calibration.hpp speed_probe)
//   training         a training step (absent for the optimizer step alone): tokens_per_step,
//                    seq_len, micro_batches, micro_batch_groups, overlap, step_s, forward_s,
//                    backward_s, parameter_gather_s, activation_comm_s, gradient_sync_s,
//                    optimizer_s (means over ranks of the time each phase had an op running),
//                    exposed_optimizer_s (the step after every rank's last forward, backward,
//                    gather and sync op), model_tflops, mfu, adamw_step_s (the same step with
//                    AdamW for every parameter), muon_overhead (step_s / adamw_step_s - 1);
//                    where the twin was measured interleaved with the point's steps (mpi),
//                    overhead_pairs and overhead_spread (the standard deviation of the per-pair
//                    overheads, a fraction like muon_overhead)
//   memory           the training state against the device's memory (absent from files written
//                    before it): model ("training_state"), limit_bytes (gpu.memory_GiB of the
//                    cluster: one GPU's, or one CPU rank's), peak_bytes and peak_rank (the fullest
//                    rank), over_ranks (ranks whose peak exceeds the limit), feasible (none
//                    does), breakdown of the fullest rank {parameters, master_weights, gradients,
//                    optimizer_state, transients, activations, reserved}; peak = parameters +
//                    master_weights + gradients + optimizer_state + max(activations,
//                    transients) + reserved (core/plan/plan.hpp training_memory). An infeasible
//                    point's step time is what the step would take with enough memory: `run`,
//                    the plots and compare say so
//   notes            free-text remarks of the backend (approximations used, caps hit)
//   cross_check      the other backends' results of the same point beside this one (written by
//                    `muonbed run` once the point's backends have run; absent or [] when there was
//                    none): [{backend, fidelity, step_s (measured: median step; predicted:
//                    average), difference_pct (this record's step over that one, minus 1),
//                    agree (|difference| <= 10 %)}]
//   checksum         SHA-256 (64 hex digits) of the file's text with this value empty
//                    ("checksum": ""): an edited or damaged file fails verify_checksum (the
//                    reader, resume and analysis/plot.py check it)
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/base/output_files.hpp"
#include "core/config/cluster.hpp"
#include "core/engine/measurement.hpp"
#include "core/experiment/result_paths.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/training.hpp"

namespace muonbed {

struct Experiment;

constexpr int kResultsSchemaVersion = 2;

struct AverageWorst {
  double average = 0;
  double worst = 0;
};

struct Provenance {
  std::string muonbed_version;
  std::string git_hash;
  std::string simgrid_version;
  std::string host_name;
  std::string experiment;
  std::string experiment_file;
  std::string point;
  std::string resolved_config;
  std::string point_id;  // written by result_to_json (point_identity of the fields above)
};

struct SetupInfo {
  std::string strategy;
  std::string cluster;
  std::string model;
  std::string mesh;
  int world_size = 0;
  int nodes = 0;
  int gpus_per_node = 0;
  std::int64_t params = 0;
  int muon_matrices = 0;
  int hyper_period = 1;
  // What one rank is: "gpu", or "cpu" for CPU ranks (a cluster profile calibrated on MPI ranks,
  // core/config/cluster.hpp CalibrationInfo::backend): tables and plots call them ranks, not GPUs.
  std::string rank_kind = "gpu";
};

struct StepPatternResult {
  int step = 0;   // the first step of the hyper-period with this pattern
  int count = 0;  // steps of the hyper-period with this pattern
  double time_s = 0;
};

// Statistics over the timed steps of a measured backend (timed_steps == 0: none).
struct StepStatistics {
  int warmup_steps = 0;
  int timed_steps = 0;
  double median_s = 0;
  double p95_s = 0;
  double stddev_s = 0;
  double min_s = 0;
};
// Median, p95 (nearest rank), population standard deviation and minimum of step times.
StepStatistics step_statistics(const std::vector<double>& times, int warmup_steps);

struct StepSummary {
  double average_s = 0;
  double worst_s = 0;
  int worst_step = 0;
  std::vector<StepPatternResult> patterns;
  StepStatistics measured;
};

struct BoundResult {
  double step_s = 0;
  double ratio = 0;
  std::string binding;
  double ns_total_s = 0;
  double ns_balanced_s = 0;
  double ns_longest_s = 0;
  double gather_s = 0;
  double scatter_s = 0;
  int owner_ranks = 0;
  std::string longest;
};

struct ThroughputResult {
  AverageWorst params_per_s_per_gpu;
  AverageWorst compute_time_s;
  AverageWorst compute_tflops_per_gpu;
  // The same with each matrix's optimizer FLOPs counted once (useful_step_flops): replicated
  // Newton-Schulz and replicated elementwise updates do not count.
  AverageWorst useful_tflops_per_gpu;
  AverageWorst compute_utilization;
  AverageWorst comm_time_s;
  AverageWorst comm_exposed_time_s;
  AverageWorst comm_GBps_per_gpu;
};

struct TrafficResult {
  std::string model;  // "algorithm" | "closed_form"
  AverageWorst intra_node_bytes;
  AverageWorst network_bytes;
};

struct CollectiveResult {
  int op = 0;
  std::string label;
  std::string kind;
  int group_size = 0;
  int instances = 0;
  int steps = 0;
  double bytes = 0;
  double time_s = 0;
  double max_time_s = 0;
  double algbw_GBps = 0;
  double busbw_GBps = 0;
  bool crosses_nodes = false;
  // Measured backends: per timed step, the mean instance time of that step (time_s is their
  // mean); empty for predictions, which compute one deterministic time.
  std::vector<double> step_times_s;
};

struct MemoryResult {
  std::int64_t static_bytes = 0;
  std::int64_t peak_transient_bytes = 0;
  std::int64_t peak_bytes = 0;
  // Measured backends: what the executor's pool held for the plan's tensors at its peak (the CPU
  // store's static bytes plus its peak of live buffers; the GPU pool's static and transient
  // regions), beside rank_memory's figures above. -1: not measured (predicted backends).
  std::int64_t measured_peak_bytes = -1;
};

// The training state's memory against the device's (core/plan/plan.hpp training_memory and
// memory_feasibility). present: false in records read from files written before it.
struct MemoryFeasibilityResult {
  bool present = false;
  std::string model = "training_state";
  std::int64_t limit_bytes = 0;
  std::int64_t peak_bytes = 0;
  int peak_rank = 0;
  int over_ranks = 0;
  bool feasible = true;
  TrainingMemory breakdown;  // of peak_rank
};

// The training step around the optimizer (core/plan/training.hpp); present: false for plans of
// the optimizer step alone. Times are the average step's (the hyper-period's weighted mean);
// phase times are means over ranks of the time an op of that phase ran.
struct TrainingResult {
  bool present = false;
  std::int64_t tokens_per_step = 0;
  std::int64_t seq_len = 0;
  std::int64_t micro_batches = 0;  // per data-parallel rank
  int micro_batch_groups = 0;
  std::string overlap;
  double step_s = 0;  // the whole training step
  double forward_s = 0;
  double backward_s = 0;
  double parameter_gather_s = 0;  // FSDP's parameter all-gathers
  double activation_comm_s = 0;   // TP, EP, CP and PP activation traffic
  double gradient_sync_s = 0;
  double optimizer_s = 0;  // the optimizer's ops (compute and communication)
  // The part of the step after every rank's forward, backward and gradient sync ended: what the
  // optimizer adds to the step's critical path.
  double exposed_optimizer_s = 0;
  double model_tflops = 0;  // forward and backward FLOPs of all ranks per step, in TFLOP
  double mfu = 0;           // model FLOPs / (step x ranks x peak)
  // The same step with AdamW for every parameter (the run's twin plan; 0: not run).
  double adamw_step_s = 0;
  double muon_overhead = 0;  // step_s / adamw_step_s - 1
  // A twin measured interleaved with the point's steps (a measured backend that pairs them):
  // the number of (step, twin step) pairs and the population standard deviation of their
  // overheads (step i / twin step i - 1), the noise of muon_overhead within the run (0: none).
  int overhead_pairs = 0;
  double overhead_spread = 0;
};

// One other backend's result of the same point beside this one: whether they agree.
inline constexpr double kCrossCheckTolerance = 0.10;
struct CrossCheck {
  std::string backend;
  std::string fidelity;
  double step_s = 0;          // the other backend's step (measured: median; else average)
  double difference_pct = 0;  // this record's step over the other's, minus 1, in percent
  bool agree = true;          // |difference| <= kCrossCheckTolerance
};

struct RankResult {
  int rank = 0;
  int node = 0;
  TimeBreakdown average;
  TimeBreakdown worst;
  double bytes_sent = 0;
  double bytes_received = 0;
  MemoryResult memory;
};

// What a measured backend ran on and what the executor itself cost (present: !library.empty()).
struct ExecutionInfo {
  std::string library;  // "Open MPI v4.1.4, package: ..."
  std::string mpi_standard;
  std::string launcher;  // "mpirun (started by muonbed)", "mpirun", "srun", ...
  std::vector<std::string> hosts;
  std::vector<int> ranks_per_host;
  bool oversubscribed = false;
  std::string blas;
  int blas_threads = 0;
  int compute_threads = 0;
  std::string compute_mode;
  double engine_s = 0;
  double handlers_s = 0;
  double mpi_s = 0;
  double overhead_fraction = 0;
  // The machine-speed probe (see speed_probe above); probe_predicted_s == 0: not taken.
  std::vector<std::int64_t> probe_shape;  // batch, rows, cols
  double probe_predicted_s = 0;
  double probe_before_s = 0;
  double probe_after_s = 0;
  bool has_speed_probe() const { return probe_predicted_s > 0; }
};

struct ResultRecord {
  int schema_version = kResultsSchemaVersion;
  std::string backend;
  std::string fidelity;
  std::string timestamp;
  Provenance provenance;
  SetupInfo setup;
  StepSummary step;
  BoundResult bound;
  ThroughputResult throughput;
  TrafficResult traffic;
  std::vector<CollectiveResult> collectives;
  std::vector<RankResult> ranks;
  ExecutionInfo execution;
  MemoryFeasibilityResult memory;
  TrainingResult training;
  std::vector<std::string> notes;
  std::vector<CrossCheck> cross_check;
  std::string checksum;  // as read from a file; result_to_json computes its own
  // The step time other backends are compared with: a measured record's median timed step, a
  // predicted record's average step.
  double comparable_step_s() const {
    return step.measured.timed_steps > 0 ? step.measured.median_s : step.average_s;
  }
};

// Each record's cross_check against the other records of the same point (same experiment and
// point label, another backend): the step times beside each other, and `agree` false where they
// differ by more than kCrossCheckTolerance. Returns the indices of records whose cross_check
// changed (their files need rewriting).
std::vector<std::size_t> cross_check_point(std::vector<ResultRecord*> records);

// ---- Building records (shared by every backend) ------------------------------------------------

// The rows a backend hands in (StepMeasurement, CollectiveMeasurement, step_patterns) are the
// engine's: core/engine/measurement.hpp.

// Fills setup, step, bound (core/engine/bound.hpp), throughput, traffic, collectives and ranks
// (memory from rank_memory) from per-pattern measurements. `collectives` holds, per pattern, the
// backend's per-op measurements.
// What fill_record derives from the plan and the cluster alone: the step's lower bound (its
// ratio left to fill_record), or why there is none, and every rank's training memory. A backend
// may make it beside its run: the simulator does, on a thread of its own (0.3 s of a 1,024-GPU
// megatron step's record).
struct PlanFigures {
  BoundResult bound;
  std::string no_bound;  // why there is no bound ("": there is one)
  std::vector<TrainingMemory> memory;
};
PlanFigures plan_figures(const StepPlan& plan, const ClusterSpec& cluster);

// `figures`: plan_figures(plan, cluster) made beforehand, or null (then made here).
void fill_record(ResultRecord& record, const StepPlan& plan, const ClusterSpec& cluster,
                 const std::vector<StepMeasurement>& steps,
                 const std::vector<std::vector<CollectiveMeasurement>>& collectives,
                 const PlanFigures* figures = nullptr);

// Provenance of this process and build: version, git hash (run time), host; the experiment part
// when `experiment` is not null.
Provenance make_provenance(const Experiment* experiment, const std::string& simgrid_version);
std::string utc_timestamp();  // "2025-01-31T12:34:56Z"

// The analytic backend: estimate_step() for each step pattern, the closed-form time of every
// collective instance, and closed-form traffic of the same algorithms the simulator lowers to.
ResultRecord analytic_record(const StepPlan& plan, const ClusterSpec& cluster);

// ---- Reports ------------------------------------------------------------------------------------

// How tables name a result's backend: "sim/step", "sim/flow" (the simulator's fidelity), else the
// backend's name.
std::string backend_label(const std::string& backend, const std::string& fidelity);

// Seed 000's claims (parallel vs sequential ~N x, prefetch 2-3 x on top, 16-24 x total on 8 GPUs)
// and the records that test them. This is the one classifier of the claims' configurations
// (strategy name and prefetch_count from each record's resolved configuration: "sequential",
// "parallel" = owner with prefetch 0, "prefetch" = owner with prefetch >= 2); the CLI prints
// seed_claims_table() and muonbed-run.json carries the rows for analysis/plot.py. Rows only for
// backends with at least two of the three configurations.
struct SeedClaimRow {
  std::string claim;         // "parallel owner vs sequential"
  std::string claimed;       // "~N x" with N filled in, "2-3x", "16-24x"
  double low = 0, high = 0;  // the claimed speedup range (a single N holds within +-20 %)
  std::string backend;       // the records' backend ("sim", "analytic")
  std::string fidelity;
  std::string baseline, target;                   // configuration names
  const ResultRecord* baseline_record = nullptr;  // null when the sweep lacks it
  const ResultRecord* target_record = nullptr;
  double predicted() const;  // baseline / target average step time; NaN when a record is missing
};
std::vector<SeedClaimRow> seed_claims(const std::vector<ResultRecord>& records);
// The rows as a table beside each backend's step times; "" when there are none.
std::string seed_claims_table(const std::vector<ResultRecord>& records);

// ---- JSON ---------------------------------------------------------------------------------------

// Stable key order, 1-space indent, point_id and checksum filled in. Throws Error naming the
// field when a number is not finite (NaN or infinity: the backend went wrong).
std::string result_to_json(const ResultRecord& record);
// Throws Error on malformed input: not JSON, a missing or mistyped field, another schema
// version, or a checksum that does not match the text (an edited or damaged file).
ResultRecord result_from_json(const std::string& text);
// True when `text` ends with a checksum field matching the rest of it.
bool verify_checksum(const std::string& text);
// The part of a resolved configuration that decides a backend's result: without the keys that
// do not (which backends run, where files go, the simulator's settings for other backends), so
// adding a backend or moving the output keeps finished points.
std::string result_identity(const std::string& resolved_yaml, const std::string& backend);
// 16 hex digits of SHA-256 over the experiment name, point label, backend and result_identity.
std::string point_identity(const std::string& experiment, const std::string& point,
                           const std::string& backend, const std::string& resolved_yaml);
ResultRecord read_result_file(const std::string& path);

// Where a point's results go (result_path, point_slug): core/experiment/result_paths.hpp.

}  // namespace muonbed
