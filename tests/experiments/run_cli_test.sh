#!/usr/bin/env bash
# `muonbed run` end to end on a tiny sweep: results written per point and backend, resume skips
# finished points (and only those), a changed configuration or a damaged file is run again,
# reruns give byte-identical results (timestamp aside), and unsupported backends fail with a fix.
# Usage: run_cli_test.sh MUONBED_BINARY HAVE_SIMGRID(0|1) WORK_DIR
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/cli_test.sh"
muonbed=$1
have_sim=$2
work=$3
enter_work_dir "$work"

backends=analytic
[ "$have_sim" = 1 ] && backends="analytic, sim"
write_experiment() {  # $1 = ns_steps, $2 = strategies swept (default: sequential, owner)
  {
    tiny_experiment tiny dgx-h100 8 "$backends" "{name: owner, prefetch_count: 1}"
    cat <<EOF
optimizer: {ns_steps: $1}
sweep:
  strategy.name: [${2:-sequential, owner}]
output: out
EOF
  } >tiny.yaml
}
nb=$([ "$have_sim" = 1 ] && echo 2 || echo 1)
runs=$((2 * nb))

write_experiment 5
"$muonbed" run tiny.yaml --no-plots >first.log 2>&1 || { cat first.log; fail "first run exited non-zero"; }
for point in strategy.name=sequential strategy.name=owner; do
  [ -s "out/$point/analytic.json" ] || fail "missing out/$point/analytic.json"
  if [ "$have_sim" = 1 ]; then
    [ -s "out/$point/sim.json" ] || fail "missing out/$point/sim.json"
    [ -s "out/$point/sim.trace.json" ] || fail "missing out/$point/sim.trace.json"
  fi
done
[ -z "$(find out -name '*tmp*')" ] || fail "temporary files left behind: $(find out -name '*tmp*')"
grep -q "$runs runs in" first.log || { cat first.log; fail "expected $runs runs"; }
grep -q "speedup" first.log || { cat first.log; fail "no results table"; }

# The manifest lists the sweep's results (and traces) for analysis/plot.py.
listed=$(grep -c '\.json"' out/muonbed-run.json)
[ "$listed" -eq $((runs + 2 * (nb - 1))) ] || { cat out/muonbed-run.json; fail "manifest lists $listed files"; }

# Everything finished: nothing runs again, files untouched.
cp -r out snapshot
"$muonbed" run tiny.yaml --no-plots >second.log 2>&1 || { cat second.log; fail "resume run failed"; }
grep -q "resumed: $runs of $runs runs" second.log || { cat second.log; fail "resume did not skip"; }
grep -q "^0 runs in" second.log || { cat second.log; fail "resume ran something"; }
diff -r out snapshot >/dev/null || fail "a resumed run rewrote finished results"

# A lost point (as after a kill) is the only one run again.
rm out/strategy.name=owner/analytic.json
"$muonbed" run tiny.yaml --no-plots >third.log 2>&1 || { cat third.log; fail "partial rerun failed"; }
grep -q "^1 run in" third.log || { cat third.log; fail "expected exactly one run"; }
grep -q "strategy.name=owner \[analytic\]" third.log || { cat third.log; fail "wrong point rerun"; }

# A run killed mid-write leaves a temporary file; the next run removes it (its writer is gone, or
# its pid now belongs to another program, as this shell's does) but keeps one whose writer is a
# live muonbed process, and never touches a file muonbed did not write, however it is named or
# wherever it lies (a user's notes, another tool's temp files, nested folders).
dead_pid=$(sh -c 'echo $$')
echo partial >"out/strategy.name=owner/analytic.json.muonbed-tmp-$dead_pid"
echo partial >"out/muonbed-run.json.muonbed-tmp-$dead_pid"
echo partial >"out/strategy.name=sequential/analytic.json.muonbed-tmp-$$"  # a live non-muonbed pid
cp "$(command -v sleep)" ./muonbed-test-writer  # a live process whose program is named muonbed*
./muonbed-test-writer 120 &
live_pid=$!
trap 'kill $live_pid 2>/dev/null' EXIT
echo busy >"out/strategy.name=owner/analytic.json.muonbed-tmp-$live_pid"
mkdir -p out/notes out/strategy.name=owner/mine
user_files=("out/thesis.tmp.$dead_pid" "out/notes/analytic.json.muonbed-tmp-$dead_pid"
  "out/strategy.name=owner/mine/sim.json.muonbed-tmp-$dead_pid"
  "out/strategy.name=owner/paper.pdf.muonbed-tmp-$dead_pid"
  "out/strategy.name=owner/analytic.json.tmp.$dead_pid")
