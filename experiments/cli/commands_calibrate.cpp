// `muonbed calibrate`: microbenchmarks on this machine with a real backend, written as a cluster
// profile (core/results/calibration.hpp). With `--backend mpi` it starts itself under mpirun (one
// process per rank, as `muonbed run` runs mpi points), then rank 0 leads: the compute benchmark on
// every rank at once (Newton-Schulz, momentum, apply_update, GEMM, packing at the experiment's
// shapes), then `bench collective` rows of every collective the experiment's plans run, over the
// group shapes and sizes they use, each checked (#wrong) like nccl-tests. With `--backend nccl`
// (a CUDA build, one GPU) it times the CUDA kernels the GPU executor runs (Newton-Schulz at every
// shape the plans use and bench ns's default shapes, momentum, apply_update and adamw) with bench
// ns's timer and writes them into a base profile (--base: one GPU cannot measure the network).
// Only the timer differs between the two (core/results/calibration.hpp's ComputeTimer): the
// shapes measured, the fits and the profile writing are one code path. The fitted profile is
// written atomically and read back with the loader before the command reports success.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/base/errors.hpp"
#include "core/base/process.hpp"
#include "core/config/cluster.hpp"
#include "core/experiment/experiment.hpp"
#include "core/results/calibration.hpp"
#include "core/results/collective_bench.hpp"
#include "core/results/results.hpp"
#include "experiments/cli/backends.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/format.hpp"
#include "kernels/bench.hpp"
#include "kernels/gpu.hpp"
#include "kernels/newton_schulz.hpp"
#include "kernels/optimizer_math.hpp"
#include "muonbed/config.hpp"

#if MUONBED_HAVE_MPI
#include "backends/mpi/mpi_backend.hpp"
#endif

namespace muonbed::cli {

namespace {

struct CalibrateOptions {
  std::string backend = "mpi";
  std::string experiment;
  std::string base;                 // nccl: the profile whose compute tables are replaced
  int kernel_version = 2;           // nccl: the NS kernel version (the GPU executor's default)
  std::vector<std::string> shapes;  // nccl: NS shapes to time besides the plans' and defaults
  bool warmup_given = false, repeats_given = false;
  int ranks = 0;  // 0: the experiment's smallest mesh, else 2
  std::string out;
  std::string name;  // "": the output file's stem
  std::string note;  // a line for the profile's header (what the machine is)
  int warmup = 2;
  int repeats = 7;
  int iters = 10;
  int runs = 3;             // bench runs per collective size: the median one is kept
  bool concurrent = false;  // compute: all ranks at once (else one rank at a time)
  double max_fit_error = kDefaultMaxFitErrorPct;  // % above which a fit is warned about
};

ConfigError calibrate_error(const std::string& what, const std::string& fix) {
  return ConfigError(SourceLocation{"calibrate", 0, 0}, what, fix);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  return "unknown CPU";
}

bool is_vm() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("flags", 0) == 0) return line.find(" hypervisor") != std::string::npos;
  return false;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one.empty() ? "unknown" : one + " " + five + " " + fifteen;
}

double memory_GiB_per_rank(int ranks) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 2;
  const double gib = static_cast<double>(pages) * static_cast<double>(page) / (1 << 30);
  return std::max(0.001, std::floor(gib / std::max(1, ranks) * 10) / 10);
}

// The options of a --backend nccl run, as given.
std::vector<std::string> gpu_args(const CalibrateOptions& o) {
  std::vector<std::string> args = {"calibrate", "--backend", o.backend};
  if (!o.experiment.empty()) args.insert(args.end(), {"--experiment", o.experiment});
  args.insert(args.end(), {"--base", o.base, "--out", o.out, "--kernel-version",
                           std::to_string(o.kernel_version), "--warmup", std::to_string(o.warmup),
                           "--repeats", std::to_string(o.repeats)});
  for (const std::string& shape : o.shapes) args.insert(args.end(), {"--shape", shape});
  if (!o.name.empty()) args.insert(args.end(), {"--name", o.name});
  if (!o.note.empty()) args.insert(args.end(), {"--note", o.note});
  return args;
}

