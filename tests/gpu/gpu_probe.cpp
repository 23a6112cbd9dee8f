// Makes the GPU test binary skip visibly: before the first test runs, a Catch2 listener checks
// for a usable CUDA device and, if there is none, prints "SKIPPED: <reason>" and exits with 77,
// the code ctest's SKIP_RETURN_CODE turns into "Skipped". Listing tests still works without one.
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // TestEventListenerBase; its code is in Catch2WithMain
#include <catch2/catch.hpp>
#include <cstdlib>
#include <iostream>
#include <string>

#include "kernels/gpu.hpp"

namespace {

struct GpuProbe : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;

  void testRunStarting(Catch::TestRunInfo const& info) override {
    std::string why;
    if (!muonbed::cuda_device_available(&why)) {
      std::cout << "SKIPPED: " << why << std::endl;
      std::exit(77);
    }
    TestEventListenerBase::testRunStarting(info);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(GpuProbe)
