// `muonbed bench ns`: the Newton-Schulz benchmark of kernels/bench.hpp. Each kernel is validated
// against the CPU reference before it is timed; prints time, TFLOP/s and the fraction of a large
// GEMM's rate. Without a GPU it runs (and says it runs) the CPU fp32 path.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "core/results.hpp"
#include "experiments/cli/commands.hpp"
#include "kernels/bench.hpp"
#include "kernels/gpu.hpp"

namespace muonbed::cli {

namespace {

struct BenchNsOptions {
  NsBenchOptions bench;
  std::vector<std::string> shapes;
  bool list_versions = false;
};

// "ROWSxCOLS" or "BATCHxROWSxCOLS".
MatrixShape parse_shape(const std::string& text) {
  std::vector<std::int64_t> dims;
  std::size_t pos = 0;
  while (true) {
    const std::size_t x = text.find('x', pos);
    const std::string part = text.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || value < 1)
      throw ConfigError(SourceLocation{}, "bad shape '" + text + "'",
                        "write ROWSxCOLS or BATCHxROWSxCOLS with positive sizes, e.g. 4096x4096");
    dims.push_back(value);
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  if (dims.size() == 2) return {1, dims[0], dims[1]};
  if (dims.size() == 3) return {dims[0], dims[1], dims[2]};
  throw ConfigError(SourceLocation{}, "bad shape '" + text + "'",
                    "write ROWSxCOLS or BATCHxROWSxCOLS, e.g. 4096x4096 or 8x1024x4096");
}

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
    const std::filesystem::path json(o.bench.json_path);
    check_writable_folder(json.has_parent_path() ? json.parent_path().string() : ".");
    if (std::filesystem::is_directory(json))
      throw ConfigError(SourceLocation{}, "--json '" + o.bench.json_path + "' is a folder",
                        "give a file name, e.g. --json ns.json");
  }
  return run_ns_benchmark(o.bench, std::cout);
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Microbenchmarks (validated before timed)");
  bench->require_subcommand(1);
  bench->footer(R"(Example:
  muonbed bench ns --device cpu)");
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
}

}  // namespace muonbed::cli
