#!/usr/bin/env bash
# mpirun for loom: one rank per slot, OpenMP threads split evenly over the cores, ranks not
# pinned (loom's OpenMP pool does its own placement), the flags root needs, and a clean Ctrl-C.
#   launch/mpirun.sh -np 4 build/loom train --config F.toml --set parallel.dp=4
# Open MPI's mpirun answers SIGINT and SIGTERM by killing its ranks (SIGTERM one second later,
# SIGKILL the next) and exits 1; it forwards SIGUSR1 to every rank on every node, which loom takes
# as the same stop request. So mpirun runs in a session of its own (the terminal's Ctrl-C reaches
# only this script), the first SIGINT/SIGTERM goes on to it as SIGUSR1 (the ranks stop at the next
# step boundary, export and exit 75, and so does this script), and a second as SIGTERM (end now).
set -euo pipefail
np=1
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  [ "${args[i]}" = "-np" ] || [ "${args[i]}" = "-n" ] && np=${args[i + 1]}
done
cores=${LOOM_CORES:-$(nproc)}  # LOOM_CORES: as loom counts them (docs/testing.md)
threads=$(( cores / np > 0 ? cores / np : 1 ))
extra=(--bind-to none -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}")
# Open MPI counts a node's slots in physical cores: two hardware threads of one core are one slot.
physical=$(lscpu -p=CORE,SOCKET 2> /dev/null | grep -v '^#' | sort -u | wc -l)
(( np > cores || np > ${physical:-0} )) && extra+=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
job="" stops=0 signalled=0
on_stop() {
  signalled=1 stops=$((stops + 1))
  [ -n "$job" ] || return 0
  if [ "$stops" -eq 1 ]; then kill -USR1 "$job" 2> /dev/null; else kill -TERM "$job" 2> /dev/null; fi
}
trap on_stop INT TERM
setsid mpirun "${extra[@]}" "$@" < /dev/null &
job=$!
[ "$stops" -eq 0 ] || kill -USR1 "$job" 2> /dev/null  # a signal that came while it started
set +e
while :; do
  signalled=0
  wait "$job"
  status=$?
  # A trapped signal ends `wait` early: wait again while mpirun lives (a zombie still answers).
  [ "$signalled" -eq 1 ] && kill -0 "$job" 2> /dev/null || break
done
exit "$status"
