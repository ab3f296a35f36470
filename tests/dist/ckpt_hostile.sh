#!/usr/bin/env bash
# Hostile checkpoint layouts, each against every reader (ckpt verify, inspect, export, resume)
# or against the writer:
#   links: a step directory or a rank file that is a symbolic link out of checkpoint.dir is
#          refused by the save, and nothing outside is written or deleted (the clean-up of an
#          earlier attempt used to follow the link); a linked step directory is never taken
#          for a checkpoint;
#   names: a manifest's shard file that is a path ("../x.h5", "/etc/x", "sub/x") is refused;
#   kinds: a shard that is a FIFO, a directory or a link is refused at once (a FIFO hung them);
#   boxes: an offset outside the tensor, a shape of [], of 3 dims or whose product wraps, a
#          negative offset, a tensor with no shards are refused without a crash;
#   cover: overlapping shards (a copy of one over another, a shifted offset) and gaps are
#          refused by every reader, not only verify;
#   model: verify refuses what cannot resume: a tensor of the model missing (or all of them), a
#          tensor the model does not have or at another shape, a step beyond its run; every
#          reader refuses a negative step or one that disagrees with the directory's name.
#   ckpt_hostile.sh LOOM
set -uo pipefail
loom=$1
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=16 --set train.global_batch=4 --set train.micro_batch=4 --set train.threads=1
        --set train.device=cpu --set data.val_batches=0)
# Every reader must exit non-zero, quickly, saying WANT.
readers() {  # CASE CKPT WANT
  local name=$1 ck=$2 want=$3
  for r in verify inspect export resume; do
    local out=$dir/$name.$r.log
    case $r in
      verify | inspect) timeout 20 "$loom" ckpt "$r" "$ck" > "$out" 2>&1 ;;
      export) timeout 20 "$loom" ckpt export "$ck" "$dir/$name.safetensors" > "$out" 2>&1 ;;
      resume) timeout 60 "$loom" train "${common[@]}" --set train.steps=3 --set checkpoint.resume="$ck" \
                --set checkpoint.dir="$dir/$name.resumed" --set log.dir="$dir/$name.run" > "$out" 2>&1 ;;
    esac
    local rc=$?
    if [ $rc = 124 ]; then fail "$name: $r hung"; continue; fi
    # inspect lists what it finds: a bad file is reported in its table, not an exit status.
    if [ $rc = 0 ] && [ "$r" != inspect ]; then fail "$name: $r accepted it"; continue; fi
    if [ $rc -ge 128 ]; then fail "$name: $r crashed ($rc)"; continue; fi
    grep -q -- "$want" "$out" || { fail "$name: $r did not say '$want'"; tail -3 "$out"; }
  done
}
run_or_show "$dir/ok.log" "$loom" train "${common[@]}" --set train.steps=2 --set checkpoint.every=2 \
  --set checkpoint.dir="$dir/ok" \
  --set log.dir="$dir/ok.run"
good=$dir/ok/step-00000002
"$loom" ckpt verify "$good" > /dev/null || die "the good checkpoint does not verify"
variant() {  # NAME PYTHON: a copy of the good checkpoint, its manifest edited by PYTHON (m: the JSON)
  rm -rf "$dir/$1"
  cp -r "$good" "$dir/$1"
  python3 - "$dir/$1/manifest.json" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
t = m["tensors"]
name = "params/transformer.h.0.mlp.c_fc.weight"
exec(sys.argv[2])
json.dump(m, open(sys.argv[1], "w"))
PY
}

echo "names"
for bad in "../ok/step-00000002/rank-00000.h5" "/etc/passwd" "sub/rank-00000.h5" ".."; do
  variant name "t[name]['shards'][0]['file'] = '$bad'"
  readers "name" "$dir/name" "not a file of the checkpoint directory"
done

echo "kinds"
variant fifo "pass"
rm "$dir/fifo/rank-00000.h5" && mkfifo "$dir/fifo/rank-00000.h5"
readers fifo "$dir/fifo" "is a FIFO, not a regular file"
variant linked "pass"
mv "$dir/linked/rank-00000.h5" "$dir/outside.h5" && ln -s "$dir/outside.h5" "$dir/linked/rank-00000.h5"
readers linked "$dir/linked" "is a symbolic link, not a regular file"
variant subdir "pass"
rm "$dir/subdir/rank-00000.h5" && mkdir "$dir/subdir/rank-00000.h5"
readers subdir "$dir/subdir" "is a directory, not a regular file"
variant manififo "pass"
rm "$dir/manififo/manifest.json" && mkfifo "$dir/manififo/manifest.json"
readers manififo "$dir/manififo" "is a FIFO"

echo "boxes"
variant outside "t[name]['shards'][0]['offset'] = [0, 100000]"
readers outside "$dir/outside" "lies outside the tensor's shape"
variant negative "t[name]['shards'][0]['offset'] = [-1, 0]"
readers negative "$dir/negative" "lies outside the tensor's shape"
variant empty "t[name]['shards'][0]['shape'] = []"
readers empty "$dir/empty" "for a tensor of 2 dims"
variant dims3 "t[name]['shape'] = [2, 2, 2]"
readers dims3 "$dir/dims3" "has 3 dims"
variant wraps "t[name]['shape'] = [2**62, 2**62]"
readers wraps "$dir/wraps" "which no checkpoint holds"
variant noshards "t[name]['shards'] = []"
readers noshards "$dir/noshards" "has no shards"

