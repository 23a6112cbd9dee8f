#!/usr/bin/env bash
# `muonbed run --shard I/N` end to end (issue 23 item 6): shards of one sweep, run at the same
# time into one results folder, run every point exactly once between them, give the same results
# as one unsharded run, and leave a manifest that lists every result (each writer rebuilds it
# from the files present until what it wrote is what it finds); a plain run afterwards merges
# and finds nothing to do. Bad --shard values are refused with the fix. The sweep is zipped.
# Usage: shard_cli_test.sh MUONBED_BINARY WORK_DIR
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/cli_test.sh"
muonbed=$1
work=$2
enter_work_dir "$work"

{
  tiny_experiment tiny dgx-h100 8 analytic "{name: owner}"
  cat <<EOF
sweep:
  strategy.name: [sequential, owner]
  zip:
    mesh.dp_shard: [1, 2, 4, 8]
    optimizer.ns_steps: [5, 5, 4, 4]
output: out
EOF
} >tiny.yaml
points=8
listed() { grep -c '"backend": "analytic"' out/muonbed-run.json; }

# The reference: one unsharded run of the same file in another folder.
mkdir whole && cp tiny.yaml whole/
(cd whole && "$muonbed" run tiny.yaml --no-plots >../whole.log 2>&1) || { cat whole.log; fail "unsharded run failed"; }
grep -q "tiny: 8 points x backends = 8 runs" whole.log || { cat whole.log; fail "the zipped sweep is not 8 points"; }

# Four shards at once into one folder, five times over: shard 1 reads the folder for its last
# manifest first and replaces the manifest last (it waits 1 s in between), after the other shards,
# started 0.2 s apart, added their results and manifests. A shard that wrote its view once and
# stopped would leave a manifest without them (it did in every run of this test); here shard 1
# reads the folder again and corrects it. Each round starts from an empty folder.
shards=4
for round in 1 2 3 4 5; do
  rm -rf out
  pids=()
  for i in $(seq 1 $shards); do
    [ "$i" = 1 ] && delay=1000 || delay=0
    MUONBED_TEST_MANIFEST_DELAY_MS=$delay \
      "$muonbed" run tiny.yaml --no-plots --shard "$i/$shards" >"shard$i.log" 2>&1 &
    pids+=($!)
    sleep 0.2
  done
  for i in $(seq 1 $shards); do
    wait "${pids[$((i - 1))]}" || { cat "shard$i.log"; fail "shard $i/$shards exited non-zero (round $round)"; }
  done
  [ "$(listed)" -eq $points ] || { cat out/muonbed-run.json; fail "round $round: the manifest lists $(listed) of $points results"; }
  [ -z "$(find out -name '*muonbed-tmp*')" ] || fail "temporary files left: $(find out -name '*muonbed-tmp*')"
done
# Shard i ran points i and i+4 (1-based, in sweep order), and nothing else.
labels=($(grep -o '^OK  \[[0-9]*/8\] [^ ]*' <("$muonbed" validate tiny.yaml) | awk '{print $3}'))
[ ${#labels[@]} -eq $points ] || fail "validate listed ${#labels[@]} points"
for i in $(seq 1 $shards); do
  grep -q "tiny: shard $i/$shards: 2 of 8 points x backends = 2 runs" "shard$i.log" || { cat "shard$i.log"; fail "shard $i header"; }
  [ "$(grep -c '^\[' "shard$i.log")" -eq 2 ] || { cat "shard$i.log"; fail "shard $i ran other than 2 runs"; }
  for k in $((i - 1)) $((i - 1 + shards)); do
    grep -q "] ${labels[$k]} \[analytic\]" "shard$i.log" || { cat "shard$i.log"; fail "shard $i did not run ${labels[$k]}"; }
  done
done
# The same results as the unsharded run (the timestamp and the checksum over it aside).
[ "$(cd whole/out && find . -name 'analytic.json' | wc -l)" -eq $points ] || fail "the unsharded run lacks results"
for f in $(cd whole/out && find . -name 'analytic.json'); do
  [ -f "out/$f" ] || fail "sharded run lacks $f"
  diff <(grep -v '"timestamp"\|"checksum"' "whole/out/$f") <(grep -v '"timestamp"\|"checksum"' "out/$f") >/dev/null ||
    fail "$f differs from the unsharded run"
done

# The merge: a plain run afterwards finds every point done and rebuilds the manifest.
rm out/muonbed-run.json
"$muonbed" run tiny.yaml --no-plots >merge.log 2>&1 || { cat merge.log; fail "merge run failed"; }
grep -q "resumed: 8 of 8 runs" merge.log || { cat merge.log; fail "the merge ran points again"; }
[ "$(listed)" -eq $points ] || fail "the merge's manifest lists $(listed) results"

# More shards than points: the extra ones have nothing to do and say so.
"$muonbed" run tiny.yaml --no-plots --shard 9/9 >empty.log 2>&1 || { cat empty.log; fail "an empty shard failed"; }
grep -q "shard 9/9 has no points (the selection has 8" empty.log || { cat empty.log; fail "empty shard message"; }
# Shards of a --point selection: every 2nd point of the 4 owner points.
"$muonbed" run tiny.yaml --no-plots --point strategy.name=owner --shard 2/2 >sel.log 2>&1 || { cat sel.log; fail "shard of a selection failed"; }
grep -q "shard 2/2: 2 of 4 points" sel.log || { cat sel.log; fail "shard of a selection header"; }

# Bad shards: exit 2, the value and the fix (shards count from 1).
for bad in 0/4 5/4 4 1/0 x/4 1/4/2 -1/4 1/100000; do
  "$muonbed" run tiny.yaml --no-plots --shard "$bad" >bad.log 2>&1
  rc=$?
  [ $rc -eq 2 ] || { cat bad.log; fail "--shard $bad: exit $rc, expected 2"; }
  grep -q -- "--shard '$bad'" bad.log || { cat bad.log; fail "--shard $bad: the value is not named"; }
  grep -q "shards count from 1" bad.log || { cat bad.log; fail "--shard $bad: no fix"; }
done
echo "PASS: shards run every point once into one folder whose manifest lists them all"
