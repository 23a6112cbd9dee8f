#!/usr/bin/env bash
# The device half of scripts/gpu-bundle: runs on the lent GPU machine from the repository root,
#
#   bash gpu-bundle/run.sh [STAGE...]          (default: every stage, in the order below)
#   bash gpu-bundle/run.sh remaining           (what earlier lent machines left unrun, below)
#
# A lent machine gives 15 minutes of device time in all (its start and every call included), so
# the default run is sized to finish within MUONBED_BUNDLE_BUDGET seconds (default 400): every
# stage gets its share (STAGE_SECONDS below) or what is left of the budget, whichever is less, is
# stopped when it overruns (`timeout`), and is skipped when under 15 s are left. After every
# stage the results so far are packed into $OUT/gpu-run.tgz (atomically) and summary.txt gets a
# line: a device call that times out still returns everything that finished.
#
# Stages, most important first:
#   tests      gpu_tests: CUDA kernels vs the CPU, the CUDA loopback equivalence matrix with its
#              negative control, captured graph == eager bits
#   nccl       nccl_equivalence under the carried mpirun -np 1 (world size 1)
#   loopback   the quickstart's five strategies as 8 logical ranks on the GPU, eager and graph;
#              then as `muonbed run --backend cuda_loopback` records beside the analytic model,
#              and `muonbed compare` of them
#   llama      llama-7b (16 layers on an 80 GB card) at world size 1, eager vs graph, with op
#              times (host overhead) and where the step went: per op kind, the step's NS calls
#              against the same calls alone, and the step again with NS skipped (--ns-identity);
#              the GPU's clocks, power and clock-event reasons sampled every 200 ms meanwhile
#              (llama_smi.csv, summarised in llama_smi.txt); then `muonbed run --backend nccl`
#              of it, eager and graph
#   calibrate  `muonbed calibrate --backend nccl`: the NS and elementwise tables of this GPU at
#              the shapes of experiments/hf_qwen3_moe.yaml's plans (Qwen3-30B-A3B: expert stacks
#              [16, 768, 2048] per EP rank), the whole 128 x [768, 2048] stack and bench ns's
#              default shapes, into dgx-h100.yaml (dgx-h200.yaml on a card of 120 GB or more):
#              $OUT/h100-measured.yaml (h200-measured.yaml)
#   validate8  the 8-rank validate_cpu points on this machine's cores: calibrate --backend mpi
#              at 8 ranks, run them with that profile, compare (CPU only; no oversubscription)
#   ns         `muonbed bench ns` per kernel version, PyTorch's Muon NS, the comparison table
#              (last: the plans' shapes are timed by calibrate)
# Not in the default run (name it: `bash gpu-bundle/run.sh training`):
#   training   issue 24's CPU check on this machine's quiet cores: calibrate --backend mpi for
#              experiments/mpi_training.yaml (2 ranks), three runs of it with that profile, then
#              compare: measured against predicted Muon overhead, with the runs' noise
#
# `remaining` (one device call of at most 590 s, its own budget): tests (a regression check of
# this build), llama (the 300-ms gap between the llama-7b step and its kernels, measured on an
# H200 on 2026-11-28), loopback (with the cuda_loopback backend's records and compare, new since
# then), validate8 with one run: what the lent machines of 2026-11-27 and 2026-11-28 left unrun
# or unexplained (experiments/BENCHMARKS.md, "GPU executor on a lent H200"). Then, with the
# device time left, `bash gpu-bundle/run.sh training` (issue 24's check on quiet cores).
#
# Knobs for a rerun of part of it (environment): MUONBED_SHARE_<stage>=SECONDS,
# MUONBED_GPU_TESTS_FILTER (a Catch2 spec, e.g. "[loopback]"), MUONBED_LOOPBACK_REPEATS,
# MUONBED_VALIDATE8_PROFILE (a profile already calibrated on this kind of machine: calibrate is
# skipped), MUONBED_VALIDATE8_RUNS (1 or 2).
#
# scripts/gpu-bundle --dry-run runs this same script on a machine without a GPU with a small
# budget: paths, libraries, mpirun and the packing are checked; the GPU stages report SKIPPED.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# The interpreter that has torch on the GPU machine (NS vs PyTorch): the first python3 on PATH
# there, not Debian's /usr/bin/python3 (which has matplotlib here and no torch there).
# MUONBED_TORCH_PYTHON names another one.
torch_python=${MUONBED_TORCH_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}
root=$(cd "$here/.." && pwd)
start_s=$(date +%s)
budget=${MUONBED_BUNDLE_BUDGET:-400}
declare -A STAGE_SECONDS=([tests]=90 [nccl]=75 [loopback]=80 [llama]=150 [calibrate]=40
  [validate8]=140 [ns]=50 [training]=120)
