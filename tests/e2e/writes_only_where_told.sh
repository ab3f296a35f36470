#!/usr/bin/env bash
# Nothing lost, nothing written outside the given places, through the binary as a user runs it:
#   1 model: a checkpoint of another model (model.* differs) with resume = latest is a config
#     error: exit 2 naming the keys, every checkpoint where it was, none set aside; the right
#     config then resumes it. Damage sets a checkpoint aside, and a second set-aside of the same
#     step keeps the first (nothing deleted);
#   4 links: a link in a step directory (manifest.json.tmp) or at metrics.jsonl is refused; one
#     at NAME.tmp beside an output (*.safetensors.tmp, config.toml.tmp) is not loom's temporary
#     (those have names of their own) and stays as it is; the files they point to are untouched;
#   2 devices: outputs (export.final, loom data's, ckpt export, report --out) that name a device
#     or a FIFO are refused, which stays what it was;
#   5 inputs: loom data with its output one of its inputs (the same name, or a hard link) is
#     refused and the input is untouched;
#   6 not loom's: a step directory holding a user's file is not saved into (exit 2) and pruning
#     leaves such a file where it is; a fresh run into a directory of another run's checkpoints
#     is refused; an output that exists and is not of the kind loom writes there (export.final,
#     ckpt export, report --out, loom data's shard) or that is the run's init.from is refused;
#     ckpt export of a checkpoint missing a tensor of its model is refused; a checkpoint pruned
#     while it was read is said to be, not called damaged.
#   writes_only_where_told.sh LOOM
set -uo pipefail
loom=$1
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.vocab_size=64
        --set model.seq_len=8 --set train.global_batch=2 --set train.micro_batch=2 --set train.threads=1
        --set train.device=cpu --set data.val_batches=0)
# Runs loom; the status in $rc, the output in $dir/last.log.
run() { timeout 120 "$loom" "$@" > "$dir/last.log" 2>&1; rc=$?; }
refused_rc() {  # CASE WANT: exit 2, one line naming WANT
  [ "$rc" = 2 ] || { fail "$1: exit $rc, not 2"; tail -3 "$dir/last.log"; return; }
  grep -q -- "$2" "$dir/last.log" || { fail "$1: did not say '$2'"; tail -3 "$dir/last.log"; }
}
# A special file that must stay what it is: a character device where this user may make one.
special() {
  rm -f "$1"
  mknod "$1" c 1 3 2> /dev/null || mkfifo "$1"
}
is_special() { [ -c "$1" ] || [ -p "$1" ]; }

echo "1 model"
ck=$dir/ck
run train "${common[@]}" --set train.steps=2 --set checkpoint.every=2 --set checkpoint.dir="$ck" \
  --set log.dir="$dir/r1"
[ $rc = 0 ] || { cat "$dir/last.log"; exit 1; }
before=$(cd "$ck" && find . | sort)
run train "${common[@]}" --set model.n_layer=2 --set train.steps=4 --set checkpoint.every=2 \
  --set checkpoint.dir="$ck" --set checkpoint.resume=latest --set log.dir="$dir/r2"
refused_rc "other model" "model.n_layer = 1 there, 2 here"
[ "$(cd "$ck" && find . | sort)" = "$before" ] || fail "other model: checkpoint.dir changed: $(ls "$ck")"
run train "${common[@]}" --set train.steps=4 --set checkpoint.every=2 --set checkpoint.dir="$ck" \
  --set checkpoint.resume=latest --set log.dir="$dir/r3"
[ $rc = 0 ] && grep -q "resum.*step-00000002" "$dir/last.log" || { fail "the right config did not resume"; tail -5 "$dir/last.log"; }
# Damage: step 4's shard cut twice over; each is set aside under its own name.
for n in 1 2; do
  truncate -s 3000 "$ck/step-00000004/rank-00000.h5"
  run train "${common[@]}" --set train.steps=4 --set checkpoint.every=2 --set checkpoint.dir="$ck" \
    --set checkpoint.resume=latest --set log.dir="$dir/r4$n"
  [ $rc = 0 ] || { fail "damage $n: exit $rc"; tail -3 "$dir/last.log"; }
done
[ -d "$ck/step-00000004.unusable" ] && [ -d "$ck/step-00000004.unusable-2" ] ||
  fail "damage: a set-aside checkpoint was deleted: $(ls "$ck")"

