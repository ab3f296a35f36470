#!/usr/bin/env bash
# Malformed input through the binary: each ends with loom's one-line error and
# status 2 (never a crash, a raw library message, or a write to another path), or is accepted
# the way the docs say:
#    4 a control character in a path key (export.final = "D/e\u0000.safetensors" wrote D/e);
#    5 parallel.dp = 0 (SIGFPE, status 136, in train, bench train, plan memory, plan layout, eval);
#    6 JSON nested 200,000 deep (SIGSEGV): a manifest (verify, inspect, export, resume), a
#      metrics.jsonl line (report: skipped), a safetensors header (eval, generate, init.from), a
#      Hugging Face config.json and index, a GPT-2 vocab.json;
#    8 the JSON library's own words: an empty, truncated or non-JSON manifest (resume warns), a
#      safetensors header of length 0 or with bytes that are not UTF-8, a --vocab not JSON;
#    9 a 300-byte path component (status 1, "filesystem error"): export.final, a ckpt export
#      directory, eval and generate --from, init.from, log.dir, loom data's and report's outputs;
#   12 --config /proc/self/environ (read as empty: the default job trained), loom data of an
#      empty file (a shard of 0 tokens);
#   10 eval of finite weights that overflow (loss -nan, status 0);
#   13 a mixture naming one file twice, a token shard as text (train and loom data), refused;
#      val_path = path under any spelling and val_path beside synthetic data, said; a FIFO among shards, a linked
#      directory or a shard in loom data's input directory skipped with a word;
#   14 a manifest with a tensor more (resume took it, verify refused it);
#   15 SIGTERM during a validation of 10^9 batches (waited fault.grace_s);
#   16 supervise --log-dir that cannot be written (too long, immutable: exit 0, nothing written);
#   17 a cluster's peak_tflops = 1e308 (inf, every layout 0.0%), nodes = 10^9 (a wrong range);
#   18 a newline in a string key, a manifest config of "[[[" (called another model), a wholly
#      damaged metrics.jsonl ("no step yet"), an empty shard directory ("but validation ones"),
#      a gzip-repacked rank file ("corrupt").
#   malformed_inputs.sh LOOM
set -uo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir"
common=(--set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.vocab_size=64
        --set model.seq_len=8 --set train.global_batch=2 --set train.micro_batch=2 --set train.threads=1
        --set train.device=cpu --set data.val_batches=0)
# A run that goes on with a warning: status 0, the warning said once.
warned() {
  local name=$1 want=$2
  shift 2
  n=$((n + 1))
  timeout -k 5 60 "$loom" "$@" > "out$n.log" 2>&1 < /dev/null
  local rc=$?
  [ $rc = 0 ] || { fail "$name: exit $rc, not 0"; tail -3 "out$n.log"; return; }
  [ "$(grep -c -- "$want" "out$n.log")" = 1 ] || { fail "$name: did not say '$want' once"; tail -3 "out$n.log"; }
}
run_or_show r0.log "$loom" train "${common[@]}" --set train.steps=2 --set checkpoint.every=2 \
  --set checkpoint.dir=ck \
  --set export.final="$dir/w.safetensors" --set log.dir=r0
printf 'the quick brown fox jumps over the lazy dog\n%.0s' $(seq 50) > text.txt
deep=$(python3 -c "print('[' * 200000 + ']' * 200000)")

echo "4 control characters in path keys"
mkdir -p D
printf '[export]\nfinal = "%s/D/e\\u0000.safetensors"\n' "$dir" > nul.toml
refused "NUL in export.final" "export.final holds a control character (U+0000 at byte" train --config nul.toml \
  "${common[@]}" --set train.steps=1 --set log.dir=r4
[ ! -e D/e ] || fail "NUL in export.final: wrote D/e"
refused "newline in log.dir" "log.dir holds a control character (U+000A" train "${common[@]}" --set train.steps=1 \
  --set log.dir=$'r4\nx'
refused "escape in data.path" "data.path holds a control character (U+001B" train "${common[@]}" \
  --set data.source=tokens --set data.path=$'x\e[2J.bin' --set train.steps=1 --set log.dir=r4b

