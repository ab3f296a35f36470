#!/usr/bin/env bash
# mpirun for loom: one rank per slot, OpenMP threads split evenly over the cores, ranks not
# pinned (loom's OpenMP pool does its own placement), and the flags root needs.
#   launch/mpirun.sh -np 4 build/loom train --config F.toml --set parallel.dp=4
set -euo pipefail
np=1
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  [ "${args[i]}" = "-np" ] || [ "${args[i]}" = "-n" ] && np=${args[i + 1]}
done
cores=$(nproc)
threads=$(( cores / np > 0 ? cores / np : 1 ))
extra=(--bind-to none -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}")
(( np > cores )) && extra+=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
exec mpirun "${extra[@]}" "$@"