default_stages=(tests nccl loopback llama calibrate validate8 ns)
if [ "${1:-}" = remaining ] && [ $# -eq 1 ]; then
  set -- tests llama loopback validate8
  budget=${MUONBED_BUNDLE_BUDGET:-590}
  STAGE_SECONDS[tests]=70
  STAGE_SECONDS[llama]=140
  STAGE_SECONDS[loopback]=90
  STAGE_SECONDS[validate8]=270
  : "${MUONBED_VALIDATE8_RUNS:=1}"
fi

dest=${OUT:-$here/out}
mkdir -p "$dest"
out=$(mktemp -d)   # scratch: logs and JSON, packed into $dest/gpu-run.tgz after each stage
pl=$(mktemp -d)    # the unpacked payload: binaries, libraries, Open MPI
smi_pid=
# The GPU's clocks, power, temperature and the reasons its clocks are held, every 200 ms, into
# FILE, until smi_stop (a GEMM-bound step that slows the longer it runs shows here). The reasons
# field has two names across drivers; without either the rest is still sampled.
smi_start() {
  command -v nvidia-smi >/dev/null || return 0
  local fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu reasons=
  for r in clocks_event_reasons.active clocks_throttle_reasons.active; do
    nvidia-smi --query-gpu="$r" --format=csv,noheader >/dev/null 2>&1 && reasons=$r && break
  done
  nvidia-smi --query-gpu="$fields${reasons:+,$reasons}" --format=csv,nounits -lms 200 \
    >"$1" 2>&1 &
  smi_pid=$!
}
smi_stop() {  # stops the sampler this script started (never any other process)
  [ -n "$smi_pid" ] || return 0
  kill "$smi_pid" 2>/dev/null
  wait "$smi_pid" 2>/dev/null
  smi_pid=
}
# SM clock and power over the samples where the GPU was busy (utilization >= 50 %), and every
# clock-event reason bitmask seen then.
smi_summary() {
  [ -s "$1" ] || { echo "no GPU samples (nvidia-smi did not run)"; return 0; }
  # Columns found by name (nvidia-smi prints its own names, e.g. clocks.current.sm [MHz]).
  awk -F', *' 'NR == 1 {
      for (i = 1; i <= NF; ++i) {
        if ($i ~ /clocks.*sm/) cc = i; else if ($i ~ /power.draw/) pc = i
        else if ($i ~ /utilization.gpu/) uc = i; else if ($i ~ /reasons/) rc = i
      }
      next
    }
    uc && $uc + 0 >= 50 {
      n++; c = $cc + 0; p = $pc + 0
      cs += c; ps += p; if (n == 1 || c < cmin) cmin = c; if (c > cmax) cmax = c
      if (p > pmax) pmax = p
      if (rc) seen[$rc]++
    }
    END {
      if (n == 0) { print "no busy samples (utilization >= 50 %)"; exit }
      printf "busy samples %d (200 ms apart): SM clock min %d, mean %.0f, max %d MHz; power mean %.0f, max %.0f W\n", n, cmin, cs / n, cmax, ps / n, pmax
      for (r in seen) printf "clock-event reasons %s: %d samples\n", r, seen[r]
    }' "$1"
}
trap 'smi_stop; rm -rf "$pl" "$out"' EXIT
summary=$dest/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

pack() {  # the results so far, replaced atomically (a timeout between stages loses nothing)
  tar czf "$dest/.gpu-run.tgz.tmp" -C "$out" . 2>/dev/null && mv -f "$dest/.gpu-run.tgz.tmp" \
    "$dest/gpu-run.tgz"
}

tar xJf "$here/payload.tar.xz" -C "$pl" || { note "gpu-bundle: cannot unpack the payload"; exit 1; }
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=("${default_stages[@]}")

