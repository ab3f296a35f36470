#!/usr/bin/env bash
# The scaling scripts as a user runs them, before any work: a file the project ships is never
# replaced without --force (the documented commands once overwrote this_machine.toml and the
# results' CSVs and PNGs), arguments are checked before the first run (a bad --sweep, a missing
# --loom), and each refusal is one line with status 2, leaving the file as it was. plot.py under
# a Python without matplotlib (a virtual environment) runs itself again under Debian's, or says
# which to use, and makes its --out-dir only once all is checked. calibrate.py removes its scratch
# folder however it ends: a failure, Ctrl-C, SIGTERM. (calibrate.py into a folder that does not
# exist yet, and its scratch gone after a whole calibration: dist.scaling_sweep.)
#   scaling_scripts.sh LOOM
set -uo pipefail
loom=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir"
# script_refused NAME PATTERN COMMAND...: status 2, one line on stderr matching PATTERN, nothing run.
script_refused() {
  local name=$1 pattern=$2
  shift 2
  "$@" > out.log 2> err.log
  local status=$?
  [ "$status" -eq 2 ] || { cat out.log err.log; die "$name: status $status, not 2"; }
  [ "$(grep -c . err.log)" -eq 1 ] && grep -q -- "$pattern" err.log || { cat err.log; die "$name: not one line '$pattern'"; }
  ! grep -q "^sweep: \|^calibrate: " out.log || { cat out.log; die "$name: it ran something first"; }
}
s=$src/examples/scaling
shipped=(examples/clusters/this_machine.toml examples/scaling/results/strong.csv examples/scaling/results/model_check.csv
         examples/scaling/results/strong_throughput.png)
before=$(cd "$src" && sha256sum "${shipped[@]}")
script_refused "calibrate over a shipped file" "is a file the project ships (examples/clusters/this_machine.toml).*--force" \
  python3 "$s/calibrate.py" --loom "$loom" --out "$src/examples/clusters/this_machine.toml"
script_refused "sweep over a shipped file" "is a file the project ships" \
  python3 "$s/sweep.py" --loom "$loom" --sweep parallel.dp=1,2 --out "$src/examples/scaling/results/strong.csv"
script_refused "validate over a shipped file" "is a file the project ships" python3 "$s/validate.py" --loom "$loom" \
  --cluster "$src/examples/clusters/this_machine.toml" "$src/examples/scaling/results/strong.csv" \
  --out "$src/examples/scaling/results/model_check.csv"
script_refused "plot over shipped PNGs" "give --out-dir" python3 "$s/plot.py" "$src/examples/scaling/results/strong.csv"
# Every argument checked before --out-dir is made (the second CSV is not there).
script_refused "plot with a missing CSV" "CSV no/such.csv is not a file" python3 "$s/plot.py" --out-dir plots/refused \
  "$src/examples/scaling/results/strong.csv" no/such.csv
[ ! -e plots ] || die "a refused plot.py made its --out-dir"
script_refused "sweep with a bad --sweep" "is not KEY=V1" python3 "$s/sweep.py" --loom "$loom" --sweep parallel.dp \
  --out sweeps/refused/s.csv
[ ! -e sweeps ] || die "a refused sweep.py made its --out folder"
[ "$(cd "$src" && sha256sum "${shipped[@]}")" = "$before" ] || die "a shipped file changed"
# Arguments checked before the first run: a bad second series, a loom that is not there.
script_refused "a bad --sweep" "--sweep 'parallel.tp' is not KEY=V1" \
  python3 "$s/sweep.py" --loom "$loom" --sweep parallel.dp=1,2 --sweep parallel.tp --out new/a/s.csv
script_refused "calibrate without loom" "--loom no/loom is not a file" python3 "$s/calibrate.py" --loom no/loom --out new/b/c.toml
script_refused "calibrate with a bad launcher" "--launch 'no-such-launcher -np'" \
  python3 "$s/calibrate.py" --loom "$loom" --launch "no-such-launcher -np" --out new/b/c.toml
script_refused "calibrate --nodes 0" "--nodes 0 --per-node 4: both count" python3 "$s/calibrate.py" --loom "$loom" \
  --nodes 0 --out new/b/c.toml
script_refused "calibrate --overlap 7" "--overlap 7.0: a share" python3 "$s/calibrate.py" --loom "$loom" --overlap 7 --out new/b/c.toml
script_refused "calibrate --max-mb abc" "--max-mb abc: megabytes" python3 "$s/calibrate.py" --loom "$loom" --max-mb abc \
  --out new/b/c.toml
script_refused "calibrate --set of no key" "--set: .*model.n_layers" python3 "$s/calibrate.py" --loom "$loom" \
  --set model.n_layers=2 --out new/b/c.toml
[ ! -e new/b ] || die "a refused calibration left its --out folder"
# invariant_cost.sh (emulated nodes, as root): its arguments before anything, then root. As
# root, the refusal is checked as nobody; its runs: dist.netns_nodes_and_link_cut.
cost=$s/invariant_cost.sh
script_refused "invariant_cost --pairs 0" "need 1 <= warmup < steps and pairs >= 1" env LOOM="$loom" "$cost" --pairs 0
script_refused "invariant_cost --layouts dp3:0" "'dp3:0' is not dp2:ZERO or dp4:ZERO" env LOOM="$loom" "$cost" --layouts dp3:0
# Root comes first (a user learns that before being sent to build), then the binary.
[ "$(id -u)" -ne 0 ] ||
  script_refused "invariant_cost without loom" "LOOM=no/loom is not a program" env LOOM=no/loom "$cost"
