#!/usr/bin/env bash
# Expert parallel where a rank gets no tokens: with every router weight zero, each token's
# probabilities are equal and its top 2 are experts 0 and 1 (ties go to the lower id), so at
# ep 2 the rank holding experts 2 and 3 receives nothing in the first step's micro-batches.
# Checked two ways: the metric's expert load is exactly 2.0 at step 1 (N on two experts of a
# mean N / 2), and after one step experts 2 and 3 moved by weight decay alone (a zero
# gradient: AdamW's step is 0), experts 0 and 1 by more. The ep 2 run (dp 2, each rank its own
# micro-batch) must still match the single rank routing the same micro-batches over 10 steps:
# losses, the step-1 norm and the exported weights (tests/dist/parity.sh's fp32 tolerances).
#   moe_ep.sh LOOM COMPARE "MPIRUN... -np"
set -euo pipefail
loom=$1 compare=$2 launch=$3
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.arch=llama --set model.n_layer=2 --set model.d_model=32 --set model.n_head=8 --set model.n_kv_head=4
        --set model.vocab_size=96 --set model.seq_len=16 --set model.d_ff=128 --set model.moe.num_experts=4
        --set train.micro_batch=4 --set train.global_batch=8 --set train.lr=3e-3 --set train.warmup_steps=2
        --set train.threads=1 --set train.device=cpu --set data.val_batches=0)
run_or_show "$dir/init.log" "$loom" train "${common[@]}" --set train.steps=0 --set log.dir= \
  --set export.final="$dir/init.safetensors"
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
run ep2_step1 2 --set parallel.dp=2 --set parallel.ep=2 --set train.steps=1
python3 - "$dir/init.safetensors" "$dir/ep2_step1/final.safetensors" <<'PY'
import json, struct, sys
def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return {k: struct.unpack(f"<{(t['data_offsets'][1] - t['data_offsets'][0]) // 4}f",
                             raw[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]])
            for k, t in header.items() if k != "__metadata__"}
init, after = read(sys.argv[1]), read(sys.argv[2])
decay = 1 - 1.5e-3 * 0.1  # the first step's lr (3e-3 over 2 warm-up steps) times weight decay
for name, w0 in init.items():
    if ".experts." not in name:
        continue
    worst = max(abs(b - a * decay) for a, b in zip(w0, after[name]))
    expert = int(name.split(".experts.")[1].split(".")[0])
    if expert >= 2:
        assert worst < 1e-8, f"{name} moved by {worst} beyond weight decay: it received tokens"
    else:
        assert worst > 1e-5, f"{name} did not move: experts 0 and 1 should have taken every token"
print("step 1: experts 2 and 3 (ep rank 1) received no tokens; experts 0 and 1 all of them")
PY
for r in one ep2; do
  python3 - "$dir/$r/metrics.jsonl" <<'PY'
import json, sys
first = [json.loads(l) for l in open(sys.argv[1]) if '"moe"' in l][0]
loads = [m["load"] for m in first["moe"]]
assert loads == [2.0, 2.0], f"step 1 expert load {loads}: experts 2 and 3 were not left without tokens"
PY
done
"$compare" "$dir/ep2" "$dir/one" --min-steps 10
# The same over NCCL's rules on the CPU, where the empty rank's all-to-all sends and receives
# nothing at all: bitwise equal to the MPI run.
run ep2_emu 2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.comm=nccl-emulated
"$compare" "$dir/ep2_emu" "$dir/ep2" --min-steps 10 --loss-rtol 0 --norm-rtol 0 --weight-atol 0
echo ok