# Libraries: the payload's, Open MPI's, then the machine's CUDA runtime, cuBLAS and NCCL. Where
# the machine keeps one elsewhere (PyTorch's wheels carry cuBLAS and NCCL), its folder is found.
libs="$pl/lib:$pl/ompi/lib/x86_64-linux-gnu/openmpi/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib"
libs+=${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for _ in 1 2 3; do
  missing=$(LD_LIBRARY_PATH=$libs ldd "$pl"/bin/* 2>/dev/null | awk '/not found/ {print $1}' |
    sort -u)
  [ -z "$missing" ] && break
  for name in $missing; do
    found=$(find /usr/local /opt /usr/lib /usr/lib64 -name "$name" 2>/dev/null | head -1)
    [ -n "$found" ] && libs+=":$(dirname "$found")" && note "gpu-bundle: $name from $found"
  done
done
if [ -n "$missing" ]; then
  note "gpu-bundle: libraries not found on this machine: $missing"
  exit 1
fi
export OPAL_PREFIX=$pl/ompi PMIX_INSTALL_PREFIX=$pl/ompi/pmix2
export PMIX_MCA_mca_base_component_path=$pl/ompi/pmix2/lib/pmix
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MUONBED_MPIRUN=$pl/ompi/bin/mpirun MUONBED_GPU_WORKER=$pl/bin/muonbed-gpu-worker
export PATH=$pl/ompi/bin:$PATH
mb=$pl/bin/muonbed

{
  date -u +"date %Y-%m-%dT%H:%M:%SZ"
  echo "host $(hostname) cores $(nproc) kernel $(uname -r)"
  cat "$here/provenance.txt" 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv 2>&1 || echo "nvidia-smi: not available"
  nvidia-smi 2>&1 | head -5
  for lib in libcudart.so libcublas.so libnccl.so; do
    echo "$lib: $(LD_LIBRARY_PATH=$libs ldd "$pl/bin/gpu_tests" "$pl/bin/nccl_equivalence" |
      awk -v l="$lib" 'index($1, l) == 1 {print $3; exit}' | xargs -r readlink -f)"
  done
  "$torch_python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
    'nccl', torch.cuda.nccl.version())" 2>&1 | tail -1
} >"$out/device.txt" 2>&1
cat "$out/device.txt"
memory_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null |
  head -1)

status=0
run() {  # run NAME CMD...: logs to $out/NAME.log, under the stage's time limit
  local name=$1
  shift
  local now left
  now=$(date +%s)
  left=$((stage_deadline - now))
  if [ "$left" -lt 5 ]; then
    note "$name skipped: the stage's time is spent"
    status=1
    return
  fi
  echo "== $name (limit ${left}s): $*"
  local t0=$now
  LD_LIBRARY_PATH=$libs timeout -k 5 "$left" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  local verdict=ok
  case $rc in
    0) ;;
    77) verdict="SKIPPED (no usable GPU)" ;;
    124 | 137) verdict="TIMED OUT after ${left}s" ;;
    *) verdict=FAILED ;;
  esac
  note "$name exit $rc ($verdict) $(($(date +%s) - t0))s"
  [ "$rc" -eq 0 ] || status=1
}

# MUONBED_GPU_TESTS_FILTER: a Catch2 test spec (e.g. "[loopback]") to rerun part of gpu_tests.
stage_tests() {
  run gpu_tests "$pl/bin/gpu_tests" --durations yes ${MUONBED_GPU_TESTS_FILTER:+"$MUONBED_GPU_TESTS_FILTER"}
}

stage_nccl() {
  run nccl_equivalence "$pl/ompi/bin/mpirun" -np 1 --bind-to none \
    -x LD_LIBRARY_PATH="$libs" "$pl/bin/nccl_equivalence"
}

stage_loopback() {
  # Data drawn on the device (no --check): the step's GPU work without a host fill per step.
  run loopback "$pl/bin/muonbed-gpu-worker" loopback "$root/experiments/gpu_loopback.yaml" \
    --mode both ${MUONBED_LOOPBACK_REPEATS:+--repeats "$MUONBED_LOOPBACK_REPEATS"} \
    --json "$out/loopback.json"
  # The same points as records of the cuda_loopback backend beside the analytic model, and
  # compare's table of them (marked: 8 ranks on one GPU are not the 8-GPU node predicted).
  local results=$out/loopback_records
  mkdir -p "$results"
  cp "$root/experiments/gpu_loopback.yaml" "$results/"
  ln -sfn "$root/experiments/clusters" "$results/clusters"
  run loopback_records "$mb" run "$results/gpu_loopback.yaml" --backend cuda_loopback \
    --backend analytic --no-plots --force --output "$results/run"
  run loopback_compare "$mb" compare "$results/gpu_loopback.yaml" --output "$results/run" \
    --no-plots --json "$results/compare.json"
  rm -f "$results/clusters"
}

stage_llama() {
  local exp=$root/experiments/gpu_llama7b_h100.yaml
  [ "${memory_mib:-0}" -ge 120000 ] && exp=$root/experiments/gpu_llama7b.yaml
  smi_start "$out/llama_smi.csv"
  run llama_loopback "$pl/bin/muonbed-gpu-worker" loopback "$exp" --mode both --op-times \
    --json "$out/llama_loopback.json"
  # The same step with the NS kernels skipped: its NS ops are then their gathers, roundings and
  # scatters alone, so the two tables split the NS ops' time between the kernel and the copies.
  run llama_loopback_identity "$pl/bin/muonbed-gpu-worker" loopback "$exp" --mode eager \
    --op-times --ns-identity --warmup 1 --repeats 3 --json "$out/llama_loopback_identity.json"
  smi_stop
  smi_summary "$out/llama_smi.csv" | tee "$out/llama_smi.txt"
  local results=$out/llama_nccl
  mkdir -p "$results"
  cp "$exp" "$results/"
  ln -sfn "$root/experiments/clusters" "$results/clusters"
  run llama_nccl_eager "$mb" run "$results/$(basename "$exp")" --backend nccl --no-plots --force \
    --output "$results/eager"
  MUONBED_NCCL_GRAPH=1 run llama_nccl_graph "$mb" run "$results/$(basename "$exp")" \
    --backend nccl --no-plots --force --output "$results/graph"
  # Predicted beside measured: the analytic model on the same point, then compare per mode.
  for mode in eager graph; do
    run "llama_analytic_$mode" "$mb" run "$results/$(basename "$exp")" --backend analytic \
      --no-plots --force --output "$results/$mode"
  done
  run llama_compare_eager "$mb" compare "$results/$(basename "$exp")" --output "$results/eager" \
    --no-plots --json "$results/compare_eager.json"
  run llama_compare_graph "$mb" compare "$results/$(basename "$exp")" --output "$results/graph" \
    --no-plots --json "$results/compare_graph.json"
  rm -f "$results/clusters"
}

# The GPU's compute tables at the plans' shapes, batched MoE expert stacks included, written into
# the base profile of this kind of machine (the network is the base's: one GPU cannot measure it).
stage_calibrate() {
  local base=$root/experiments/clusters/dgx-h100.yaml name=h100-measured
  if [ "${memory_mib:-0}" -ge 120000 ]; then
    base=$root/experiments/clusters/dgx-h200.yaml
    name=h200-measured
  fi
  run calibrate_nccl "$mb" calibrate --backend nccl --experiment \
    "$root/experiments/hf_qwen3_moe.yaml" --base "$base" --shape 128x768x2048 \
    --shape 32x768x2048 --out "$out/$name.yaml" \
    --note "the lent GPU machine ($(hostname)), one GPU, gpu-bundle"
  cp "$out/$name.yaml" "$dest/" 2>/dev/null
}

# validate_cpu's 8-rank points with a profile calibrated here, at 8 ranks (the 2-core VMs can
# only oversubscribe them). Analytic predictions beside the measured steps (no SimGrid here).
stage_validate8() {
  local v=$out/validate8
  mkdir -p "$v"
  local ranks=8
  [ "$(nproc)" -lt 8 ] && ranks=2  # a dry run on a small machine: the same commands, 2 ranks
  # MUONBED_VALIDATE8_PROFILE: a profile calibrated earlier on this kind of machine (the run
  # then skips calibrate; the speed probe of every point says whether this machine matches it).
  local profile=${MUONBED_VALIDATE8_PROFILE:-}
  if [ -n "$profile" ] && [ "$ranks" -eq 8 ]; then
    cp "$root/$profile" "$v/" && profile=$v/$(basename "$profile")
  else
    profile=$v/gpu-host-cpu$ranks.yaml
    run validate8_calibrate "$mb" calibrate --backend mpi --experiment \
      "$root/experiments/validate_cpu.yaml" --ranks "$ranks" --out "$profile" \
      --note "the lent GPU machine's CPU cores ($(nproc)), $ranks MPI ranks, gpu-bundle"
  fi
  [ -s "$profile" ] || return
  sed -e "s|^cluster: .*|cluster: $profile|" \
    -e "s|^name: validate_cpu|name: validate_cpu$ranks|" \
    -e "s|mesh.dp_shard: \[.*\]|mesh.dp_shard: [$ranks]|" \
    -e "s|^backend: .*|backend: [mpi, analytic]|" \
    "$root/experiments/validate_cpu.yaml" >"$v/validate_cpu$ranks.yaml"
  run validate8_run1 "$mb" run "$v/validate_cpu$ranks.yaml" --no-plots --force --output "$v/run1"
  [ "${MUONBED_VALIDATE8_RUNS:-2}" -ge 2 ] &&
    run validate8_run2 "$mb" run "$v/validate_cpu$ranks.yaml" --no-plots --force --output "$v/run2"
  local outs=(--output "$v/run1")
  [ -d "$v/run2" ] && outs+=(--output "$v/run2")
  run validate8_compare "$mb" compare "$v/validate_cpu$ranks.yaml" "${outs[@]}" --no-plots \
    --json "$v/compare.json"
  cp "$out/validate8_compare.log" "$dest/validate8.txt" 2>/dev/null
}

# The training step on 2 CPU ranks (experiments/mpi_training.yaml) with a profile calibrated here:
# the overhead check of issue 24 on cores nothing else uses (the 2-core VMs are noisy).
stage_training() {
  local t=$out/training
  mkdir -p "$t"
  local profile=$t/gpu-host-cpu2.yaml
  run training_calibrate "$mb" calibrate --backend mpi --experiment \
    "$root/experiments/mpi_training.yaml" --ranks 2 --out "$profile" \
    --note "the lent GPU machine's CPU cores ($(nproc)), 2 MPI ranks, gpu-bundle"
  [ -s "$profile" ] || return
  sed -e "s|^cluster: .*|cluster: $profile|" "$root/experiments/mpi_training.yaml" \
    >"$t/mpi_training.yaml"
  local outs=() i
  for i in 1 2 3; do
    run "training_run$i" "$mb" run "$t/mpi_training.yaml" --no-plots --force --output "$t/run$i"
    [ -d "$t/run$i" ] && outs+=(--output "$t/run$i")
  done
  [ ${#outs[@]} -gt 0 ] || return
  run training_compare "$mb" compare "$t/mpi_training.yaml" "${outs[@]}" --no-plots \
    --json "$t/compare.json"
  cp "$out/training_compare.log" "$dest/training.txt" 2>/dev/null
}

stage_ns() {
  local versions jsons=()
  versions=$(LD_LIBRARY_PATH=$libs "$mb" bench ns --list-versions | awk '{print $1}')
  for v in $versions; do
    run "bench_ns_v$v" "$mb" bench ns --device gpu --kernel-version "$v" \
      --json "$out/bench_ns_v$v.json"
    [ -s "$out/bench_ns_v$v.json" ] && jsons+=("$out/bench_ns_v$v.json")
  done
  PYTHONUNBUFFERED=1 run bench_torch "$torch_python" "$here/bench_torch_muon.py" --json \
    "$out/bench_torch.json"
  if [ ${#jsons[@]} -gt 0 ]; then
    local torch_args=()
    [ -s "$out/bench_torch.json" ] && torch_args=(--torch "$out/bench_torch.json")
    run compare_ns "$torch_python" "$here/compare_ns.py" "${torch_args[@]}" "${jsons[@]}"
    cp "$out/compare_ns.log" "$dest/compare_ns.md" 2>/dev/null
  fi
}

for stage in "${stages[@]}"; do
  if ! declare -F "stage_$stage" >/dev/null; then
    note "unknown stage $stage (${default_stages[*]})"
    status=1
    continue
  fi
  now=$(date +%s)
  left=$((start_s + budget - now))
  if [ "$left" -lt 15 ]; then
    note "stage $stage skipped: the bundle's budget (${budget}s) is spent"
    status=1
    continue
  fi
  share_var=MUONBED_SHARE_$stage
  share=${!share_var:-${STAGE_SECONDS[$stage]}}
  [ "$share" -gt "$left" ] && share=$left
  stage_deadline=$((now + share))
  note "## stage $stage (share ${share}s, $((now - start_s))s into the run)"
  "stage_$stage"
  pack
done

# Figures where this machine's python3 has matplotlib (else plot the JSON at home).
for py in /usr/bin/python3 python3; do
  if "$py" -c "import matplotlib" 2>/dev/null; then
    "$py" "$here/plot_gpu_run.py" "$out" "$out" >"$out/plots.log" 2>&1
    break
  fi
done
note "gpu-bundle: done in $(($(date +%s) - start_s))s, status $status"
pack
exit $status
