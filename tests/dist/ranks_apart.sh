#!/usr/bin/env bash
# Ranks of one job that do not share the places they must (per-rank working directories,
# node-local disks), launched with the same config (relative paths) in two directories:
#   ckpt:   checkpoint.dir is not one directory: refused at start, naming it, nothing committed
#           (the log said "committed over 2 files" with rank 1's file missing);
#   data:   data.path names different files: refused at start, naming data.path and what each
#           rank sees (they trained on different data, silently);
#   moved:  shared at start, then rank 1's checkpoint.dir leads elsewhere: the save is not
#           committed, naming rank 1's file that rank 0 does not see.
#   ranks_apart.sh LOOM "MPIRUN..."
set -uo pipefail
loom=$1 mpirun=$2
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir"
common=(--set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.vocab_size=256
        --set model.seq_len=8 --set train.global_batch=4 --set train.micro_batch=2 --set train.threads=1
        --set train.device=cpu --set data.val_batches=0 --set parallel.dp=2 --set log.dir=log)
apart() {  # NAME ARGS...: rank 0 in $dir/NAME/a, rank 1 in $dir/NAME/b, the same arguments
  local name=$1
  shift
  # shellcheck disable=SC2086
  timeout 120 $mpirun -np 1 -wdir "$dir/$name/a" "$loom" train "${common[@]}" "$@" : \
    -np 1 -wdir "$dir/$name/b" "$loom" train "${common[@]}" "$@" > "$dir/$name.log" 2>&1
}
python3 -c "print('the quick brown fox jumps over the lazy dog. ' * 2000)" > text.txt
python3 -c "print('a different text for the other rank to read. ' * 2000)" > other.txt
"$loom" data text.txt one.bin > /dev/null && "$loom" data other.txt two.bin > /dev/null || exit 1

echo "ckpt"
mkdir -p ckpt/a ckpt/b
apart ckpt --set train.steps=2 --set checkpoint.every=2 --set checkpoint.dir=ck
rc=$?
[ $rc = 2 ] || fail "ckpt: exit $rc, not 2"
grep -q "rank 1 does not see the checkpoint.dir 'ck' rank 0 sees" ckpt.log || { fail "ckpt: not named"; tail -5 ckpt.log; }
ls -d ckpt/*/ck/step-* > /dev/null 2>&1 && fail "ckpt: a checkpoint was written: $(ls ckpt/*/ck)"

echo "data"
mkdir -p data/a data/b
cp one.bin data/a/d.bin && cp two.bin data/b/d.bin
apart data --set train.steps=2 --set data.source=tokens --set data.path=d.bin
rc=$?
[ $rc = 2 ] || fail "data: exit $rc, not 2"
grep -q "rank 1 reads other data than rank 0: data.path is 1 file, .* bytes, xxh64" data.log ||
  { fail "data: not named"; tail -5 data.log; }

echo "moved"
mkdir -p moved/a/ck moved/b moved/elsewhere
ln -s "$dir/moved/a/ck" moved/b/ck
apart moved --set train.steps=400 --set checkpoint.every=400 --set checkpoint.dir=ck --set fault.slow=0:20 &
run=$!
for _ in $(seq 600); do [ -s moved/a/log/metrics.jsonl ] && break; sleep 0.1; done
ln -sfn "$dir/moved/elsewhere" moved/b/ck
wait $run
rc=$?
[ $rc = 2 ] || fail "moved: exit $rc, not 2"
grep -q "checkpoint step 400 not committed: rank 1 wrote rank-00001.h5 (.*) but rank 0 sees no such file" moved.log ||
  { fail "moved: not named"; tail -5 moved.log; }
[ -e moved/a/ck/step-00000400/manifest.json ] && fail "moved: committed without rank 1's file"

finish "ranks apart: all held"
