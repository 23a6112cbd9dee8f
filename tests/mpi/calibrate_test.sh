#!/usr/bin/env bash
# The measured side of issue 12 under mpirun (no timing assertions: this machine may be loaded).
# Modes:
#   bench      `muonbed bench collective --backend mpi`: nccl-tests' table with a checked #wrong
#              column (0) and min / median / max over the iterations, JSON rows with op,
#              size_bytes, gpus, time_us, algbw_GBps, busbw_GBps, backend, min_time_us <=
#              median_time_us <= max_time_us around the mean time_us, iterations, noisy;
#              busbw = algbw x the bus factor; a spread verdict under the table
#   calibrate  `muonbed calibrate --backend mpi` on a tiny experiment: the profile it writes is
#              accepted by the loader (an experiment naming it by path validates and runs on the
#              analytic backend), its provenance is there, its GEMM rate is within physical bounds
#              (above 0.1 GFLOP/s, below 2 TFLOP/s for one CPU core in fp32), and every
#              measurement it lists has the time of the bench row calibrate printed; every fit's
#              error is in the header, and with --max-fit-error 0.001 each fit is warned about
#              (stderr, header, source); no cost is negative; --backend nccl is a clear "needs a
#              GPU build" error
# Usage: calibrate_test.sh MODE MUONBED_BINARY WORK_DIR. Exits 77 (skipped) without mpirun.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/cli_test.sh"
mode=$1
muonbed=$2
work=$3
skip_without_mpirun
enter_work_dir "$work"
export TMPDIR=$work

case "$mode" in
bench)
  "$muonbed" bench collective --backend mpi --op all_gather --gpus 2 --sizes 1K:64K:8 \
    --warmup 1 --iters 3 --json ag.json >bench.out 2>&1 || { cat bench.out; fail "bench collective --backend mpi failed"; }
  cat bench.out
  grep -q "#wrong      min   median      max" bench.out || fail "no #wrong and min/median/max columns"
  grep -q "^# measured: " bench.out || fail "no 'measured' line"
  grep -q "^# spread: " bench.out || fail "no spread verdict"
  # The machine against its profile: the speed probe around the first and last sizes.
  grep -q "^# machine: speed probe (NS .*, profile 'local-cpu'" bench.out || fail "no speed probe line"
  grep -Eq "^# machine: (steady|NOT the profile|its speed moved)" bench.out || fail "no speed verdict"
  python3 - ag.json <<'EOF' || fail "bad JSON rows"
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["rows"]
assert len(rows) == 3, rows
for r in rows:
    for k in ("op", "size_bytes", "gpus", "time_us", "algbw_GBps", "busbw_GBps", "backend"):
        assert k in r, k
    assert r["backend"] == "mpi" and r["op"] == "all_gather" and r["gpus"] == 2, r
    assert r["wrong"] == 0, r
    assert r["time_us"] > 0, r
    assert abs(r["algbw_GBps"] - r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9) <= 1e-6 * r["algbw_GBps"], r
    assert abs(r["busbw_GBps"] - r["algbw_GBps"] * 0.5) <= 1e-9 + 1e-9 * r["busbw_GBps"], r
    assert r["iterations"] == 3, r
    eps = 1e-9 * r["max_time_us"]
    assert 0 < r["min_time_us"] <= r["median_time_us"] <= r["max_time_us"], r
    assert r["min_time_us"] - eps <= r["time_us"] <= r["max_time_us"] + eps, r  # the mean
    assert r["noisy"] == (r["max_time_us"] / r["min_time_us"] > 1.5), r
# The first and last sizes carry the probe (predicted from the profile, measured around them).
probed = [r for r in rows if "speed_probe" in r]
assert [r["size_bytes"] for r in probed] == [rows[0]["size_bytes"], rows[-1]["size_bytes"]], probed
for r in probed:
    p = r["speed_probe"]
    assert p["predicted_s"] > 0 and p["before_s"] > 0 and p["after_s"] > 0, p
print("rows ok")
EOF
  # Every op, one size: each checks its data.
  for op in reduce_scatter all_reduce all_to_all broadcast gather scatter sendrecv; do
    "$muonbed" bench collective --backend mpi --op $op --gpus 2 --sizes 8K --warmup 0 --iters 1 \
      --json $op.json >$op.out 2>&1 || { cat $op.out; fail "bench collective $op failed"; }
    python3 -c "import json,sys; r=json.load(open('$op.json'))['rows'][0]; sys.exit(0 if r['wrong']==0 else 1)" ||
      fail "$op: #wrong is not 0"
  done
  echo "PASS: bench collective --backend mpi: nccl-tests' table, #wrong 0 for every op, JSON rows"
  ;;
