#!/usr/bin/env bash
# --tokenizer spm against SentencePiece's own spm_encode: a BPE model with byte fallback and a
# unigram model, trained here by spm_train on the machine's copyright texts, on multilingual
# one-line documents (edge cases and English) as JSON Lines; each document's ids must be
# spm_encode's for its line, opened by <s>. A file that is not a SentencePiece model is
# refused, and so is a tokenizer.json model loom does not implement, by name. A run on the BPE
# model's shard takes its vocabulary, exports tokenizer.model, and generate uses it unasked. A
# copied binary beside a libloom_spm.so of another interface refuses it by name.
#   compare_spm.sh LOOM
set -euo pipefail
loom=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import glob, json, sys
d = sys.argv[1]
text = []
for p in sorted(glob.glob("/usr/share/common-licenses/*"))[:12]:
    try:
        text.append(open(p, encoding="utf-8").read())
    except (UnicodeDecodeError, OSError):
        pass
multi = ["caf\u00e9 na\u00efve \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587", "\u0645\u0631\u062d\u0628\u0627",
         "\U0001f642\U0001f642 \U0001f468\u200d\U0001f469\u200d\U0001f467", "123456789012345678901234567890",
         "<s> </s> <unk> it's IT'S", "     spaces  and\ttabs", "\u0938\u094d\u0924\u0947 \ud55c\uad6d\uc5b4", "x" * 200]
open(d + "/train.txt", "w", encoding="utf-8").write("\n".join(text) + "\n" + "\n".join(multi * 20) + "\n")
lines = [l.strip() for t in text for l in t.split("\n") if l.strip()][:600] + multi
with open(d + "/docs.jsonl", "w", encoding="utf-8") as f, open(d + "/docs.txt", "w", encoding="utf-8") as g:
    for l in lines:
        f.write(json.dumps({"text": l}, ensure_ascii=False) + "\n")
        g.write(l + "\n")
PY
fails=0
for type in bpe unigram; do
  spm_train --input="$dir/train.txt" --model_prefix="$dir/$type" --vocab_size=1200 --model_type=$type \
    --byte_fallback=true --character_coverage=0.9995 --minloglevel=2 > "$dir/$type.train.log" 2>&1 ||
    { cat "$dir/$type.train.log"; exit 1; }
  "$loom" data --format jsonl --tokenizer spm --tokenizer-file "$dir/$type.model" --threads 2 "$dir/docs.jsonl" \
    "$dir/$type.bin" > "$dir/$type.log" 2>&1 || { cat "$dir/$type.log"; exit 1; }
  spm_encode --model="$dir/$type.model" --output_format=id < "$dir/docs.txt" > "$dir/$type.ids"
  python3 - "$dir/$type.bin" "$dir/$type.ids" "$type" <<'PY' || fails=$((fails + 1))
import struct, sys
shard, ref, name = sys.argv[1:]
b = open(shard, "rb").read()
h = struct.unpack("<256i", b[:1024])
ids = list(struct.unpack("<%dH" % h[2], b[1024:1024 + h[2] * 2]))
want = []
for line in open(ref):
    want += [1] + [int(x) for x in line.split()]
assert b[36:39] == b"spm" and h[5] == 1200 and h[6] == 1, (b[36:44], h[5], h[6])
if ids != want:
    i = next((k for k, (a, c) in enumerate(zip(ids, want)) if a != c), min(len(ids), len(want)))
    sys.exit("%s: loom %s, spm_encode %s at %d" % (name, ids[max(0, i - 3):i + 5], want[max(0, i - 3):i + 5], i))
print("spm %s: %d ids identical to spm_encode's" % (name, len(ids)))
PY
done
# The shard trains with the model's vocabulary; the export carries the model.
"$loom" train --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.seq_len=16 \
  --set train.micro_batch=2 --set train.global_batch=2 --set train.threads=1 --set train.steps=1 \
  --set data.val_batches=0 --set data.path="$dir/bpe.bin" --set log.dir="$dir/log" --set export.final="$dir/hf/" \
  > "$dir/train.log" 2>&1 || { cat "$dir/train.log"; exit 1; }
grep -q '"vocab_size": 1200' "$dir/hf/config.json" && cmp -s "$dir/hf/tokenizer.model" "$dir/bpe.model" &&
  grep -q LlamaTokenizer "$dir/hf/tokenizer_config.json" || { echo "FAIL: the export lacks the model"; fails=$((fails + 1)); }
"$loom" generate --from "$dir/hf/" --prompt "the" --max-new 2 > "$dir/gen.log" 2>&1 &&
  grep -q "tokenizer spm, recorded with the weights" "$dir/gen.log" || { cat "$dir/gen.log"; fails=$((fails + 1)); }
# Refusals, one line each: a file that is not a SentencePiece model; a model loom lacks.
printf 'not a model' > "$dir/bad.model"
"$loom" data --tokenizer spm --tokenizer-file "$dir/bad.model" "$dir/docs.txt" "$dir/x.bin" > /dev/null 2> "$dir/err" &&
  { echo "FAIL: a file that is not a model was read"; fails=$((fails + 1)); }
grep -q "is not a SentencePiece model" "$dir/err" || { cat "$dir/err"; fails=$((fails + 1)); }
printf '{"model": {"type": "WordPiece", "vocab": {"a": 0}}}' > "$dir/wp.json"
"$loom" data --tokenizer hf --tokenizer-file "$dir/wp.json" "$dir/docs.txt" "$dir/x.bin" > /dev/null 2> "$dir/err" &&
  { echo "FAIL: a WordPiece tokenizer was read"; fails=$((fails + 1)); }
grep -q "the tokenizer's model is WordPiece; loom implements BPE" "$dir/err" || { cat "$dir/err"; fails=$((fails + 1)); }
# A copied binary beside a libloom_spm.so of another interface: refused naming it, never called.
mkdir "$dir/copy"
cp "$loom" "$dir/copy/loom"
printf 'int loom_spm_abi(void) { return 999; }\n' > "$dir/abi.c"
cc -shared -fPIC -o "$dir/copy/libloom_spm.so" "$dir/abi.c"
"$dir/copy/loom" data --tokenizer spm --tokenizer-file "$dir/bpe.model" "$dir/docs.txt" "$dir/x.bin" > /dev/null \
  2> "$dir/err" && { echo "FAIL: a wrapper of another interface was used"; fails=$((fails + 1)); }
grep -q "libloom_spm.so' is loom's SentencePiece wrapper of another build (interface 999" "$dir/err" ||
  { cat "$dir/err"; fails=$((fails + 1)); }
exit $((fails > 0))