for f in "${user_files[@]}"; do echo "user data" >"$f"; done
"$muonbed" run tiny.yaml --no-plots >temp.log 2>&1 || { cat temp.log; fail "run after a kill failed"; }
grep -q "removed 3 unfinished temporary files" temp.log || { cat temp.log; fail "stale temp files not removed exactly"; }
[ ! -e "out/strategy.name=owner/analytic.json.muonbed-tmp-$dead_pid" ] || fail "stale temp file still there"
[ ! -e "out/muonbed-run.json.muonbed-tmp-$dead_pid" ] || fail "stale manifest temp file still there"
[ ! -e "out/strategy.name=sequential/analytic.json.muonbed-tmp-$$" ] ||
  fail "a temp file whose pid now belongs to another program was kept"
[ -e "out/strategy.name=owner/analytic.json.muonbed-tmp-$live_pid" ] || fail "a live writer's temp file was removed"
kill $live_pid
for f in "${user_files[@]}"; do
  [ "$(cat "$f" 2>/dev/null)" = "user data" ] || fail "a file muonbed did not write was deleted: $f"
done
rm -r "out/strategy.name=owner/analytic.json.muonbed-tmp-$live_pid" out/notes out/strategy.name=owner/mine \
  "out/thesis.tmp.$dead_pid" "out/strategy.name=owner/paper.pdf.muonbed-tmp-$dead_pid" \
  "out/strategy.name=owner/analytic.json.tmp.$dead_pid"

# A damaged file is run again, not trusted.
echo '{"schema_version": 1, "backe' >out/strategy.name=sequential/analytic.json
"$muonbed" run tiny.yaml --no-plots >fourth.log 2>&1 || { cat fourth.log; fail "rerun of damaged file failed"; }
grep -q "^1 run in" fourth.log || { cat fourth.log; fail "damaged result not rerun"; }

# Deterministic: rerunning everything gives the same bytes except the timestamp (and the
# checksum, which covers it).
"$muonbed" run tiny.yaml --no-plots --force >fifth.log 2>&1 || { cat fifth.log; fail "--force run failed"; }
grep -q "$runs runs in" fifth.log || { cat fifth.log; fail "--force did not rerun everything"; }
for f in $(cd snapshot && find . -name '*.json'); do
  diff <(grep -v '"timestamp"\|"checksum"' "snapshot/$f") <(grep -v '"timestamp"\|"checksum"' "out/$f") >/dev/null ||
    fail "$f differs between two runs of the same experiment"
done

# A rerun without a trace removes the old one: no trace of another run is left beside a result.
if [ "$have_sim" = 1 ]; then
  "$muonbed" run tiny.yaml --no-plots --force --trace-ranks 0 >notrace.log 2>&1 ||
    { cat notrace.log; fail "--trace-ranks 0 run failed"; }
  [ -z "$(find out -name 'sim.trace.json')" ] || fail "stale traces kept: $(find out -name 'sim.trace.json')"
  grep -q "trace.json" out/muonbed-run.json && { cat out/muonbed-run.json; fail "manifest lists a stale trace"; }
  "$muonbed" run tiny.yaml --no-plots --force >retrace.log 2>&1 || { cat retrace.log; fail "retrace failed"; }
fi

# A changed configuration is not mistaken for a finished one.
write_experiment 4
"$muonbed" run tiny.yaml --no-plots >sixth.log 2>&1 || { cat sixth.log; fail "changed-config run failed"; }
grep -q "$runs runs in" sixth.log || { cat sixth.log; fail "changed configuration reused old results"; }

# --timelines is forwarded to analysis/plot.py: none draws no timeline, the default (first) the
# first point's, all every traced point's (the plots are drawn again on each resumed run).
if [ "$have_sim" = 1 ] && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  timelines() { find out -name 'tiny-timeline-*.png' -printf '%f\n' | sort | tr '\n' ' '; }
  "$muonbed" run tiny.yaml --timelines none >tl_none.log 2>&1 || { cat tl_none.log; fail "--timelines none failed"; }
  grep -q "plot: \[1/" tl_none.log || { cat tl_none.log; fail "no plot progress lines"; }
  [ -z "$(timelines)" ] || fail "--timelines none drew: $(timelines)"
  "$muonbed" run tiny.yaml >tl_first.log 2>&1 || { cat tl_first.log; fail "default --timelines failed"; }
  [ "$(timelines)" = "tiny-timeline-sim-sequential.png " ] || fail "default (first) drew: $(timelines)"
  "$muonbed" run tiny.yaml --timelines all >tl_all.log 2>&1 || { cat tl_all.log; fail "--timelines all failed"; }
  [ "$(timelines)" = "tiny-timeline-sim-owner.png tiny-timeline-sim-sequential.png " ] ||
    fail "--timelines all drew: $(timelines)"
  "$muonbed" run tiny.yaml --timelines sometimes >tl_bad.log 2>&1 && fail "--timelines sometimes was accepted"
  grep -q "sometimes" tl_bad.log || { cat tl_bad.log; fail "no message for --timelines sometimes"; }
fi

