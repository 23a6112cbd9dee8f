#!/usr/bin/env bash
# Runs a program under `mpirun -np RANKS` with what this machine needs: --allow-run-as-root as
# root, --oversubscribe beyond its cores (timings then mean nothing; correctness does), no
# binding (ranks run compute threads beside their MPI thread). Without mpirun it exits 77, which
# ctest reports as skipped, with the reason.
# Usage: mpirun.sh RANKS PROGRAM [ARGS...]
set -uo pipefail
ranks=$1
shift
mpirun=${MUONBED_MPIRUN:-$(command -v mpirun || true)}
if [ -z "$mpirun" ]; then
  echo "SKIP: mpirun not found (sudo apt-get install openmpi-bin): the mpi tests did not run"
  exit 77
fi
flags=(--bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
[ "$ranks" -gt "$(nproc)" ] && flags+=(--oversubscribe)
exec "$mpirun" -np "$ranks" "${flags[@]}" "$@"