std::vector<std::string> relaunch_args(const CalibrateOptions& o) {
  if (o.backend == "nccl") return gpu_args(o);
  std::vector<std::string> args = {"calibrate", "--backend", o.backend};
  if (!o.experiment.empty()) args.insert(args.end(), {"--experiment", o.experiment});
  args.insert(args.end(), {"--ranks", std::to_string(o.ranks), "--out", o.out, "--warmup",
                           std::to_string(o.warmup), "--repeats", std::to_string(o.repeats),
                           "--iters", std::to_string(o.iters)});
  if (!o.name.empty()) args.insert(args.end(), {"--name", o.name});
  if (!o.note.empty()) args.insert(args.end(), {"--note", o.note});
  args.insert(args.end(), {"--runs", std::to_string(o.runs)});
  if (o.concurrent) args.push_back("--concurrent");
  if (o.max_fit_error != kDefaultMaxFitErrorPct) {
    std::ostringstream pct;
    pct.precision(17);
    pct << o.max_fit_error;
    args.insert(args.end(), {"--max-fit-error", pct.str()});
  }
  return args;
}

// The command that ran, with every option (what rank 0 was started with), quoted so that it can
// be pasted back into a shell whatever --name and --note hold.
std::string command_line(const CalibrateOptions& o) {
  return "muonbed " + shell_words(relaunch_args(o));
}

std::string shape_text(const NsCallShape& s) {
  return (s.batch > 1 ? std::to_string(s.batch) + "x" : "") + std::to_string(s.rows) + "x" +
         std::to_string(s.cols);
}

// The end of both backends' report: the fits' quality lines, then the file written (and whether
// its header carries warnings).
void print_fit_quality_and_output(const CalibrationResult& fitted, const CalibrateOptions& o,
                                  const std::vector<std::string>& fit_warnings) {
  for (const std::string& line : fit_quality_header(fitted, o.max_fit_error))
    std::cout << "# " << line << "\n";
  std::cout << "# wrote " << o.out
            << (fit_warnings.empty() && fitted.clamped.empty()
                    ? std::string()
                    : " (with the warnings above in its header)")
            << "\n";
}

#if MUONBED_HAVE_MPI
// The mpi backend's timer: every rank runs the bench plans (compute_bench under mpirun, rank 0
// leads), one rank at a time unless --concurrent; prints its table as it goes.
class MpiComputeTimer : public ComputeTimer {
 public:
  explicit MpiComputeTimer(const CalibrateOptions& o) : o_(o) {}
  std::string ns_version() const override { return "cpu-fp32"; }
  std::vector<ComputeBenchRow> time(const CalibrationWorkload& w) override {
    const CalibrateOptions& o = o_;
    const DeviceMesh mesh({{"g", o.ranks, DimRole::replicate}}, std::max(8, o.ranks));
    const std::vector<StepPlan> plans = calibration_bench_plans(w, mesh);
    std::cout << "# compute: " << w.ns_shapes.size() << " Newton-Schulz shapes; per kernel "
              << o.warmup << " warm-up calls, then " << o.repeats
              << " rounds of back-to-back calls (>= 30 ms), "
              << (o.concurrent ? "all ranks at once" : "one rank at a time")
              << ": the median round "
                 "of the slowest rank, per call (ms)\n";
    const std::vector<ComputeBenchRow> all_compute =
        run_compute_bench(plans, o.warmup, o.repeats, o.concurrent);
    std::vector<ComputeBenchRow> compute, host_comm;
    for (const ComputeBenchRow& r : all_compute)
      (r.kernel == "host_comm" ? host_comm : compute).push_back(r);
    std::cout << fmt::format("# {:>16} {:>12} {:>12} {:>12} {:>12} {:>12} {:>10}\n", "shape", "NS",
                             "momentum", "apply", "gemm XX^T", "pack bf16", "NS GFLOP/s");
    std::size_t i = 0;
    for (; i + 5 <= compute.size() && !compute[i].step_sized; i += 5) {
      const auto& m = compute[i];
      const auto& ns = compute[i + 1];
      std::cout << fmt::format(
          "  {:>16} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f} {:>10.2f}\n",
          shape_text(m.shape), ns.seconds * 1e3, m.seconds * 1e3, compute[i + 2].seconds * 1e3,
          compute[i + 3].seconds * 1e3, compute[i + 4].seconds * 1e3, ns.flops / ns.seconds / 1e9);
    }
    if (i < compute.size()) {
      std::cout << "# elementwise ops at the sizes the plans' ops have on one rank (ms; GB/s of "
                   "the model's bytes)\n"
                << fmt::format("# {:>16} {:>12} {:>12} {:>12} {:>8} {:>8} {:>8}\n", "elements",
                               "momentum", "apply", "adamw", "GB/s", "GB/s", "GB/s");
      for (; i + 3 <= compute.size(); i += 3) {
        const auto rate = [](const ComputeBenchRow& r) { return r.model_bytes / r.seconds / 1e9; };
        std::cout << fmt::format(
            "  {:>16} {:>12.3f} {:>12.3f} {:>12.3f} {:>8.2f} {:>8.2f} {:>8.2f}\n", compute[i].numel,
            compute[i].seconds * 1e3, compute[i + 1].seconds * 1e3, compute[i + 2].seconds * 1e3,
            rate(compute[i]), rate(compute[i + 1]), rate(compute[i + 2]));
      }
    }

    if (!host_comm.empty()) {
      std::cout << "# host cost of messages: each Newton-Schulz back to back, every rank at once, "
                   "quiet and then exchanging messages with a partner rank at its progress points "
                   "(packed and unpacked as the executor does); extra time per exchange (one "
                   "message each way), the median round of the slowest rank (us)\n"
                << fmt::format("# {:>16} {:>12} {:>12} {:>12}\n", "shape", "2x16 KiB", "2x64 KiB",
                               "2x256 KiB");
      for (std::size_t k = 0; k + 3 <= host_comm.size(); k += 3)
        std::cout << fmt::format("  {:>16} {:>12.1f} {:>12.1f} {:>12.1f}\n",
                                 shape_text(host_comm[k].shape), host_comm[k].seconds * 1e6,
                                 host_comm[k + 1].seconds * 1e6, host_comm[k + 2].seconds * 1e6);
    }
    return all_compute;
  }

