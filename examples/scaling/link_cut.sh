#!/usr/bin/env bash
# A link-cut drill on emulated nodes (examples/scaling/netns.sh): 2 nodes x 2 ranks (tp 2 inside
# a node, dp 2 across), trained under `loom supervise` with checkpoints. Mid-run node 1's link
# goes down: the job must end with the hang verdict; the link comes back during the
# supervisor's back-off, and the restarted job must resume from the latest checkpoint and
# finish with the weights of the run that was never cut, bitwise.
#   examples/scaling/link_cut.sh [OUT_DIR]     (root; leaves no namespace behind)
set -uo pipefail
cd "$(dirname "$0")/../.."
here=examples/scaling
loom=$PWD/build/loom compare=$PWD/build/tests/loom_compare_runs
out=${1:-$(mktemp -d)}
mkdir -p "$out"
trap '$here/netns.sh down' EXIT
$here/netns.sh up 2 1gbit > /dev/null || exit 1
common=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=32 --set train.micro_batch=2 --set train.global_batch=8 --set train.steps=30
        --set train.threads=1 --set data.val_batches=0 --set parallel.dp=2 --set parallel.tp=2
        --set checkpoint.every=5 --set parallel.timeout_s=5)
launch=($here/netns.sh mpirun -np 4)
"${launch[@]}" "$loom" train "${common[@]}" --set log.dir="$out/base" --set checkpoint.dir="$out/base_ckpt" \
  --set export.final="$out/base/final.safetensors" > "$out/base.log" 2>&1 || { tail -20 "$out/base.log"; exit 1; }
"$loom" supervise --max-restarts 2 --backoff-s 4 --log-dir "$out/run" -- "${launch[@]}" "$loom" train "${common[@]}" \
  --set log.dir="$out/run" --set checkpoint.dir="$out/ckpt" --set checkpoint.resume=latest \
  --set export.final="$out/run/final.safetensors" > "$out/run.log" 2>&1 &
sup=$!
for _ in $(seq 600); do grep -qs '"step":12,' "$out/run/metrics.jsonl" && break; sleep 0.05; done
t0=$(date +%s.%N)
$here/netns.sh cut 1
for _ in $(seq 600); do grep -qs "hang verdict" "$out/run.log" && break; sleep 0.1; done
t1=$(date +%s.%N)
grep -q "hang verdict" "$out/run.log" || { echo "FAIL: no hang verdict after the cut"; tail -20 "$out/run.log"; exit 1; }
$here/netns.sh heal 1
wait $sup
status=$?
[ $status -eq 0 ] || { echo "FAIL: the supervised job ended with $status"; tail -30 "$out/run.log"; exit 1; }
grep "hang verdict" "$out/run.log" | head -1
"$compare" --resumed "$out/base" "$out/run" || exit 1
echo "link cut at step 12: hang verdict after $(awk "BEGIN {printf \"%.1f\", $t1 - $t0}") s; resumed and finished bitwise"
