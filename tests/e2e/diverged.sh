#!/usr/bin/env bash
# A run that diverges keeps a good checkpoint and says so, through the binary as a user runs it:
#   1 lr 100 after 4 good steps (checkpoint.every = 1, keep = 1): exit 5 naming the last
#     checkpoint whose weights gave a finite loss, which is the newest left, verifies, and whose
#     next step's loss in metrics.jsonl is finite; one rollback, not a loop; no export written
#     (it exited 0 with step-29 and step-30 left, both NaN, the good ones pruned);
#   2 lr 1e308 (infinite weights): no checkpoint of infinite weights is committed (one was, and
#     verified "ok"), exit 5, the good one left;
#   3 diverged at the end without checkpoints (every = 0): exit 5, no export;
#   4 a transient fault (the nan drill, max_skips 0) rolls back once and ends 0 with its export;
#   5 loom supervise does not restart a diverged run.
#   diverged.sh LOOM
set -uo pipefail
loom=$1
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir"
common=(--set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.vocab_size=64
        --set model.seq_len=8 --set train.global_batch=2 --set train.micro_batch=2 --set train.threads=1
        --set train.device=cpu --set data.val_batches=0)
run() { timeout 120 "$loom" "$@" > last.log 2>&1; rc=$?; }
# good_named CASE CKDIR LOGDIR: exit 5; the checkpoint the error names is the newest in CKDIR,
# verifies, and the loss its weights gave (the next step's) is finite.
good_named() {
  [ "$rc" = 5 ] || { fail "$1: exit $rc, not 5"; tail -3 last.log; return; }
  grep -q "error: the run diverged" last.log || { fail "$1: did not say it diverged"; tail -3 last.log; }
  local good
  good=$(grep -o "the last checkpoint whose weights gave a finite loss is [^ ;]*" last.log | awk '{print $NF}')
  [ -n "$good" ] || { fail "$1: no good checkpoint named"; tail -3 last.log; return; }
  [ "$(ls -d "$2"/step-* | tail -1)" = "$good" ] || fail "$1: $good is not the newest left: $(ls "$2")"
  "$loom" ckpt verify "$good" > /dev/null || fail "$1: $good does not verify"
  python3 - "$3/metrics.jsonl" "$((10#${good##*step-} + 1))" <<'PY' || fail "$1: the weights of $good gave no finite loss"
import json, math, sys
losses = [json.loads(l).get("loss") for l in open(sys.argv[1]) if f'"step":{sys.argv[2]},' in l]
sys.exit(0 if any(isinstance(v, (int, float)) and math.isfinite(v) for v in losses) else 1)
PY
}

echo "1 lr 100"
run train "${common[@]}" --set train.steps=4 --set checkpoint.every=1 --set checkpoint.dir=ck1 --set log.dir=a1
[ $rc = 0 ] || { cat last.log; exit 1; }
run train "${common[@]}" --set train.steps=30 --set train.lr=100 --set checkpoint.every=1 --set checkpoint.keep=1 \
  --set checkpoint.dir=ck1 --set checkpoint.resume=latest --set log.dir=b1 --set export.final="$dir/w1.safetensors"
good_named "lr 100" ck1 b1
[ "$(grep -c "rolling back to ck1" last.log)" = 1 ] || fail "lr 100: $(grep -c "rolling back to ck1" last.log) rollbacks, not 1"
[ ! -e w1.safetensors ] || fail "lr 100: diverged weights exported"
grep -q '"event":"diverged"' b1/faults.jsonl || fail "lr 100: no diverged event in faults.jsonl"

echo "2 lr 1e308"
run train "${common[@]}" --set train.steps=4 --set checkpoint.every=1 --set checkpoint.dir=ck2 --set log.dir=a2
run train "${common[@]}" --set train.steps=12 --set train.lr=1e308 --set checkpoint.every=1 --set checkpoint.dir=ck2 \
  --set checkpoint.resume=latest --set log.dir=b2
good_named "lr 1e308" ck2 b2
grep -q "not committed: the state holds .* NaN or infinite values" last.log || fail "lr 1e308: no refused commit"
for d in ck2/step-*; do "$loom" ckpt verify "$d" > /dev/null || fail "lr 1e308: $d left and does not verify"; done

echo "3 diverged at the end, no checkpoints"
run train "${common[@]}" --set train.steps=3 --set train.lr=1e308 --set export.final="$dir/w3.safetensors" --set log.dir=b3
[ "$rc" = 5 ] && grep -q "its final weights hold .* NaN or infinite values\|its last update was skipped" last.log &&
  grep -q "no checkpoint to go back to" last.log || { fail "end: exit $rc"; tail -3 last.log; }
[ ! -e w3.safetensors ] || fail "end: diverged weights exported"

echo "4 a transient fault"
run train "${common[@]}" --set train.steps=8 --set checkpoint.every=2 --set checkpoint.dir=ck4 --set fault.nan=0:6 \
  --set fault.max_skips=0 --set export.final="$dir/w4.safetensors" --set log.dir=b4
[ "$rc" = 0 ] && [ "$(grep -c "rolling back to ck4/step-00000004" last.log)" = 1 ] && [ -s w4.safetensors ] ||
  { fail "transient: exit $rc"; tail -3 last.log; }

echo "5 supervise"
run supervise --max-restarts 3 --backoff-s 0 -- "$loom" train "${common[@]}" --set train.steps=3 --set train.lr=1e308 \
  --set log.dir=b5
[ "$rc" = 5 ] && [ "$(grep -c "supervise: run [0-9]* (LOOM_RESTART" last.log)" = 1 ] ||
  { fail "supervise: exit $rc"; grep supervise last.log; }

finish "diverged: all held"
