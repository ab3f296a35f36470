#!/usr/bin/env bash
# The scaling scripts as a user runs them, before any work: a file the project ships is never
# replaced without --force (the documented commands once overwrote this_machine.toml and the
# results' CSVs and PNGs), arguments are checked before the first run (a bad --sweep, a missing
# --loom), and each refusal is one line with status 2, leaving the file as it was. plot.py under
# a Python without matplotlib (a virtual environment) runs itself again under Debian's, or says
# which to use. (calibrate.py into a folder that does not exist yet: dist.scaling_sweep.)
#   scaling_scripts.sh LOOM
set -uo pipefail
loom=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
fail() { echo "FAIL: $*"; exit 1; }
# refused NAME PATTERN COMMAND...: status 2, one line on stderr matching PATTERN, nothing run.
refused() {
  local name=$1 pattern=$2
  shift 2
  "$@" > out.log 2> err.log
  local status=$?
  [ "$status" -eq 2 ] || { cat out.log err.log; fail "$name: status $status, not 2"; }
  [ "$(grep -c . err.log)" -eq 1 ] && grep -q -- "$pattern" err.log || { cat err.log; fail "$name: not one line '$pattern'"; }
  ! grep -q "^sweep: \|^calibrate: " out.log || { cat out.log; fail "$name: it ran something first"; }
}
s=$src/examples/scaling
shipped=(examples/clusters/this_machine.toml examples/scaling/results/strong.csv examples/scaling/results/model_check.csv
         examples/scaling/results/strong_throughput.png)
before=$(cd "$src" && sha256sum "${shipped[@]}")
refused "calibrate over a shipped file" "is a file the project ships (examples/clusters/this_machine.toml).*--force" \
  python3 "$s/calibrate.py" --loom "$loom" --out "$src/examples/clusters/this_machine.toml"
refused "sweep over a shipped file" "is a file the project ships" \
  python3 "$s/sweep.py" --loom "$loom" --sweep parallel.dp=1,2 --out "$src/examples/scaling/results/strong.csv"
refused "validate over a shipped file" "is a file the project ships" python3 "$s/validate.py" --loom "$loom" \
  --cluster "$src/examples/clusters/this_machine.toml" "$src/examples/scaling/results/strong.csv" \
  --out "$src/examples/scaling/results/model_check.csv"
refused "plot over shipped PNGs" "give --out-dir" python3 "$s/plot.py" "$src/examples/scaling/results/strong.csv"
[ "$(cd "$src" && sha256sum "${shipped[@]}")" = "$before" ] || fail "a shipped file changed"
# Arguments checked before the first run: a bad second series, a loom that is not there.
refused "a bad --sweep" "--sweep 'parallel.tp' is not KEY=V1" \
  python3 "$s/sweep.py" --loom "$loom" --sweep parallel.dp=1,2 --sweep parallel.tp --out new/a/s.csv
refused "calibrate without loom" "--loom no/loom is not a file" python3 "$s/calibrate.py" --loom no/loom --out new/b/c.toml
refused "calibrate with a bad launcher" "--launch 'no-such-launcher -np'" \
  python3 "$s/calibrate.py" --loom "$loom" --launch "no-such-launcher -np" --out new/b/c.toml
refused "calibrate --nodes 0" "--nodes 0 --per-node 4: both count" python3 "$s/calibrate.py" --loom "$loom" \
  --nodes 0 --out new/b/c.toml
refused "calibrate --overlap 7" "--overlap 7.0: a share" python3 "$s/calibrate.py" --loom "$loom" --overlap 7 --out new/b/c.toml
refused "calibrate --max-mb abc" "--max-mb abc: megabytes" python3 "$s/calibrate.py" --loom "$loom" --max-mb abc \
  --out new/b/c.toml
refused "calibrate --set of no key" "--set: .*model.n_layers" python3 "$s/calibrate.py" --loom "$loom" \
  --set model.n_layers=2 --out new/b/c.toml
[ ! -e new/b ] || fail "a refused calibration left its --out folder"
# plot.py: in a virtual environment (no matplotlib), Debian's Python draws; without it, a sentence.
if /usr/bin/python3 -c "import matplotlib" 2> /dev/null && /usr/bin/python3 -m venv --without-pip venv 2> /dev/null; then
  venv/bin/python "$s/plot.py" --out-dir plots/new "$src/examples/scaling/results/strong.csv" > plot.log 2>&1 ||
    { cat plot.log; fail "plot.py in a virtual environment"; }
  [ -s plots/new/strong_throughput.png ] && [ -s plots/new/strong_split.png ] || { cat plot.log; fail "no PNGs"; }
  grep -q "running under /usr/bin/python3" plot.log || { cat plot.log; fail "plot.py did not say which Python drew"; }
  LOOM_PLOT_RERUN=1 venv/bin/python "$s/plot.py" --out-dir plots/new2 "$src/examples/scaling/results/strong.csv" \
    > out.log 2> err.log
  [ $? -eq 2 ] && grep -q "matplotlib is missing from .*venv/bin/python.*run this with /usr/bin/python3" err.log ||
    { cat err.log; fail "plot.py without matplotlib does not say which Python to use"; }
else
  echo "skipped plot.py's Python: no Debian matplotlib or venv here"
fi
echo "ok"
