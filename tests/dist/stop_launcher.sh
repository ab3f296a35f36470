#!/usr/bin/env bash
# Ctrl-C as users send it, to the launcher: the terminal's SIGINT to the whole foreground process
# group of launch/mpirun.sh, and SIGUSR1 to a plain mpirun. Either way every rank stops at a step
# boundary, export.final is written and loads, and the launcher exits 75. (A plain mpirun given
# SIGINT/SIGTERM kills its ranks within two seconds and exits 1: Open MPI's own behaviour.)
# Through the script, loom's log names the Ctrl-C (not the SIGUSR1 the script passed on), and
# Open MPI's notice that a process "returned a non-zero exit code" stays out of the clean stop.
# A second Ctrl-C to the script ends the ranks at once: status 130, said in a sentence.
#   stop_launcher.sh LOOM SOURCE_DIR "MPIRUN..."
set -uo pipefail
loom=$1 src=$2 mpirun=$3
. "$(dirname "$0")/../lib.sh"
test_dir
marker="stop-launcher-$$"
args=(train --set train.device=cpu --set train.threads=1 --set train.steps=100000 --set data.val_batches=0
      --set parallel.dp=2 --set train.micro_batch=8)
wait_steps() {  # wait_steps LOG_DIR N
  for _ in $(seq 300); do
    [ "$(grep -c '"loss"' "$1/metrics.jsonl" 2> /dev/null || echo 0)" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
check_stop() {  # check_stop NAME STATUS LOG_DIR EXPORT LOG
  local name=$1 status=$2 log_dir=$3 export=$4 log=$5
  echo "$name: status $status"
  [ "$status" -eq 75 ] || { cat "$log"; echo "FAIL: $name: exit status $status, not 75"; exit 1; }
  tail -1 "$log_dir/metrics.jsonl" | grep -q '"stopped":"SIG' || die "$name: no stop record"
  "$loom" train --set train.device=cpu --set train.steps=1 --set data.val_batches=0 --set train.threads=1 \
    --set init.from="$export" --set log.dir="$dir/again" > "$dir/again.log" 2>&1 ||
    { cat "$dir/again.log"; echo "FAIL: $name: the export does not load"; exit 1; }
  sleep 0.5
  pgrep -f "$marker" > /dev/null && { pkill -9 -f "$marker"; die "$name: processes left"; }
}

# 1. launch/mpirun.sh in a process group of its own with SIGINT not ignored, as an interactive
#    shell starts a foreground job (job control on); the terminal's Ctrl-C is SIGINT to that group.
set -m
"$src/launch/mpirun.sh" -np 2 "$loom" "${args[@]}" --set log.dir="$dir/$marker-a" \
  --set export.final="$dir/a.safetensors" > "$dir/a.log" 2>&1 &
job=$!
wait_steps "$dir/$marker-a" 3 || { cat "$dir/a.log"; echo "FAIL: no steps"; kill -9 -- -$job; exit 1; }
kill -INT -- -"$job"
wait $job
check_stop "Ctrl-C to launch/mpirun.sh" $? "$dir/$marker-a" "$dir/a.safetensors" "$dir/a.log"
grep -q "stopped by Ctrl-C to launch/mpirun.sh after step" "$dir/a.log" ||
  { cat "$dir/a.log"; echo "FAIL: the log does not say the run was stopped by a Ctrl-C"; exit 1; }
grep -q "non-zero exit code\|non-zero status\|Forwarding signal" "$dir/a.log" &&
  { cat "$dir/a.log"; echo "FAIL: Open MPI's notices of a failure in a clean stop"; exit 1; }

# 1b. Ctrl-C twice, the second mid-step (fault.slow holds rank 0 in each step for 4 s): the ranks
#     are ended at once, and the script says so and exits 130 (not mpirun's 1), without Open MPI's
#     notices; the checkpoint committed before is intact.
"$src/launch/mpirun.sh" -np 2 "$loom" "${args[@]}" --set log.dir="$dir/$marker-c" --set fault.slow=0:4000 \
  --set checkpoint.dir="$dir/$marker-ck" --set checkpoint.every=1 --set export.final="$dir/c.safetensors" \
  > "$dir/c.log" 2>&1 &
job=$!
for _ in $(seq 300); do  # a checkpoint committed (step 1's, at the end of step 2), then into the next step
  compgen -G "$dir/$marker-ck/step-*/manifest.json" > /dev/null && break
  sleep 0.1
done
compgen -G "$dir/$marker-ck/step-*/manifest.json" > /dev/null ||
  { cat "$dir/c.log"; echo "FAIL: no checkpoint committed"; kill -9 -- -$job; exit 1; }
sleep 0.5
kill -INT -- -"$job"
sleep 0.5
kill -INT -- -"$job"
wait $job
status=$?
echo "Ctrl-C twice to launch/mpirun.sh: status $status"
[ "$status" -eq 130 ] || { cat "$dir/c.log"; echo "FAIL: a second Ctrl-C: exit status $status, not 130"; exit 1; }
grep -q "^launch/mpirun.sh: ended by a second Ctrl-C: ranks still in a step were stopped there" "$dir/c.log" ||
  { cat "$dir/c.log"; echo "FAIL: the script does not say what a second Ctrl-C did"; exit 1; }
grep -q "non-zero exit code\|non-zero status\|Forwarding signal\|mpirun noticed\|exited on signal" "$dir/c.log" &&
  { cat "$dir/c.log"; echo "FAIL: Open MPI's notices after a second Ctrl-C"; exit 1; }
grep -q "stopped by" "$dir/c.log" && { cat "$dir/c.log"; echo "FAIL: the step in flight was finished"; exit 1; }
[ ! -e "$dir/c.safetensors" ] || die "an export after a second Ctrl-C"
last=$(dirname "$(ls -d "$dir/$marker-ck"/step-*/manifest.json | tail -1)")
"$loom" ckpt verify "$last" > "$dir/verify.log" 2>&1 ||
  { cat "$dir/verify.log"; echo "FAIL: the last committed checkpoint is not intact"; exit 1; }
sleep 0.5
pgrep -f "$marker" > /dev/null && { pkill -9 -f "$marker"; die "processes left after a second Ctrl-C"; }
set +m

# 2. A plain mpirun, given SIGUSR1 (which it forwards to every rank).
$mpirun -np 2 "$loom" "${args[@]}" --set log.dir="$dir/$marker-b" --set export.final="$dir/b.safetensors" \
  > "$dir/b.log" 2>&1 &
job=$!
wait_steps "$dir/$marker-b" 3 || { cat "$dir/b.log"; echo "FAIL: no steps"; kill -9 $job; exit 1; }
kill -USR1 "$job"
wait $job
check_stop "SIGUSR1 to mpirun" $? "$dir/$marker-b" "$dir/b.safetensors" "$dir/b.log"
grep -q "stopped by SIGUSR1 after step" "$dir/b.log" || { cat "$dir/b.log"; echo "FAIL: not said stopped by SIGUSR1"; exit 1; }
echo "ok"
