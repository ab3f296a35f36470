#!/usr/bin/env bash
# Stage balance: parallel.pp_layers = "auto" against the even split at p = 2 (two ranks, one
# thread each) on a gpt2 whose head (a 16384-token vocabulary) weighs about five blocks: each
# stage's measured compute per step (metrics' stage_compute_ms, mean of steps 3..) and the
# step time, beside `loom plan pipeline`'s split. Prints a Markdown table.
#   examples/pipeline/balance.sh
#   env: LOOM (build/loom), LAUNCH ("launch/mpirun.sh -np"), STEPS (12)
set -euo pipefail
cd "$(dirname "$0")/../.."
loom=${LOOM:-build/loom} launch=${LAUNCH:-launch/mpirun.sh -np} steps=${STEPS:-12}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
model=(--set model.n_layer=8 --set model.d_model=256 --set model.n_head=8 --set model.seq_len=128
       --set model.vocab_size=16384 --set train.micro_batch=2 --set train.global_batch=16 --set train.threads=1
       --set data.val_batches=0 --set parallel.pp=2)
echo "| split | blocks per stage | stage 0 compute ms | stage 1 compute ms | step ms |"
echo "| --- | --- | ---: | ---: | ---: |"
for split in even auto; do
  s=()
  [ "$split" = auto ] && s=(--set parallel.pp_layers=auto)
  $launch 2 "$loom" train "${model[@]}" "${s[@]}" --set train.steps="$steps" --set log.dir="$dir/$split" \
    > "$dir/$split.log" 2>&1 || { cat "$dir/$split.log"; exit 1; }
  blocks=$(grep -o "blocks [0-9,]* per model chunk" "$dir/$split.log" | awk '{print $2}')
  python3 - "$dir/$split/metrics.jsonl" "$split" "$blocks" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"stage_compute_ms"' in l]
rows = [r for r in rows if r["step"] >= 3]
st = [sum(r["stage_compute_ms"][i] for r in rows) / len(rows) for i in range(2)]
step = sum(r["step_ms"] for r in rows) / len(rows)
print(f"| {sys.argv[2]} | {sys.argv[3]} | {st[0]:.0f} | {st[1]:.0f} | {step:.0f} |")
PY
done