echo "4 links"
echo "outside, not loom's" > "$dir/outside"
cp "$dir/outside" "$dir/outside.orig"
ck4=$dir/ck4
mkdir -p "$ck4/step-00000002"
ln -s "$dir/outside" "$ck4/step-00000002/manifest.json.tmp"
run train "${common[@]}" --set train.steps=2 --set checkpoint.every=2 --set checkpoint.dir="$ck4" \
  --set log.dir="$dir/r5"
refused_rc "manifest.json.tmp link" "holds 'manifest.json.tmp', which loom did not write"
[ -L "$ck4/step-00000002/manifest.json.tmp" ] || fail "the link in a step directory was removed"
mkdir -p "$dir/exp"
ln -s "$dir/outside" "$dir/exp/m.safetensors.tmp"
run train "${common[@]}" --set train.steps=1 --set export.final="$dir/exp/m.safetensors" --set log.dir="$dir/r6"
[ $rc = 0 ] && [ -L "$dir/exp/m.safetensors.tmp" ] || fail "safetensors.tmp link: exit $rc, or the link removed"
mkdir -p "$dir/r7"
ln -s "$dir/outside" "$dir/r7/config.toml.tmp"
run train "${common[@]}" --set train.steps=1 --set log.dir="$dir/r7"
[ $rc = 0 ] && [ -L "$dir/r7/config.toml.tmp" ] || fail "config.toml.tmp link: exit $rc, or the link removed"
mkdir -p "$dir/r8"
printf 'cut last line without newline' >> "$dir/outside"
cp "$dir/outside" "$dir/outside.orig"
ln -s "$dir/outside" "$dir/r8/metrics.jsonl"
run train "${common[@]}" --set train.steps=1 --set log.dir="$dir/r8"
refused_rc "metrics.jsonl link" "metrics.jsonl' is a symbolic link"
cmp -s "$dir/outside" "$dir/outside.orig" || fail "links: the file outside was written"

echo "2 devices"
special "$dir/dev"
run train "${common[@]}" --set train.steps=1 --set export.final="$dir/dev" --set log.dir="$dir/r9"
refused_rc "export.final device" "is a \(character device\|FIFO\)"
is_special "$dir/dev" || fail "export.final replaced the device"
printf 'some text to make a shard of\n' > "$dir/in.txt"
special "$dir/dev"
run data "$dir/in.txt" "$dir/dev"
refused_rc "data output device" "is a \(character device\|FIFO\)"
is_special "$dir/dev" || fail "loom data replaced the device"
special "$dir/dev"
run ckpt export "$ck/step-00000002" "$dir/dev"
refused_rc "ckpt export device" "is a \(character device\|FIFO\)"
is_special "$dir/dev" || fail "ckpt export replaced the device"
special "$dir/dev"
run report "$dir/r1" --out "$dir/dev"
refused_rc "report --out device" "is a \(character device\|FIFO\)"
is_special "$dir/dev" || fail "report --out replaced the device"

echo "5 inputs"
cp "$dir/in.txt" "$dir/in.orig"
run data "$dir/in.txt" "$dir/in.txt"
refused_rc "data in = out" "is the input"
ln "$dir/in.txt" "$dir/hard.bin"
run data "$dir/in.txt" "$dir/hard.bin"
refused_rc "data out = hard link of in" "is the input"
cmp -s "$dir/in.txt" "$dir/in.orig" || fail "loom data replaced its input"

echo "6 not loom's"
ck6=$dir/ck6
mkdir -p "$ck6/step-00000001"
echo "the user's" > "$ck6/step-00000001/notes.txt"
run train "${common[@]}" --set train.steps=1 --set checkpoint.every=1 --set checkpoint.dir="$ck6" --set log.dir="$dir/r61"
refused_rc "a user's file in a step directory" "notes.txt', which loom did not write"
[ -f "$ck6/step-00000001/notes.txt" ] || fail "a user's file in a step directory was deleted"
ck6b=$dir/ck6b
run train "${common[@]}" --set train.steps=2 --set checkpoint.every=1 --set checkpoint.keep=5 \
  --set checkpoint.dir="$ck6b" --set log.dir="$dir/r62"
