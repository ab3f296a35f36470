#!/usr/bin/env bash
# Reshard on load: a checkpoint written at dp 2 x tp 2 with ZeRO-1 (4 ranks) loads at 1 rank,
# at tp 4, at dp 4 with ZeRO-3, at pp 2 x dp 2 with ZeRO-3 (the last stage's tied copy
# loaded, never written) and at cp 2 x dp 2 with ZeRO-2 (and at 1 rank in bf16); one written at
# cp 2 x dp 2 with ZeRO-1 loads at 1 rank. Loaded and saved again at once,
# each holds the same tensors bitwise (weights, both moments) and verifies; continued to step
# 20, each stays within 1e-4 of the run that kept the original layout. Another model shape is
# refused by name. Each resume in another layout says, in its log, from which layout it was
# resharded. `loom ckpt export` equals the run's export, and an independent reader
# (h5py) rebuilds a tensor from the manifest and finds the values loom exports.
#   reshard.sh LOOM COMPARE "MPIRUN... -np" [PYTHON]
set -euo pipefail
loom=$1 compare=$2 launch=$3 py=${4:-/usr/bin/python3}
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=16 --set model.d_ff=128 --set train.global_batch=8 --set train.micro_batch=2
        --set train.steps=20 --set train.warmup_steps=2 --set train.threads=1 --set train.device=cpu
        --set data.val_batches=1 --set data.val_every=0 --set checkpoint.every=10)
run() {  # NAME NP ARGS...
  local name=$1 np=$2
  shift 2
  run_or_show "$dir/$name.log" ranks "$np" "$loom" train "${common[@]}" "$@" --set log.dir="$dir/$name" \
    --set export.final="$dir/$name/final.safetensors"
}
run orig 4 --set parallel.dp=2 --set parallel.tp=2 --set parallel.zero=1 --set checkpoint.dir="$dir/orig_ckpt"
grep -E "layout|committed" "$dir/orig.log"
src=$dir/orig_ckpt/step-00000010
"$loom" ckpt verify "$src"
for layout in "rank1:1" "tp4:4:--set parallel.tp=4" "dp4_zero3:4:--set parallel.dp=4 --set parallel.zero=3" \
  "pp2_dp2_zero3:4:--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=3" \
  "cp2_dp2_zero2:4:--set parallel.cp=2 --set parallel.dp=2 --set parallel.zero=2"; do
  IFS=: read -r name np sets <<< "$layout"
  read -r -a lay <<< "$sets"
  # Loaded and saved at once: nothing left to run, so the end state is the loaded one.
  run "${name}_same" "$np" "${lay[@]}" --set train.steps=10 --set checkpoint.resume="$src" \
    --set checkpoint.dir="$dir/${name}_ckpt"
  "$loom" ckpt verify "$dir/${name}_ckpt/step-00000010"
  "$compare" --ckpt-equal "$src" "$dir/${name}_ckpt/step-00000010"
  run "${name}_on" "$np" "${lay[@]}" --set checkpoint.resume="$src" --set checkpoint.dir="$dir/${name}_on_ckpt"
  grep -E "layout" "$dir/${name}_on.log"
  # The log says the state was resharded, from which layout.
  grep -q "resumed from $src: step 10 of 20; resharded from dp 2 x tp 2, ZeRO-1, f32 (4 ranks) to " "$dir/${name}_on.log" ||
    { grep "resumed" "$dir/${name}_on.log"; echo "FAIL: $name: the log does not say it resharded"; exit 1; }
  "$compare" --resumed "$dir/orig" "$dir/${name}_on" 1e-4 1e-4
done
# The other way: a checkpoint written at cp 2 x dp 2 with ZeRO-1 (shards over dp x cp) loads
# at 1 rank and saves the same tensors; continued, it stays with the cp run.
run cp_orig 4 --set parallel.cp=2 --set parallel.dp=2 --set parallel.zero=1 --set checkpoint.dir="$dir/cp_ckpt"
"$loom" ckpt verify "$dir/cp_ckpt/step-00000010"
run cp_rank1_same 1 --set train.steps=10 --set checkpoint.resume="$dir/cp_ckpt/step-00000010" \
  --set checkpoint.dir="$dir/cp_rank1_ckpt"
"$compare" --ckpt-equal "$dir/cp_ckpt/step-00000010" "$dir/cp_rank1_ckpt/step-00000010"
run cp_rank1_on 1 --set checkpoint.resume="$dir/cp_ckpt/step-00000010" --set checkpoint.dir="$dir/cp_rank1_on_ckpt"
"$compare" --resumed "$dir/cp_orig" "$dir/cp_rank1_on" 1e-4 1e-4
# And across dtypes: the fp32 checkpoint loaded by a bf16 run is its master weights and
# moments, bitwise.
run bf16_same 1 --set train.dtype=bf16 --set train.steps=10 --set checkpoint.resume="$src" \
  --set checkpoint.dir="$dir/bf16_ckpt"
"$compare" --ckpt-equal "$src" "$dir/bf16_ckpt/step-00000010"
grep -q "resharded from dp 2 x tp 2, ZeRO-1, f32 (4 ranks) to one rank, bf16 (1 rank)" "$dir/bf16_same.log" ||
  { grep "resumed" "$dir/bf16_same.log"; echo "FAIL: bf16: the log does not say it resharded"; exit 1; }
# Another model shape is refused, naming the keys that differ.
if $launch 1 "$loom" train "${common[@]}" --set model.n_layer=3 --set checkpoint.resume="$src" \
  --set checkpoint.dir="$dir/bad_ckpt" --set log.dir="$dir/bad" > "$dir/bad.log" 2>&1; then
  echo "FAIL: a checkpoint of another model shape loaded"
  exit 1
fi
grep -q "model.n_layer = 2 there, 3 here" "$dir/bad.log" || { cat "$dir/bad.log"; exit 1; }
# `loom ckpt export` of the last checkpoint is the run's own export, bitwise.
"$loom" ckpt export "$dir/orig_ckpt/step-00000020" "$dir/export.safetensors"
"$compare" --weights-equal "$dir/export.safetensors" "$dir/orig/final.safetensors"
# Another HDF5 client: h5py rebuilds the token embedding from the manifest's shards.
"$py" - "$dir/orig_ckpt/step-00000020" "$dir/export.safetensors" <<'PY'
import json, struct, sys
import h5py, numpy as np
ckpt, exported = sys.argv[1], sys.argv[2]
m = json.load(open(ckpt + "/manifest.json"))
name = "transformer.wte.weight"
t = m["tensors"]["params/" + name]
whole = np.full(t["shape"], np.nan, dtype=np.float32)
for s in t["shards"]:
    with h5py.File(ckpt + "/" + s["file"], "r") as f:
        d = f[s["dataset"]][...]
    sl = tuple(slice(o, o + n) for o, n in zip(s["offset"], s["shape"]))
    whole[sl] = d
raw = open(exported, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])[name]
b, e = h["data_offsets"]
ref = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=np.float32).reshape(h["shape"])
assert not np.isnan(whole).any(), "shards leave part of the tensor uncovered"
assert np.array_equal(whole, ref), "h5py's tensor differs from loom's export"
print(f"h5py: {name} {list(whole.shape)} rebuilt from {len(t['shards'])} shards equals loom's export")
PY
