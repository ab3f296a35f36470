#!/usr/bin/env bash
# Hostile inputs through the binary as a user runs it: each ends quickly with loom's one-line
# error and status 2 (never a crash, a hang, a raw library message or a restartable status):
#    7 a shard cut shorter while a run reads it (was SIGBUS, status 135);
#    8 FIFOs and endless files as inputs: data.path, a FIFO among the shards, data.val_path, a
#      text source, tokenizer files, /dev/zero as text;
#    9 an empty weight_map, a number in it (eval, generate);
#   10 vocab.json ids -1 and 2^31-1 (loom data);
#   12 report: learning rates one ulp apart (looped), a FIFO as metrics.jsonl, odd types;
#   13 ckpt export of a manifest that claims more than its files hold (allocated first);
#   14 a run that only resumes beside a run that saves and prunes the directory;
#   15 train.min_lr above train.lr, NaN weights from init.from (train, generate), a vocab.json
#      that is an array, duplicate ids, a merges line of three fields, --merges /dev/zero,
#      supervise --backoff-s nan;
#   16 non-UTF-8 log.dir, a symlink loop as data.path, a directory named x.bin, a string id in
#      vocab.json, supervise --max-restarts 99999999999, a command not found (127, not
#      restarted), a log.dir that is a file.
#   and A to J:
#   A --config and --cluster that are a directory, a FIFO, /dev/zero or a sparse 20 GB file
#     (train, bench train, eval, plan layout, plan memory);
#   B supervise: SIGHUP and SIGUSR1 go on to the job (not an orphaned job), SIGTERM ends a
#     back-off, --log-dir FILE, --backoff-s 0x10;
#   C report: steps above 2^53 (the axis ticks looped);
#   D plan pipeline --pp/--virtual/--micro out of range or past the model's blocks, plan
#     memory --dp 0 and --params nan, bench comm --max-mb -1|nan|huge;
#   E a safetensors header length of 30 GiB (eval, generate, init.from);
#   F loom data: a sparse 100 GB input, a symlink loop in an input directory (skipped);
#   G fault drill numbers past int64 and a rank of 2^32;
#   H generate --seed -1, --threads 99999;
#   I manifests with fields of the wrong JSON type, a fractional shape, a step of 1e30;
#   J range errors in a short message (not DBL_MAX in 300 digits).
#   hostile_inputs.sh LOOM
set -uo pipefail
loom=$1
# Cases that would allocate what a file claims run with the address space limited to 4 GB; not
# under a sanitizer (LOOM_SANITIZED, tests/sanitized.sh), whose shadow memory maps terabytes.
limited=(bash -c 'ulimit -v 4000000 && exec "$@"' limited)
[ -z "${LOOM_SANITIZED:-}" ] || limited=()
. "$(dirname "$0")/../lib.sh"
test_dir
writer=
on_exit 'kill $writer 2>/dev/null'
cd "$dir"
common=(--set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.vocab_size=256
        --set model.seq_len=8 --set train.global_batch=2 --set train.micro_batch=2 --set train.threads=1
        --set train.device=cpu --set data.val_batches=0)
python3 -c "print('the quick brown fox jumps over the lazy dog. ' * 60000)" > text.txt
run_or_show data.log "$loom" data text.txt shard.bin
tokens=(--set data.source=tokens --set data.path="$dir/shard.bin")

echo "7 a shard cut under the run"
cp shard.bin cut.bin
timeout 120 "$loom" train "${common[@]}" --set data.source=tokens --set data.path="$dir/cut.bin" \
  --set train.steps=1000000 --set log.dir=r7 > r7.log 2>&1 &
run=$!
for _ in $(seq 600); do [ -s r7/metrics.jsonl ] && break; sleep 0.1; done
truncate -s 1024 cut.bin
wait $run
rc=$?
[ $rc = 2 ] && grep -q "token shard '$dir/cut.bin' became shorter while this run read it" r7.log ||
  { fail "cut shard: exit $rc"; tail -3 r7.log; }

echo "8 FIFOs and endless inputs"
mkfifo fifo.bin
refused "data.path FIFO" "is a FIFO" train "${common[@]}" --set data.source=tokens --set data.path="$dir/fifo.bin" \
  --set train.steps=1 --set log.dir=r8a
mkdir shards && cp shard.bin shards/a.bin && mkfifo shards/b.bin && mkdir shards/c.bin
timeout -k 5 60 "$loom" train "${common[@]}" --set data.source=tokens --set data.path="$dir/shards" --set train.steps=1 \
  --set log.dir=r8b > r8b.log 2>&1 || { fail "a FIFO and a directory among the shards: not skipped"; tail -3 r8b.log; }
