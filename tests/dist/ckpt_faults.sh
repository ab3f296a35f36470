#!/usr/bin/env bash
# Checkpoint failure paths, at 2 ranks:
#   1. rank 1 is SIGKILLed halfway through writing the async checkpoint of step 10: the job
#      ends, step 10 is left without a manifest, and checkpoint.resume = latest takes step 5,
#      from where the run finishes bitwise equal to one that never stopped; an older partial
#      directory is pruned; resuming from step 15 into a directory with newer ones is refused;
#   2. a flipped byte in a shard of the newest checkpoint: `loom ckpt verify` fails naming the
#      shard, and resume = latest falls back to the one before with a warning (the corrupt one
#      is set aside as step-N.unusable).
# The full disk has its own test (ckpt_full_disk.sh).
#   ckpt_faults.sh LOOM COMPARE "MPIRUN... -np" [PYTHON]
set -euo pipefail
loom=$1 compare=$2 launch=$3 py=${4:-/usr/bin/python3}
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=16 --set train.global_batch=8 --set train.micro_batch=4 --set train.steps=20
        --set train.warmup_steps=2 --set train.threads=1 --set train.device=cpu --set data.val_batches=1
        --set data.val_every=0 --set parallel.dp=2 --set checkpoint.every=5)
run() {  # NAME ARGS... (status in $rc)
  local name=$1
  shift
  set +e
  $launch 2 "$loom" train "${common[@]}" "$@" --set log.dir="$dir/$name" \
    --set export.final="$dir/$name/final.safetensors" > "$dir/$name.log" 2>&1
  rc=$?
  set -e
}

# 1. Killed in the middle of an async save.
run straight --set checkpoint.dir="$dir/straight_ckpt"
[ "$rc" -eq 0 ] || { cat "$dir/straight.log"; exit 1; }
run killed --set checkpoint.dir="$dir/ckpt" --set checkpoint.keep=5 --fault-kill-in-save 1:10
grep -E "fault drill|committed" "$dir/killed.log" || true
[ "$rc" -ne 0 ] || die "the killed job exited 0"
[ -f "$dir/ckpt/step-00000005/manifest.json" ] || die "step 5 was not committed"
[ ! -f "$dir/ckpt/step-00000010/manifest.json" ] || die "the killed save has a manifest"
# An unfinished directory older than what the resumed run commits goes with its first commit.
mkdir -p "$dir/ckpt/step-00000003" && echo junk > "$dir/ckpt/step-00000003/rank-00000.h5"
run resumed --set checkpoint.dir="$dir/ckpt" --set checkpoint.resume=latest
[ "$rc" -eq 0 ] || { cat "$dir/resumed.log"; exit 1; }
grep -q "resumed from $dir/ckpt/step-00000005" "$dir/resumed.log" || { cat "$dir/resumed.log"; exit 1; }
"$compare" --resumed "$dir/straight" "$dir/resumed"
[ ! -d "$dir/ckpt/step-00000003" ] || die "the partial step 3 is still there after newer commits"
# Resuming from an older checkpoint into a checkpoint.dir that holds newer ones is refused.
run older --set checkpoint.dir="$dir/ckpt" --set checkpoint.resume="$dir/ckpt/step-00000015"
[ "$rc" -ne 0 ] && grep -q "holds a newer checkpoint" "$dir/older.log" || { cat "$dir/older.log"; exit 1; }

# 2. A flipped byte in the newest checkpoint (step 20), inside rank 1's first dataset.
newest=$dir/ckpt/step-00000020
"$py" - "$newest/rank-00001.h5" <<'PY'
import sys, h5py
path = sys.argv[1]
with h5py.File(path, "r") as f:
    names = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    off = f[names[0]].id.get_offset()
with open(path, "r+b") as f:
    f.seek(off + 1)
    b = f.read(1)
    f.seek(off + 1)
    f.write(bytes([b[0] ^ 0x40]))
print(f"flipped a byte of {names[0]} in {path}")
PY
set +e
"$loom" ckpt verify "$newest" > "$dir/verify.txt" 2>&1
vrc=$?
set -e
cat "$dir/verify.txt"
[ "$vrc" -ne 0 ] && grep -q "rank-00001.h5:.* is corrupt" "$dir/verify.txt" || die "verify did not name the shard"
run fallback --set checkpoint.dir="$dir/ckpt" --set checkpoint.resume=latest --set train.steps=25
[ "$rc" -eq 0 ] || { cat "$dir/fallback.log"; exit 1; }
grep -E "unusable|corrupt" "$dir/fallback.log" | head -3
grep -q "falling back to $dir/ckpt/step-00000015" "$dir/fallback.log" || die "no fallback warning"
grep -q "resumed from $dir/ckpt/step-00000015" "$dir/fallback.log" || die "did not resume from 15"
[ -d "$newest.unusable" ] || die "the corrupt checkpoint was not set aside"
echo ok