echo "5 parallel.dp = 0"
refused "train dp 0" "parallel.dp = 0 must be positive" train "${common[@]}" --set parallel.dp=0 --set log.dir=r5
refused "bench train dp 0" "parallel.dp = 0 must be positive" bench train "${common[@]}" --set parallel.dp=0
refused "plan memory dp 0" "parallel.dp = 0 must be positive" plan memory --set parallel.dp=0
refused "plan layout dp 0" "parallel.dp = 0 must be positive" plan layout --set parallel.dp=0 \
  --cluster "$here/../../examples/clusters/h200.toml"
refused "eval dp 0" "parallel.dp = 0 must be positive" eval --from w.safetensors --data text.txt --set parallel.dp=0

echo "6 JSON nested 200,000 deep"
mkdir -p d6 && cp -r ck/step-00000002 d6/ && echo "$deep" > d6/step-00000002/manifest.json
for c in verify inspect; do refused "deep manifest: ckpt $c" "more than 512 deep" ckpt $c d6/step-00000002; done
refused "deep manifest: ckpt export" "more than 512 deep" ckpt export d6/step-00000002 x.safetensors
refused "deep manifest: resume" "more than 512 deep" train "${common[@]}" --set train.steps=3 \
  --set checkpoint.resume="$dir/d6/step-00000002" --set log.dir=r6
mkdir -p r6m && cp r0/metrics.jsonl r6m/
python3 -c "print('{\"step\": 5, \"loss\": 1.0, \"mem\": ' + '[' * 200000 + ']' * 200000 + '}')" >> r6m/metrics.jsonl
timeout -k 5 60 "$loom" report r6m --out r6m.html > r6m.log 2>&1 || { fail "deep metrics line: exit $?"; tail -3 r6m.log; }
python3 -c "
import struct
h = b'[' * 200000 + b']' * 200000
open('deep.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h)"
refused "deep header: eval" "more than 512 deep" eval --from deep.safetensors --data text.txt
refused "deep header: generate" "more than 512 deep" generate --from deep.safetensors --prompt hi
refused "deep header: init.from" "more than 512 deep" train "${common[@]}" --set init.from="$dir/deep.safetensors" \
  --set train.steps=1 --set log.dir=r6b
mkdir -p hf && cp w.safetensors hf/model.safetensors && echo "$deep" > hf/config.json
python3 -c "
import json, struct
b = open('hf/model.safetensors', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
del h['__metadata__']; h = json.dumps(h).encode(); h += b' ' * (-len(h) % 8)
open('hf/model.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h + b[8 + n:])"
refused "deep config.json" "config.json' is not valid JSON: it nests" eval --from hf --data text.txt
mkdir -p idx && cp w.safetensors idx/ && echo "$deep" > idx/model.safetensors.index.json
refused "deep index" "more than 512 deep" eval --from idx/model.safetensors.index.json --data text.txt
echo "$deep" > deep.json && printf '#version: 0.2\n' > m.txt
refused "deep vocab.json" "more than 512 deep" data --tokenizer gpt2 --vocab deep.json --merges m.txt text.txt o.bin

echo "8 the JSON library's words"
for m in empty cut text; do
  rm -rf c8 && mkdir c8 && cp -r ck/step-00000002 c8/
  case $m in
    empty) : > c8/step-00000002/manifest.json ;;
    cut) head -c 200 ck/step-00000002/manifest.json > c8/step-00000002/manifest.json ;;
    text) echo "not json" > c8/step-00000002/manifest.json ;;
  esac
  timeout -k 5 60 "$loom" train "${common[@]}" --set train.steps=3 --set checkpoint.every=1 --set checkpoint.dir=c8 \
    --set checkpoint.resume=latest --set log.dir=r8$m > r8$m.log 2>&1
  grep -q "manifest) is not valid JSON: it" r8$m.log && ! grep -q "json.exception" r8$m.log ||
    { fail "$m manifest: the resume warning"; grep -i "warn\|error" r8$m.log | head -3; }
