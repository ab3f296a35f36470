#!/usr/bin/env bash
# A full disk at 2 ranks (a 1 MiB tmpfs): the save of step 10 fails with the OS's reason,
# ends the run with status 74 (a machine's failure, which `loom supervise` retries), commits
# nothing, and leaves the checkpoint of step 5 sound. At 1 rank the same, and no crash at exit
# (a file whose flush failed crashed HDF5's exit handler: 139). A full disk under log.dir while
# appending metrics: 74 (was 2), and no cut line left to glue onto the next run's first; a cut
# line found at start is dropped. Exits 77 (ctest: skipped) where a tmpfs cannot be mounted.
#   ckpt_full_disk.sh LOOM "MPIRUN... -np"
set -euo pipefail
loom=$1 launch=$2
. "$(dirname "$0")/../lib.sh"
test_dir
on_exit 'for m in "$dir/full" "$dir/one" "$dir/log"; do mountpoint -q "$m" 2>/dev/null && umount "$m"; done'
mkdir -p "$dir/full"
if ! mount -t tmpfs -o size=1m tmpfs "$dir/full" 2>/dev/null; then
  echo "skipped: cannot mount a tmpfs here"
  exit 77
fi
# About 0.4 MB a checkpoint: the one after step 5 fits, the one after step 10 does not.
set +e
$launch 2 "$loom" train --set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 \
  --set model.vocab_size=96 --set model.seq_len=16 --set train.global_batch=8 --set train.micro_batch=4 \
  --set train.steps=20 --set train.warmup_steps=2 --set train.threads=1 --set train.device=cpu \
  --set data.val_batches=1 --set data.val_every=0 --set parallel.dp=2 --set checkpoint.every=5 \
  --set checkpoint.dir="$dir/full/ckpt" --set checkpoint.keep=5 --set log.dir="$dir/run" > "$dir/run.log" 2>&1
rc=$?
set -e
grep -E "error" "$dir/run.log" | head -2
[ "$rc" = 74 ] || die "a full disk ended the run with status $rc, not 74"
grep -q "No space left on device" "$dir/run.log" || die "the error does not say why"
"$loom" ckpt verify "$dir/full/ckpt/step-00000005"
[ ! -f "$dir/full/ckpt/step-00000010/manifest.json" ] || die "a failed save committed"

tiny=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
      --set model.seq_len=16 --set train.global_batch=4 --set train.micro_batch=4 --set train.threads=1
      --set train.device=cpu --set data.val_batches=0)
# One rank, the checkpoint's flush fails.
mkdir -p "$dir/one" && mount -t tmpfs -o size=1m tmpfs "$dir/one"
set +e
"$loom" train "${tiny[@]}" --set model.n_layer=2 --set train.steps=20 --set checkpoint.every=5 \
  --set checkpoint.dir="$dir/one/ckpt" --set checkpoint.keep=5 --set log.dir="$dir/run1" > "$dir/one.log" 2>&1
rc=$?
set -e
[ "$rc" = 74 ] || { tail -3 "$dir/one.log"; die "at 1 rank a full disk ended the run with status $rc, not 74"; }
grep -q "No space left on device" "$dir/one.log" || die "the 1-rank error does not say why"

# Metrics on a full disk: 74, and the file ends on a whole line.
# 16k: a page each for the lock, config.toml and run.json, one for metrics.jsonl to fill
mkdir -p "$dir/log" && mount -t tmpfs -o size=16k tmpfs "$dir/log"
set +e
"$loom" train "${tiny[@]}" --set train.steps=400 --set log.dir="$dir/log" > "$dir/log.log" 2>&1
rc=$?
set -e
[ "$rc" = 74 ] || { tail -3 "$dir/log.log"; die "a full disk under log.dir ended the run with status $rc, not 74"; }
grep -q "metrics.jsonl' failed (No space left on device)" "$dir/log.log" || die "no reason"
[ "$(tail -c 1 "$dir/log/metrics.jsonl" | od -An -c | tr -d ' ')" = '\n' ] ||
  die "the full disk left a cut line in metrics.jsonl"
# With room again, the run restarted (as loom supervise restarts it: it continues in its log.dir)
# appends whole lines after the first attempt's.
mount -o remount,size=1m "$dir/log"
printf '{"step":1,"cut' >> "$dir/log/metrics.jsonl"  # as a kill mid-write would leave it
LOOM_RESTART=1 "$loom" train "${tiny[@]}" --set train.steps=3 --set log.dir="$dir/log" > "$dir/log2.log" 2>&1 ||
  { tail -3 "$dir/log2.log"; die "the run after the full disk"; }
grep -q "dropped the cut last line" "$dir/log2.log" || die "the cut line was not reported"
python3 - "$dir/log/metrics.jsonl" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
for i, l in enumerate(lines):
    try:
        json.loads(l)
    except ValueError:
        sys.exit(f"FAIL: line {i + 1} of metrics.jsonl is not JSON: {l[:80]}")
print(f"metrics.jsonl: {len(lines)} lines, each JSON")
PY
echo "ok"
