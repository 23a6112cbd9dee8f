#!/usr/bin/env bash
# `muonbed run --backend mpi` end to end, and its failures. Modes:
#   run           muonbed starts mpirun per point: results, measured traces, statistics and
#                 provenance, the manifest, resume, plots of the mpi results (with matplotlib)
#   user_mpirun   `mpirun -np 2 muonbed run EXP` started by the user: rank 0 writes the results; a
#                 point whose mesh needs 4 ranks is an error on rank 0 naming both sizes, no hang
#   fault_exit, fault_throw, fault_hang
#                 MUONBED_MPI_FAULT makes rank 1 exit, throw or hang at an NS op of step 1: the
#                 run fails within the timeout, every rank ends, the message names the rank,
#                 step, op id and label, no result file is written; fault_exit then reruns the
#                 point without the fault and gets its result (resume reruns failed points)
# Usage: mpi_cli_test.sh MODE MUONBED_BINARY WORK_DIR. Exits 77 (skipped) without mpirun.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/cli_test.sh"
mode=$1
muonbed=$2
work=$3
skip_without_mpirun
enter_work_dir "$work"
export TMPDIR=$work  # the launcher's job files, so leftover ranks of this test are recognizable

# A tiny experiment: 2 ranks (the sweep may add a 4-rank point), 1 warm-up and 3 timed steps.
write_experiment() {  # $1 = strategies swept, $2 = dp_shard sizes swept
  {
    tiny_experiment tiny local-cpu 2 "mpi, analytic" "{name: owner, prefetch_count: 1}"
    cat <<EOF
steps: 1
repeats: 3
seed: 7
sweep:
  strategy.name: [$1]
  mesh.dp_shard: [${2:-2}]
output: out
EOF
  } >tiny.yaml
}

