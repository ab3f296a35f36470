#!/usr/bin/env bash
# mpirun for loom: one rank per slot, OpenMP threads split evenly over the cores, ranks not
# pinned (loom's OpenMP pool does its own placement), the flags root needs, and a clean Ctrl-C.
#   launch/mpirun.sh -np 4 build/loom train --config F.toml --set parallel.dp=4
# Open MPI's mpirun answers SIGINT and SIGTERM by killing its ranks (SIGTERM one second later,
# SIGKILL the next) and exits 1; it forwards SIGUSR1 to every rank on every node, which loom takes
# as the same stop request. So mpirun runs in a session of its own (the terminal's Ctrl-C reaches
# only this script), the first SIGINT/SIGTERM goes on to it as SIGUSR1 (the ranks stop at the next
# step boundary, export and exit 75, and so does this script), and a second as SIGTERM (end now:
# mpirun ends the ranks where they are, and this script says what that lost and exits 130 after
# a second Ctrl-C, 143 after a second SIGTERM). loom's log then names the Ctrl-C, and Open MPI's
# notices of a non-zero exit stay out of both.
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
# What the user did, for loom's log (the ranks see only SIGUSR1; LOOM_STOP_CAUSE names this file),
# and a pipe for mpirun's stderr through the filter below.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-mpirun.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cause=$tmp/stop_cause ended=$tmp/ended  # ended: not empty once a second stop ended the ranks
: > "$cause"
: > "$ended"
mkfifo "$tmp/stderr"
extra+=(-x LOOM_STOP_CAUSE="$cause")
job="" stops=0 signalled=0
on_stop() {  # on_stop INT|TERM
  signalled=1 stops=$((stops + 1))
  what=SIGTERM
  [ "$1" = INT ] && what=Ctrl-C
  if [ "$stops" -eq 1 ]; then
    echo "$what to launch/mpirun.sh" > "$cause"
    echo "launch/mpirun.sh: $what: the ranks stop at the next step boundary (again: end them now)" >&2
  elif [ "$stops" -eq 2 ]; then
    echo "$what" > "$ended"
    echo "launch/mpirun.sh: $what again: ending the ranks now, without waiting for the step boundary" >&2
  fi
  [ -n "$job" ] || return 0
  if [ "$stops" -eq 1 ]; then kill -USR1 "$job" 2> /dev/null; else kill -TERM "$job" 2> /dev/null; fi
}
trap 'on_stop INT' INT
trap 'on_stop TERM' TERM
# mpirun's stderr, as it comes, but for Open MPI's notices that a rank exited non-zero when that
# was loom's stop status (75) after a stop this script passed on: a clean stop, not a failure.
# Its blocks sit between lines of dashes; the "terminated normally, but" one is held until the
# next says which status. After a second stop, which ends the ranks on purpose, every notice of
# Open MPI's goes (this script says what happened instead). The filter ignores the signals, so it
# outlives a Ctrl-C to the group.
filter='
function stopping(  line, got) { got = (getline line < cause) > 0 && line != ""; close(cause); return got }
function ending(  line, got) { got = (getline line < ended) > 0 && line != ""; close(ended); return got }
function out(text) { printf "%s", text; fflush() }
function release() { if (held != "") out(held); held = "" }
function judge(b) {
  if (ending()) { held = ""; return }
  if (b ~ /terminated normally, but/ && stopping()) { held = b; return }
  if (b ~ /exited with non-zero status/ && b ~ /Exit code: *75\n/ && stopping()) { held = ""; return }
  release(); out(b)
}
/^-+$/ && length($0) >= 40 { if (!inside) { inside = 1; block = $0 "\n" } else { inside = 0; judge(block $0 "\n") } next }
inside { block = block $0 "\n"; next }
/^mpirun: Forwarding signal/ && stopping() { next }
/^mpirun: / && ending() { next }
{ release(); out($0 "\n") }
END { release(); if (inside) out(block) }'
(trap '' INT TERM; exec awk -v cause="$cause" -v ended="$ended" "$filter" < "$tmp/stderr" >&2) &
filter_pid=$!
setsid mpirun "${extra[@]}" "$@" < /dev/null 2> "$tmp/stderr" &
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
while ! wait "$filter_pid" && kill -0 "$filter_pid" 2> /dev/null; do :; done  # its last lines out first
if [ "$stops" -ge 2 ] && [ "$status" -ne 75 ] && [ "$status" -ne 0 ]; then
  # mpirun's own status (1) after it killed the ranks says nothing; the shell's for the signal does.
  what=$(cat "$ended")
  echo "launch/mpirun.sh: ended by a second $what: ranks still in a step were stopped there, with no" \
    "checkpoint or export.final for it; the last committed checkpoint is intact (checkpoint.resume=latest" \
    "goes on from it)" >&2
  [ "$what" = Ctrl-C ] && exit 130
  exit 143
fi
exit "$status"