[ $rc = 0 ] || { fail "two checkpoints: exit $rc"; tail -3 "$dir/last.log"; }
echo "the user's" > "$ck6b/step-00000001/notes.txt"
mkdir -p "$ck6b/step-00000000/sub" && echo "the user's" > "$ck6b/step-00000000/sub/file"
run train "${common[@]}" --set train.steps=3 --set checkpoint.every=1 --set checkpoint.keep=1 \
  --set checkpoint.dir="$ck6b" --set checkpoint.resume=latest --set log.dir="$dir/r63"
[ $rc = 0 ] || { fail "prune beside a user's file: exit $rc"; tail -3 "$dir/last.log"; }
[ -f "$ck6b/step-00000001/notes.txt" ] && [ -f "$ck6b/step-00000000/sub/file" ] ||
  fail "pruning deleted a user's file: $(cd "$ck6b" && find . | sort | tr '\n' ' ')"
# keep = 1, and the one before the newest stays until a step has run on the newest's weights
# (a diverging run keeps one whose weights gave a finite loss).
[ ! -e "$ck6b/step-00000001/manifest.json" ] && [ -e "$ck6b/step-00000002/manifest.json" ] ||
  fail "pruning kept an old checkpoint, or not the proven one: $(cd "$ck6b" && find . | sort | tr '\n' ' ')"
before=$(cd "$ck6b" && find . | sort)
run train "${common[@]}" --set train.steps=2 --set checkpoint.every=1 --set checkpoint.dir="$ck6b" \
  --set log.dir="$dir/r64"
refused_rc "a fresh run into another run's checkpoints" "holds checkpoints of an earlier run"
[ "$(cd "$ck6b" && find . | sort)" = "$before" ] || fail "a refused fresh run changed checkpoint.dir"
echo "the user's text" > "$dir/text.txt"
cp "$dir/text.txt" "$dir/text.orig"
run train "${common[@]}" --set train.steps=1 --set export.final="$dir/text.txt" --set log.dir="$dir/r65"
refused_rc "export.final over a text" "is not a safetensors file"
run train "${common[@]}" --set train.steps=1 --set export.final="$dir/w.safetensors" --set log.dir="$dir/r66"
[ $rc = 0 ] || fail "export into a new file: exit $rc"
cp "$dir/w.safetensors" "$dir/w.orig"
run train "${common[@]}" --set train.steps=1 --set init.from="$dir/w.safetensors" \
  --set export.final="$dir/w.safetensors" --set log.dir="$dir/r67"
refused_rc "export.final over init.from" "is the input"
cmp -s "$dir/w.safetensors" "$dir/w.orig" || fail "export.final replaced init.from"
run ckpt export "$ck6b/step-00000003" "$ck6b/step-00000003/rank-00000.h5"
refused_rc "ckpt export over a rank file" "is not a safetensors file"
run ckpt verify "$ck6b/step-00000003"
[ $rc = 0 ] || fail "ckpt export damaged the checkpoint it read"
run report "$dir/r66" --out "$dir/r66/metrics.jsonl"
refused_rc "report --out over metrics" "is not an HTML page"
run data "$dir/text.orig" "$dir/text.txt"
refused_rc "loom data over a text" "is not a token shard"
cmp -s "$dir/text.txt" "$dir/text.orig" || fail "an output that is not loom's was replaced"
cp -r "$ck6b/step-00000003" "$dir/partial"
python3 - "$dir/partial/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for name in [k for k in m["tensors"] if k.startswith("params/") and k.endswith("c_fc.weight")]:
    del m["tensors"][name]
json.dump(m, open(sys.argv[1], "w"))
PY
run ckpt export "$dir/partial" "$dir/partial.safetensors"
refused_rc "ckpt export of part of a model" "its params/ tensors hold"
[ ! -e "$dir/partial.safetensors" ] || fail "ckpt export wrote part of a model"
# A reader racing the run that prunes: with checkpoint.dir's lock held and the manifest gone
# (pruning removes it first), verify says the checkpoint was removed, not that it is damaged.
cp -r "$ck6b" "$dir/ck6c"
rm "$dir/ck6c/step-00000003/manifest.json"
(exec 9> "$dir/ck6c/.lock" && flock 9 && exec sleep 30) &
holder=$!
sleep 0.5
run ckpt verify "$dir/ck6c/step-00000003"
kill $holder 2> /dev/null
refused_rc "verify of a checkpoint pruned while read" "was removed while it was read"

finish "writes only where told: all held"
