// A program using the kernels does not load the CUDA libraries when it starts: cudart and cuBLAS
// (~200 MB, most of a second per process) live in the CUDA module, loaded on the first GPU call
// (kernels/src/gpu_loader.cpp). Trivial in a build without CUDA; in a CUDA build it failed
// before the module existed.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/bench.hpp"
#include "kernels/newton_schulz.hpp"

using namespace muonbed;

namespace {

std::string mapped_files() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str();
}

// Taken while the test program starts, before any test (other tests in this binary call the
// GPU entry points, which load the module in a CUDA build, as they should).
const std::string maps_at_start = mapped_files();

}  // namespace

TEST_CASE("a program linking the kernels starts without the CUDA libraries", "[kernels][startup]") {
  REQUIRE_FALSE(maps_at_start.empty());
  CHECK(maps_at_start.find("libcublas") == std::string::npos);
  CHECK(maps_at_start.find("libcudart") == std::string::npos);
  // The CPU numerics need nothing of CUDA.
  const MatrixShape shape{1, 32, 48};
  std::vector<double> in(shape.numel(), 0.5), out(shape.numel());
  in[3] = 2.0;
  newton_schulz(in.data(), out.data(), shape, NsConfig::keller_jordan(5));
  CHECK(std::isfinite(out[0]));
}
