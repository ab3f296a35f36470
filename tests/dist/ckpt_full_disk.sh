#!/usr/bin/env bash
# A full disk at 2 ranks (a 1 MiB tmpfs): the save of step 10 fails with the OS's reason,
# ends the run, commits nothing, and leaves the checkpoint of step 5 sound. Exits 77 (ctest:
# skipped) where a tmpfs cannot be mounted.
#   ckpt_full_disk.sh LOOM "MPIRUN... -np"
set -euo pipefail
loom=$1 launch=$2
dir=$(mktemp -d)
cleanup() {
  mountpoint -q "$dir/full" 2>/dev/null && umount "$dir/full"
  rm -rf "$dir"
}
trap cleanup EXIT
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
[ "$rc" -ne 0 ] || { echo "FAIL: a full disk did not end the run"; exit 1; }
grep -q "No space left on device" "$dir/run.log" || { echo "FAIL: the error does not say why"; exit 1; }
"$loom" ckpt verify "$dir/full/ckpt/step-00000005"
[ ! -f "$dir/full/ckpt/step-00000010/manifest.json" ] || { echo "FAIL: a failed save committed"; exit 1; }
echo "ok"
