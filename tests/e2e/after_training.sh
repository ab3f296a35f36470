#!/usr/bin/env bash
# After training: a small model trained on a repeating sentence must continue it under
# `loom generate` (greedy), sample the same text for the same seed, and refuse a --max-new
# that does not fit; `loom eval` with the training config must give the run's last validation
# loss, and the same loss under data and tensor parallelism (when an mpirun command is given).
set -euo pipefail
loom=$(realpath "$1")
mpirun=${2:-}
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir"
for _ in $(seq 400); do printf 'the quick brown fox jumps over the lazy dog. '; done >fox.txt
cat >fox.toml <<'EOF'
[model]
n_layer = 2
d_model = 64
vocab_size = 256
seq_len = 64
[train]
steps = 120
micro_batch = 8
global_batch = 8
threads = 1
[data]
source = "text"
path = "fox.txt"
val_every = 0
[log]
dir = "run"
EOF
"$loom" train --config fox.toml --set export.final=fox.safetensors >train.log 2>&1

# Greedy: the sentence goes on, past its end and into the next one.
out=$("$loom" generate --from fox.safetensors --prompt "the quick brown" --max-new 45 2>gen.err)
echo "greedy: $out"
[ "$out" = "the quick brown fox jumps over the lazy dog. the quick brown" ]
grep -q "15 prompt + 45 new tokens" gen.err

# Sampled: reproducible for a seed.
a=$("$loom" generate --from fox.safetensors --prompt "the lazy" --temperature 0.9 --top-k 8 --seed 5 2>/dev/null)
b=$("$loom" generate --from fox.safetensors --prompt "the lazy" --temperature 0.9 --top-k 8 --seed 5 2>/dev/null)
echo "sampled: $a"
[ "$a" = "$b" ]

# A continuation that does not fit the 64-token context: status 2, one line that says the limit.
set +e
"$loom" generate --from fox.safetensors --prompt "the quick brown" --max-new 60 >/dev/null 2>err.txt
rc=$?
set -e
cat err.txt
[ "$rc" -eq 2 ] && [ "$(wc -l <err.txt)" -eq 1 ] && grep -q "use --max-new 49 or less" err.txt

# eval with the training config gives the run's final validation loss.
val=$(grep -o '"val_loss":[0-9.e+-]*' run/metrics.jsonl | tail -1 | cut -d: -f2)
eval_loss() { grep -o 'loss [0-9.]*' | head -1 | cut -d' ' -f2; }
one=$("$loom" eval --from fox.safetensors --config fox.toml | tee eval.txt | eval_loss)
cat eval.txt
echo "training's last val_loss $val, eval $one"
awk -v a="$val" -v b="$one" 'BEGIN { d = a - b; exit !(d < 1e-6 && d > -1e-6) }'
grep -q "perplexity" eval.txt

if [ -n "$mpirun" ]; then
  for layout in "parallel.dp=2 --set train.micro_batch=4" "parallel.tp=2"; do
    # shellcheck disable=SC2086
    got=$($mpirun 2 "$loom" eval --from fox.safetensors --config fox.toml --set $layout | eval_loss)
    echo "eval under $layout: $got"
    awk -v a="$one" -v b="$got" 'BEGIN { d = a - b; exit !(d < 1e-5 && d > -1e-5) }'
  done
fi

# The same weights as Hugging Face ships GPT-2: names without "transformer.", no loom
# metadata, a config.json beside them. generate must read the shape from it and agree.
mkdir hf
python3 - fox.safetensors hf/model.safetensors <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
meta = header.pop("__metadata__")
out = {k.removeprefix("transformer."): v for k, v in header.items()}
out["__metadata__"] = {"format": "pt"}
h = json.dumps(out).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PY
cat >hf/config.json <<'EOF2'
{"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64, "vocab_size": 256,
 "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new"}
EOF2
hf=$("$loom" generate --from hf/model.safetensors --prompt "the quick brown" --max-new 45 2>/dev/null)
echo "as shipped: $hf"
[ "$hf" = "$out" ]
