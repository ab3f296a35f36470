#!/usr/bin/env bash
# The lost-node drill on emulated nodes (examples/scaling/netns.sh): 2 nodes x 2 ranks at dp 4,
# trained in fp32 under `loom supervise --ranks 2:4` with a checkpoint every 5 steps. After step
# 12 node 1's link goes down for good. The ranks reach the hang verdict; the supervisor ends the
# launcher (it cannot reach node 1's ranks), probes the hosts, finds node 1 gone, and relaunches
# on node 0 alone at dp 2 (the same global batch: two micro-batches a rank instead of one),
# resuming from the last checkpoint resharded. The report: detection (cut -> verdict), restart
# (verdict -> the first step after it), the steps redone, and every step's loss and the final
# weights against a run that lost nothing: the same bits (parallel.invariant: the gradients
# are summed in one tree whether 4 ranks or 2 share the batch, docs/invariant.md).
#   examples/scaling/elastic.sh [OUT_DIR]   (root; env LOOM, COMPARE: the binaries to use)
set -uo pipefail
cd "$(dirname "$0")/../.."
here=examples/scaling
loom=${LOOM:-$PWD/build/loom} compare=${COMPARE:-$PWD/build/tests/loom_compare_runs}
out=${1:-}
[ -n "$out" ] || { out=$(mktemp -d) && own_out=1; }
mkdir -p "$out"
sup=""
cleanup() {
  if [ -n "$sup" ]; then  # a failed drill: take the job down (its command lines name $out)
    kill "$sup" 2> /dev/null
    for _ in $(seq 100); do kill -0 "$sup" 2> /dev/null || break; sleep 0.1; done
    pkill -9 -f -- "$out/run" 2> /dev/null
  fi
  $here/netns.sh down
  [ -n "${own_out:-}" ] && rm -rf "$out"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -30 "$out/run.log" 2> /dev/null; exit 1; }
$here/netns.sh up 2 1gbit > /dev/null || exit 1
common=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=32 --set train.micro_batch=2 --set train.global_batch=8 --set train.steps=30
        --set train.threads=1 --set data.val_batches=0 --set checkpoint.every=5 --set parallel.timeout_s=5
        --set parallel.invariant=true)
"$here/netns.sh" mpirun -np 4 "$loom" train "${common[@]}" --set parallel.dp=4 --set log.dir="$out/base" \
  --set checkpoint.dir="$out/base_ckpt" --set export.final="$out/base/final.safetensors" > "$out/base.log" 2>&1 ||
  { tail -20 "$out/base.log"; exit 1; }
# {hosts}, {ranks} and {dp}: what the supervisor fills in before every run.
# The probe: the launcher itself starts a process on the host (it fails at once over a dead link).
"$loom" supervise --ranks 2:4 --hosts 10.77.0.1:2,10.77.0.2:2 --probe "$here/netns.sh mpirun --host {host}:1 -np 1 true" \
  --verdict-grace-s 5 --max-restarts 2 --backoff-s 1 --log-dir "$out/run" -- \
  "$here/netns.sh" mpirun --host {hosts} -np {ranks} "$loom" train "${common[@]}" --set parallel.dp={dp} \
  --set log.dir="$out/run" --set checkpoint.dir="$out/ckpt" --set checkpoint.resume=latest \
  --set export.final="$out/run/final.safetensors" > "$out/run.log" 2>&1 &
sup=$!
reached=""
for _ in $(seq 1200); do
  grep -qs '"step":12,' "$out/run/metrics.jsonl" && reached=1 && break
  sleep 0.02
done
[ -n "$reached" ] || fail "the job never reached step 12"
t0=$(date +%s.%N)
$here/netns.sh cut 1  # for good
cut_at=$(grep -o '"step":[0-9]*' "$out/run/metrics.jsonl" | tail -1 | cut -d: -f2)
verdict=""
for _ in $(seq 600); do
  [ -s "$out/run/flight/verdict.txt" ] && verdict=1 && break
  sleep 0.05
done
t1=$(date +%s.%N)
[ -n "$verdict" ] || fail "no hang verdict after the cut"
# The first step of the relaunched run.
second_run_stepped() {
  awk '/^\{"run":/ {r++} r >= 2 && /"loss":/ {found = 1} END {exit !found}' "$out/run/metrics.jsonl" 2> /dev/null
}
for _ in $(seq 1800); do second_run_stepped && break; sleep 0.05; done
t2=$(date +%s.%N)
second_run_stepped || fail "the relaunched job took no step"
wait $sup
status=$?
sup=""
[ $status -eq 0 ] || fail "the supervised job ended with $status"
[ "$(grep -c "supervise: restarting" "$out/run.log")" -eq 1 ] || fail "expected exactly one restart"
grep -qE '"event":"layout","t":[0-9.]+,"restart":1,"ranks":2,"dp":2,"hosts":"10.77.0.1:2","lost":1' \
  "$out/run/faults.jsonl" ||
  fail "the restart did not run at dp 2 on node 0 alone: $(grep layout "$out/run/faults.jsonl")"
from=$(grep -o "resumed from [^:]*: step [0-9]*" "$out/run.log" | head -1 | grep -o "[0-9]*$")
[ -n "$from" ] && [ "$from" -gt 0 ] || fail "the restarted job did not resume from a checkpoint"
"$compare" --resumed "$out/base" "$out/run" || fail "the losses or weights are not the unbroken run's bits"
cmp -s "$out/base/final.safetensors" "$out/run/final.safetensors" || fail "the exported weights differ in bytes"
printf "| node lost for good after step %s | detected in %.1f s (hang verdict) | first step at dp 2 on 1 node " \
  "$cut_at" "$(awk "BEGIN {print $t1 - $t0}")"
redone=$((cut_at - from))
printf "%.1f s later | resumed from step %s: %s step%s redone | every step's loss and the weights: the unbroken run's bits |\n" \
  "$(awk "BEGIN {print $t2 - $t1}")" "$from" "$redone" "$([ "$redone" -eq 1 ] || echo s)"