 private:
  const CalibrateOptions& o_;
};

int calibrate_inside(CalibrateOptions& o, const std::vector<Experiment>& points) {
  if (const int code = mpi_command_begin(); code >= 0) return code;
  struct EndMpi {
    ~EndMpi() { mpi_command_end(); }
  } end_mpi;
  const launch::MpiEnvironment env = launch::mpi_environment();
  if (env.size != 0 && env.size != o.ranks)
    throw calibrate_error("this MPI world has " + std::to_string(env.size) +
                              " ranks but --ranks is " + std::to_string(o.ranks),
                          "start it with mpirun -np " + std::to_string(o.ranks) +
                              ", or run muonbed calibrate outside mpirun (it starts mpirun)");
  const CalibrationWorkload w = calibrate_workload(points, o.ranks, {});
  const Provenance prov = make_provenance(nullptr, "");
  const std::string date = utc_timestamp();
  std::cout << "# muonbed calibrate --backend mpi: " << o.ranks << " ranks on " << prov.host_name
            << " (" << cpu_model() << ", " << sysconf(_SC_NPROCESSORS_ONLN)
            << " cores, load average " << load_average() << ")\n";
  if (o.ranks > sysconf(_SC_NPROCESSORS_ONLN))
    std::cout << "# warning: more ranks than cores: oversubscribed, these figures are not a "
                 "benchmark\n";

  MpiComputeTimer timer(o);
  const std::vector<ComputeBenchRow> all_compute = timer.time(w);

  // Collectives, through `bench collective`'s harness on the mpi backend.
  Experiment e;
  e.name = "calibrate";
  e.cluster.name = "calibrating";
  e.cluster.gpus_per_node = std::max(8, o.ranks);
  e.cluster.nodes = 1;
  e.cluster.gpu.peak_tflops = 1;
  e.backends = {"mpi"};
  e.steps = o.warmup;
  e.repeats = o.iters;
  RunSettings settings;
  settings.trace_max_ranks = 0;
  settings.warmup = o.warmup;
  settings.iterations = o.iters;
  settings.check_data = true;
  std::vector<CollectiveBenchRow> rows;
  std::cout << "# collectives: " << w.collectives.size() << " (op, group) pairs the plans use, "
            << o.iters << " timed iterations after " << o.warmup << " warm-up, the median of "
            << o.runs << " such runs (min / median / max: over that run's iterations)\n"
            << collective_bench_header(true);
  for (const CollectiveWorkload& c : w.collectives) {
    e.mesh = c.spec.mesh;
    std::cout << "# " << c.spec.op << " on mesh " << c.spec.mesh.describe() << ", groups of "
              << c.spec.mesh.group_size(c.spec.group) << " (plans move " << c.min_bytes << ".."
              << c.max_bytes << " B)\n";
    for (std::int64_t size : c.sizes) {
      // The median of a few runs: one burst of another process's work moves a run's mean.
      std::vector<CollectiveBenchRow> runs;
      for (int k = 0; k < o.runs; ++k)
        runs.push_back(run_collective_bench(c.spec, e, size, "mpi", settings));
      std::sort(runs.begin(), runs.end(),
                [](const CollectiveBenchRow& a, const CollectiveBenchRow& b) {
                  return a.time_us < b.time_us;
                });
      rows.push_back(runs[runs.size() / 2]);
      for (const CollectiveBenchRow& r : runs)
        if (r.wrong != 0) rows.back().wrong = r.wrong;
      std::cout << collective_bench_line(rows.back()) << std::endl;
      if (rows.back().wrong != 0)
        throw Error("calibrate: " + c.spec.op + " of " + std::to_string(size) + " B delivered " +
                    std::to_string(rows.back().wrong) +
                    " wrong elements (#wrong); fix: the MPI installation or the executor is "
                    "broken, run ctest -L mpi");
    }
  }

  CalibrationInput in;
  in.name = o.name.empty() ? std::filesystem::path(o.out).stem().string() : o.name;
  in.ranks = o.ranks;
  in.ns_steps = w.ns_steps;
  in.ns_version = timer.ns_version();
  in.compute = all_compute;
  in.collectives = rows;
  in.memory_GiB = memory_GiB_per_rank(o.ranks);
  in.info.tool = std::string("muonbed calibrate ") + MUONBED_VERSION;
  in.info.date = date;
  in.info.host = prov.host_name;
  in.info.git_hash = prov.git_hash;
  in.info.backend = "mpi";
  in.info.command = command_line(o);
  in.info.notes = std::to_string(o.ranks) + " ranks on " +
                  std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " cores (" + cpu_model() +
                  "), load average " + load_average() + "; " + mpi_library_version() + "; " +
                  cpu_gemm_backend();
  // Refuses a physically impossible fit (the quantity, its value, the rows, the fix): no
  // profile is written then.
  CalibrationResult fitted = calibrate_profile(in);
  ClusterSpec& profile = fitted.profile;
  profile.source = "muonbed calibrate on " + prov.host_name + ", " + date +
                   " (microbenchmarks only; see the calibration block)";
  // The quality of every fit: warned about on stderr and recorded in the header (and the
  // source line) when a fit misses its own rows by more than --max-fit-error, or when a term was
  // clamped at 0.
  const std::vector<std::string> fit_warnings = fit_error_warnings(fitted, o.max_fit_error);
  // Each warning in one write, after stdout's table: under mpirun the two streams are forwarded
  // apart, and a line written in pieces could be split by the table's lines.
  std::cout << std::flush;
  for (const std::string& w : fit_warnings)
    std::cerr << ("muonbed: warning: calibrate: " + w + "\n") << std::flush;
  for (const std::string& c : fitted.clamped)
    std::cerr << ("muonbed: warning: calibrate: CLAMPED at 0 by non-negative least squares: " + c +
                  "\n")
              << std::flush;

  const std::vector<std::string> header = {
      in.name +
          ": a cluster profile MEASURED by `muonbed calibrate` (microbenchmarks only, never "
          "step times)",
      "machine: " + prov.host_name + ", " + cpu_model() + ", " +
          std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) +
          " cores (a VM when /proc/cpuinfo says hypervisor: " + (is_vm() ? "yes" : "no") +
          "); each MPI rank is one \"GPU\"",
      "date: " + date + "; load average at the start " + load_average(),
      "note: " + (o.note.empty() ? std::string("(none given)") : o.note),
      "command: " + command_line(o),
      "versions: muonbed " + std::string(MUONBED_VERSION) + " (" + prov.git_hash + "), " +
          mpi_library_version() + ", GEMM " + cpu_gemm_backend(),
      "",
      "What each number is (units as in every profile: GB/s = 1e9 B/s, us, TFLOP/s, ms; every "
      "compute figure",
      "is per call, the median of " + std::to_string(o.repeats) +
          " rounds of back-to-back calls (>= 30 ms), slowest of " + std::to_string(o.ranks) +
          " ranks " +
          (o.concurrent ? "running at once" : "taking turns (each with the machine to itself)") +
          "):",
  };
  // The new profile replaces an old one only after the loader users run has read it back.
  write_calibrated_profile(
      o.out, fitted, header,
      {"  nic, network              placeholders: one machine, no network is measured"}, "mpi",
      o.max_fit_error);
  const ClusterSpec& back = profile;  // validate above read the file back with the loader
  std::cout << fmt::format(
      "# profile '{}': NS table {} shapes; GEMM peak {:.1f} GFLOP/s; elementwise {:.2f} GB/s + "
      "{:.1f} us per kernel; host comm {:.1f} us/message + {:.3f} ns/byte; link {:.2f} GB/s, "
      "latency {:.1f} us, collective launch {:.1f} us, "
      "efficiency ring {:.2f} all_to_all {:.2f} p2p {:.2f}\n",
      back.name, back.gpu.ns_table.size(), back.gpu.peak_tflops * 1e3, back.gpu.hbm_GBps,
      back.launch_overhead.kernel_us, back.gpu.host_comm_us_per_message,
      back.gpu.host_comm_ns_per_byte, back.intra.bandwidth_GBps, back.intra.latency_us,
      back.launch_overhead.collective_us, back.efficiency.intra_node.ring,
      back.efficiency.intra_node.all_to_all, back.efficiency.intra_node.p2p);
  print_fit_quality_and_output(fitted, o, fit_warnings);
  return 0;
}
#endif