calibrate)
  {
    tiny_experiment tinycal local-cpu 2 analytic "{name: owner}"
    echo "sweep: {strategy.name: [sequential, all_to_all]}"
    echo "output: out"
  } >tiny.yaml
  "$muonbed" calibrate --backend nccl --out x.yaml >nccl.out 2>&1 && fail "--backend nccl succeeded"
  grep -q "needs a GPU build" nccl.out || { cat nccl.out; fail "--backend nccl: no clear message"; }
  "$muonbed" calibrate --backend mpi --experiment tiny.yaml --ranks 2 --out prof.yaml \
    --warmup 0 --repeats 1 --iters 2 --max-fit-error 0.001 >cal.out 2>cal.err ||
    { cat cal.out cal.err; fail "calibrate failed"; }
  # stdout and stderr apart: mpirun forwards them separately, so their lines may interleave.
  cat cal.out cal.err
  [ -f prof.yaml ] || fail "no profile written"
  grep -q "^# command: muonbed calibrate --backend mpi" prof.yaml || fail "no command in the header"
  grep -q "^  date: " prof.yaml || fail "no calibration date"
  grep -q "ns_kernel: cpu-fp32" prof.yaml || fail "no measured NS table"
  grep -q "^# fit quality" prof.yaml || fail "no fit quality in the header"
  grep -q "^#   collective closed form .* on [a-z_]*: |error| median" prof.yaml ||
    fail "no collective fit error in the header"
  # Every real fit misses its rows by more than 0.001 %: warned on stderr, in the header and source.
  grep -q "^muonbed: warning: calibrate: fit error .* above --max-fit-error 0.001 %" cal.err ||
    fail "no fit-error warning on stderr"
  grep -q "^# WARNING: fit error" prof.yaml || fail "no fit-error warning in the header"
  grep -q "^source: .*WARNING: [0-9]* fit(s) above --max-fit-error 0.001 %" prof.yaml ||
    fail "no warning in the source line"
  # The loader accepts it: an experiment naming it by path validates and runs.
  sed "s|cluster: local-cpu|cluster: $work/prof.yaml|" tiny.yaml >onprof.yaml
  "$muonbed" validate onprof.yaml >val.out 2>&1 || { cat val.out; fail "the profile does not load"; }
  "$muonbed" run onprof.yaml --no-plots >run.out 2>&1 || { cat run.out; fail "run on the profile failed"; }
  python3 - prof.yaml cal.out <<'EOF' || fail "profile numbers inconsistent"
import re, sys
prof = open(sys.argv[1]).read()
out = open(sys.argv[2]).read()
peak = float(re.search(r"peak_tflops: ([0-9.e+-]+)", prof).group(1))
# No fitted cost, latency or time is negative, no bandwidth <= 0 (the YAML, not the header).
body = "\n".join(l for l in prof.splitlines() if not l.startswith("#"))
launch = re.search(r"launch_overhead_us: \{collective: ([^,]+), kernel: ([^}]+)\}", body)
assert launch, "no launch_overhead_us"
for v in launch.groups():
    assert float(v) >= 0, f"launch_overhead_us: {v} is negative"
for key in ("host_comm_us_per_message", "host_comm_ns_per_byte", "latency_us"):
    for v in re.findall(r"\b" + key + r": (\S+)", body):
        assert float(v) >= 0, f"{key}: {v} is negative"
for key in ("hbm_GBps", "bandwidth_GBps"):
    for v in re.findall(r"\b" + key + r": (\S+)", body):
        assert float(v) > 0, f"{key}: {v}"
assert 1e-4 < peak < 2, f"GEMM peak {peak} TFLOP/s is outside what one CPU core does"
# The host cost of messages: one row per NS shape with three sizes (us per exchange), and what
# the profile holds agrees with the summary line (written only when positive).
assert "# host cost of messages" in out, "no host-comm table"
rows = [l.split() for l in out.split("# host cost of messages")[1].split("# collectives")[0].splitlines()[2:]]
rows = [r for r in rows if len(r) == 4]
assert rows, "no host-comm rows"
for r in rows:
    assert all(abs(float(x)) < 1e5 for x in r[1:]), f"host-comm row {r} is absurd"
m = re.search(r"host comm ([0-9.]+) us/message \+ ([0-9.]+) ns/byte", out)
assert m, "no host comm in the summary"
for key, value, printed in (("host_comm_us_per_message", float(m.group(1)), 0.05),
                            ("host_comm_ns_per_byte", float(m.group(2)), 0.0005)):
    got = re.search(key + r": ([0-9.e+-]+)", prof)
    written = float(got.group(1)) if got else 0.0
    assert abs(written - value) <= printed * 1.01, f"{key}: profile {written}, summary {value}"
# bench rows printed by calibrate: "size count type redop root time algbw busbw #wrong", per op
printed = {}
op = None
for line in out.splitlines():
    m = re.match(r"# (\w+) on mesh", line)
    if m:
        op = m.group(1)
        continue
    f = line.split()
    if op and len(f) >= 12 and f[0].isdigit():  # nccl-tests' 9 columns, then min median max
        assert float(f[9]) <= float(f[10]) <= float(f[11]), line
        printed[(op, int(f[0]))] = float(f[5])
        assert f[8] == "0", line
meas = re.findall(r"\{op: (\w+), gpus: (\d+), size_bytes: (\d+), busbw_GBps: [^,]+, time_us: ([0-9.e+-]+)", prof)
assert meas, "no measurements in the profile"
for op, gpus, size, t in meas:
    want = printed[(op, int(size))]
    assert abs(float(t) - want) <= max(0.01, 1e-3 * want), (op, size, t, want)
print(f"peak {peak * 1e3:.1f} GFLOP/s; {len(meas)} measurements equal the printed bench rows")
EOF
  echo "PASS: calibrate writes a profile the loader accepts, consistent with its bench rows"
  ;;
*)
  fail "unknown mode $mode"
  ;;
esac
