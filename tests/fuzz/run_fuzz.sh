#!/usr/bin/env bash
# Builds the libFuzzer target over experiment and cluster YAML (tests/fuzz/experiment_fuzz.cpp)
# with clang, AddressSanitizer and UndefinedBehaviorSanitizer in its own build folder, then fuzzes
# for a while from a seed corpus: the shipped experiments and clusters, the test data and the
# hostile cases. Exit 0: no crash, hang (-timeout), memory blow-up (-rss_limit_mb) or sanitizer
# report; 1: a finding (the input is saved under BUILD/artifacts/); 77: no clang or libFuzzer
# (ctest reports the test skipped, never passed).
#
#   tests/fuzz/run_fuzz.sh [--seconds 45] [--build DIR] [--corpus DIR] [--jobs N]
#
# The long campaign of issue 10 is `tests/fuzz/run_fuzz.sh --seconds 600 --corpus fuzz-corpus`.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
seconds=45
build=$src/build-fuzz
corpus=""
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --corpus) corpus=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "usage: $0 [--seconds N] [--build DIR] [--corpus DIR] [--jobs N]"; exit 2 ;;
  esac
done

if ! command -v clang++ >/dev/null 2>&1; then
  echo "SKIP: clang++ not found; the fuzzer needs clang with libFuzzer (apt-get install clang)"
  exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe/probe.cpp"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" \
  >"$probe/log" 2>&1; then
  echo "SKIP: clang++ cannot link libFuzzer with ASan/UBSan (apt-get install clang libclang-rt-dev)"
  cat "$probe/log"
  exit 77
fi

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION"
if ! cmake -S "$src" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMUONBED_FUZZ=ON -DMUONBED_BUILD_TESTS=OFF -DMUONBED_WITH_CUDA=OFF -DMUONBED_WITH_MPI=OFF \
  -DMUONBED_WITH_SIMGRID=OFF "-DCMAKE_CXX_FLAGS=$flags" "${launcher[@]}" >"$probe/configure.log" 2>&1; then
  cat "$probe/configure.log"
  echo "FAIL: configuring the fuzz build failed"
  exit 1
fi
if ! cmake --build "$build" --target muonbed_fuzz_experiment -j"$jobs" >"$probe/build.log" 2>&1; then
  tail -40 "$probe/build.log"
  echo "FAIL: building the fuzz target failed"
  exit 1
fi

# Seeds: read-only folders; new inputs go to the working corpus (the first folder).
seeds=$build/seeds
rm -rf "$seeds" && mkdir -p "$seeds"
cp "$src"/experiments/*.yaml "$src"/experiments/clusters/*.yaml "$src"/tests/experiments/data/*.yaml \
  "$seeds"/ 2>/dev/null
[ -d "$src/tests/experiments/hostile" ] && cp "$src"/tests/experiments/hostile/*.yaml "$seeds"/ 2>/dev/null
cp "$src"/tests/fuzz/seeds/* "$seeds"/ 2>/dev/null
if [ -z "$corpus" ]; then
  corpus=$build/corpus-$$
  rm -rf "$corpus"
  trap 'rm -rf "$probe" "$corpus"' EXIT
fi
mkdir -p "$corpus" "$build/artifacts"

cd "$src" || exit 1  # named clusters resolve from here
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
log=$build/fuzz.log
"$build/muonbed_fuzz_experiment" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -dict="$src/tests/fuzz/yaml.dict" -print_final_stats=1 \
  -artifact_prefix="$build/artifacts/" "$corpus" "$seeds" >"$log" 2>&1
rc=$?
tail -25 "$log"
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
files=$(ls "$corpus" | wc -l)
if [ $rc -ne 0 ]; then
  echo "FAIL: the fuzzer found a problem (exit $rc); inputs in $build/artifacts/ (log: $log)"
  exit 1
fi
echo "PASS: fuzzed ${seconds}s: ${execs:-?} executions, ${cov:-cov ?} edges, corpus $files new inputs, no crash, hang or sanitizer report"