// The nccl backend's timer: one GPU, the CUDA kernels the GPU executor runs, timed by bench ns's
// code (kernels/bench.hpp's time_calibration_kernels_gpu). Momentum and apply_update are also
// timed at every NS shape's size: those rows fit gpu.hbm_GBps and launch_overhead_us.kernel.
class GpuComputeTimer : public ComputeTimer {
 public:
  explicit GpuComputeTimer(const CalibrateOptions& o) : o_(o) {}
  std::string ns_version() const override { return "v" + std::to_string(o_.kernel_version); }
  const GpuCalibrationTimes& times() const { return times_; }
  std::vector<ComputeBenchRow> time(const CalibrationWorkload& w) override {
    std::vector<ComputeBenchRow> rows = calibration_compute_rows(w);
    GpuCalibrationRequest q;
    std::vector<std::int64_t> numels;
    for (const ComputeBenchRow& r : rows) {
      if (r.kernel == "newton_schulz")
        q.ns_shapes.push_back({r.shape.batch, r.shape.rows, r.shape.cols});
      if (r.kernel == "momentum") numels.push_back(r.numel);
    }
    std::sort(numels.begin(), numels.end());
    numels.erase(std::unique(numels.begin(), numels.end()), numels.end());
    q.elementwise_numels = numels;
    q.version = o_.kernel_version;
    const MuonConfig& muon = w.optimizer.muon;
    q.config = make_ns_config(muon);
    q.momentum = momentum_params(muon);
    q.apply = apply_params(muon, 1024, 1024);  // the scalars do not change the kernel's time
    q.adamw = w.optimizer.adamw;
    q.warmup = o_.warmup;
    q.repeats = o_.repeats;
    std::cout << "# compute: " << q.ns_shapes.size() << " Newton-Schulz shapes (the plans' and "
              << "bench ns's default GPU list), elementwise kernels at " << numels.size()
              << " sizes (the plans' ops on one rank and the NS shapes)\n";
    times_ = time_calibration_kernels_gpu(q, std::cout);
    const auto numel_index = [&](std::int64_t n) {
      return static_cast<std::size_t>(std::lower_bound(numels.begin(), numels.end(), n) -
                                      numels.begin());
    };
    std::size_t ns = 0;
    for (ComputeBenchRow& r : rows) {
      if (r.kernel == "newton_schulz") {
        r.seconds = times_.ns_ms.at(ns++) * 1e-3;
        continue;
      }
      const std::array<double, 3>& ms = times_.elementwise_ms.at(numel_index(r.numel));
      r.seconds = (r.kernel == "momentum"       ? ms[0]
                   : r.kernel == "apply_update" ? ms[1]
                                                : ms[2]) *
                  1e-3;
    }
    return rows;
  }

