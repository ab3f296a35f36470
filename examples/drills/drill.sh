#!/usr/bin/env bash
# A fault drill: one short job (2 ranks over mpirun or srun, dp 2, checkpoints every 5 steps) with one
# injected fault, run under `loom supervise` with checkpoint.resume = "latest", next to the
# same job without the fault. Writes OUT/report.json and prints the table of
# docs/faults-and-drills.md, its header and this drill's row (time to detect, time to recover,
# steps lost, goodput, final weights bitwise equal).
#   examples/drills/drill.sh SCENARIO [OUT]        (OUT: runs/drills/SCENARIO)
# Scenarios: kill kill_in_save exit hang sigterm preempt nan nan_rollback bitflip
#            bitflip_unchecked slow ckpt_corrupt enospc
# Environment: LOOM (build/loom), NP (2), TP (1: dp = NP / TP), LAUNCH (the launcher up to its rank count: mpirun
#              with this machine's flags and -np by default; srun ... -n under Slurm),
#              SEED (picks the fault's step, 7-22, for kill, exit, hang, nan and bitflip; AT sets it),
#              DEVICE (train.device: cpu, or cuda), COMM (parallel.comm, e.g. nccl-emulated),
#              ARGS (more flags for both jobs, e.g. "--set checkpoint.async=false"). The
#              fault hits rank 1 (rank 0 at NP=1).
set -euo pipefail
scenario=${1:?usage: drill.sh SCENARIO [OUT]}
here=$(cd "$(dirname "$0")" && pwd)
out=${2:-runs/drills/$scenario}
loom=$(readlink -f "${LOOM:-$here/../../build/loom}")
np=${NP:-2}
tp=${TP:-1}  # tensor-parallel degree; dp = NP / TP
# The launcher, up to its count of ranks (e.g. "srun --mpi=pmix --kill-on-bad-exit=1 -n").
read -r -a launch <<< "${LAUNCH:-mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np}"
RANDOM=${SEED:-$$}
at=${AT:-$((RANDOM % 16 + 7))}
r=$((np > 1 ? 1 : 0))  # the rank the fault hits
steps=30
# OUT is replaced only when it is an earlier drill's (or empty): never a directory of yours.
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ ! -f "$out/base.log" ]; then
  echo "error: $out exists and is not a drill's output; pick another OUT" >&2
  exit 2
fi
rm -rf "$out"
mkdir -p "$out"
out=$(readlink -f "$out")
common=(--set model.n_layer=2 --set model.d_model=128 --set model.n_head=4 --set model.vocab_size=256
        --set model.seq_len=64 --set train.global_batch=8 --set train.micro_batch=2 --set train.steps=$steps
        --set train.warmup_steps=3 --set train.threads=1 --set train.device="${DEVICE:-cpu}" --set data.val_every=0
        --set parallel.comm="${COMM:-auto}"
        --set data.val_batches=1 --set parallel.dp=$((np / tp)) --set parallel.tp="$tp" --set parallel.timeout_s=5 --set checkpoint.every=5
        --set checkpoint.keep=3 --set fault.grace_s=20)
