# What the test scripts of tests/dist and tests/e2e share, sourced by each:
#   . "$(dirname "$0")/../lib.sh"
# a temporary folder of the test's own, removed at exit; failing now or counting failures; a
# command whose output is shown only when it fails; launching on N ranks; no process left.
# It sets no shell options and reads no arguments: each script keeps its own `set` and says
# what it takes.

# test_dir: makes the test's own temporary folder, $dir, removed at exit (KEEP=1 keeps it and
# says where). Commands given to on_exit run first (ending processes the test started).
test_dir() {
  dir=$(mktemp -d)
  trap _test_exit EXIT
}
_test_cleanups=()
on_exit() {  # COMMAND: eval'd at exit, before $dir goes
  _test_cleanups+=("$1")
}
_test_exit() {
  local c
  for c in "${_test_cleanups[@]}"; do eval "$c" || true; done
  if [ -n "${KEEP:-}" ]; then echo "kept $dir" >&2; else rm -rf "$dir"; fi
}

# die MESSAGE: the test fails now, saying why.
die() {
  echo "FAIL: $*"
  exit 1
}

# fail MESSAGE: one failure, counted; the test goes on to its other checks, and ends with
# `finish`, which fails it if any was counted.
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
finish() {  # [WHAT HELD]: prints it (default PASS) when nothing failed
  if [ "$fails" = 0 ]; then
    echo "${1:-PASS}"
    exit 0
  fi
  echo "$fails failure(s)"
  exit 1
}

# run_or_show LOG COMMAND...: runs the command with its output in LOG; if it fails, shows LOG
# and ends the test.
run_or_show() {
  local log=$1
  shift
  local rc=0
  "$@" > "$log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { cat "$log"; die "exited with status $rc: $(basename "$log") above"; }
}

# refused CASE WANT LOOM-ARGS...: $loom exits 2 within ${HOSTILE_TIMEOUT:-60} s, saying WANT in
# loom's own words (no raw library message); a failure is counted (`fail`). Runs through the
# command array `wrap` where the script sets one (a shell that limits it first); the output is
# out<N>.log in the current folder, N counting the cases.
n=0
wrap=()
refused() {
  local name=$1 want=$2
  shift 2
  n=$((n + 1))
  timeout -k 5 "${HOSTILE_TIMEOUT:-60}" "${wrap[@]}" "$loom" "$@" > "out$n.log" 2>&1 < /dev/null
  local rc=$?
  if [ $rc = 124 ]; then fail "$name: hung"; return; fi
  [ $rc = 2 ] || { fail "$name: exit $rc, not 2"; tail -3 "out$n.log"; return; }
  grep -q -- "$want" "out$n.log" || { fail "$name: did not say '$want'"; tail -3 "out$n.log"; }
  grep -q "terminate called\|what():\|\[json.exception\|filesystem error" "out$n.log" && fail "$name: a raw library message"
}

# ranks NP COMMAND...: the command on NP ranks, through $launch, the launcher string a test is
# given ("mpirun ... -np" or "srun ... -n": it takes the count next).
ranks() {
  local np=$1
  shift
  # shellcheck disable=SC2086  # $launch is a command line
  $launch "$np" "$@"
}

# no_processes_left MARKER [WAIT]: after WAIT seconds (default 1), no process whose command line holds MARKER (a name in the test's
# log.dir) is still running; any left are killed and the test fails.
no_processes_left() {
  sleep "${2:-1}"
  if pgrep -f "$1" > /dev/null; then
    echo "processes left behind:"
    pgrep -fa "$1"
    pkill -9 -f "$1"
    die "processes left behind"
  fi
}
