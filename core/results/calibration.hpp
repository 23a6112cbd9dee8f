// `muonbed calibrate` as a library: what to measure on a machine, and how the measurements become
// a cluster profile (core/config/cluster.hpp) that the analytic model and the simulator read.
// Backend- neutral: the measurements themselves come from a real executor (the MPI backend's
// compute benchmark and `bench collective` rows, backends/mpi/mpi_backend.hpp); this header only
// plans them and fits the profile's numbers to them. Calibration uses microbenchmarks only, never
// the step times a profile is later judged by.
//
//   workload       from an experiment's points: every Newton-Schulz call shape the plans make
//                  ([batch,] rows x cols), the elementwise sizes, and every collective kind with
//                  the mesh and group dims it runs over and the range of its sizes (nccl-tests' S)
//   compute rows   per shape (timed on the real backend's ranks: backends/mpi/measure.hpp's
//                  compute_bench): the handler's Newton-Schulz time (-> gpu.ns_table, version
//                  "cpu-fp32", interpolated in FLOPs by the model), momentum and apply_update
//                  (-> gpu.hbm_GBps and launch_overhead_us.kernel: a least-squares fit of
//                  t = kernel + model_bytes / hbm over all of them), an sgemm of the NS shape
//                  (-> gpu.peak_tflops = the fastest, gpu.gemm_efficiency by min dim), and
//                  message packing (reported, not fitted: collective rows include it), and
//                  "host_comm" rows: the Newton-Schulz's extra time per call while the rank
//                  sends and receives messages at its progress points, over the bytes it moved
//                  (-> gpu.host_comm_ns_per_byte, the median over shapes, at least 0)
//   elementwise rows  momentum, apply_update and adamw over the numbers of elements the plans'
//                  ops touch on one rank (-> gpu.elementwise_table): a step's elementwise ops
//                  cover many parameters at once, out of the caches a per-shape row stays in
//   collective rows  `bench collective` rows of the backend -> intra_node.bandwidth_GBps (the
//                  best class's rate), latency_us, launch_overhead_us.collective and
//                  efficiency.intra_node per collective class: the values that minimize the
//                  squared log error of the model's own closed form (cost_model.hpp's
//                  collective_time) over the rows, by coordinate descent
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config/cluster.hpp"
#include "core/experiment/experiment.hpp"
#include "core/plan/plan.hpp"
#include "core/results/collective_bench.hpp"

