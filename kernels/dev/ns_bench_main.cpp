// Standalone driver of the Newton-Schulz benchmark (kernels/bench.hpp), the workbench entry
// point while the muonbed CLI's `bench ns` is wired elsewhere. Example:
//   muonbed_ns_bench --device cpu --shape 512x512 --shape 4x256x384 --repeats 3
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "core/base/errors.hpp"
#include "kernels/bench.hpp"

namespace {

// "ROWSxCOLS" or "BATCHxROWSxCOLS".
muonbed::MatrixShape parse_shape(const std::string& text) {
  std::vector<std::int64_t> dims;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t x = text.find('x', pos);
    const std::string part = text.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    dims.push_back(std::stoll(part));
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  if (dims.size() == 2) return {1, dims[0], dims[1]};
  if (dims.size() == 3) return {dims[0], dims[1], dims[2]};
  throw CLI::ValidationError("--shape", "expected ROWSxCOLS or BATCHxROWSxCOLS, got " + text);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Validate, then time Newton-Schulz (GPU kernel versions, or the CPU fp32 path)"};
  muonbed::NsBenchOptions options;
  std::vector<std::string> shapes;
  app.add_option("--device", options.device, "auto, gpu or cpu")->capture_default_str();
  app.add_option("--shape", shapes, "ROWSxCOLS or BATCHxROWSxCOLS (repeatable)");
  app.add_option("--model", options.model_preset, "GPU: preset whose Muon set is timed ('' none)")
      ->capture_default_str();
  app.add_option("--coefficients", options.coefficients, "keller_jordan or polar_express")
      ->capture_default_str();
  app.add_option("--steps", options.steps, "Newton-Schulz iterations")->capture_default_str();
  app.add_option("--version", options.version, "GPU kernel version")->capture_default_str();
  app.add_option("--warmup", options.warmup, "untimed runs (-1: device default)");
  app.add_option("--repeats", options.repeats, "timed runs (-1: device default)");
  app.add_option("--seed", options.seed, "random data seed")->capture_default_str();
  app.add_flag("!--no-validate", options.validate, "skip the check against the CPU reference");
  app.add_option("--json", options.json_path, "also write results as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    for (const std::string& s : shapes) options.shapes.push_back(parse_shape(s));
  } catch (const std::exception& e) {
    std::cerr << "error: bad --shape: " << e.what() << "\n";
    return 2;
  }
  try {
    return muonbed::run_ns_benchmark(options, std::cout);
  } catch (const muonbed::Error& e) {  // options outside the limits, a file that cannot be written
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