 private:
  const CalibrateOptions& o_;
  GpuCalibrationTimes times_;
};

// bench ns's default GPU shapes and the --shape ones.
std::vector<NsCallShape> gpu_table_shapes(const CalibrateOptions& o) {
  std::vector<MatrixShape> list = default_gpu_bench_shapes();
  for (const std::string& text : o.shapes) list.push_back(parse_shape(text));
  std::vector<NsCallShape> shapes;
  for (const MatrixShape& s : list) shapes.push_back({s.batch, s.rows, s.cols});
  return shapes;
}

// calibrate --backend nccl after its checks: measure, fit into the base profile, write.
int calibrate_gpu(const CalibrateOptions& o, const std::vector<Experiment>& points,
                  const ClusterSpec& base) {
  // Every point's NS calls, whatever its world size: one GPU times any rank's compute.
  const CalibrationWorkload w = calibrate_workload(points, 0, gpu_table_shapes(o));
  const Provenance prov = make_provenance(nullptr, "");
  const std::string date = utc_timestamp();
  std::cout << "# muonbed calibrate --backend nccl on " << prov.host_name << ", base profile '"
            << base.name << "' (" << o.base << ")\n";
  GpuComputeTimer timer(o);
  const std::vector<ComputeBenchRow> rows = timer.time(w);
  const GpuCalibrationTimes& t = timer.times();
  std::vector<std::string> fallback;
  for (std::size_t i = 0; i < t.ns_version.size(); ++i)
    if (t.ns_version[i] != o.kernel_version) fallback.push_back(shape_text(w.ns_shapes[i]));

  CalibrationInfo info;
  info.tool = std::string("muonbed calibrate ") + MUONBED_VERSION;
  info.date = date;
  info.host = prov.host_name;
  info.git_hash = prov.git_hash;
  info.backend = "nccl";
  info.command = command_line(o);
  info.notes = "one GPU, " + t.device_name + "; " + t.versions + "; NS kernel " + t.kernel;
  const std::string name = o.name.empty() ? std::filesystem::path(o.out).stem().string() : o.name;
  // Refuses a physically impossible fit, as for every backend: no profile is written then.
  CalibrationResult fitted =
      calibrate_compute(base, rows, timer.ns_version(), w.ns_steps, name, info);
  fitted.profile.source = "muonbed calibrate --backend nccl on " + prov.host_name + " (" +
                          t.device_name + "), " + date +
                          ": NS and elementwise tables, hbm_GBps and the kernel launch measured; "
                          "everything else from the base profile '" +
                          base.name + "' (" + base.source + ")";
  const std::vector<std::string> fit_warnings = fit_error_warnings(fitted, o.max_fit_error);
  for (const std::string& warning : fit_warnings)
    std::cerr << ("muonbed: warning: calibrate: " + warning + "\n");
  for (const std::string& c : fitted.clamped)
    std::cerr << ("muonbed: warning: calibrate: CLAMPED at 0 by non-negative least squares: " + c +
                  "\n");
  const std::vector<std::string> header = {
      name +
          ": a cluster profile whose compute tables were MEASURED on one GPU by `muonbed "
          "calibrate --backend nccl` (microbenchmarks only, never step times); the rest is "
          "the base profile",
      "machine: " + prov.host_name + ", GPU " + t.device_name,
      "versions: muonbed " + std::string(MUONBED_VERSION) + " (" + prov.git_hash + "), " +
          t.versions,
      "date: " + date,
      "note: " + (o.note.empty() ? std::string("(none given)") : o.note),
      "command: " + command_line(o),
      "base: " + o.base + " ('" + base.name +
          "'): its network, NVLink, efficiencies, peak, GEMM "
          "curve and memory are kept (one GPU cannot measure them)",
      "",
      "What each number is (units as in every profile: GB/s = 1e9 B/s, us, ms; every compute "
      "figure is per call,",
      "the median of " + std::to_string(o.repeats) + " runs after " + std::to_string(o.warmup) +
          " warm-ups, the L2 flushed before each run: bench ns's timer; NS kernel " + t.kernel +
          (fallback.empty()
               ? std::string()
               : "; shapes it cannot run took v1, as the executor does: " + join(fallback)) +
          "):",
  };
  write_calibrated_profile(o.out, fitted, header,
                           {"  everything else            the base profile's, unchanged"}, "nccl",
                           o.max_fit_error);
  const ClusterSpec& profile = fitted.profile;
  std::cout << fmt::format(
      "# profile '{}': NS table {} shapes of {} (of {} rows); elementwise table {} rows; hbm "
      "{:.1f} GB/s + {:.2f} us per kernel (fitted)\n",
      profile.name, w.ns_shapes.size(), timer.ns_version(), profile.gpu.ns_table.size(),
      profile.gpu.elementwise_table.size(), profile.gpu.hbm_GBps,
      profile.launch_overhead.kernel_us);
  print_fit_quality_and_output(fitted, o, fit_warnings);
  return 0;
}

