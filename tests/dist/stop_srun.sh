#!/usr/bin/env bash
# The stop under srun as users send it: SIGUSR1 to srun (which forwards it to every task) and
# `scancel --signal=TERM` (to the step's tasks) both end every rank at a step boundary with the
# export written and srun's status 75. (srun itself answers SIGTERM, and Ctrl-C twice within a
# second, by killing its tasks: Slurm's own behaviour, which the docs say.)
#   stop_srun.sh LOOM
set -uo pipefail
loom=$1
. "$(dirname "$0")/../lib.sh"
test_dir
marker="stop-srun-$$"
one() {  # one NAME HOW: start a 2-task job, stop it by HOW (a command; $job is srun's pid)
  local name=$1 how=$2 log_dir=$dir/$marker-$1
  srun -n 2 --mpi=pmix --job-name="$marker-$name" "$loom" train --set train.device=cpu --set train.threads=1 --set train.steps=100000 \
    --set data.val_batches=0 --set parallel.dp=2 --set train.micro_batch=8 --set log.dir="$log_dir" \
    --set export.final="$dir/$name.safetensors" > "$dir/$name.log" 2>&1 &
  job=$!
  for _ in $(seq 300); do
    [ "$(grep -c '"loss"' "$log_dir/metrics.jsonl" 2> /dev/null || echo 0)" -ge 3 ] && break
    sleep 0.1
  done
  eval "$how"
  wait $job
  local status=$?
  echo "$name: status $status"
  [ "$status" -eq 75 ] || { cat "$dir/$name.log"; echo "FAIL: $name: status $status, not 75"; exit 1; }
  tail -1 "$log_dir/metrics.jsonl" | grep -q '"stopped":"SIG' || die "$name: no stop record"
  [ -s "$dir/$name.safetensors" ] || die "$name: no export"
}
one usr1 'kill -USR1 $job'
one scancel 'scancel --signal=TERM --name="$marker-scancel"'
echo "ok"