refused "data.val_path FIFO" "is a FIFO" train "${common[@]}" "${tokens[@]}" --set data.val_path="$dir/fifo.bin" \
  --set data.val_batches=1 --set train.steps=1 --set log.dir=r8c
refused "text source FIFO" "is a FIFO" train "${common[@]}" --set data.source=text --set data.path="$dir/fifo.bin" \
  --set train.steps=1 --set log.dir=r8d
echo '{"a": 0}' > v.json
printf '#version: 0.2\n' > m.txt
refused "vocab FIFO" "is a FIFO" data --tokenizer gpt2 --vocab fifo.bin --merges m.txt text.txt o.bin
refused "merges FIFO" "is a FIFO" data --tokenizer gpt2 --vocab v.json --merges fifo.bin text.txt o.bin
refused "/dev/zero as text" "is a character device" data /dev/zero o.bin

echo "9 index weight_map"
run_or_show r9.log "$loom" train "${common[@]}" --set train.steps=1 \
  --set export.final="$dir/w.safetensors" --set log.dir=r9
mkdir idx && cp w.safetensors idx/
echo '{"weight_map": {}}' > idx/model.safetensors.index.json
refused "empty weight_map: eval" "empty weight_map" eval --from idx/model.safetensors.index.json --data text.txt
refused "empty weight_map: generate" "empty weight_map" generate --from idx/model.safetensors.index.json --prompt hi
echo '{"weight_map": {"lm_head.weight": 5}}' > idx/model.safetensors.index.json
refused "number in weight_map" "not a file name" eval --from idx/model.safetensors.index.json --data text.txt

echo "10, 15, 16 vocab and merges"
gpt2() { refused "$1" "$2" data --tokenizer gpt2 --vocab "$3" --merges "$4" text.txt o.bin; }
echo '{"a": -1, "b": 1}' > v1.json && gpt2 "vocab id -1" "has id -1" v1.json m.txt
echo '{"a": 2147483647}' > v2.json && gpt2 "vocab id 2^31-1" "has id 2147483647" v2.json m.txt
echo '["a", "b"]' > v3.json && gpt2 "vocab array" "is not a GPT-2 vocab" v3.json m.txt
echo '{"a": 0, "b": 0}' > v4.json && gpt2 "duplicate ids" "id 0 is given to both" v4.json m.txt
echo '{"a": "0"}' > v5.json && gpt2 "string id" "has id \"0\"" v5.json m.txt
printf '#version: 0.2\na b c\n' > m3.txt && gpt2 "merges of three" "is not one merge" v.json m3.txt
gpt2 "merges /dev/zero" "is a character device" v.json /dev/zero

echo "12 report"
for r in ra rb; do mkdir -p $r; done
echo '{"run":1}' > ra/metrics.jsonl && echo '{"step":1,"loss":2.0,"lr":0.001}' >> ra/metrics.jsonl
echo '{"run":1}' > rb/metrics.jsonl && echo '{"step":1,"loss":2.0,"lr":0.0010000000000000002}' >> rb/metrics.jsonl
timeout -k 5 60 "$loom" report ra rb --out ulp.html > ulp.log 2>&1 || { fail "report: lrs an ulp apart: exit $?"; tail -3 ulp.log; }
mkdir rf && mkfifo rf/metrics.jsonl
refused "report: FIFO metrics" "is a FIFO" report rf --out f.html
mkdir ro
printf '%s\n' '{"run":1}' '[1,2]' '"text"' '{"step":1,"loss":"x","time":5,"mem":"big","lr":null}' \
  '{"step":2,"loss":1.5,"split_ms":{"measured":3},"gap":7}' '{"split_ms":4}' > ro/metrics.jsonl
timeout -k 5 60 "$loom" report ro --out odd.html > odd.log 2>&1 || { fail "report: odd types: exit $?"; tail -3 odd.log; }

echo "13 ckpt export of a forged shape"
run_or_show r13.log "$loom" train "${common[@]}" --set train.steps=2 --set checkpoint.every=2 \
  --set checkpoint.dir=ck13 \
  --set log.dir=r13
python3 - ck13/step-00000002/manifest.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
name = next(k for k, t in m["tensors"].items() if k.startswith("params/") and len(t["shards"]) == 1
            and len(t["shape"]) == 2)
t = m["tensors"][name]
t["shape"] = [40000, 40000]  # 6.4 GB of floats
t["shards"][0]["shape"] = [40000, 40000]
json.dump(m, open(sys.argv[1], "w"))
PY
# Under 4 GB of address space: allocated before it is read, the claim ended in std::bad_alloc;
# now the model check (the weights its config describes) or the size check refuses it first.
wrap=("${limited[@]}")
refused "forged shape" "its manifest claims\\|its params/ tensors hold" ckpt export ck13/step-00000002 forged.safetensors
wrap=()