echo "cover"
# One shard per tensor at one rank: split this one's in two to have something to overlap.
split="s = t[name]['shards'][0]; r = t[name]['shape'][0]; import copy
a = copy.deepcopy(s); b = copy.deepcopy(s); a['shape'] = [r // 2, s['shape'][1]]; b['offset'] = [r // 2, 0]
b['shape'] = [r - r // 2, s['shape'][1]]"
variant overlap "$split
b['offset'] = [0, 0]; t[name]['shards'] = [a, b]"
readers overlap "$dir/overlap" "in more than one"
variant gap "$split
t[name]['shards'] = [a]"
readers gap "$dir/gap" "in no shard"
variant twice "t[name]['shards'] = t[name]['shards'] * 2"
readers twice "$dir/twice" "in more than one"

echo "model"
# Sound files that cannot resume: verify must say why (it passed them).
verify_only() {  # CASE CKPT WANT
  local out=$dir/$1.verify.log
  timeout 20 "$loom" ckpt verify "$2" > "$out" 2>&1
  local rc=$?
  [ $rc = 1 ] || { fail "$1: verify exited $rc, not 1"; tail -3 "$out"; return; }
  grep -q -- "$3" "$out" || { fail "$1: verify did not say '$3'"; tail -3 "$out"; }
}
variant missing "del t['exp_avg/transformer.h.0.mlp.c_fc.weight']"
verify_only missing "$dir/missing" "tensor exp_avg/transformer.h.0.mlp.c_fc.weight (.*) of the model is missing"
variant nothing "m['tensors'] = {}"
verify_only nothing "$dir/nothing" "of the model is missing"
variant stranger "t['params/stray.weight'] = t[name]"
verify_only stranger "$dir/stranger" "tensor params/stray.weight is not of the model"
variant reshaped "import re; m['config'] = re.sub('(?m)^vocab_size = 96$', 'vocab_size = 128', m['config'])"
verify_only reshaped "$dir/reshaped" "has shape .* where the model has"
variant beyond "import re; m['config'] = re.sub('(?m)^steps = 2$', 'steps = 1', m['config'])"
verify_only beyond "$dir/beyond" "step 2 is beyond its run's train.steps = 1"
variant negstep "m['step'] = -1"
readers negstep "$dir/negstep" "says step -1"
mkdir -p "$dir/renamed"
variant renamed/step-00000005 "pass"
readers renamed "$dir/renamed/step-00000005" "says step 2 in step-00000005"

echo "links (writer)"
# A step directory that is a link out of checkpoint.dir: the save is refused and the victim
# directory keeps its file (the old clean-up deleted it).
mkdir -p "$dir/victim" "$dir/linkroot" && echo keep > "$dir/victim/precious.txt"
ln -s "$dir/victim" "$dir/linkroot/step-00000002"
if "$loom" train "${common[@]}" --set train.steps=2 --set checkpoint.every=2 --set checkpoint.dir="$dir/linkroot" \
  --set log.dir="$dir/linkroot.run" > "$dir/linkroot.log" 2>&1; then fail "a linked step directory was saved into"; fi
grep -q "is a symbolic link" "$dir/linkroot.log" || { fail "no message for a linked step directory"; tail -3 "$dir/linkroot.log"; }
[ -f "$dir/victim/precious.txt" ] || fail "the save deleted a file outside checkpoint.dir"
[ -z "$(ls "$dir/victim" | grep -v precious.txt)" ] || fail "the save wrote outside checkpoint.dir"
# A rank file that is a link: refused, the target untouched.
mkdir -p "$dir/fileroot/step-00000002" && echo keep > "$dir/victim/target.h5"
ln -s "$dir/victim/target.h5" "$dir/fileroot/step-00000002/rank-00000.h5"
if "$loom" train "${common[@]}" --set train.steps=2 --set checkpoint.every=2 --set checkpoint.dir="$dir/fileroot" \
  --set log.dir="$dir/fileroot.run" > "$dir/fileroot.log" 2>&1; then fail "a linked rank file was written through"; fi
grep -q "is a symbolic link" "$dir/fileroot.log" || { fail "no message for a linked rank file"; tail -3 "$dir/fileroot.log"; }
[ "$(cat "$dir/victim/target.h5")" = keep ] || fail "the save wrote through a linked rank file"
# A linked step directory (holding a complete checkpoint) is not taken by resume = latest.
mkdir -p "$dir/latest" && cp -r "$good" "$dir/elsewhere" && ln -s "$dir/elsewhere" "$dir/latest/step-00000002"
"$loom" train "${common[@]}" --set train.steps=2 --set checkpoint.resume=latest --set checkpoint.dir="$dir/latest" \
  --set log.dir="$dir/latest.run" > "$dir/latest.log" 2>&1 || { fail "resume = latest with a linked step failed"; tail -3 "$dir/latest.log"; }
if grep -q "resumed from" "$dir/latest.log"; then fail "resume = latest took a linked step directory"; fi

finish ok
