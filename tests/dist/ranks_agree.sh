#!/usr/bin/env bash
# Ranks that disagree, and shared directories:
#   config: ranks launched with different configs (MPMD: one --set differs) end at start-up with
#           status 2 naming the key, both values and the rank: a learning rate (trained diverging
#           replicas to exit 0), a seed, a shape (a raw MPI truncation abort), checkpoint.dir (a
#           checkpoint that failed verify); the same config on both runs; a second run given the
#           same log.dir moves to log.dir-2 on every rank;
#   lock:   a second run saving into a checkpoint.dir that a running job holds is refused,
#           naming the holder; once that job ends, the directory is free again;
#   dp:     launched without parallel.dp, the ranks the other axes leave are data parallel (and
#           the log says so); a parallel.dp given that does not fill the world is refused.
#   ranks_agree.sh LOOM "MPIRUN..."
set -uo pipefail
loom=$1 mpirun=$2
. "$(dirname "$0")/../lib.sh"
test_dir
on_exit 'kill $holder 2>/dev/null'
holder=
cd "$dir"
common=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=16 --set train.global_batch=4 --set train.micro_batch=2 --set train.threads=1
        --set train.device=cpu --set data.val_batches=0 --set train.steps=2 --set parallel.dp=2)

echo "config"
mpmd() {  # NAME WANT SET (given to rank 1 only) [BASE: arguments given to both first]
  local name=$1 want=$2 set=$3 base=${4:-}
  # shellcheck disable=SC2086
  timeout 120 $mpirun -np 1 "$loom" train "${common[@]}" --set log.dir=$name.run $base : \
    -np 1 "$loom" train "${common[@]}" --set log.dir=$name.run $base --set "$set" > $name.log 2>&1
  local rc=$?
  [ $rc = 2 ] || { fail "$name: exited $rc, not 2"; tail -3 $name.log; return; }
  grep -q "launched with different configs or binaries: rank 1: $want" $name.log ||
    { fail "$name: the error does not name rank 1's '$want'"; grep error $name.log | head -2; }
}
mpmd lr "train.lr = 0.001 (rank 0: 0.003)" train.lr=0.001
mpmd seed "train.seed = 7 (rank 0: 1234)" train.seed=7
mpmd shape "model.seq_len = 32 (rank 0: 16)" model.seq_len=32
mpmd ckdir 'checkpoint.dir = "ck1" (rank 0: "ck0")' checkpoint.dir=ck1 \
  "--set checkpoint.every=2 --set checkpoint.dir=ck0"
timeout 120 $mpirun -np 2 "$loom" train "${common[@]}" --set log.dir=same.run > same.log 2>&1 ||
  { fail "the same config on both ranks did not run"; tail -3 same.log; }
# Given a log.dir that holds a run, rank 0 moves a new run to log.dir-2 and every rank follows:
# each rank's trace is written there.
timeout 120 $mpirun -np 2 "$loom" train "${common[@]}" --set log.dir=same.run --set log.trace=true > same2.log 2>&1 ||
  { fail "a second run given the same log.dir"; tail -3 same2.log; }
[ -s same.run-2/trace.rank1.json ] && [ -s same.run-2/trace.json ] && [ ! -e same.run/trace.rank1.json ] ||
  { fail "the ranks did not all write same.run-2"; ls same.run same.run-2; }

echo "dp"
args=()
skip=0
for a in "${common[@]}"; do  # common without its "--set parallel.dp=2"
  if [ "$a" = --set ]; then skip=1; continue; fi
  [ $skip = 1 ] && skip=0 && [ "$a" != parallel.dp=2 ] && args+=(--set "$a")
done
timeout 120 $mpirun -np 2 "$loom" train "${args[@]}" --set log.dir=inferred.run > inferred.log 2>&1 ||
  { fail "2 ranks without parallel.dp did not run"; tail -3 inferred.log; }
grep -q "parallel.dp = 2: the 2 ranks over tp 1 x pp 1" inferred.log || fail "the inferred dp is not said"
grep -q '"dp": 2' inferred.run/run.json || fail "run.json does not record dp 2"
timeout 120 $mpirun -np 2 "$loom" train "${args[@]}" --set parallel.dp=1 --set log.dir=given.run > given.log 2>&1
rc=$?
[ $rc = 2 ] && grep -q "does not match the 2 ranks launched" given.log ||
  { fail "parallel.dp = 1 at 2 ranks exited $rc"; grep error given.log | head -2; }

echo "lock"
# A slow job that saves into ck; while it runs, a second one is refused.
"$loom" train "${common[@]}" --set parallel.dp=1 --set train.steps=400 --set fault.slow=0:20 \
  --set checkpoint.every=400 --set checkpoint.dir=ck --set log.dir=holder.run > holder.log 2>&1 &
holder=$!
for _ in $(seq 200); do [ -s ck/.lock ] && break; sleep 0.1; done
[ -s ck/.lock ] || fail "the running job holds no lock on checkpoint.dir"
timeout 60 "$loom" train "${common[@]}" --set parallel.dp=1 --set checkpoint.every=1 --set checkpoint.dir=ck \
  --set log.dir=second.run > second.log 2>&1
rc=$?
[ $rc = 2 ] || { fail "a second run into a held checkpoint.dir exited $rc, not 2"; tail -3 second.log; }
grep -q "checkpoint.dir 'ck' is in use by another run (pid $holder on " second.log ||
  { fail "the refusal does not name the holder"; grep error second.log; }
kill -0 $holder 2>/dev/null || fail "the holder ended before the second run was refused"
kill $holder; wait $holder 2>/dev/null
holder=
# Free again once the holder is gone (the kernel releases its lock, however it ended); the
# earlier runs' checkpoints go first, as a fresh run into them is refused.
rm -rf ck/step-*
timeout 60 "$loom" train "${common[@]}" --set parallel.dp=1 --set checkpoint.every=1 --set checkpoint.dir=ck \
  --set log.dir=third.run > third.log 2>&1 ||
  { fail "checkpoint.dir stayed locked after its job ended"; tail -3 third.log; }

finish ok
