// `muonbed calibrate`: microbenchmarks on this machine with a real backend, written as a cluster
// profile (core/results/calibration.hpp). With `--backend mpi` it starts itself under mpirun (one
// process per rank, as `muonbed run` runs mpi points), then rank 0 leads: the compute benchmark on
// every rank at once (Newton-Schulz, momentum, apply_update, GEMM, packing at the experiment's
// shapes), then `bench collective` rows of every collective the experiment's plans run, over the
// group shapes and sizes they use, each checked (#wrong) like nccl-tests. The fitted profile is
// written atomically and read back with the loader before the command reports success.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
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
#include "kernels/newton_schulz.hpp"
#include "muonbed/config.hpp"

#if MUONBED_HAVE_MPI
#include "backends/mpi/mpi_backend.hpp"
#endif

namespace muonbed::cli {

namespace {

struct CalibrateOptions {
  std::string backend = "mpi";
  std::string experiment;
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

std::vector<std::string> relaunch_args(const CalibrateOptions& o) {
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

#if MUONBED_HAVE_MPI
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
  const CalibrationWorkload w = points.empty() ? default_calibration_workload(o.ranks)
                                               : calibration_workload(points, o.ranks);
  const Provenance prov = make_provenance(nullptr, "");
  const std::string date = utc_timestamp();
  std::cout << "# muonbed calibrate --backend mpi: " << o.ranks << " ranks on " << prov.host_name
            << " (" << cpu_model() << ", " << sysconf(_SC_NPROCESSORS_ONLN)
            << " cores, load average " << load_average() << ")\n";
  if (o.ranks > sysconf(_SC_NPROCESSORS_ONLN))
    std::cout << "# warning: more ranks than cores: oversubscribed, these figures are not a "
                 "benchmark\n";

  // Compute.
  const DeviceMesh mesh({{"g", o.ranks, DimRole::replicate}}, std::max(8, o.ranks));
  std::vector<StepPlan> plans;
  for (const NsCallShape& s : w.ns_shapes)
    plans.push_back(compute_bench_plan(mesh, s, w.optimizer));
  for (const std::int64_t n : w.elementwise_numels)
    plans.push_back(elementwise_bench_plan(mesh, n, w.optimizer));
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
  if (!fit_warnings.empty() || !fitted.clamped.empty())
    profile.source +=
        "; WARNING: " +
        (fit_warnings.empty()
             ? std::string()
             : std::to_string(fit_warnings.size()) + " fit(s) above --max-fit-error " +
                   fmt::format("{:g}", o.max_fit_error) + " %") +
        (!fit_warnings.empty() && !fitted.clamped.empty() ? ", " : "") +
        (fitted.clamped.empty() ? std::string()
                                : std::to_string(fitted.clamped.size()) + " term(s) clamped at 0") +
        " (see the header)";

  std::vector<std::string> header = {
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
  // From the cluster field table, as the key reference (docs/KEYS.md) says it.
  for (const std::string& line : calibrated_fields_header()) header.push_back(line);
  header.push_back("  nic, network              placeholders: one machine, no network is measured");
  header.push_back("");
  for (const std::string& line : fit_quality_header(fitted, o.max_fit_error))
    header.push_back(line);
  const std::string yaml = calibrated_profile_yaml(profile, header);
  // The new profile replaces an old one only after the loader users run has read it back.
  WriteOptions write;
  write.what = "cluster profile";
  write.validate = [](const std::string& temp) { (void)load_cluster_file(temp); };
  write_output_file(o.out, yaml, write);
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
  for (const std::string& line : fit_quality_header(fitted, o.max_fit_error))
    std::cout << "# " << line << "\n";
  std::cout << "# wrote " << o.out
            << (fit_warnings.empty() && fitted.clamped.empty()
                    ? std::string()
                    : " (with the warnings above in its header)")
            << "\n";
  return 0;
}
#endif

int run_calibrate(CalibrateOptions& o) {
  if (o.backend == "nccl")
    throw calibrate_error(
        "calibrate --backend nccl needs a GPU build with the NCCL executor, which this muonbed "
        "does not have yet",
        "calibrate CPU ranks with --backend mpi; GPU profiles take their Newton-Schulz table "
        "from `muonbed bench ns --device gpu` (kernels/BENCHMARKS.md) for now");
  if (o.backend != "mpi")
    throw calibrate_error("calibrate measures with a real backend, not '" + o.backend + "'",
                          "use --backend mpi (or nccl on a GPU build)");
  require_backend("mpi", "calibrate");
  if (o.out.empty())
    throw calibrate_error("--out is required", "e.g. --out experiments/clusters/my-machine.yaml");
  const std::filesystem::path out(o.out);
  if (std::filesystem::is_directory(out))
    throw calibrate_error("--out '" + o.out + "' is a folder",
                          "give a file name, e.g. --out " + (out / "local-cpu.yaml").string());
  check_output_file(o.out, "--out");
  std::vector<Experiment> points;
  if (!o.experiment.empty()) points = load_experiment(o.experiment);
  // Refused now, not after minutes of measuring (write_output_file would refuse it too).
  if (is_input_file(o.out))
    throw calibrate_error("--out '" + o.out + "' is the experiment this command reads",
                          "write the profile to another file, e.g. --out " +
                              (out.parent_path() / "my-machine.yaml").string());
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
  cmd->add_option("--backend", o->backend, "mpi (CPU ranks under Open MPI); nccl needs a GPU build")
      ->capture_default_str();
  cmd->add_option("--experiment", o->experiment,
                  "time the NS shapes and collectives this experiment's plans use");
  cmd->add_option("--ranks", o->ranks,
                  "MPI ranks (default: the experiment's smallest mesh, else 2); points of other "
                  "sizes are skipped");
  cmd->add_option("--out", o->out, "the profile to write (YAML)")->required();
  cmd->add_option("--name", o->name, "the profile's name (default: the file's stem)");
  cmd->add_option("--note", o->note, "a line for the profile's header: what this machine is");
  cmd->add_option("--warmup", o->warmup, "untimed rounds before timing")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "timed compute rounds (median reported)")
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
Calibration uses microbenchmarks only (never the step times the profile is judged by). The
profile is written atomically, read back with the loader, and its header says where, when and
how it was measured and how well each fit reproduces its rows. A physically impossible fit (a
time or cost below 0, a bandwidth at or below 0, a value that is not finite) is refused with the
rows it came from; a fixed or per-byte cost least squares puts below 0 is refitted at 0
(non-negative least squares) and the header says so (CLAMPED).)");
  cmd->callback([o, &exit_code] { exit_code = run_calibrate(*o); });
}

}  // namespace muonbed::cli
