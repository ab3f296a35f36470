#!/usr/bin/env bash
# Stage 0's memory at p = 4, m = 8 for each schedule, from the ledger (rank 0 is stage 0): its
# activations (the micro-batches in flight and, for split backwards, the output gradients W
# reads) and its communication buffers (the pipeline's transfers in flight), beside the
# schedule's peak in flight from `loom plan pipeline`. Prints a Markdown table.
#   examples/pipeline/memory.sh
#   env: LOOM (build/loom), LAUNCH ("launch/mpirun.sh -np")
set -euo pipefail
cd "$(dirname "$0")/../.."
loom=${LOOM:-build/loom} launch=${LAUNCH:-launch/mpirun.sh -np}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Eight blocks: one per model chunk for the interleaved (v 2) and V schedules, two per stage.
model=(--set model.n_layer=8 --set model.d_model=64 --set model.n_head=4 --set model.seq_len=64
       --set model.vocab_size=512 --set train.micro_batch=1 --set train.global_batch=8 --set train.steps=2
       --set train.threads=1 --set data.val_batches=0 --set parallel.pp=4)
echo "| schedule | stage-0 peak in flight (chunk micro-batches) | stage-0 activations | stage-0 comm buffers |"
echo "| --- | ---: | ---: | ---: |"
for s in gpipe 1f1b interleaved zb zbv dualpipev; do
  v=()
  [ "$s" = interleaved ] && v=(--set parallel.pp_virtual=2)
  $launch 4 "$loom" train "${model[@]}" --set parallel.pp_schedule=$s "${v[@]}" --set log.dir="$dir/$s" \
    > "$dir/$s.log" 2>&1 || { cat "$dir/$s.log"; exit 1; }
  peak=$("$loom" plan pipeline "${model[@]}" --set parallel.pp_schedule=$s "${v[@]}" | grep "^stage  0" |
    grep -o "peak [0-9]*" | awk '{print $2}')
  python3 - "$dir/$s/metrics.jsonl" "$s" "$peak" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][-1]["mem"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {m['act_b'] / 1024:.0f} KiB | {m['comm_b'] / 1024:.0f} KiB |")
PY
done
