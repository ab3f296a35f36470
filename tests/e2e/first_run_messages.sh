#!/usr/bin/env bash
# What a new user's first runs say, through the binary as they run it: a data path is never
# ignored (its kind is read from the file), a file error is one line and status 2, `plan memory`
# says what it planned (device, dtype, layout, batch), a run starts and ends briefly, and a
# count of one is said in the singular ("1 thread per rank").
#   first_run_messages.sh LOOM ["MPIRUN..."]
set -uo pipefail
loom=$1 mpirun=${2:-}
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir"
quick=(--set train.device=cpu --set train.threads=1 --set train.steps=2 --set data.val_batches=1
       --set model.n_layer=1 --set model.d_model=64 --set model.n_head=2 --set model.seq_len=32)
# expect_error STATUS PATTERN COMMAND...: the command fails with STATUS and one line on stderr
# that matches PATTERN, and no raw C++ exception text.
expect_error() {
  local want=$1 pattern=$2
  shift 2
  "$@" > out.log 2> err.log
  local status=$?
  [ "$status" -eq "$want" ] || { cat out.log err.log; die "'$*' exited $status, not $want"; }
  grep -q -- "$pattern" err.log || { cat err.log; die "'$*': no '$pattern' on stderr"; }
  [ "$(grep -c . err.log)" -eq 1 ] || { cat err.log; die "'$*': more than one line on stderr"; }
  ! grep -q "basic_filebuf\|what()" err.log || die "'$*': a raw exception"
}

# Data: a text file and its llm.c shard, each named by data.path alone.
python3 -c "print(' '.join(['the cat sat on the mat and the dog ran'] * 2000))" > corpus.txt
"$loom" data corpus.txt corpus.bin > /dev/null || die "loom data"
"$loom" train "${quick[@]}" --set data.path=corpus.bin --set log.dir=r1 > r1.log 2>&1 || { cat r1.log; die "train on corpus.bin"; }
grep -q "data: tokens 'corpus.bin'" r1.log || { cat r1.log; die "corpus.bin was not read as token shards"; }
"$loom" train "${quick[@]}" --set data.path=corpus.txt --set log.dir=r2 > r2.log 2>&1 || { cat r2.log; die "train on corpus.txt"; }
grep -q "data: text 'corpus.txt'" r2.log || { cat r2.log; die "corpus.txt was not read as text"; }
grep -q "synthetic" r1.log r2.log && die "a run with data.path trained on the synthetic corpus"
expect_error 2 'data.source = "synthetic" would ignore it' "$loom" train "${quick[@]}" --set data.source=synthetic \
  --set data.path=corpus.bin --set log.dir=r3
expect_error 2 "data file 'missing.bin' does not exist" "$loom" train "${quick[@]}" --set data.path=missing.bin \
  --set log.dir=r3

# File errors: one line, status 2.
mkdir texts
expect_error 2 "'texts' is a directory" "$loom" train "${quick[@]}" --set data.source=text --set data.path=texts \
  --set log.dir=r4
expect_error 2 "'texts' is a directory" "$loom" train "${quick[@]}" --set data.path=corpus.txt \
  --set data.val_path=texts --set data.source=text --set log.dir=r4
expect_error 2 "is a directory" "$loom" data --tokenizer gpt2 --vocab texts --merges texts corpus.txt o.bin
expect_error 2 "tools/tokenizer_files.sh" "$loom" data --tokenizer gpt2 corpus.txt o.bin

# plan memory says in its first line what it planned (device, dtype, every axis of the layout, the
# micro-batch, the global batch), in the next why that device, and plans for a --cluster's
# device; GB as plan layout.
CUDA_VISIBLE_DEVICES=-1 "$loom" plan memory --config "$src/examples/configs/llama3_8b.toml" --dp 64 > plan.log 2>&1 ||
  { cat plan.log; die "plan memory"; }
head -1 plan.log | grep -q "^planned for cpu (f32), dp 64 x tp 1 x pp 1 x cp 1 x ep 1 (64 ranks): micro-batch 1 \
sequence of 8192 tokens, global batch 8192 sequences (128 micro-batches a step on each dp rank), recompute none$" ||
  { cat plan.log; die "plan memory's first line does not say what it planned"; }
sed -n 2p plan.log | grep -q "^device: train.device = auto on this machine.*--cluster" ||
  { cat plan.log; die "plan memory does not say why it planned for the CPU"; }
"$loom" plan memory --config "$src/examples/configs/llama3_8b.toml" --set parallel.tp=4 --set parallel.pp=2 \
  --set train.micro_batch=2 --set train.global_batch=32 --cluster "$src/examples/clusters/h100_1024.toml" > plan2.log \
  2>&1 || { cat plan2.log; die "plan memory --cluster"; }
head -1 plan2.log | grep -q "^planned for cuda (bf16), dp 1 x tp 4 x pp 2 x cp 1 x ep 1 (8 ranks): micro-batch 2 \
sequences of 8192 tokens, global batch 32 sequences (16 micro-batches a step on each dp rank)" ||
  { cat plan2.log; die "plan memory --cluster: the first line"; }
