// `muonbed bench ns`: the Newton-Schulz benchmark of kernels/bench.hpp. Each kernel is validated
// against the CPU reference before it is timed; prints time, TFLOP/s and the fraction of a large
// GEMM's rate. Without a GPU it runs (and says it runs) the CPU fp32 path.
// `muonbed bench collective`: nccl-tests' table for one collective on any registered backend
// (core/results/collective_bench.hpp): predicted by the analytic model or the simulator on a
// cluster profile, measured by the real executors when they register.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/base/errors.hpp"
#include "core/base/process.hpp"
#include "core/config/cluster.hpp"
#include "core/engine/cost_model.hpp"
#include "core/experiment/backends.hpp"
#include "core/experiment/experiment.hpp"
#include "core/results/collective_bench.hpp"
#include "core/results/compare.hpp"
#include "core/results/results.hpp"
#include "core/results/run_point.hpp"
#include "experiments/cli/backends.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/format.hpp"
#include "kernels/bench.hpp"
#include "kernels/gpu.hpp"

namespace muonbed::cli {

namespace {

struct BenchCollectiveOptions {
  std::string backend;
  std::string cluster;  // "": dgx-h100 (predicting backends), local-cpu (real ones)
  std::string op = "all_gather";
  int gpus = 8;
  std::string mesh;   // "dp=2,tp=8"
  std::string group;  // "tp" or "dp,tp"
  std::string sizes = "1K:1G";
  int root = 0;
  std::string dtype = "float";
  int warmup = 5;
  int iterations = 20;
  std::string fidelity = "auto";
  std::string json_path;
};

ConfigError cli_error(const std::string& what, const std::string& fix) {
  return ConfigError(SourceLocation{"bench collective", 0, 0}, what, fix);
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// "--mesh dp=2,tp=8 --group tp", or "--gpus N" (one dim "g", the group).
void build_mesh(const BenchCollectiveOptions& o, const ClusterSpec& cluster,
                CollectiveBenchSpec& spec) {
  const int gpn = std::max(1, cluster.gpus_per_node);
  if (o.mesh.empty()) {
    if (o.gpus < 2)
      throw cli_error("--gpus " + std::to_string(o.gpus) + " is too few for a collective",
                      "use --gpus 2 or more");
    spec.mesh = DeviceMesh({{"g", o.gpus, DimRole::replicate}}, gpn);
    spec.group = DimSet::of({0});
    if (!o.group.empty() && o.group != "g")
      throw cli_error("--group " + o.group + " names no dim of the mesh 'g'",
                      "give --mesh NAME=SIZE,... with --group, or drop --group");
    return;
  }
  std::vector<MeshDim> dims;
  for (const std::string& item : split(o.mesh, ',')) {
    const std::size_t eq = item.find('=');
    int size = 0;
    try {
      size = eq == std::string::npos ? 0 : std::stoi(item.substr(eq + 1));
    } catch (const std::exception&) {
      size = 0;
    }
    if (eq == std::string::npos || eq == 0 || size < 1)
      throw cli_error("bad mesh dim '" + item + "' in --mesh " + o.mesh,
                      "write NAME=SIZE pairs, outermost first, e.g. --mesh dp=2,tp=8");
    dims.push_back({item.substr(0, eq), size, DimRole::replicate});
  }
  spec.mesh = DeviceMesh(dims, gpn);
  const std::vector<std::string> names = split(o.group, ',');
  if (names.empty())
    throw cli_error("--mesh needs --group: the dims the collective spans",
                    "e.g. --mesh dp=2,tp=8 --group tp");
  DimSet group;
  for (const std::string& name : names) {
    const int d = spec.mesh.find(name);
    if (d < 0)
      throw cli_error("--group " + name + " is not a dim of --mesh " + o.mesh,
                      "name dims of the mesh, e.g. --group " + dims.back().name);
    group = group.with(d);
  }
  spec.group = group;
}

// The machine-speed verdict of a measured bench: the speed probe before the first size and after
// the last, against the profile's time for the probe (as `muonbed compare` judges a point).
void print_speed_verdict(const std::vector<CollectiveBenchRow>& rows, const std::string& cluster) {
  const CollectiveBenchRow* first = nullptr;
  const CollectiveBenchRow* last = nullptr;
  for (const CollectiveBenchRow& r : rows)
    if (r.probe_predicted_s > 0) {
      if (!first) first = &r;
      last = &r;
    }
  if (!first) {
    std::cout << "# machine: not probed (the profile '" << cluster
              << "' has no Newton-Schulz table to probe against; MUONBED_MPI_SPEED_PROBE=off "
                 "also skips it)\n";
    return;
  }
  const double before = first->probe_before_s / first->probe_predicted_s;
  const double after = last->probe_after_s / last->probe_predicted_s;
  const double drift =
      first->probe_before_s > 0 ? last->probe_after_s / first->probe_before_s - 1 : 0;
  std::cout << fmt::format(
      "# machine: speed probe (NS {}, profile '{}' {:.3f} ms): {:.3f} ms before the first size, "
      "{:.3f} ms after the last: {:.2f}x / {:.2f}x the profile's time\n",
      first->probe_shape, cluster, first->probe_predicted_s * 1e3, first->probe_before_s * 1e3,
      last->probe_after_s * 1e3, before, after);
  const bool off =
      std::abs(before - 1) > kSpeedProbeTolerance || std::abs(after - 1) > kSpeedProbeTolerance;
  if (off)
    std::cout << fmt::format(
        "# machine: NOT the profile's machine speed (more than {:.0f} % off): the profile "
        "describes another machine or this one under other load; recalibrate here (muonbed "
        "calibrate) before comparing these times with its predictions\n",
        kSpeedProbeTolerance * 100);
  if (std::abs(drift) > kSpeedProbeTolerance)
    std::cout << fmt::format(
        "# machine: its speed moved {:+.0f} % during the bench: rerun on a quiet machine\n",
        drift * 100);
  if (!off && std::abs(drift) <= kSpeedProbeTolerance)
    std::cout << "# machine: steady, at the profile's speed (within " << kSpeedProbeTolerance * 100
              << " %)\n";
}

// Ranks a real backend may start on one machine for a bench (calibrate's limit too).
constexpr int kMaxRealBenchRanks = 1024;

int run_bench_collective(const BenchCollectiveOptions& o) {
  std::string backend = o.backend;
  if (backend.empty()) backend = find_backend("sim") ? "sim" : "analytic";
  if (find_backend(backend) == nullptr)
    throw cli_error("backend '" + backend + "' is not built into this muonbed (this build has " +
                        backends_summary() + ")",
                    "use --backend sim or --backend analytic; a real executor (mpi, nccl) "
                    "appears here once it is built and registers itself");
  // Built but unusable here (nccl without a GPU): said before any work.
  if (const std::string why = backend_unavailable(backend, ""); !why.empty()) {
    const std::size_t fix = why.find("; fix: ");
    throw cli_error(why.substr(0, fix), fix == std::string::npos ? "" : why.substr(fix + 7));
  }
  const bool predicting = !is_measured_backend(backend);
  if (!o.json_path.empty()) check_output_file(o.json_path, "--json");  // before any work
  Experiment e;
  e.name = "bench_collective";
  // A real backend measures this machine: its profile only names it (local-cpu unless given).
  e.cluster = load_cluster_file(find_cluster_file(
      o.cluster.empty() ? (predicting ? "dgx-h100" : "local-cpu") : o.cluster, ""));
  // Real backends: nccl-tests' -w and -n are the point's warm-up and timed steps.
  e.steps = o.warmup;
  e.repeats = o.iterations;
  e.backends = {backend};
  e.sim_fidelity = o.fidelity;
  CollectiveBenchSpec spec;
  spec.op = o.op;
  spec.root = o.root;
  if (o.dtype == "float" || o.dtype == "fp32")
    spec.dtype = DType::fp32;
  else if (o.dtype == "bfloat16" || o.dtype == "bf16")
    spec.dtype = DType::bf16;
  else
    throw cli_error("unknown --dtype " + o.dtype, "use float or bfloat16");
  build_mesh(o, e.cluster, spec);
  e.mesh = spec.mesh;
  const int world = spec.mesh.world_size();
  const int gpn = std::max(1, e.cluster.gpus_per_node);
  if (e.cluster.nodes > 0 && world > e.cluster.nodes * gpn)
    throw cli_error(std::to_string(world) + " GPUs do not fit cluster '" + e.cluster.name + "' (" +
                        std::to_string(e.cluster.nodes) + " nodes x " + std::to_string(gpn) + ")",
                    "use fewer GPUs or a cluster with more nodes");
  const std::vector<std::int64_t> sizes = parse_size_range(o.sizes);
  if (!predicting) {
    // A real backend runs every rank on this machine and holds each size several times per
    // rank (send and receive buffers, wire staging): refused before any rank starts.
    if (world > kMaxRealBenchRanks)
      throw cli_error(std::to_string(world) +
                          " ranks of a real backend on one machine is more than " +
                          std::to_string(kMaxRealBenchRanks),
                      "use at most " + std::to_string(kMaxRealBenchRanks) +
                          " ranks here, or --backend sim / analytic for larger groups");
    const long long available = available_memory_bytes();
    const double need = 4.0 * static_cast<double>(sizes.back()) * world;
    if (available > 0 && need > static_cast<double>(available))
      throw cli_error(fmt::format("the largest size ({} B) on {} ranks needs about {:.2f} GiB "
                                  "(4 buffers of that size per rank), but this machine has "
                                  "{:.2f} GiB available",
                                  sizes.back(), world, need / (1 << 30),
                                  static_cast<double>(available) / (1 << 30)),
                      "use smaller --sizes or fewer ranks");
  }
  if (backend == "sim" && o.fidelity == "step" && world > kMaxStepFidelityRanks)
    throw cli_error("--fidelity step models every transfer, and " + std::to_string(world) +
                        " ranks would take hours (the limit is " +
                        std::to_string(kMaxStepFidelityRanks) + ")",
                    "use --fidelity flow or auto");
  {
    YAML::Emitter out;
    out << YAML::BeginMap << YAML::Key << "bench" << YAML::Value << "collective";
    out << YAML::Key << "op" << YAML::Value << o.op << YAML::Key << "mesh" << YAML::Value
        << spec.mesh.describe() << YAML::Key << "sizes" << YAML::Value << o.sizes;
    out << YAML::Key << "cluster" << YAML::Value << e.cluster.name << YAML::EndMap;
    e.resolved_yaml = std::string(out.c_str()) + "\n";
  }
  RunSettings settings;
  settings.trace_max_ranks = 0;
  settings.warmup = o.warmup;
  settings.iterations = o.iterations;
  settings.check_data = !predicting;  // nccl-tests' -c: an untimed pass checks every message

  const int n = spec.mesh.group_size(spec.group);
  const int instances = world / n;
  const int nodes = (world + gpn - 1) / gpn;
  const OpKind kind = o.op == "sendrecv" ? OpKind::send : op_kind_from_string(o.op);
  std::ostringstream factor;
  factor.precision(4);
  factor << bus_factor(kind, n);
  std::cout << "# muonbed bench collective: " << o.op << " on backend " << backend << " ("
            << find_backend(backend)->facts.description << "), cluster " << e.cluster.name << "\n"
            << "# " << world << " GPUs on " << nodes << (nodes == 1 ? " node" : " nodes") << " ("
            << gpn << " per node); " << instances << (instances == 1 ? " group" : " groups")
            << " of " << n << " (mesh " << spec.mesh.describe() << ")\n"
            << "# busbw = algbw x " << factor.str() << " (nccl-tests' bus factor for " << o.op
            << " on " << n << " ranks); algbw = size / time\n";
  if (predicting)
    std::cout << "# modelled: " << backend
              << " predicts one deterministic time per size (warmup and iterations are for "
                 "real backends); #wrong N/A: no data is computed\n";
  else
    std::cout << "# measured: warmup iters: " << o.warmup << " iters: " << o.iterations
              << "; time = mean over iters of the instance time (last arrival to completion), "
                 "min / median / max over the same iters; a size whose max/min > "
              << kNoisySpread << " is flagged noisy; #wrong from one untimed check pass\n";
  std::cout << "#\n" << collective_bench_header(!predicting);
  std::vector<CollectiveBenchRow> rows;
  double busbw_sum = 0;
  for (std::int64_t size : sizes) {
    // Real backends probe the machine's speed around the first and the last size (the bench
    // plans run no Newton-Schulz: the probe times a shape of the profile's ns_table).
    settings.speed_probe_from_profile =
        !predicting && (size == sizes.front() || size == sizes.back());
    rows.push_back(run_collective_bench(spec, e, size, backend, settings));
    busbw_sum += rows.back().busbw_GBps;
    std::cout << collective_bench_line(rows.back()) << std::endl;
  }
  std::ostringstream avg;
  avg.setf(std::ios::fixed);
  avg.precision(3);
  avg << (rows.empty() ? 0.0 : busbw_sum / static_cast<double>(rows.size()));
  std::cout << "# Avg bus bandwidth    : " << avg.str() << "\n";
  if (!predicting) {
    // Two verdicts: the machine's speed against the profile, and each size's spread.
    std::string noisy_sizes;
    int n_noisy = 0;
    for (const CollectiveBenchRow& r : rows)
      if (noisy(r)) {
        noisy_sizes += (n_noisy++ ? ", " : "") + std::to_string(r.size_bytes);
      }
    print_speed_verdict(rows, e.cluster.name);
    if (n_noisy > 0)
      std::cout << "# spread: " << n_noisy << " of " << rows.size()
                << " sizes noisy (max/min over the iterations > " << kNoisySpread
                << "): " << noisy_sizes
                << " B; their times are not a benchmark: rerun on a quiet machine (or with more "
                   "--iters)\n";
    else
      std::cout << "# spread: steady (every size's max/min over the iterations <= " << kNoisySpread
                << ")\n";
  }
  std::cout << "#\n";
  if (!o.json_path.empty()) {
    nlohmann::ordered_json doc;
    doc["bench"] = "collective";
    doc["op"] = o.op;
    doc["backend"] = backend;
    doc["cluster"] = e.cluster.name;
    doc["mesh"] = spec.mesh.describe();
    doc["timing"] = predicting ? "modelled" : "measured";
    doc["warmup"] = o.warmup;
    doc["iterations"] = o.iterations;
    const Provenance p = make_provenance(nullptr, "");
    doc["muonbed_version"] = p.muonbed_version;
    doc["git_hash"] = p.git_hash;
    doc["host_name"] = p.host_name;
    doc["timestamp"] = utc_timestamp();
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const CollectiveBenchRow& r : rows) list.push_back(collective_bench_json(r));
    doc["rows"] = list;
    write_file_atomically(o.json_path, doc.dump(1) + "\n");
    std::cout << "# wrote " << o.json_path << "\n";
  }
  return 0;
}

struct BenchNsOptions {
  NsBenchOptions bench;
  std::vector<std::string> shapes;
  bool list_versions = false;
};

int run_bench_ns(BenchNsOptions& o) {
  if (o.list_versions) {
    // One line per version, its number first (scripts/gpu-bundle loops over them).
    for (const NsKernelVersion& v : ns_kernel_versions()) {
      std::cout << v.version << " " << v.name << ": " << v.description << "\n";
    }
    if (ns_kernel_versions().empty()) {
      std::cerr << "no GPU Newton-Schulz kernel versions: this build has no CUDA\n";
    }
    return 0;
  }
  for (const std::string& s : o.shapes) o.bench.shapes.push_back(parse_shape(s));
  // The JSON file is written after the runs: its folder must be usable before them.
  if (!o.bench.json_path.empty()) {
    if (std::filesystem::is_directory(o.bench.json_path))
      throw ConfigError(SourceLocation{}, "--json '" + o.bench.json_path + "' is a folder",
                        "give a file name, e.g. --json ns.json");
    check_output_file(o.bench.json_path, "--json");
  }
  return run_ns_benchmark(o.bench, std::cout);
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Microbenchmarks: Newton-Schulz kernels, collectives (nccl-tests' table)");
  bench->require_subcommand(1);
  bench->footer(R"(Examples:
  muonbed bench ns --device cpu
  muonbed bench collective --backend sim --cluster dgx-h100 --op all_gather --gpus 8)");
  auto options = std::make_shared<BenchNsOptions>();
  NsBenchOptions& b = options->bench;
  CLI::App* ns = bench->add_subcommand(
      "ns", "Validate, then time Newton-Schulz: GPU kernel versions, or the CPU fp32 path");
  ns->add_option("--device", b.device, "auto (GPU if usable, else CPU), gpu or cpu")
      ->check(CLI::IsMember({"auto", "gpu", "cpu"}))
      ->capture_default_str();
  ns->add_option("--shape", options->shapes,
                 "ROWSxCOLS or BATCHxROWSxCOLS (repeatable; default: the device's list)");
  ns->add_option("--model", b.model_preset,
                 "GPU: also time this preset's Muon set batched by shape ('' for none)")
      ->capture_default_str();
  ns->add_option("--coefficients", b.coefficients, "keller (keller_jordan) or polar_express")
      ->check(CLI::IsMember({"keller", "keller_jordan", "polar_express"}))
      ->capture_default_str();
  ns->add_option("--steps", b.steps, "Newton-Schulz iterations (1..100)")->capture_default_str();
  ns->add_option("--kernel-version", b.version, "GPU NS kernel version (see --list-versions)")
      ->capture_default_str();
  ns->add_flag("--list-versions", options->list_versions,
               "print the GPU kernel versions this build has, then exit");
  ns->add_option("--warmup", b.warmup,
                 "untimed runs before timing, 0..1000 (-1: 5 on GPU, 1 on CPU)");
  ns->add_option("--repeats", b.repeats,
                 "timed runs, median reported, 1..10000 (-1: 30 on GPU, 5 on CPU)");
  ns->add_option("--seed", b.seed, "random data seed")->capture_default_str();
  ns->add_flag("!--no-validate", b.validate, "skip the check against the CPU reference");
  ns->add_option("--json", b.json_path, "also write the results as JSON to this file");
  ns->footer(R"(Examples:
  muonbed bench ns --device cpu                       CPU fp32 path, default shapes
  muonbed bench ns --shape 4096x4096 --shape 8x1024x4096
  muonbed bench ns --device gpu --json ns.json        fails (exit 2) without a usable GPU
Exit code 1 means a kernel disagreed with the CPU reference (it is reported, never timed).)");
  ns->callback([options, &exit_code] { exit_code = run_bench_ns(*options); });

  auto c = std::make_shared<BenchCollectiveOptions>();
  CLI::App* coll = bench->add_subcommand(
      "collective",
      "nccl-tests' table (size, count, type, time, algbw, busbw) for one collective on a backend");
  coll->add_option(
      "--backend", c->backend,
      "sim (default when built), analytic, or a real backend (" + backends_summary() + ")");
  coll->add_option("--cluster", c->cluster,
                   "cluster profile: name or YAML path (default dgx-h100 for sim and analytic, "
                   "local-cpu for real backends, where it only names the machine)");
  coll->add_option("--op", c->op, "the collective")
      ->check(CLI::IsMember(collective_bench_ops()))
      ->capture_default_str();
  CLI::Option* gpus =
      coll->add_option("--gpus", c->gpus,
                       "ranks, all in one group (rank r on GPU r of the cluster); not with --mesh")
          ->check(CLI::Range(2, 16384))
          ->capture_default_str();
  coll->add_option("--mesh", c->mesh, "a mesh instead: NAME=SIZE,... outermost first")
      ->excludes(gpus);
  coll->add_option("--group", c->group, "with --mesh: the dim(s) the collective spans (1 or 2)");
  coll->add_option("--sizes", c->sizes, "MIN:MAX[:FACTOR] (nccl-tests' -b -e -f) or one size")
      ->capture_default_str();
  coll->add_option("--root", c->root, "broadcast, gather, scatter: group-local root")
      ->capture_default_str();
  coll->add_option("--dtype", c->dtype, "float or bfloat16")->capture_default_str();
  coll->add_option("--warmup", c->warmup, "real backends: untimed iterations (nccl-tests' -w)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  coll->add_option("--iters", c->iterations, "real backends: timed iterations (nccl-tests' -n)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  coll->add_option("--fidelity", c->fidelity, "sim: step, flow or auto")
      ->check(CLI::IsMember({"step", "flow", "auto"}))
      ->capture_default_str();
  coll->add_option("--json", c->json_path, "also write one JSON row per size to this file");
  coll->footer(R"(Examples:
  muonbed bench collective --backend sim --cluster dgx-h100 --op all_gather --gpus 8 --sizes 1K:1G
  muonbed bench collective --backend analytic --op all_reduce --gpus 32 --sizes 1M:8G:8
  muonbed bench collective --op all_to_all --mesh dp=2,tp=8 --group tp --sizes 64M --json a2a.json
size is nccl-tests' S (all_gather: the gathered buffer; all_to_all: one rank's send buffer);
busbw = algbw x the bus factor of core/engine/cost_model.hpp, so the columns compare with nccl-tests.)");
  coll->callback([c, &exit_code] { exit_code = run_bench_collective(*c); });
}

}  // namespace muonbed::cli
