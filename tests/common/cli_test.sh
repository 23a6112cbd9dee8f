# Sourced by the end-to-end shell tests of the muonbed command (tests/experiments/*_cli_test.sh,
# tests/mpi/*_test.sh): what each of them did first (a fresh work folder, `fail`, the skip without
# mpirun) and the lines their tiny experiments start with, written once.

# fail MESSAGE...: the test's verdict; ends it.
fail() {
  echo "FAIL: $*"
  exit 1
}

# enter_work_dir DIR: DIR emptied (or made) and made the current folder.
enter_work_dir() {
  rm -rf "$1" && mkdir -p "$1" && cd "$1" || exit 1
}

# skip_without_mpirun: exits 77 (ctest's SKIP_RETURN_CODE) where neither $MUONBED_MPIRUN nor an
# mpirun on PATH is there.
skip_without_mpirun() {
  if [ -z "${MUONBED_MPIRUN:-}" ] && ! command -v mpirun >/dev/null; then
    echo "SKIP: mpirun not found (sudo apt-get install openmpi-bin): the mpi tests did not run"
    exit 77
  fi
}

# tiny_experiment NAME CLUSTER DP_SHARD BACKENDS [STRATEGY]: prints the head of an experiment of
# the tiny-dense model on a 1-D FSDP mesh; the caller appends the rest (sweep, output, ...).
tiny_experiment() {
  cat <<YAML
name: $1
cluster: $2
mesh: {dims: {dp_shard: $3}}
model: {preset: tiny-dense}
backend: [$4]
YAML
  if [ -n "${5:-}" ]; then echo "strategy: $5"; fi
}