int run_calibrate(CalibrateOptions& o) {
  if (o.backend != "mpi" && o.backend != "nccl")
    throw calibrate_error("calibrate measures with a real backend, not '" + o.backend + "'",
                          "use --backend mpi (or nccl on a GPU build)");
  if (o.backend == "mpi") require_backend("mpi", "calibrate");
  if (o.out.empty())
    throw calibrate_error("--out is required", "e.g. --out experiments/clusters/my-machine.yaml");
  const std::filesystem::path out(o.out);
  if (std::filesystem::is_directory(out))
    throw calibrate_error("--out '" + o.out + "' is a folder",
                          "give a file name, e.g. --out " + (out / "local-cpu.yaml").string());
  check_output_file(o.out, "--out");
  std::vector<Experiment> points;
  if (!o.experiment.empty()) points = load_experiment(o.experiment);
  // nccl: every path and shape first (a wrong one is said on any machine), then the GPU.
  std::optional<ClusterSpec> base;
  if (o.backend == "nccl" && !o.base.empty()) {
    const std::string path = find_cluster_file(o.base, "");
    if (std::filesystem::exists(out) && std::filesystem::equivalent(out, path))
      throw calibrate_error("--out '" + o.out + "' is the --base profile this command reads",
                            "write the profile to another file, e.g. --out " +
                                (out.parent_path() / "my-gpu.yaml").string());
    base = load_cluster_file(path);
  }
  // Refused now, not after minutes of measuring (write_output_file would refuse it too).
  if (is_input_file(o.out))
    throw calibrate_error("--out '" + o.out + "' is the experiment this command reads",
                          "write the profile to another file, e.g. --out " +
                              (out.parent_path() / "my-machine.yaml").string());
  if (o.backend == "nccl") {
    for (const std::string& text : o.shapes) (void)parse_shape(text);
    if (!o.warmup_given) o.warmup = 5;  // bench ns's GPU defaults
    if (!o.repeats_given) o.repeats = 30;
    if (std::string why; !cuda_device_available(&why))
      throw calibrate_error(
          "calibrate --backend nccl needs a GPU build with a usable GPU, and here there is none: " +
              why,
          "run it on a machine with an NVIDIA GPU (compute capability 8.0 or newer) and a CUDA "
          "build of muonbed (scripts/gpu-bundle packs one), or calibrate CPU ranks with "
          "--backend mpi");
    if (!base)
      throw calibrate_error(
          "calibrate --backend nccl needs --base: the profile whose compute "
          "tables it replaces (one GPU cannot measure the network)",
          "e.g. --base experiments/clusters/dgx-h100.yaml");
    if (o.kernel_version < 1)
      throw calibrate_error(
          "--kernel-version " + std::to_string(o.kernel_version) + " is not a kernel version",
          "see muonbed bench ns --list-versions");
    return calibrate_gpu(o, points, *base);
  }
  if (!o.shapes.empty())
    throw calibrate_error("--shape is an option of --backend nccl",
                          "drop it: --backend mpi times the shapes the plans use");
  if (o.ranks == 0) {
    o.ranks = 2;
    if (!points.empty()) {
      o.ranks = points.front().mesh.world_size();
      for (const Experiment& p : points) o.ranks = std::min(o.ranks, p.mesh.world_size());
    }
  }
  if (o.ranks < 2 || o.ranks > 1024)
    throw calibrate_error("--ranks " + std::to_string(o.ranks) + " is out of range",
                          "use 2..1024 ranks (collectives need two)");
  if (o.warmup < 0 || o.repeats < 1 || o.iters < 1 || o.runs < 1)
    throw calibrate_error("--warmup must be >= 0, --repeats and --iters >= 1",
                          "e.g. --warmup 1 --repeats 5 --iters 10");
  // Check the workload before starting any rank (a wrong --ranks is an error here, not in mpirun).
  if (!points.empty()) (void)calibration_workload(points, o.ranks);
#if MUONBED_HAVE_MPI
  if (!launch::mpi_environment().inside)
    return launch::relaunch_under_mpirun(o.ranks, relaunch_args(o),
                                         "muonbed calibrate --backend " + o.backend);
  return calibrate_inside(o, points);
#else
  return 1;  // require_backend threw
#endif
}

}  // namespace