sed -n 2p plan2.log | grep -q "^device: the device of cluster" || { cat plan2.log; die "--cluster"; }
grep -q "(GB)" plan2.log || { cat plan2.log; die "plan memory not in GB"; }

# A short start (model, device and data, layout, batch, memory, where the logs go) and one closing
# summary; the rest behind --verbose.
"$loom" train "${quick[@]}" --set train.steps=3 --set log.dir=r5 --set export.final=r5.safetensors > r5.log 2>&1 ||
  { cat r5.log; die "the short run"; }
before=$(sed -n '/step *1\//q;p' r5.log | wc -l)
[ "$before" -le 8 ] || { cat r5.log; die "$before lines before step 1 (at most 8)"; }
for word in "parameters" "layout:" "tokens per step" "metrics: r5/metrics.jsonl"; do
  grep -q "$word" r5.log || { cat r5.log; die "the start does not say '$word'"; }
done
grep -q "activation plan (B=\|memory ledger per rank\|FLOPs/token" r5.log && { cat r5.log; die "the plan tables without --verbose"; }
summary=$(sed -n '/run summary: 3 of 3 steps/,$p' r5.log)
for word in "loss        train" "validation" "tokens/s, MFU" "export      r5.safetensors" "logs        r5/"; do
  grep -q "$word" <<< "$summary" || { cat r5.log; die "the summary does not say '$word'"; }
done
"$loom" train "${quick[@]}" --verbose --set log.dir=r6 > r6.log 2>&1 || { cat r6.log; die "--verbose"; }
grep -q "activation plan (B=" r6.log && grep -q "memory ledger per rank" r6.log || { cat r6.log; die "--verbose"; }
# The shipped cluster file compares only on the machine it was fitted on (LOOM_MACHINE_NAME makes
# this one another machine); named with log.cluster, it compares anywhere.
cluster=$src/examples/clusters/this_machine.toml
elsewhere="Not the fitting CPU, 1 cores"
LOOM_MACHINE_NAME=$elsewhere "$loom" train "${quick[@]}" --set log.dir=r7 > r7.log 2>&1 || { cat r7.log; die "elsewhere"; }
grep -q "predicted" r7.log && { cat r7.log; die "a prediction from a file fitted on another machine"; }
LOOM_MACHINE_NAME=$elsewhere "$loom" train "${quick[@]}" --set log.dir=r8 --set log.cluster="$cluster" \
  --set train.global_batch=8 > r8.log 2>&1 || { cat r8.log; die "named cluster"; }
grep -q "predicted (cluster this_machine) vs measured" r8.log || { cat r8.log; die "no comparison with log.cluster"; }
# That run has one of each (layer, thread, rank, gradient bucket, micro-batch, compared step):
# each said in the singular.
grep -E '(^|[^0-9.])1 (layers|heads|threads|ranks|cores|gradient buckets|micro-batches|sequences|steps|batches)\b' r8.log &&
  { cat r8.log; die "a count of one with a plural noun"; }
for want in "model gpt2: 1 layer," "1 thread per rank" "layout: 1 rank over" "1 gradient bucket of" \
  "1 micro-batch of 8 on the one dp rank" "vs measured, mean of 1 step:"; do
  grep -qF "$want" r8.log || { cat r8.log; die "the run does not say '$want'"; }
done

# Small ones: --val-fraction says the tokens it held out; the interleaved refusal is a sentence;
# a layout the ranks launched cannot hold is said once (rank 0), status 2.
mkdir docs
for i in $(seq 20); do head -c $((i * 500)) corpus.txt > "docs/d$(printf %02d "$i").txt"; done
"$loom" data --val-fraction 0.05 docs docs.bin > docs.log 2>&1 || { cat docs.log; die "loom data docs"; }
grep -q "^validation: the last 1 of 20 documents, [0-9.]*% of the tokens" docs.log || { cat docs.log; die "val share"; }
expect_error 2 'needs a multiple of parallel.pp = 2 micro-batches per step, not 1' "$loom" train "${quick[@]}" \
  --set model.n_layer=4 --set parallel.pp=2 --set parallel.pp_schedule=interleaved --set train.global_batch=8 \
  --set log.dir=r9
if [ -n "$mpirun" ]; then
  $mpirun -np 2 "$loom" train "${quick[@]}" --set parallel.dp=4 --set train.global_batch=32 --set log.dir=r10 \
    > mpi.log 2>&1
  status=$?
  [ "$status" -eq 2 ] || { cat mpi.log; die "a layout mismatch under mpirun exited $status, not 2"; }
  [ "$(grep -c "does not match the 2 ranks launched" mpi.log)" -eq 1 ] && ! grep -q "MPI_ABORT" mpi.log ||
    { cat mpi.log; die "the layout mismatch is not said once, without an abort"; }
fi
echo "ok"