done
python3 -c "
import struct
open('zero.safetensors', 'wb').write(struct.pack('<Q', 0))
h = b'{\"a\": \"\xff\"}'
open('utf8.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h)"
for t in eval generate; do
  args=(--data text.txt); [ $t = generate ] && args=(--prompt hi)
  refused "header of length 0: $t" "is not valid JSON: it is empty" $t --from zero.safetensors "${args[@]}"
  refused "header not UTF-8: $t" "holds bytes that are not UTF-8" $t --from utf8.safetensors "${args[@]}"
done
refused "header not UTF-8: init.from" "holds bytes that are not UTF-8" train "${common[@]}" \
  --set init.from="$dir/utf8.safetensors" --set train.steps=1 --set log.dir=r8b
echo '{"a": 0,' > cut.json
refused "--vocab cut short" "is not valid JSON: it is cut short" data --tokenizer gpt2 --vocab cut.json --merges m.txt \
  text.txt o.bin

echo "9 a 300-byte name"
long=$(printf 'x%.0s' $(seq 300))
too_long() { refused "$1" "longer than the file system allows" "${@:2}"; }
too_long "export.final" train "${common[@]}" --set train.steps=1 --set export.final="$long/w.safetensors" --set log.dir=r9
too_long "export.final dir" train "${common[@]}" --set train.steps=1 --set export.final="$long/" --set log.dir=r9b
too_long "ckpt export dir" ckpt export ck/step-00000002 "$long/"
too_long "ckpt export file" ckpt export ck/step-00000002 "$long.safetensors"
too_long "eval --from" eval --from "$long" --data text.txt
too_long "generate --from" generate --from "$long/w.safetensors" --prompt hi
too_long "init.from" train "${common[@]}" --set init.from="$long" --set train.steps=1 --set log.dir=r9c
too_long "data output" data text.txt "$long/o.bin"
too_long "report --out" report r0 --out "$long.html"

echo "12 accepted silently"
refused "--config /proc/self/environ" "/proc/self/environ:" train --config /proc/self/environ
: > empty.txt
refused "loom data of an empty file" "holds no text" data empty.txt e.bin
[ ! -e e.bin ] || fail "loom data wrote an empty shard"

echo "10 eval of weights that overflow"
python3 - w.safetensors huge.safetensors <<'PY'
import array, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
a = array.array("f"); a.frombytes(b[8 + n:])
open(sys.argv[2], "wb").write(b[:8 + n] + array.array("f", (x * 1e18 for x in a)).tobytes())
PY
refused "eval: loss nan" "is -\?nan, not finite" eval --from huge.safetensors

echo "13 data that is not what it claims"
"$loom" data --val-fraction 0.1 text.txt tokens.bin > /dev/null 2>&1 || fail "data: tokens.bin"
mkdir -p D13 && cp tokens.bin D13/x.bin && ln -f D13/x.bin hard.bin
vocab=(--set model.vocab_size=256 --set train.steps=1)
# Validating on the training data runs (a parity check may mean it), and is said under any spelling.
warned "val_path = path" "data.val_path ('./tokens.bin') is data.path" train "${common[@]}" "${vocab[@]}" \
  --set data.source=tokens --set data.path=tokens.bin --set data.val_path=./tokens.bin --set log.dir=r13w1
warned "val_path a hard link of path" "the same file: validation reads the tokens it trains on" train \
  "${common[@]}" "${vocab[@]}" --set data.source=tokens --set data.path=D13/x.bin --set data.val_path=hard.bin \
  --set log.dir=r13w2
printf '[[data.sources]]\npath = "D13/x.bin"\nweight = 1.0\n[[data.sources]]\npath = "D13/../D13/x.bin"\nweight = 1.0\n' \
  > mix.toml
refused "a mixture file twice" "are the same file; a mixture names each of its files once" train --config mix.toml \
  "${common[@]}" "${vocab[@]}" --set data.source=tokens --set log.dir=r13
refused "text source on a shard" "is a token shard (an llm.c header), and data.source = \"text\"" train "${common[@]}" \
  "${vocab[@]}" --set data.source=text --set data.path=tokens.bin --set log.dir=r13
warned "val_path beside synthetic data" "never reads it" train "${common[@]}" "${vocab[@]}" \
  --set data.val_path=tokens.bin --set log.dir=r13w3
refused "loom data of a shard" "is a token shard already" data tokens.bin again.bin
mkdir -p s13 && cp tokens.bin s13/a.bin && mkfifo s13/b.bin
timeout -k 5 60 "$loom" train "${common[@]}" "${vocab[@]}" --set data.source=tokens --set data.path=s13 --set log.dir=r13b \
  > r13b.log 2>&1 && grep -q "skipping 's13/b.bin' in shard directory 's13': a FIFO" r13b.log ||
  { fail "a FIFO among the shards: exit $? or no warning"; tail -3 r13b.log; }
mkdir -p t13 other13 && cp text.txt t13/ && cp text.txt other13/ && ln -s ../other13 t13/linked && cp tokens.bin t13/
timeout -k 5 60 "$loom" data t13 t13.bin > t13.log 2>&1 && grep -q "skipping 't13/linked'.*a link to a directory" t13.log &&
  grep -q "skipping 't13/tokens.bin'.*a token shard" t13.log || { fail "loom data DIR: links and shards unsaid"; cat t13.log; }

echo "14 resume of a manifest with a tensor more"
rm -rf c14 && mkdir c14 && cp -r ck/step-00000002 c14/
python3 - c14/step-00000002/manifest.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["tensors"]["params/extra.weight"] = m["tensors"][next(k for k in m["tensors"] if k.startswith("params/"))]
json.dump(m, open(sys.argv[1], "w"))
PY
refused "resume: a tensor more" "holds tensor params/extra.weight, which is not of the model" train "${common[@]}" \
  --set train.steps=3 --set checkpoint.resume="$dir/c14/step-00000002" --set log.dir=r14

echo "15 a stop during a long validation"
"$loom" train "${common[@]}" --set train.steps=2 --set data.val_batches=1000000000 --set fault.grace_s=30 \
  --set log.dir=r15 > r15.log 2>&1 &
run=$!
for _ in $(seq 300); do grep -qs '"step":2,' r15/metrics.jsonl && break; sleep 0.1; done
sleep 0.3
t0=$(date +%s)
kill -TERM $run
wait $run
rc=$?
[ $rc = 75 ] && [ $(($(date +%s) - t0)) -lt 10 ] && grep -q '"stopped":"SIGTERM"' r15/metrics.jsonl ||
  fail "stop during validation: exit $rc after $(($(date +%s) - t0)) s (fault.grace_s is 30)"

echo "16 supervise --log-dir that cannot be written"
refused "supervise --log-dir too long" "longer than the file system allows" supervise --log-dir "$long" -- true
mkdir -p imm
if chattr +i imm 2> /dev/null; then
  refused "supervise --log-dir immutable" "cannot hold its faults.jsonl" supervise --log-dir imm -- true
  chattr -i imm
else
  echo "(no immutable directory here: chattr needs CAP_LINUX_IMMUTABLE)"
fi

echo "17 cluster numbers"
sed 's/^peak_tflops.*/peak_tflops = 1e308/' "$here/../../examples/clusters/h200.toml" > c17a.toml
sed 's/^nodes.*/nodes = 1000000000/' "$here/../../examples/clusters/h200.toml" > c17b.toml
refused "peak_tflops 1e308" "peak_tflops\` = 1e+308 is past any device's" plan layout --cluster c17a.toml
refused "nodes 1e9" "must be a whole number from 1 to 1000000" plan layout --cluster c17b.toml

echo "18 unclear"
refused "newline in a string key" "checkpoint.resume holds a control character" train --print-config \
  --set checkpoint.resume=$'a\nb'
rm -rf c18 && mkdir c18 && cp -r ck/step-00000002 c18/
python3 -c "
import json, sys; m = json.load(open(sys.argv[1])); m['config'] = '[[['; json.dump(m, open(sys.argv[1], 'w'))" \
  c18/step-00000002/manifest.json
timeout -k 5 60 "$loom" train "${common[@]}" --set train.steps=3 --set checkpoint.every=1 --set checkpoint.dir=c18 \
  --set checkpoint.resume=latest --set log.dir=r18 > r18.log 2>&1
[ -d c18/step-00000002.unusable ] && grep -q "its manifest's config does not read" r18.log ||
  { fail "a manifest config of '[[[': not set aside as damaged"; tail -3 r18.log; }
mkdir -p r18m && head -c 3000 /dev/urandom | base64 > r18m/metrics.jsonl
refused "report of damaged metrics" "none is a record loom writes" report r18m --out r18m.html
mkdir -p e18
refused "an empty shard directory" "holds no .bin token shards$" train "${common[@]}" --set data.source=tokens \
  --set data.path=e18 --set train.steps=1 --set log.dir=r18e
rm -rf g18 && mkdir g18 && cp -r ck/step-00000002 g18/
if h5repack -f GZIP=6 ck/step-00000002/rank-00000.h5 g18/step-00000002/rank-00000.h5 2> /dev/null; then
  timeout -k 5 60 "$loom" ckpt verify g18/step-00000002 > g18.log 2>&1 || { fail "a gzip-repacked rank file"; tail -3 g18.log; }
else
  echo "(no h5repack here)"
fi

finish "malformed inputs: all held"