# A sweep that lost a point: its old files stay, the manifest no longer lists them.
write_experiment 4 owner
"$muonbed" run tiny.yaml --no-plots >seventh.log 2>&1 || { cat seventh.log; fail "shrunk sweep failed"; }
grep -q "sequential" out/muonbed-run.json && { cat out/muonbed-run.json; fail "manifest lists a dropped point"; }
grep -q "strategy.name=owner/analytic.json" out/muonbed-run.json || fail "manifest lost a current point"
[ -e out/strategy.name=sequential/analytic.json ] || fail "old results were deleted"

# Backends that cannot run here (nccl: not built, or no GPU): exit 2 before any work, with the fix.
"$muonbed" run tiny.yaml --backend nccl >nccl.log 2>&1
rc=$?
[ $rc -eq 2 ] || { cat nccl.log; fail "backend nccl: exit $rc, expected 2"; }
grep -q "fix: .*--backend sim --backend analytic" nccl.log || { cat nccl.log; fail "no fix for nccl"; }
if "$muonbed" presets 2>/dev/null | grep -q "mpi (not built)"; then
  "$muonbed" run tiny.yaml --backend mpi >mpi.log 2>&1
  rc=$?
  [ $rc -eq 2 ] || { cat mpi.log; fail "backend mpi without MPI: exit $rc, expected 2"; }
  grep -q "built without MPI" mpi.log || { cat mpi.log; fail "no MPI message"; }
fi
if [ "$have_sim" = 0 ]; then
  "$muonbed" run tiny.yaml --backend sim >nosim.log 2>&1
  rc=$?
  [ $rc -eq 2 ] || { cat nosim.log; fail "sim without SimGrid: exit $rc, expected 2"; }
  grep -q "built without SimGrid" nosim.log || { cat nosim.log; fail "no SimGrid message"; }
fi
# Memory feasibility (issue 22): a point whose training state exceeds the GPU is flagged by
# validate, plan and run, and in its result; its step time is still reported, marked.
{
  tiny_experiment oom dgx-h100 8 "$backends"
  echo "memory: {reserved_GiB: 100}"
  echo "output: oom-out"
} >oom.yaml
"$muonbed" validate oom.yaml >oom-validate.log 2>&1 || { cat oom-validate.log; fail "validate of oom.yaml failed"; }
grep -q "INFEASIBLE .*exceeds the 79.6 GiB of one H100" oom-validate.log || { cat oom-validate.log; fail "validate did not flag the floor"; }
"$muonbed" plan oom.yaml >oom-plan.log 2>&1 || { cat oom-plan.log; fail "plan of oom.yaml failed"; }
grep -q "^INFEASIBLE  training memory .*reserved 100.0 GiB) exceeds" oom-plan.log || { cat oom-plan.log; fail "plan did not flag it"; }
"$muonbed" run oom.yaml --no-plots >oom-run.log 2>&1 || { cat oom-run.log; fail "run of oom.yaml failed"; }
grep -q "warning: INFEASIBLE" oom-run.log || { cat oom-run.log; fail "run did not warn"; }
grep -q " OOM" oom-run.log || { cat oom-run.log; fail "the table does not mark OOM"; }
grep -q '"feasible": false' oom-out/default/analytic.json || fail "the result does not say infeasible"
grep -q '"feasible": true' out/strategy.name=owner/analytic.json || fail "a fitting point is not feasible"
# A given memory section is part of the resolved configuration (the default one is left out, so
# results' identities stay as they were).
"$muonbed" validate oom.yaml --resolved | grep -q "reserved_GiB: 100" || fail "memory not in the resolved configuration"
# Bad memory values are refused at their place (line 6, after the tiny_experiment head) with the fix.
sed 's/reserved_GiB: 100/activations_GiB: -1/' oom.yaml >bad-memory.yaml
"$muonbed" validate bad-memory.yaml >bad-memory.log 2>&1 && fail "a negative activations_GiB was accepted"
grep -q "bad-memory.yaml:6:" bad-memory.log || { cat bad-memory.log; fail "no file:line for a bad memory value"; }
sed 's/reserved_GiB: 100/master_weights: fp16/' oom.yaml >bad-master.yaml
"$muonbed" validate bad-master.yaml >bad-master.log 2>&1 && fail "master_weights: fp16 was accepted"
grep -q "auto" bad-master.log || { cat bad-master.log; fail "the choices are not named"; }

# Two backends of one point carry each other's step beside their own (cross_check).
if [ "$have_sim" = 1 ]; then
  grep -q '"cross_check"' oom-out/default/analytic.json || fail "no cross_check in the analytic result"
  grep -q '"backend": "sim"' oom-out/default/analytic.json || fail "cross_check does not name sim"
  grep -q '"backend": "analytic"' oom-out/default/sim.json || fail "cross_check does not name analytic"
fi
echo "PASS: muonbed run writes, resumes, reruns changed or damaged points, is deterministic"