as_user=()
if [ "$(id -u)" -eq 0 ]; then
  as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  "${as_user[@]}" test -x "$cost" || as_user=()  # this tree not readable by nobody: only root's case is left
fi
if [ "$(id -u)" -ne 0 ] || [ ${#as_user[@]} -gt 0 ]; then
  script_refused "invariant_cost as a user" "needs root (network namespaces and tc)" "${as_user[@]}" env LOOM="$loom" "$cost"
  # and root before the binary: a user without either hears of root first
  script_refused "invariant_cost as a user without loom" "needs root" "${as_user[@]}" env LOOM=no/loom "$cost"
else
  echo "skipped invariant_cost as a user: this tree is not readable by nobody"
fi
# calibrate.py's scratch folder (the training run's logs, the trial cluster files) goes however
# the script ends: a launcher that fails after the training run, Ctrl-C to the terminal's process
# group (set -m, as an interactive shell runs a job) and SIGTERM to the script alone.
mkdir tmp
tiny=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.vocab_size=96
      --set model.seq_len=16 --set train.micro_batch=2 --set train.global_batch=4 --set train.device=cpu
      --set data.val_batches=0)
scratch_gone() {  # scratch_gone NAME: nothing of calibrate's (or its children's) left in TMPDIR
  [ -z "$(ls -A tmp)" ] || { ls -la tmp; cat cal.log; die "$1: left $(ls tmp) in TMPDIR"; }
}
TMPDIR=$PWD/tmp python3 "$s/calibrate.py" --loom "$loom" --launch false "${tiny[@]}" --set train.steps=3 \
  --out cal/fail.toml > cal.log 2>&1
[ $? -eq 1 ] && grep -q "^calibrate: failed (1)" cal.log || { cat cal.log; die "calibrate with a failing launcher"; }
scratch_gone "a failed calibration"
# (env --default-signal: where this test was started with SIGINT ignored, as a background job of
# a non-interactive shell is, set -m alone does not give it back.)
for how in INT TERM; do
  set -m  # the job in a process group of its own, for this one command
  TMPDIR=$PWD/tmp env --default-signal=INT python3 "$s/calibrate.py" --loom "$loom" "${tiny[@]}" \
    --set train.steps=1000000 --out cal/$how.toml > cal.log 2>&1 &
  job=$!
  set +m
  for _ in $(seq 200); do
    compgen -G "tmp/calibrate_*/run/metrics.jsonl" > /dev/null && grep -q '"loss"' tmp/calibrate_*/run/metrics.jsonl &&
      break
    sleep 0.1
  done
  grep -q '"loss"' tmp/calibrate_*/run/metrics.jsonl 2> /dev/null || { kill -9 -- -$job; cat cal.log; die "no run"; }
  if [ $how = INT ]; then kill -INT -- -$job; else kill -TERM $job; fi
  wait $job
  status=$?
  want=$([ $how = INT ] && echo 130 || echo 143)
  [ $status -eq "$want" ] || { kill -9 -- -$job; cat cal.log; die "calibrate given SIG$how: status $status, not $want"; }
  [ $how = TERM ] || grep -q "^calibrate: stopped by Ctrl-C; no cluster file written" cal.log ||
    { cat cal.log; die "calibrate does not say it was stopped"; }
  scratch_gone "calibrate given SIG$how"
  [ ! -e cal/$how.toml ] || die "calibrate given SIG$how wrote its --out"
done
# plot.py: in a virtual environment (no matplotlib), Debian's Python draws; without it, a sentence.
if /usr/bin/python3 -c "import matplotlib" 2> /dev/null && /usr/bin/python3 -m venv --without-pip venv 2> /dev/null; then
  venv/bin/python "$s/plot.py" --out-dir plots/new "$src/examples/scaling/results/strong.csv" > plot.log 2>&1 ||
    { cat plot.log; die "plot.py in a virtual environment"; }
  [ -s plots/new/strong_throughput.png ] && [ -s plots/new/strong_split.png ] || { cat plot.log; die "no PNGs"; }
  grep -q "running under /usr/bin/python3" plot.log || { cat plot.log; die "plot.py did not say which Python drew"; }
  LOOM_PLOT_RERUN=1 venv/bin/python "$s/plot.py" --out-dir plots/new2 "$src/examples/scaling/results/strong.csv" \
    > out.log 2> err.log
  [ $? -eq 2 ] && grep -q "matplotlib is missing from .*venv/bin/python.*run this with /usr/bin/python3" err.log ||
    { cat err.log; die "plot.py without matplotlib does not say which Python to use"; }
  [ ! -e plots/new2 ] || die "plot.py without matplotlib made its --out-dir"
else
  echo "skipped plot.py's Python: no Debian matplotlib or venv here"
fi
echo "ok"