void add_calibrate_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "Microbenchmark this machine with a real backend and write a cluster profile YAML");
  cmd->add_option("--backend", o->backend,
                  "mpi (CPU ranks under Open MPI) or nccl (one GPU: compute tables into --base)")
      ->capture_default_str();
  cmd->add_option("--base", o->base,
                  "nccl: the cluster profile (name or YAML) whose compute tables are replaced");
  cmd->add_option("--kernel-version", o->kernel_version,
                  "nccl: the Newton-Schulz kernel version to time (bench ns --list-versions)")
      ->capture_default_str();
  cmd->add_option("--shape", o->shapes,
                  "nccl: ROWSxCOLS or BATCHxROWSxCOLS to time besides the plans' shapes and bench "
                  "ns's default GPU list (repeatable)");
  cmd->add_option("--experiment", o->experiment,
                  "time the NS shapes and collectives this experiment's plans use");
  cmd->add_option("--ranks", o->ranks,
                  "MPI ranks (default: the experiment's smallest mesh, else 2); points of other "
                  "sizes are skipped");
  cmd->add_option("--out", o->out, "the profile to write (YAML)")->required();
  cmd->add_option("--name", o->name, "the profile's name (default: the file's stem)");
  cmd->add_option("--note", o->note, "a line for the profile's header: what this machine is");
  CLI::Option* warmup =
      cmd->add_option("--warmup", o->warmup, "untimed rounds before timing (nccl: default 5)")
          ->check(CLI::Range(0, 100))
          ->capture_default_str();
  CLI::Option* repeats = cmd->add_option("--repeats", o->repeats,
                                         "timed compute rounds, median reported (nccl: default 30)")
                             ->check(CLI::Range(1, 1000))
                             ->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed iterations per collective size and run")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  cmd->add_flag("--concurrent", o->concurrent,
                "time compute on all ranks at once (they share cores) instead of one at a time");
  cmd->add_option("--runs", o->runs, "runs per collective size (the median one is kept)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--max-fit-error", o->max_fit_error,
                  "PCT: warn (stderr and the profile's header) about every fit whose model "
                  "misses one of its own rows by more than this")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cmd->footer(R"(Examples:
  muonbed calibrate --backend mpi --experiment experiments/validate_cpu.yaml --out my-cpu.yaml
  then set `cluster: my-cpu.yaml` in the experiment, muonbed run it, and muonbed compare it
  muonbed calibrate --backend nccl --experiment experiments/hf_qwen3_moe.yaml \
      --base experiments/clusters/dgx-h100.yaml --out h100-measured.yaml
  (a CUDA build on a GPU machine: NS at the plans' shapes, elementwise kernels, into the base)
Calibration uses microbenchmarks only (never the step times the profile is judged by). The
profile is written atomically, read back with the loader, and its header says where, when and
how it was measured and how well each fit reproduces its rows. A physically impossible fit (a
time or cost below 0, a bandwidth at or below 0, a value that is not finite) is refused with the
rows it came from; a fixed or per-byte cost least squares puts below 0 is refitted at 0
(non-negative least squares) and the header says so (CLAMPED).)");
  cmd->callback([o, warmup, repeats, &exit_code] {
    o->warmup_given = warmup->count() > 0;
    o->repeats_given = repeats->count() > 0;
    exit_code = run_calibrate(*o);
  });
}

}  // namespace muonbed::cli