read -r -a args <<< "${ARGS:-}"
common+=("${args[@]}")
case $scenario in
  kill) fault=(--set fault.kill=$r:$at) ;;
  kill_in_save) fault=(--set fault.kill=$r:15:checkpoint) ;;
  exit) fault=(--set fault.exit=$r:$at:backward) ;;
  hang) fault=(--set fault.hang=$r:$at) ;;
  # The signal is sent below once step 12 is reported; 20 ms more a step on rank 0 (which
  # changes no value) keeps the job from finishing before it lands.
  sigterm) fault=(--set fault.slow=0:20) ;;  # to the ranks, as a scheduler's preemption would
  preempt) fault=(--set fault.slow=0:20) ;;  # to the supervisor; then the same job again
  nan) fault=(--set fault.nan=$r:$at) ;;
  nan_rollback) fault=(--set fault.nan=$r:$at --set fault.max_skips=0) ;;
  bitflip) fault=(--set fault.bitflip=$r:$at --set fault.sdc_every=1) ;;
  bitflip_unchecked) fault=(--set fault.bitflip=$r:$at) ;;
  slow) fault=(--set fault.slow=$r:40) ;;
  # A synchronous save: step 10 is committed (and damaged) before the kill at 13, whatever
  # the disk's speed (an async one may still be writing then, and nothing is damaged).
  ckpt_corrupt) fault=(--set fault.ckpt_corrupt=10 --set fault.kill=$r:13 --set checkpoint.async=false) ;;
  enospc) fault=(--set fault.enospc=10) ;;
  *) echo "error: unknown scenario '$scenario'" >&2; exit 2 ;;
esac

# The same job, no fault.
t0=$(date +%s.%N)
"${launch[@]}" "$np" "$loom" train "${common[@]}" --set log.dir="$out/base" --set checkpoint.dir="$out/base_ckpt" \
  --set export.final="$out/base/final.safetensors" > "$out/base.log" 2>&1 || { cat "$out/base.log"; exit 1; }
echo "$t0 $(date +%s.%N)" > "$out/base/wall"

# The drill, supervised.
supervised=("$loom" supervise --max-restarts 3 --backoff-s 0.5 --log-dir "$out/run" --
  "${launch[@]}" "$np" "$loom" train "${common[@]}" "${fault[@]}" --set log.dir="$out/run"
  --set checkpoint.dir="$out/ckpt" --set checkpoint.resume=latest --set export.final="$out/run/final.safetensors")
after_step() {  # STEP: wait until the job has reported it (or 60 s, or the job ended)
  for _ in $(seq 1200); do
    grep -qs "\"step\":$1," "$out/run/metrics.jsonl" && return 0
    kill -0 "$sup" 2> /dev/null || return 1
    sleep 0.05
  done
  return 1
}
set +e
"${supervised[@]}" >> "$out/run.log" 2>&1 &
sup=$!
if [ "$scenario" = sigterm ] || [ "$scenario" = preempt ]; then
  after_step 12 || { echo "FAIL: the job never reached step 12"; tail -30 "$out/run.log"; exit 1; }
  printf '{"event":"fault","t":%s,"kind":"%s","rank":-1,"step":12}\n' "$(date +%s.%N)" "$scenario" \
    >> "$out/run/faults.jsonl"
  if [ "$scenario" = sigterm ]; then
    pkill -TERM -f "^$loom train .*$out/run" || true  # the ranks: the supervisor restarts their 75
  else
    kill -TERM "$sup"  # the supervisor: it passes the signal on and asks for a requeue (75)
  fi
fi
wait "$sup"
status=$?
if [ "$scenario" = preempt ]; then
  [ "$status" -eq 75 ] || { echo "FAIL: a preempted supervisor ended with $status, not 75"; tail -30 "$out/run.log"; exit 1; }
  "${supervised[@]}" >> "$out/run.log" 2>&1  # the requeued job
  status=$?
fi
set -e
[ "$status" -eq 0 ] || { echo "FAIL: the supervised job ended with status $status"; tail -30 "$out/run.log"; exit 1; }

# Nothing left behind: no process of the job, no checkpoint a resume could pick up that does
# not verify (unusable ones are set aside under another name).
if pgrep -f "$out/run" > /dev/null; then
  echo "FAIL: processes left behind:"; pgrep -fa "$out/run"; exit 1
fi
for d in "$out"/ckpt/step-????????; do
  [ -f "$d/manifest.json" ] || { echo "FAIL: unfinished checkpoint $d left behind"; exit 1; }
  "$loom" ckpt verify "$d" > /dev/null || { echo "FAIL: $d does not verify"; exit 1; }
done
python3 "$here/report.py" "$scenario" "$out"
