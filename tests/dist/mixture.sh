#!/usr/bin/env bash
# A mixture of two token sources (weights 3:1, one in GPT-2's uint16 shards, one in LLaMA-3's
# uint32 format) trained at dp 2 and resumed from its step-4 checkpoint at dp 1 with twice the
# accumulation reads the same sequences step for step: per-source token counts equal, losses
# within 1e-4 of the unbroken run. The same resume fed the sources the other way round must
# not match (the check can fail).
#   mixture.sh LOOM COMPARE "MPIRUN... -np"
set -euo pipefail
loom=$1 compare=$2 launch=$3
. "$(dirname "$0")/../lib.sh"
test_dir
# Source a: a repeating 5-cycle, source b: a repeating 7-cycle, as token shards.
python3 - "$dir" <<'PY'
import struct, sys
d = sys.argv[1]
def shard(path, toks, u32):
    head = [20240801 if u32 else 20240520, 7 if u32 else 1, len(toks)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *head))
        f.write(struct.pack("<%d%s" % (len(toks), "I" if u32 else "H"), *toks))
shard(d + "/a.bin", [(i * 3) % 5 + 10 * ((i // 97) % 4) for i in range(20000)], False)
shard(d + "/b.bin", [(i * 2) % 7 + 50 + ((i // 31) % 3) for i in range(8000)], True)
PY
common=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=16 --set model.d_ff=128 --set train.global_batch=8 --set train.micro_batch=2
        --set train.steps=8 --set train.warmup_steps=2 --set train.threads=1 --set train.device=cpu
        --set data.source=tokens --set data.shuffle=true --set data.val_batches=1 --set data.val_every=0
        --set checkpoint.every=4)
mix="[{path = \"$dir/a.bin\", weight = 3}, {path = \"$dir/b.bin\", weight = 1}]"
swapped="[{path = \"$dir/a.bin\", weight = 1}, {path = \"$dir/b.bin\", weight = 3}]"
run() {  # NAME NP SOURCES ARGS...
  local name=$1 np=$2 sources=$3
  shift 3
  run_or_show "$dir/$name.log" ranks "$np" "$loom" train "${common[@]}" \
    --set data.sources="$sources" "$@" --set log.dir="$dir/$name" \
    --set export.final="$dir/$name/final.safetensors"
}
run full 2 "$mix" --set parallel.dp=2 --set checkpoint.dir="$dir/ckpt"
grep -E "mixture of 2 sources" "$dir/full.log"
run resumed 1 "$mix" --set parallel.dp=1 --set checkpoint.resume="$dir/ckpt/step-00000004" \
  --set checkpoint.dir="$dir/ckpt_resumed"
"$compare" --resumed "$dir/full" "$dir/resumed" 1e-4 1e-4
# Each step's counts are the global batch's (8 sequences of 16 tokens), 3:1 within a sequence.
python3 - "$dir/full/metrics.jsonl" "$dir/resumed/metrics.jsonl" <<'PY'
import json, sys
def counts(path):
    return {s["step"]: list(s["source_tokens"].values())
            for s in map(json.loads, open(path)) if "source_tokens" in s}
full, resumed = counts(sys.argv[1]), counts(sys.argv[2])
assert sorted(full) == list(range(1, 9)) and sorted(resumed) == list(range(5, 9)), (full, resumed)
for step, v in full.items():
    assert sum(v) == 8 * 16 and abs(v[1] - 32) <= 16, (step, v)
    if step in resumed:
        assert resumed[step] == v, (step, v, resumed[step])
print("source tokens per step:", full)
PY
run swapped 1 "$swapped" --set parallel.dp=1 --set checkpoint.resume="$dir/ckpt/step-00000004" \
  --set checkpoint.dir="$dir/ckpt_swapped"
if "$compare" --resumed "$dir/full" "$dir/swapped" 1e-4 1e-4 > "$dir/swapped.cmp" 2>&1; then
  echo "FAIL: a resume fed other sequences matched the unbroken run"
  exit 1
fi
echo "mixture resumed at dp 1 reads what the dp 2 run read"