echo "14 a resume-only run beside a saving run"
timeout 300 "$loom" train "${common[@]}" --set train.steps=1000000 --set checkpoint.every=1 --set checkpoint.keep=1 \
  --set checkpoint.dir=ck14 --set log.dir=r14w > r14w.log 2>&1 &
writer=$!
for _ in $(seq 600); do ls ck14/step-*/manifest.json > /dev/null 2>&1 && break; sleep 0.1; done
for k in 1 2 3; do
  refused "resume-only beside a writer ($k)" "in use by another run" train "${common[@]}" --set train.steps=1 \
    --set checkpoint.every=0 --set checkpoint.resume=latest --set checkpoint.dir=ck14 --set log.dir=r14r$k
done
kill $writer && wait $writer 2> /dev/null
writer=
ls -d ck14/*.unusable* > /dev/null 2>&1 && fail "a resume-only run set checkpoints aside: $(ls ck14)"
timeout -k 5 60 "$loom" train "${common[@]}" --set train.steps=1 --set checkpoint.every=0 \
  --set checkpoint.resume=latest --set checkpoint.dir=ck14 --set log.dir=r14z > r14z.log 2>&1
grep -q "resumed from" r14z.log || { fail "resume-only after the writer ended did not resume"; tail -3 r14z.log; }

echo "15 accepted silently"
refused "min_lr above lr" "train.min_lr = 0.01 is above train.lr = 0.001" train "${common[@]}" --set train.lr=0.001 \
  --set train.min_lr=0.01 --set train.steps=1 --set log.dir=r15a
python3 - w.safetensors nan.safetensors <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
t = next(v for k, v in h.items() if k != "__metadata__")
at = 8 + n + t["data_offsets"][0]
b[at:at + 4] = struct.pack("<f", float("nan"))
open(sys.argv[2], "wb").write(b)
PY
refused "NaN weights: train" "NaN or infinite" train "${common[@]}" --set init.from="$dir/nan.safetensors" \
  --set train.steps=1 --set log.dir=r15b
refused "NaN weights: generate" "NaN or infinite" generate --from nan.safetensors --prompt hi
refused "backoff nan" "takes seconds" supervise --backoff-s nan -- true
refused "backoff inf" "takes seconds" supervise --backoff-s inf -- true

echo "16 wrong messages"
refused "non-UTF-8 log.dir" "not UTF-8" train "${common[@]}" --set train.steps=1 --set log.dir=$'r16\xff'
ln -s loop1 loop2 && ln -s loop2 loop1
refused "symlink loop data.path" "loop of symbolic links" train "${common[@]}" --set data.source=tokens \
  --set data.path="$dir/loop1" --set train.steps=1 --set log.dir=r16b
mkdir dirbin && mkdir dirbin/x.bin
refused "a directory named x.bin" "holds no .bin token shards" train "${common[@]}" --set data.source=tokens \
  --set data.path="$dir/dirbin" --set train.steps=1 --set log.dir=r16c
refused "max-restarts huge" "takes a whole number" supervise --max-restarts 99999999999 -- true
timeout -k 5 60 "$loom" supervise --max-restarts 3 --backoff-s 0 -- /nonexistent/cmd > r16e.log 2>&1
rc=$?
[ $rc = 127 ] && ! grep -q "restarting" r16e.log || { fail "command not found: exit $rc or restarted"; tail -3 r16e.log; }
touch afile
refused "log.dir a file" "is not a directory" train "${common[@]}" --set train.steps=1 --set log.dir="$dir/afile"

echo "A config and cluster files that are not regular files, or too big"
truncate -s 20G sparse.toml
refused "train --config ." "is a directory, not a regular file" train --config .
refused "train --config FIFO" "is a FIFO" train --config fifo.bin
refused "bench train --config ." "is a directory, not a regular file" bench train --config .
refused "eval --config FIFO" "is a FIFO" eval --from w.safetensors --config fifo.bin --data text.txt
refused "plan layout --cluster FIFO" "is a FIFO" plan layout --cluster fifo.bin
refused "plan memory --cluster FIFO" "is a FIFO" plan memory --cluster fifo.bin
# Under 4 GB of address space: read whole, /dev/zero and the sparse file end in std::bad_alloc,
# not in a hang or all of the machine's memory.
wrap=("${limited[@]}")
refused "train --config sparse" "more than the 4194304 loom reads whole" train --config sparse.toml
refused "plan memory --cluster sparse" "more than the 4194304" plan memory --cluster sparse.toml
refused "train --config /dev/zero" "is a character device" train --config /dev/zero
refused "plan layout --cluster /dev/zero" "is a character device" plan layout --cluster /dev/zero
wrap=()

echo "B supervise"
touch logfile
refused "supervise --log-dir FILE" "is a regular file, not a directory" supervise --log-dir logfile -- true
refused "supervise --backoff-s 0x10" "takes seconds" supervise --backoff-s 0x10 -- true
refused "supervise --max-restarts 0x3" "takes a whole number" supervise --max-restarts 0x3 -- true
# A stop signal to the supervisor goes on to the job, which ends; the supervisor exits 75.
for sig in HUP USR1; do
  rm -f job.pid
  "$loom" supervise --backoff-s 0 -- bash -c 'echo $$ > job.pid; exec sleep 60' > sup$sig.log 2>&1 &
  sup=$!
  for _ in $(seq 100); do [ -s job.pid ] && break; sleep 0.1; done
  sleep 0.3
  kill -$sig $sup
  for _ in $(seq 100); do kill -0 $sup 2> /dev/null || break; sleep 0.1; done
  kill -0 $sup 2> /dev/null && { fail "SIG$sig: the supervisor did not end"; kill $sup; }
  wait $sup
  rc=$?
  [ $rc = 75 ] || fail "SIG$sig to the supervisor: exit $rc, not 75"
  job=$(cat job.pid 2> /dev/null)
  for _ in $(seq 50); do kill -0 "$job" 2> /dev/null || break; sleep 0.1; done
  if [ -n "$job" ] && kill -0 "$job" 2> /dev/null; then fail "SIG$sig to the supervisor left the job running"; kill "$job"; fi
done
# SIGTERM during a 30 s back-off ends the wait at once.
"$loom" supervise --backoff-s 30 --max-restarts 2 -- false > supwait.log 2>&1 &
sup=$!
for _ in $(seq 100); do grep -q "restarting in" supwait.log && break; sleep 0.1; done
t0=$(date +%s)
kill -TERM $sup
wait $sup
rc=$?
[ $rc = 75 ] && [ $(($(date +%s) - t0)) -lt 10 ] || fail "SIGTERM in a back-off: exit $rc after $(($(date +%s) - t0)) s"

echo "C report on steps above 2^53"
mkdir rbig
printf '%s\n' '{"run":1}' '{"step": 1000000000000000000, "loss": 1}' '{"step": 1000000000000000256, "loss": 2}' \
  > rbig/metrics.jsonl
timeout -k 5 60 "$loom" report rbig --out big.html > big.log 2>&1 || { fail "report: steps above 2^53: exit $?"; tail -3 big.log; }

echo "D plan and bench numbers"
refused "pipeline --pp 100000" "takes a whole number from 1 to 256" plan pipeline --pp 100000
refused "pipeline --pp 200" "more than the model's 4 blocks" plan pipeline --pp 200
refused "pipeline --micro 2e9" "takes a whole number from 1 to 65536" plan pipeline --pp 2 --micro 2000000000
refused "pipeline --virtual 1e6" "takes a whole number from 1 to 256" plan pipeline --pp 2 --virtual 1000000 \
  --schedule interleaved
refused "pipeline --virtual 128" "more than the model's 4 blocks" plan pipeline --pp 2 --virtual 128 \
  --schedule interleaved
refused "pipeline --pp 0" "takes a whole number from 1" plan pipeline --pp 0
refused "pipeline --pp -2" "takes a whole number from 1" plan pipeline --pp -2 --micro -4
refused "pipeline --micro 0" "takes a whole number from 1" plan pipeline --micro 0
refused "pipeline global_batch 2e9" "more than loom plan pipeline simulates" plan pipeline --pp 2 \
  --set train.global_batch=2000000000 --set train.micro_batch=1
refused "memory --dp 0" "takes a whole number from 1" plan memory --dp 0
refused "memory --dp -3" "takes a whole number from 1" plan memory --dp -3
refused "memory --params -5" "takes a number above 0" plan memory --params -5 --dp 2
refused "memory --params nan" "takes a number above 0" plan memory --params nan --dp 2
for mb in -1 nan 1000000000; do
  refused "bench comm --max-mb $mb" "takes a number above 0" bench comm --max-mb $mb
done

echo "E a safetensors header length of 30 GiB"
python3 -c "
import struct
with open('hdr.safetensors', 'wb') as f:
    f.write(struct.pack('<Q', 30 * 2**30 - 8))
    f.truncate(30 * 2**30)"
wrap=("${limited[@]}")
refused "header: eval" "more than the 100000000 a safetensors header" eval --from hdr.safetensors --data text.txt
refused "header: generate" "more than the 100000000 a safetensors header" generate --from hdr.safetensors --prompt hi
refused "header: init.from" "more than the 100000000 a safetensors header" train "${common[@]}" \
  --set init.from="$dir/hdr.safetensors" --set train.steps=1 --set log.dir=rE
wrap=()
rm -f hdr.safetensors

echo "F loom data: a sparse 100 GB input, a symlink loop in a directory"
truncate -s 100G huge.txt
wrap=("${limited[@]}")
refused "data: sparse 100 GB" "not text: its first 4096 bytes are all NUL" data huge.txt o.bin
wrap=()
rm -f huge.txt
mkdir loopdir && cp text.txt loopdir/ && ln -s l1 loopdir/l2 && ln -s l2 loopdir/l1
timeout -k 5 60 "$loom" data loopdir loop.bin > loopdir.log 2>&1 && grep -q "warning: skipping '.*l1'.*loop" loopdir.log ||
  { fail "data: a symlink loop in a directory: exit $? or no warning"; tail -3 loopdir.log; }

echo "G fault drill numbers"
big=99999999999999999999
for k in exit hang; do
  refused "fault.$k step $big" "fault.$k = \"0:$big\": step $big is more than" train "${common[@]}" \
    --set fault.$k=0:$big --set train.steps=1 --set log.dir=rG$k
done
refused "fault.slow $big" "fault.slow = \"0:$big\": delay in ms $big is more than" train "${common[@]}" \
  --set fault.slow=0:$big --set train.steps=1 --set log.dir=rGs
refused "--fault-exit rank $big" "rank $big is more than" train "${common[@]}" --fault-exit $big:1 \
  --set train.steps=1 --set log.dir=rGr
refused "--fault-exit rank 2^32" "rank 4294967296 is more than" train "${common[@]}" --fault-exit 4294967296:2 \
  --set train.steps=2 --set log.dir=rGw

echo "H generate --seed, --threads"
refused "generate --seed -1" "takes a whole number from 0" generate --from w.safetensors --prompt hi --seed -1
refused "generate --threads 99999" "takes a whole number from 0 to 4096" generate --from w.safetensors --prompt hi \
  --threads 99999

echo "I forged manifest types"
forge() {  # forge NAME PYTHON: a copy of ckI's step 2 with m (the manifest), t (a tensor) edited
  rm -rf "f$1" && mkdir -p "f$1" && cp -r ckI/step-00000002 "f$1/" || return
  python3 - "f$1/step-00000002/manifest.json" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
name = next(k for k, t in m["tensors"].items() if k.startswith("params/") and len(t["shape"]) == 2
            and t["shape"] == t["shards"][0]["shape"])
t = m["tensors"][name]
exec(sys.argv[2])
open(sys.argv[1], "w").write(m if isinstance(m, str) else json.dumps(m))
PY
}
run_or_show rI.log "$loom" train "${common[@]}" --set train.steps=2 --set checkpoint.every=2 \
  --set checkpoint.dir=ckI \
  --set log.dir=rI
manifest() {
  forge "$1" "$2"
  refused "manifest $1" "$3" ckpt verify "f$1/step-00000002"
}
manifest xxh "t['shards'][0]['xxh64'] = 5" "shard 0's \"xxh64\" is number 5, not a string"
manifest version "m['version'] = '1'" "\"version\" is string \"1\", not a whole number"
manifest config "m['config'] = 5" "\"config\" is number 5, not a string"
manifest shape_text "t['shape'] = 'big'" "\"shape\" is string \"big\", not an array"
manifest array "m = '[1, 2]'" "the manifest is array \[1,2\], not a JSON object"
manifest fraction "t['shape'][0] += 0.5; t['shards'][0]['shape'][0] += 0.5" "is number .*\.5, not a whole number"
manifest step "m['step'] = 1e30" "\"step\" is number 1e+30, not a whole number"

echo "J short range messages"
refused "eval --threads -5" "takes a whole number from 0 to 4096" eval --from w.safetensors --data text.txt --threads -5
grep -q 17976931348 "out$n.log" && fail "eval --threads -5: DBL_MAX written out"
refused "generate --top-k -1" "takes a whole number from 0" generate --from w.safetensors --prompt hi --top-k -1
refused "data --threads -2" "takes a whole number from 0 to 4096" data --threads -2 text.txt o.bin
refused "plan layout --top 0" "takes a whole number from 1" plan layout --top 0 --cluster x.toml

finish "hostile inputs: all held"
