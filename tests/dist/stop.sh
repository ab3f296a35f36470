#!/usr/bin/env bash
# Clean stops: SIGTERM (or SIGINT) to a training job ends it at the next step boundary on every
# rank, with export.final written and loadable, metrics.jsonl closed with a stop record, and
# exit status 75; a second signal ends it at once (no export).
#   stop.sh LOOM "MPIRUN..." NP SIGNAL
set -uo pipefail
loom=$1 mpirun=$2 np=$3 sig=$4
. "$(dirname "$0")/../lib.sh"
test_dir
marker="stop-drill-$$"
launch=()
[ "$np" -gt 1 ] && launch=($mpirun -np "$np")
args=(train --set train.device=cpu --set train.threads=1 --set train.steps=100000 --set data.val_batches=0
      --set parallel.dp="$np" --set train.micro_batch=$((16 / np)) --set log.dir="$dir/$marker")
# wait_steps N: metrics.jsonl has N step lines.
wait_steps() {
  for _ in $(seq 300); do
    [ "$(grep -c '"loss"' "$dir/$marker/metrics.jsonl" 2> /dev/null || echo 0)" -ge "$1" ] && return 0
    sleep 0.1
  done
  return 1
}
"${launch[@]}" "$loom" "${args[@]}" --set export.final="$dir/final.safetensors" > "$dir/log" 2>&1 &
job=$!
wait_steps 3 || { cat "$dir/log"; kill -9 $job; die "no steps"; }
pkill -"$sig" -f "^$loom train.*$marker"  # the ranks (not mpirun, which ends with 1 when signalled)
wait $job
status=$?
echo "status $status"; tail -3 "$dir/log"
[ "$status" -eq 75 ] || { cat "$dir/log"; die "exit status $status, not 75"; }
tail -1 "$dir/$marker/metrics.jsonl" | grep -q "\"stopped\":\"SIG$sig\"" || die "no stop record"
steps=$(grep -c '"loss"' "$dir/$marker/metrics.jsonl")
# The exported weights load: a tp-1 run starts from them.
"$loom" train --set train.device=cpu --set train.steps=1 --set data.val_batches=0 --set train.threads=1 \
  --set init.from="$dir/final.safetensors" --set log.dir="$dir/again" > "$dir/again.log" 2>&1 ||
  { cat "$dir/again.log"; die "the export does not load"; }
echo "stopped cleanly after $steps steps"
# A second signal ends the job at once: no export. Longer steps (T = 1024), so that both
# signals land inside one; the first is handled before the second is sent (signals of one
# kind pending together would merge into one).
rm -rf "$dir/$marker"
"${launch[@]}" "$loom" "${args[@]}" --set model.seq_len=1024 --set export.final="$dir/second.safetensors" \
  > "$dir/log2" 2>&1 &
job=$!
wait_steps 2 || { kill -9 $job; die "no steps"; }
pkill -STOP -f "^$loom train.*$marker"
pkill -"$sig" -f "^$loom train.*$marker"
pkill -CONT -f "^$loom train.*$marker"
sleep 0.05
pkill -"$sig" -f "^$loom train.*$marker"
wait $job
status=$?
[ "$status" -ne 0 ] && [ "$status" -ne 75 ] || die "the second signal did not end it at once ($status)"
[ ! -e "$dir/second.safetensors" ] || die "it exported after the second signal"
no_processes_left "$marker" 0.5
echo "ok"
