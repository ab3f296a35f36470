#!/usr/bin/env bash
# Expert parallel where a rank gets no tokens: with every router weight zero, each token's
# probabilities are equal and its top 2 are experts 0 and 1 (ties go to the lower id), so at
# ep 2 the rank holding experts 2 and 3 receives nothing in the first step's micro-batches
# (the metric's expert load is exactly 2.0 there: N on two experts of a mean N / 2). The ep 2
# run (dp 2, each rank its own micro-batch) must still match the single rank routing the same
# micro-batches: losses, the step-1 norm and the exported weights (tests/dist/parity.sh's
# fp32 tolerances).
#   moe_ep.sh LOOM COMPARE "MPIRUN... -np"
set -euo pipefail
loom=$1 compare=$2 launch=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--set model.arch=llama --set model.n_layer=2 --set model.d_model=32 --set model.n_head=8 --set model.n_kv_head=4
        --set model.vocab_size=96 --set model.seq_len=16 --set model.d_ff=128 --set model.moe.num_experts=4
        --set train.micro_batch=4 --set train.global_batch=8 --set train.lr=3e-3 --set train.warmup_steps=2
        --set train.threads=1 --set train.device=cpu --set data.val_batches=0)
"$loom" train "${common[@]}" --set train.steps=0 --set log.dir= --set export.final="$dir/init.safetensors" \
  > "$dir/init.log" 2>&1 || { cat "$dir/init.log"; exit 1; }
python3 - "$dir/init.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
zeroed = 0
for name, t in header.items():
    if name.endswith("block_sparse_moe.gate.weight"):
        a, b = t["data_offsets"]
        raw[8 + n + a:8 + n + b] = bytes(b - a)
        zeroed += 1
assert zeroed == 2, zeroed
open(path, "wb").write(raw)
PY
run() {  # NAME NP ARGS...
  local name=$1 np=$2
  shift 2
  $launch "$np" "$loom" train "${common[@]}" --set train.steps=10 --set init.from="$dir/init.safetensors" "$@" \
    --set log.dir="$dir/$name" --set export.final="$dir/$name/final.safetensors" > "$dir/$name.log" 2>&1 ||
    { cat "$dir/$name.log"; exit 1; }
}
run one 1
run ep2 2 --set parallel.dp=2 --set parallel.ep=2
for r in one ep2; do
  python3 - "$dir/$r/metrics.jsonl" <<'PY'
import json, sys
first = [json.loads(l) for l in open(sys.argv[1]) if '"moe"' in l][0]
loads = [m["load"] for m in first["moe"]]
assert loads == [2.0, 2.0], f"step 1 expert load {loads}: experts 2 and 3 were not left without tokens"
PY
done
"$compare" "$dir/ep2" "$dir/one" --min-steps 10
echo ok