namespace muonbed {

// One Newton-Schulz call shape: `batch` matrices of rows x cols.
struct NsCallShape {
  std::int64_t batch = 1;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  bool operator==(const NsCallShape&) const = default;
  bool operator<(const NsCallShape& o) const {
    return std::tie(rows, cols, batch) < std::tie(o.rows, o.cols, o.batch);
  }
};

// A collective the plans run: kind (bench op name), mesh and group, and the sizes to bench.
struct CollectiveWorkload {
  CollectiveBenchSpec spec;
  std::int64_t min_bytes = 0;  // smallest and largest S the plans move
  std::int64_t max_bytes = 0;
  std::vector<std::int64_t> sizes;  // what calibrate benches (covers min..max)
};

struct CalibrationWorkload {
  int ranks = 2;
  int ns_steps = 5;
  OptimizerConfig optimizer;                     // of the first point (NS coefficients, dtypes)
  std::vector<NsCallShape> ns_shapes;            // distinct, sorted
  std::vector<std::int64_t> elementwise_numels;  // sizes to time momentum, apply and adamw at
  std::vector<CollectiveWorkload> collectives;
};

// The workload of an experiment's points whose mesh has `ranks` ranks (the world calibrate runs
// in; other points are skipped). Throws ConfigError when no point has that many ranks. Collective
// sizes: factor-4 steps from the smallest S the plans move (at least 1 KiB) up past the largest.
CalibrationWorkload calibration_workload(const std::vector<Experiment>& points, int ranks);
// `ranks` 0: every point, whatever its mesh (one device timing compute alone: calibrate --backend
// nccl); its collectives are then not meant to be benched.
// Without an experiment: NS on 256^2, 256x688 (hidden x MLP of the llama-shaped CPU model of
// experiments/mpi_quickstart.yaml), 512^2 and 1024^2; every bench collective over all `ranks`
// ranks, 4 KiB to 16 MiB by 4.
CalibrationWorkload default_calibration_workload(int ranks);
// What `muonbed calibrate` measures, for every backend: the experiment's workload
// (calibration_workload at `ranks`, 0 = every point) or without points the default one, plus
// `table_shapes` (a backend's default table, e.g. bench ns's GPU list, so that a profile keeps
// the shapes other experiments interpolate between), distinct and sorted.
CalibrationWorkload calibrate_workload(const std::vector<Experiment>& points, int ranks,
                                       const std::vector<NsCallShape>& table_shapes);

// The synthetic plan the compute benchmark runs on every rank: one replicated Muon matrix of
// `shape` (every rank holds all of it), momentum -> newton_schulz -> apply_update on every rank,
// with the experiment's optimizer settings. Ops 0, 1, 2 in that order.
StepPlan compute_bench_plan(const DeviceMesh& mesh, const NsCallShape& shape,
                            const OptimizerConfig& optimizer);
// The machine-speed probe of a measured point: does the machine still run compute at the speed
// its cluster profile says? The plan's costliest Newton-Schulz call shape (most FLOPs per call,
// over every rank) as a compute_bench_plan on the plan's mesh, and the seconds the profile gives
// that call (compute_time of the probe plan's newton_schulz op: gpu.ns_table where it has the
// shape, else what the model interpolates). A real backend times the probe before and after a
// point's steps as calibrate times gpu.ns_table; measured / predicted far from 1 means the
// profile describes another machine (or this one under other load), and compare says so.
struct SpeedProbe {
  NsCallShape shape;
  StepPlan plan;
  double predicted_s = 0;
};
// nullopt when the plan runs no Newton-Schulz, unless `from_profile`: then a plan without NS
// (a bench plan) is probed with a shape of the profile's own ns_table (the entry of the model's
// kernel version whose time is nearest 10 ms: long enough to time, short enough to repeat), so a
// measurement of communication alone still says whether the machine runs at the profile's speed.
std::optional<SpeedProbe> speed_probe(const StepPlan& plan, const ClusterSpec& cluster,
                                      bool from_profile = false);

// The synthetic plan of an elementwise row: a 1 x numel Muon matrix (momentum, newton_schulz,
// apply_update: ops 0, 1, 2) and a numel-element AdamW vector (adamw: op 3), replicated.
StepPlan elementwise_bench_plan(const DeviceMesh& mesh, std::int64_t numel,
                                const OptimizerConfig& optimizer);

// Measured compute: median seconds over repeats of the slowest rank (ranks run concurrently).
struct ComputeBenchRow {
  std::string kernel;  // newton_schulz | momentum | apply_update | gemm | pack | host_comm
  NsCallShape shape;   // gemm: rows x cols is the NS shape whose X X^T it times
  std::int64_t numel = 0;
  double seconds = 0;
  double model_bytes = 0;   // momentum, apply_update: op_memory_bytes of the bench plan's op;
                            // host_comm: bytes sent + received per call (seconds: the extra)
  double flops = 0;         // newton_schulz, gemm
  bool step_sized = false;  // an elementwise row at a plan op's size (elementwise_bench_plan)
};

// The synthetic plans of a workload's compute rows on `mesh`: compute_bench_plan per NS shape,
// then elementwise_bench_plan per elementwise size (what every rank of the mpi backend runs).
std::vector<StepPlan> calibration_bench_plans(const CalibrationWorkload& workload,
                                              const DeviceMesh& mesh);

// The compute rows a device timer fills in (seconds = 0 until then), with what the model counts
// for each from the bench plans on one device: per NS shape momentum (model_bytes),
// newton_schulz (flops) and apply_update (model_bytes), the rows of the gpu.hbm_GBps /
// launch_overhead_us.kernel line; per elementwise size momentum, apply_update and adamw
// (step_sized, model_bytes), the gpu.elementwise_table.
std::vector<ComputeBenchRow> calibration_compute_rows(const CalibrationWorkload& workload);

// What times calibrate's compute rows: the only part that differs between backends. The mpi
// backend's ranks (the CPU handlers under mpirun, experiments/cli/commands_calibrate.cpp) or one
// GPU with the CUDA kernels the nccl executor runs (kernels/bench.hpp's
// time_calibration_kernels_gpu); a test implements it on the host. `time` returns rows of the
// kinds calibrate_profile / calibrate_compute fit (calibration_compute_rows' kinds, and the mpi
// ranks' gemm, pack and host_comm rows).
class ComputeTimer {
 public:
  virtual ~ComputeTimer() = default;
  // The gpu.ns_table version its Newton-Schulz rows are written under ("cpu-fp32", "v2").
  virtual std::string ns_version() const = 0;
  virtual std::vector<ComputeBenchRow> time(const CalibrationWorkload& workload) = 0;
};

struct CalibrationInput {
  std::string name = "local-cpu";
  int ranks = 2;
  int ns_steps = 5;
  std::string ns_version = "cpu-fp32";  // the timer's (ComputeTimer::ns_version)
  std::vector<ComputeBenchRow> compute;
  std::vector<CollectiveBenchRow> collectives;
  CalibrationInfo info;
  double memory_GiB = 2;  // per rank
};

// How well one fit reproduces the rows it was made from: per row |model - measured| / |measured|
// in percent, the median and the largest, and the row of the largest.
struct FitQuality {
  std::string name;  // the profile keys fitted, and to what
  int rows = 0;
  double median_error_pct = 0;
  double max_error_pct = 0;
  std::string worst;  // the row of the largest error: "... model X, measured Y"
};

// The fitted profile, how well each fit reproduces its rows, and the terms least squares wanted
// below zero that non-negative least squares refitted at 0 (one message each, naming the
// quantity, what plain least squares gave and the rows it came from).
struct CalibrationResult {
  ClusterSpec profile;
  std::vector<FitQuality> fits;  // every fit, always
  std::vector<std::string> clamped;
};

// The fitted profile (a single node of max(8, ranks) "GPUs": every rank on this machine), fitted
// as the header above says, with the physical limits enforced:
//   - a fixed cost that plain least squares puts below 0 (launch_overhead_us.kernel,
//     gpu.host_comm_us_per_message) or a per-byte cost below 0 (gpu.host_comm_ns_per_byte) is
//     refitted by non-negative least squares with that term at 0, and reported in `clamped`: a
//     zero cost is physical, a negative one is noise;
//   - anything else impossible (a bandwidth <= 0 or unbounded: elementwise times that do not grow
//     with the bytes; a time, cost or latency < 0; a value that is not finite) throws Error naming
//     the quantity, its fitted value, the rows it came from and the fix. No profile is made.
CalibrationResult calibrate_profile(const CalibrationInput& input);
// calibrate_profile(input).profile.
ClusterSpec calibrated_profile(const CalibrationInput& input);

// A device's compute measured into a base profile (calibrate --backend nccl: one GPU cannot
// measure the network, so the base profile keeps everything else): `base` with the entries of
// gpu.ns_table of version `ns_version` replaced by the newton_schulz rows (the base's other
// versions kept), gpu.ns_kernel set to it, gpu.elementwise_table replaced by the step-sized
// rows, and gpu.hbm_GBps and launch_overhead_us.kernel refitted from the momentum and
// apply_update rows, by the same fits as calibrate_profile (refusals, clamps, fit quality);
// name and calibration info set from the arguments.
CalibrationResult calibrate_compute(const ClusterSpec& base,
                                    const std::vector<ComputeBenchRow>& rows,
                                    const std::string& ns_version, int ns_steps,
                                    const std::string& name, const CalibrationInfo& info);

// Writes a fitted profile as calibrate does for every backend: a warning about the fits above
// `max_fit_error` and the clamped terms appended to its source line, the header (`header`, then
// what each number is: calibrated_fields_header(backend) and `after_fields`, then
// fit_quality_header), written atomically with the project's one writer
// (core/base/output_files.hpp) and read back by the cluster loader before it replaces `path`.
// Returns the profile as the loader read it back.
ClusterSpec write_calibrated_profile(const std::string& path, CalibrationResult& fitted,
                                     std::vector<std::string> header,
                                     const std::vector<std::string>& after_fields,
                                     const std::string& backend, double max_fit_error);

// `muonbed calibrate --max-fit-error`'s default: a fit whose largest row error exceeds it (in %)
// is warned about and recorded in the profile's header.
constexpr double kDefaultMaxFitErrorPct = 25;
// One warning per fit whose max_error_pct exceeds `max_pct`, naming the fit, its errors and its
// worst row.
std::vector<std::string> fit_error_warnings(const CalibrationResult& result, double max_pct);
// The profile header's lines on the fits: every fit's errors, then "WARNING: ..." per fit above
// `max_pct` and "CLAMPED: ..." per clamped term.
std::vector<std::string> fit_quality_header(const CalibrationResult& result, double max_pct);

// The profile header's "what each number is": per profile field calibrate measures or fits, its
// path and how (the cluster field table's calibrated column, core/config/cluster_fields.hpp, as
// the key reference prints it), wrapped under a 28-column path.
// `backend` mpi or nccl: the fields whose calibrated text has a "calibrate (BACKEND): " part.
std::vector<std::string> calibrated_fields_header(const std::string& backend = "mpi");

// The model's closed-form time (seconds) of one bench row on `cluster`: what the analytic
// backend predicts for the bench's one-op plan (tests check that the two agree).
double model_bench_seconds(const ClusterSpec& cluster, const CollectiveBenchRow& row);

// The profile as YAML: `header` lines as comments first (provenance, what each number is), then
// the profile in the loader's format.
std::string calibrated_profile_yaml(const ClusterSpec& cluster,
                                    const std::vector<std::string>& header);

}  // namespace muonbed
