#!/usr/bin/env bash
# A link-cut drill on emulated nodes (examples/scaling/netns.sh): 2 nodes x 2 ranks (tp 2 inside
# a node, dp 2 across), trained under `loom supervise` with a checkpoint every 5 steps. After
# step 12 node 1's link goes down: the ranks must reach the hang verdict with the link down.
# mpirun cannot take down the ranks beyond a dead link, so the job ends once the link is back
# (it comes back right after the verdict); the supervisor must then restart it once, and the
# restarted job must resume from the latest checkpoint (not from step 0) and finish with the
# weights of a run that was never cut, bitwise.
#   examples/scaling/link_cut.sh [OUT_DIR]   (root; env LOOM, COMPARE: the binaries to use)
set -uo pipefail
cd "$(dirname "$0")/../.."
here=examples/scaling
loom=${LOOM:-$PWD/build/loom} compare=${COMPARE:-$PWD/build/tests/loom_compare_runs}
out=${1:-}
[ -n "$out" ] || { out=$(mktemp -d) && own_out=1; }
mkdir -p "$out"
sup=""
cleanup() {
  if [ -n "$sup" ]; then  # a failed drill: the link back so that the job can be taken down
    $here/netns.sh heal 1 2> /dev/null
    kill "$sup" 2> /dev/null
    for _ in $(seq 100); do kill -0 "$sup" 2> /dev/null || break; sleep 0.1; done
    pkill -9 -f -- "$out/run" 2> /dev/null  # whatever of the job is left (its command lines name $out)
  fi
  $here/netns.sh down
  [ -n "${own_out:-}" ] && rm -rf "$out"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -20 "$out/run.log" 2> /dev/null; exit 1; }
$here/netns.sh up 2 1gbit > /dev/null || exit 1
common=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=32 --set train.micro_batch=2 --set train.global_batch=8 --set train.steps=40
        --set train.threads=1 --set data.val_batches=0 --set parallel.dp=2 --set parallel.tp=2
        --set checkpoint.every=5 --set parallel.timeout_s=5)
launch=($here/netns.sh mpirun -np 4)
"${launch[@]}" "$loom" train "${common[@]}" --set log.dir="$out/base" --set checkpoint.dir="$out/base_ckpt" \
  --set export.final="$out/base/final.safetensors" > "$out/base.log" 2>&1 || { tail -20 "$out/base.log"; exit 1; }
"$loom" supervise --max-restarts 2 --backoff-s 4 --log-dir "$out/run" -- "${launch[@]}" "$loom" train "${common[@]}" \
  --set log.dir="$out/run" --set checkpoint.dir="$out/ckpt" --set checkpoint.resume=latest \
  --set export.final="$out/run/final.safetensors" > "$out/run.log" 2>&1 &
sup=$!
reached=""
for _ in $(seq 600); do
  grep -qs '"step":12,' "$out/run/metrics.jsonl" && reached=1 && break
  sleep 0.02
done
[ -n "$reached" ] || fail "the job never reached step 12"
t0=$(date +%s.%N)
$here/netns.sh cut 1
cut_at=$(grep -o '"step":[0-9]*' "$out/run/metrics.jsonl" | tail -1 | cut -d: -f2)
# The verdict: in the flight directory (the rank that judges may sit beyond the cut, whose
# output cannot reach the launcher while the link is down).
verdict=""
for _ in $(seq 600); do
  [ -s "$out/run/flight/verdict.txt" ] && verdict=1 && break
  sleep 0.05
done
t1=$(date +%s.%N)
[ -n "$verdict" ] || fail "no hang verdict after the cut"
$here/netns.sh heal 1
wait $sup
status=$?
sup=""
[ $status -eq 0 ] || fail "the supervised job ended with $status"
[ "$(grep -c "supervise: restarting" "$out/run.log")" -eq 1 ] || fail "expected exactly one restart"
from=$(grep -o "resumed from [^:]*: step [0-9]*" "$out/run.log" | head -1 | grep -o "[0-9]*$")
[ -n "$from" ] && [ "$from" -gt 0 ] || fail "the restarted job did not resume from a checkpoint"
cat "$out/run/flight.prev/verdict.txt" 2> /dev/null || cat "$out/run/flight/verdict.txt"
"$compare" --resumed "$out/base" "$out/run" || exit 1
echo "link cut after step $cut_at: the hang verdict $(awk "BEGIN {printf \"%.1f\", $t1 - $t0}") s later; with the" \
  "link back, one restart, resumed from step $from, finished bitwise"
