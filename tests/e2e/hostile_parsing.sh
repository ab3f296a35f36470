#!/usr/bin/env bash
# Hostile input of the third pass, through the binary: each ends with loom's one-line error and
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
#      empty file (a shard of 0 tokens).
#   hostile_parsing.sh LOOM
set -uo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
common=(--set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.vocab_size=64
        --set model.seq_len=8 --set train.global_batch=2 --set train.micro_batch=2 --set train.threads=1
        --set train.device=cpu --set data.val_batches=0)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
n=0
# refused CASE WANT LOOM-ARGS...: status 2 within 60 s, saying WANT, in loom's words.
refused() {
  local name=$1 want=$2
  shift 2
  n=$((n + 1))
  timeout -k 5 60 "$loom" "$@" > "out$n.log" 2>&1 < /dev/null
  local rc=$?
  [ $rc = 2 ] || { fail "$name: exit $rc, not 2"; tail -3 "out$n.log"; return; }
  grep -q -- "$want" "out$n.log" || { fail "$name: did not say '$want'"; tail -3 "out$n.log"; }
  grep -q "terminate called\|what():\|\[json.exception\|filesystem error" "out$n.log" && fail "$name: a raw library message"
}
"$loom" train "${common[@]}" --set train.steps=2 --set checkpoint.every=2 --set checkpoint.dir=ck \
  --set export.final="$dir/w.safetensors" --set log.dir=r0 > r0.log 2>&1 || { cat r0.log; exit 1; }
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

[ $fails = 0 ] && echo "hostile parsing: all held" || { echo "$fails failures"; exit 1; }
