#!/usr/bin/env bash
# Long sequences on a tiny model, split over cp ranks: per rank, the activations the ledger
# holds (what `loom plan memory` plans, byte for byte), the measured peak resident memory, and tokens/s, for T = 1K .. 16K at cp 1, 2 and 4 (ring); then
# the step against the step-time model's prediction on this machine's cluster file (the run
# prints it); then the ring's exposed communication with its transfers overlapped against the
# same run with parallel.cp_overlap = false. Rank 0's figures, the median of the steps after
# the first.
# Prints two Markdown tables.
#   examples/context/long_context.sh [T...]
#   env: LOOM (build/loom), LAUNCH ("launch/mpirun.sh -np"), STEPS (4), OVERLAP_T (8192)
set -euo pipefail
cd "$(dirname "$0")/../.."
loom=${LOOM:-build/loom} launch=${LAUNCH:-launch/mpirun.sh -np} steps=${STEPS:-4} overlap_t=${OVERLAP_T:-8192}
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(1024 2048 4096 8192 16384)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# llama, 2 layers, d_model 64, 2 heads (1 kv head): attention, not the weights, is what grows.
model=(--set model.arch=llama --set model.n_layer=2 --set model.d_model=64 --set model.n_head=2
       --set model.n_kv_head=1 --set model.d_ff=192 --set model.vocab_size=256 --set train.micro_batch=1
       --set train.global_batch=1 --set train.steps="$steps" --set train.warmup_steps=1 --set train.threads=1
       --set train.device=cpu --set data.val_batches=0 --set log.every=1000)
run() {  # NAME CP T ARGS...
  local name=$1 cp=$2 T=$3
  shift 3
  $launch "$cp" "$loom" train --verbose "${model[@]}" --set model.seq_len="$T" --set parallel.cp="$cp" "$@" \
    --set log.dir="$dir/$name" > "$dir/$name.log" 2>&1 || { tail -20 "$dir/$name.log"; exit 1; }
}
summary() {  # NAME -> "act_MiB rss_MiB tok/s comm_ms step_ms predicted_ms"
  python3 - "$dir/$1/metrics.jsonl" "$dir/$1.log" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
later = rows[1:] or rows
med = lambda k: statistics.median(r[k] for r in later)
med_t = lambda k: statistics.median(r["time"][k] for r in later)
mem = rows[-1]["mem"]
predicted = float("nan")
for line in open(sys.argv[2]):
    m = re.search(r"predicted on cluster .*?: ([\d.e+-]+) ms per step", line)
    if m:
        predicted = float(m.group(1))
print(f"{mem['act_b'] / 2**20:.1f} {mem['rss_peak_b'] / 2**20:.0f} {med('tokens_per_s'):.0f} "
      f"{med_t('comm_exposed_ms'):.1f} {med('step_ms'):.0f} {predicted:.0f}")
PY
}
echo "| T | cp | activations / rank (ledger) | peak RSS / rank | tokens/s | step | predicted |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for T in "${lengths[@]}"; do
  for cp in 1 2 4; do
    run "t${T}_cp$cp" "$cp" "$T"
    read -r act rss tps _ step pred <<< "$(summary "t${T}_cp$cp")"
    echo "| $T | $cp | $act MiB | $rss MiB | $tps | $step ms | $pred ms |"
  done
done
echo
echo "| T = $overlap_t, ring | cp | exposed comm / step, overlapped | not overlapped | step, overlapped | not overlapped |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for cp in 2 4; do
  run "ov_on_$cp" "$cp" "$overlap_t"
  run "ov_off_$cp" "$cp" "$overlap_t" --set parallel.cp_overlap=false
  read -r _ _ _ on_comm on_step _ <<< "$(summary "ov_on_$cp")"
  read -r _ _ _ off_comm off_step _ <<< "$(summary "ov_off_$cp")"
  echo "| | $cp | $on_comm ms | $off_comm ms | $on_step ms | $off_step ms |"
done
