#!/usr/bin/env bash
# The launcher of a supervised job killed outright (SIGKILL to mpirun): its ranks outlive it,
# holding log.dir's lock and saving checkpoints. The supervisor ends them before the restart,
# which then takes the lock and resumes (it failed "in use by another run", 3 of 3). The ranks
# print rarely (log.every): a rank writing to its dead launcher's pipe would die of SIGPIPE.
#   supervise_leftovers.sh LOOM "MPIRUN..."
set -uo pipefail
loom=$1 mpirun=$2
. "$(dirname "$0")/../lib.sh"
test_dir  # KEEP=1 keeps it
cd "$dir"
# shellcheck disable=SC2086
timeout 280 "$loom" supervise --backoff-s 0 --max-restarts 2 -- $mpirun -np 2 "$loom" train \
  --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.vocab_size=64 \
  --set model.seq_len=8 --set train.global_batch=4 --set train.micro_batch=2 --set train.threads=1 \
  --set train.device=cpu --set data.val_batches=0 --set parallel.dp=2 --set train.steps=150 \
  --set fault.slow=0:20 --set checkpoint.every=40 --set checkpoint.dir=ck --set checkpoint.resume=latest \
  --set log.every=1000 --set log.dir=log > sup.log 2>&1 &
sup=$!
for _ in $(seq 900); do [ -e ck/step-00000040/manifest.json ] && break; sleep 0.1; done
supervisor=$(pgrep -P $sup | head -1)  # $sup is timeout's
launcher=$(pgrep -P "$supervisor" | head -1)
[ -n "$launcher" ] || { cat sup.log; die "no launcher under the supervisor"; }
kill -9 "$launcher"
# When the restart begins, no process of the first run is left (its ranks would save on).
for _ in $(seq 600); do grep -q "LOOM_RESTART=1" sup.log && break; sleep 0.05; done
for p in $(pgrep -f "loom train"); do
  # This test's ranks only (their directory): other tests' supervised runs may run beside it.
  [ "$(readlink "/proc/$p/cwd" 2> /dev/null)" = "$PWD" ] || continue
  if grep -qa "LOOM_RESTART=0" "/proc/$p/environ" 2> /dev/null; then
    fail "pid $p of the first run still runs as the restart begins"
  fi
done
wait $sup
rc=$?
[ $rc = 0 ] || fail "the supervised job ended with $rc"
grep -q "in use by another run" sup.log && fail "the restart found the old run's lock"
grep -q "resumed from" sup.log || fail "the restart did not resume"
[ $fails = 0 ] || tail -20 sup.log
finish "supervise leftovers: held"