# The id of the first Newton-Schulz op rank 1 runs (plan ops are listed in id order).
ns_op_of_rank_1() {
  "$muonbed" plan tiny.yaml --json plans >/dev/null || fail "muonbed plan failed"
  python3 - plans/*.json <<'EOF'
import json, sys
ops = json.load(open(sys.argv[1]))["ops"]
print(next(i for i, o in enumerate(ops)
           if o["kind"] == "newton_schulz" and o.get("ranks", {}).get("dp_shard") == 1))
EOF
}

field() {  # field FILE PYTHON_EXPRESSION_OF_r
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"
}

case "$mode" in
run)
  write_experiment "owner, all_to_all"
  "$muonbed" run tiny.yaml --no-plots >first.log 2>&1 || { cat first.log; fail "mpi run failed"; }
  cat first.log
  for point in "strategy.name=owner,mesh.dp_shard=2" "strategy.name=all_to_all,mesh.dp_shard=2"; do
    r="out/$point/mpi.json"
    [ -s "$r" ] || fail "missing $r"
    [ -s "out/$point/mpi.trace.json" ] || fail "missing measured trace of $point"
    [ -s "out/$point/analytic.json" ] || fail "missing analytic result of $point"
    [ "$(field "$r" "r['backend'], r['fidelity'], r['step']['timed_steps'], r['step']['warmup_steps'], len(r['step']['patterns'])")" = "mpi measured 3 1 3" ] ||
      fail "$r: backend, fidelity or step counts wrong: $(field "$r" "r['step']")"
    field "$r" "r['execution']['library']" | grep -q "Open MPI" || fail "$r: no MPI library in provenance"
    # 2 ranks x (MPI thread + a compute worker) need 4 cores for worker threads (executor.hpp).
    mode=progress_points workers=0
    if [ "$(nproc)" -ge 4 ]; then mode=threads workers=1; fi
    [ "$(field "$r" "r['execution']['ranks_per_host'], r['execution']['blas_threads'] >= 0, r['execution']['compute_mode'], r['execution']['compute_threads']")" = "[2] True $mode $workers" ] ||
      fail "$r: execution provenance: $(field "$r" "r['execution']")"
    # The speed probe: taken before and after the steps, in seconds like the profile's time
    # for it (a unit slip would put them 1000x apart), on a Muon matrix of the model.
    [ "$(field "$r" "(lambda p: len(p['shape']) == 3 and all(x > 0 for x in p['shape']) and all(0.01 < p[k] / p['predicted_s'] < 100 for k in ('before_s', 'after_s')))(r['execution']['speed_probe'])")" = "True" ] ||
      fail "$r: speed probe missing or in the wrong unit: $(field "$r" "r['execution'].get('speed_probe')")"
    [ "$(field "$r" "0 < r['step']['min_s'] <= r['step']['median_s'] <= r['step']['p95_s'] <= r['step']['worst_s'], r['step']['stddev_s'] >= 0")" = "True True" ] ||
      fail "$r: statistics out of order: $(field "$r" "r['step']")"
    [ "$(field "$r" "all(c['time_s'] > 0 and c['algbw_GBps'] > 0 for c in r['collectives']) and len(r['collectives']) > 0")" = "True" ] ||
      fail "$r: collective times missing"
    [ "$(field "$r" "all(abs(x['average']['compute_s'] + x['average']['exposed_comm_s'] + x['average']['idle_s'] - r['step']['average_s']) < 1e-6 for x in r['ranks'])")" = "True" ] ||
      fail "$r: per-rank breakdown does not add up to the step"
    # Each rank's store in the plan's dtypes (issue 25): at least its static tensors, and its peak
    # of live buffers within tests/backends/memory_test.cpp's kExecutionPeakFactor (2) of the plan's.
    [ "$(field "$r" "all(m['static_bytes'] <= m['measured_peak_bytes'] <= m['static_bytes'] + 2 * m['peak_transient_bytes'] for m in (x['memory'] for x in r['ranks']))")" = "True" ] ||
      fail "$r: measured pool peak outside the plan's memory: $(field "$r" "[x['memory'] for x in r['ranks']]")"
    field "out/$point/mpi.trace.json" "sum(e.get('cat') == 'compute' for e in r['traceEvents']) > 0 and r['otherData']['note'].startswith('measured')" | grep -q True ||
      fail "trace of $point has no compute spans"
  done
  grep -q '"strategy.name=owner,mesh.dp_shard=2/mpi.json"' out/muonbed-run.json || { cat out/muonbed-run.json; fail "manifest lacks the mpi results"; }
  grep -q 'mpi.trace.json' out/muonbed-run.json || fail "manifest lacks the mpi traces"
  grep -q "strategy.name=owner,mesh.dp_shard=2 \[mpi\]: step" first.log || fail "no progress line for mpi"
  # Resume: nothing runs again, unless the measurement settings change.
  "$muonbed" run tiny.yaml --no-plots >second.log 2>&1 || { cat second.log; fail "resume failed"; }
  grep -q "resumed: 4 of 4 runs" second.log || { cat second.log; fail "mpi points not resumed"; }
  sed -i 's/^repeats: 3/repeats: 2/' tiny.yaml
  "$muonbed" run tiny.yaml --no-plots >third.log 2>&1 || { cat third.log; fail "rerun failed"; }
  grep -q "resumed: 2 of 4 runs" third.log || { cat third.log; fail "changed repeats must rerun mpi points only"; }
  if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    "$muonbed" run tiny.yaml >plots.log 2>&1 || { cat plots.log; fail "plotting the mpi results failed"; }
    ls out/*timeline-mpi* >/dev/null 2>&1 || { cat plots.log; ls out; fail "no timeline plot of the measured trace"; }
    ls out/tiny-strategies.png >/dev/null 2>&1 || { ls out; fail "no strategies plot"; }
  else
    echo "note: matplotlib missing for /usr/bin/python3: plots not checked"
  fi
  # compare over two runs of the experiment: the measured step is the median of the runs'
  # (their mean with two), each point has both runs' steps, and the table shows the spread.
  "$muonbed" run tiny.yaml --output out2 --backend mpi --no-plots >run2.log 2>&1 ||
    { cat run2.log; fail "second run into out2 failed"; }
  "$muonbed" compare tiny.yaml --output out --output out2 >compare.log 2>&1 ||
    { cat compare.log; fail "muonbed compare over two runs failed"; }
  cat compare.log
  grep -q "median over 2 runs" compare.log || fail "compare does not say it combined 2 runs"
  grep -q "spread: (slowest - fastest run)" compare.log || fail "compare shows no spread"
  grep -q "machine: speed probe" compare.log || fail "compare shows no speed probe verdict"
  [ "$(field out/compare.json "r['runs'] == ['out', 'out2'] and all(len(p['measured']['runs_s']) == 2 and abs(p['measured']['step_s'] - sum(p['measured']['runs_s']) / 2) < 1e-12 for p in r['points'])")" = "True" ] ||
    fail "compare.json: runs or median over runs wrong: $(cat out/compare.json | head -c 2000)"
  if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    ls out/compare/tiny-compare-scatter.png out/compare/tiny-compare-points.png >/dev/null ||
      { ls out/compare; fail "compare drew no scatter or bars"; }
  fi
  "$muonbed" compare tiny.yaml --output out --output missing-run --no-plots >missing.log 2>&1 &&
    fail "compare must refuse a run folder without results"
  grep -q "fix: muonbed run tiny.yaml --output missing-run" missing.log ||
    { cat missing.log; fail "no fix named for the missing run"; }
  echo "PASS: muonbed run --backend mpi writes measured results, traces and manifests, resumes, plots; compare combines runs"
  ;;
user_mpirun)
  write_experiment "owner" "2, 4"
  flags=(--bind-to none)
  [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
  start=$(date +%s)
  "${MUONBED_MPIRUN:-mpirun}" -np 2 "${flags[@]}" "$muonbed" run tiny.yaml --no-plots >user.log 2>&1
  rc=$?
  cat user.log
  [ $rc -ne 0 ] || fail "a point needing 4 ranks in a 2-rank world must fail the run"
  [ $(($(date +%s) - start)) -lt 120 ] || fail "took too long"
  grep -q "strategy.name=owner,mesh.dp_shard=4 \[mpi\]: point 'strategy.name=owner,mesh.dp_shard=4' needs 4 ranks (mesh .*) but this MPI world has 2" user.log ||
    fail "no clear world-size error on rank 0"
  [ -s "out/strategy.name=owner,mesh.dp_shard=2/mpi.json" ] || fail "the 2-rank point has no result"
  [ -s "out/strategy.name=owner,mesh.dp_shard=4/analytic.json" ] || fail "the other backends' points did not run"
  [ ! -e "out/strategy.name=owner,mesh.dp_shard=4/mpi.json" ] || fail "a result for the point that could not run"
  [ "$(grep -c "runs in" user.log)" = 1 ] || fail "more than one rank printed the summary"
  field "out/strategy.name=owner,mesh.dp_shard=2/mpi.json" "r['execution']['launcher']" | grep -q "mpirun" ||
    fail "launcher not recorded"
  echo "PASS: muonbed run under a user's mpirun writes from rank 0 and rejects a mismatched world"
  ;;
fault_exit | fault_throw | fault_hang)
  kind=${mode#fault_}
  write_experiment "owner"
  op=$(ns_op_of_rank_1)
  label=$(python3 -c "import json,sys,glob; print(json.load(open(glob.glob('plans/*.json')[0]))['ops'][$op]['label'])")
  start=$(date +%s.%N)
  MUONBED_MPI_TIMEOUT=4 MUONBED_MPI_FAULT="1:1:$op:$kind" "$muonbed" run tiny.yaml --no-plots >fault.log 2>&1
  rc=$?
  elapsed=$(python3 -c "print(round($(date +%s.%N) - $start, 1))")
  cat fault.log
  echo "fault $kind at rank 1, step 1, op $op ('$label'): muonbed exited $rc after $elapsed s"
  [ $rc -ne 0 ] || fail "the run succeeded despite the fault"
  python3 -c "import sys; sys.exit(0 if $elapsed < 60 else 1)" || fail "took $elapsed s, more than 60"
  grep -q "rank 1, step 1, op $op ('$label')" fault.log || fail "the error does not name rank 1, step 1, op $op ('$label')"
  grep -q "strategy.name=owner,mesh.dp_shard=2 \[mpi\]: mpirun" fault.log || fail "the point's failure is not reported"
  [ ! -e "out/strategy.name=owner,mesh.dp_shard=2/mpi.json" ] || fail "a result file was written"
  [ -s "out/strategy.name=owner,mesh.dp_shard=2/analytic.json" ] || fail "the analytic run did not run"
  sleep 0.5
  pgrep -f "mpi-worker $work" >/dev/null && fail "ranks are still running: $(pgrep -af "mpi-worker $work")"
  if [ "$kind" = exit ]; then
    grep -q "exited with code 3\|exit code.*3\|Exit code: *3" fault.log || fail "the exit code of the rank is not reported"
    "$muonbed" run tiny.yaml --no-plots >rerun.log 2>&1 || { cat rerun.log; fail "rerun failed"; }
    grep -q "resumed: 1 of 2 runs" rerun.log || { cat rerun.log; fail "the failed point was not rerun alone"; }
    [ -s "out/strategy.name=owner,mesh.dp_shard=2/mpi.json" ] || fail "rerun wrote no result"
  fi
  if [ "$kind" = hang ]; then
    grep -q "no progress for" fault.log || fail "the watchdog did not report"
    grep -q "fault injection: this rank hangs here" fault.log || fail "the hung rank did not report first"
  fi
  echo "PASS: fault '$kind' on rank 1 failed the run in $elapsed s, named rank, step and op, wrote no result"
  ;;
*)
  fail "unknown mode $mode"
  ;;
esac
