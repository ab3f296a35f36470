#!/usr/bin/env bash
# loom data on JSON Lines, through the binary: the same documents as text files and as
# .jsonl, .jsonl.gz and .jsonl.zst records give byte-identical shards (any thread count, with a
# validation split), whose ids are the records' bytes as read here in Python; past
# --shard-tokens, numbered shards; each bad record (one longer than --max-record too) is a
# one-line error naming its file and line, leaving no output (an earlier one stays as it was),
# or with --skip-bad a count; JSON or compressed data given as text is refused naming --format
# jsonl, skipped in a text directory; a highly compressed file streams in bounded memory, and
# a long record takes its planned share; the shard still reads as llm.c's loader reads it, and
# records its tokenizer.
#   data_jsonl.sh LOOM
set -uo pipefail
loom=$(realpath "$1")
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir" || exit 1

# A tiny GPT-2 vocabulary: bytes stand for themselves, <|endoftext|> opens each document.
python3 - <<'PY'
import json
printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
extra, table = 0, {}
for b in range(256):
    if b in printable:
        table[b] = chr(b)
    else:
        table[b] = chr(256 + extra)
        extra += 1
vocab = {table[b]: b for b in range(256)}
vocab["th"] = 256; vocab["the"] = 257; vocab["\u0120the"] = 258; vocab["<|endoftext|>"] = 259
json.dump(vocab, open("vocab.json", "w"))
open("merges.txt", "w").write("#version: 0.2\nt h\nth e\n\u0120 the\n")
# Documents with what JSON escapes: quotes, backslashes, newlines, tabs, non-ASCII, an empty one.
docs = ["the cat sat on the mat\nand the dog ran", "", "quotes \" and \\ backslashes\ttabs",
        "caf\u00e9 \u65e5\u672c\u8a9e \U0001f642 na\u00efve", "line one\n\nline three\r\nend\n"]
docs += ["document %d: the quick brown fox jumps over the lazy dog. " % i * (1 + i % 7) for i in range(200)]
docs.append("x\ny " * 400000)  # 1.6 MB: cut into pieces for the threads
import os
os.makedirs("texts")
with open("c.jsonl", "w", encoding="utf-8") as f:
    for i, d in enumerate(docs):
        open("texts/d%04d.txt" % i, "w", encoding="utf-8", newline="").write(d)
        # Escaped both ways, with keys around the text and blank lines between records.
        f.write(json.dumps({"id": i, "text": d, "meta": {"k": [1, 2]}}, ensure_ascii=(i % 2 == 0)) + "\n")
        if i % 50 == 0:
            f.write("\n  \n")
PY
gzip -k c.jsonl && zstd -q -k c.jsonl && cp c.jsonl c2.jsonl && cat c.jsonl.gz c.jsonl.gz > twice.jsonl.gz
tok=(--tokenizer gpt2 --vocab vocab.json --merges merges.txt)
"$loom" data "${tok[@]}" texts t.bin > t.log 2>&1 || { cat t.log; fail "texts"; }
for f in c.jsonl c.jsonl.gz c.jsonl.zst; do
  for threads in 1 2; do
    "$loom" data "${tok[@]}" --format jsonl --threads $threads $f j.bin > j.log 2>&1 || { cat j.log; fail "$f"; }
    cmp -s t.bin j.bin || fail "$f on $threads threads: the shard differs from the text files'"
  done
done
grep -q "from 206 documents" j.log || { cat j.log; fail "not 206 documents"; }
# The shard's contents against the records read here, not through loom: with GPT-2's byte
# alphabet and no merges, a document is <|endoftext|> (256) and then its UTF-8 bytes.
python3 - <<'PY'
import json
vocab = json.load(open("vocab.json"))
json.dump({t: i for t, i in vocab.items() if i < 256} | {"<|endoftext|>": 256}, open("bytes.json", "w"))
open("none.txt", "w").write("#version: 0.2\n")
PY
for threads in 1 2; do
  "$loom" data --tokenizer gpt2 --vocab bytes.json --merges none.txt --format jsonl --threads $threads c.jsonl.gz \
    b.bin > b.log 2>&1 || { cat b.log; fail "bytes"; }
  python3 - <<'PY' || fail "the shard on $threads threads is not the records' bytes, each opened by 256"
import json, struct
want = []
for line in open("c.jsonl", encoding="utf-8"):
    if line.strip():
        want += [256] + list(json.loads(line)["text"].encode("utf-8"))
b = open("b.bin", "rb").read()
h = struct.unpack("<256i", b[:1024])
got = list(struct.unpack("<%dH" % h[2], b[1024:]))
assert (h[5], h[6]) == (257, 256) and got == want, (h[5], h[6], len(got), len(want))
PY
done
# Concatenated gzip members are one stream: twice the documents.
"$loom" data "${tok[@]}" --format jsonl twice.jsonl.gz w.bin > w.log 2>&1 && grep -q "from 412 documents" w.log ||
  { cat w.log; fail "two gzip members"; }
# A validation split: the same last documents either way.
"$loom" data "${tok[@]}" texts ts.bin --val-fraction 0.1 > /dev/null 2>&1 || fail "texts split"
"$loom" data "${tok[@]}" --format jsonl c.jsonl.zst js.bin --val-fraction 0.1 > js.log 2>&1 || { cat js.log; fail "split"; }
cmp -s ts.bin js.bin && cmp -s ts_val.bin js_val.bin || fail "the split differs between text and JSON Lines"
grep -q "^validation: the last 21 of 206 documents" js.log || { cat js.log; fail "split line"; }

# More tokens than --shard-tokens: numbered shards, each whole with its record, holding in order
# the tokens of the one shard (the validation split too); made again with room for all, the
# numbered shards of the first run are removed.
mkdir rdir
"$loom" data "${tok[@]}" --shard-tokens 400000 texts rdir/r.bin --val-fraction 0.1 > r.log 2>&1 ||
  { cat r.log; fail "numbered shards"; }
grep -q "^a shard holds at most 400000 tokens (--shard-tokens): train on the shards' directory" r.log ||
  { cat r.log; fail "numbered shards: no advice"; }
# numbered MAX: rdir's shards of each output, in order, hold ts.bin's and ts_val.bin's tokens.
numbered() {
  python3 - "$1" <<'PY'
import glob, struct, sys
most = int(sys.argv[1])
def tokens(path):
    b = open(path, "rb").read()
    h = struct.unpack("<256i", b[:1024])
    assert h[3] == 0x6d6f6f6c and h[5] == 260, (path, h[3:7])
    return h[2], list(struct.unpack("<%dH" % h[2], b[1024:]))
for stem, whole in (("r", "ts.bin"), ("r_val", "ts_val.bin")):
    names = ["rdir/%s.bin" % stem] + sorted(glob.glob("rdir/%s_0*.bin" % stem))
    counts, ids = zip(*map(tokens, names))
    assert all(c == most for c in counts[:-1]) and 0 < counts[-1] <= most, (names, counts)
    assert sum(ids, []) == tokens(whole)[1], stem
print("numbered shards of at most %d tokens: %s" % (most, sorted(glob.glob("rdir/*"))))
PY
}
numbered 400000 || fail "numbered shards differ from the one shard"
[ -f rdir/r_val_000004.bin ] || fail "not several numbered shards: $(ls rdir)"
"$loom" data "${tok[@]}" --shard-tokens 1500000 texts rdir/r.bin --val-fraction 0.1 > r.log 2>&1 ||
  { cat r.log; fail "numbered shards again"; }
numbered 1500000 || fail "numbered shards made again differ"
[ "$(ls rdir | tr '\n' ' ')" = "r.bin r_val.bin r_val_000001.bin " ] || fail "stale numbered shards stay: $(ls rdir)"

# llm.c's loader's checks (its header reader, restated): magic, version, count > 0, and the
# file's size exactly header + count tokens. Then loom's record in the spare words.
python3 - t.bin <<'PY' || fail "the shard is not what llm.c's reader takes, or its record is wrong"
import os, struct, sys
b = open(sys.argv[1], "rb").read(1024)
h = struct.unpack("<256i", b)
assert h[0] == 20240520 and h[1] == 1, h[:3]
assert h[2] > 0 and os.path.getsize(sys.argv[1]) == 256 * 4 + h[2] * 2
assert h[3] == 0x6d6f6f6c and h[4] == 1, "no record"
assert h[5] == 260 and h[6] == 259, h[5:7]
kind = b[36:68].split(b"\0")[0].decode()
files = b[68:].split(b"\0")[0].decode().split("\n")
assert kind == "gpt2" and [os.path.basename(f) for f in files] == ["vocab.json", "merges.txt"], (kind, files)
PY

# Bad input: one line on stderr naming file and line, status 2, no output (an old one kept).
cp t.bin keep.bin
bad() {  # NAME PATTERN FILE [OPTION...]
  "$loom" data "${tok[@]}" --format jsonl "${@:4}" "$3" keep.bin > out.log 2> err.log
  local rc=$?
  [ $rc = 2 ] || { cat out.log err.log; fail "$1: exit $rc, not 2"; }
  grep -q -- "$2" err.log || { cat err.log; fail "$1: no '$2'"; }
  [ "$(grep -c . err.log)" = 1 ] && [ "$(wc -c < err.log)" -lt 400 ] || { head -c 600 err.log; fail "$1: not one short line"; }
  cmp -s keep.bin t.bin || fail "$1: the output was replaced"
  if compgen -G "keep*.tmp" > /dev/null || compgen -G "keep_val*" > /dev/null; then fail "$1: something partial was left: $(ls keep*)"; fi
}
printf '{"text": "a"}\n{"text": "b"\n{"text": "c"}\n' > badjson.jsonl
bad "not JSON" "'badjson.jsonl' line 2: not valid JSON" badjson.jsonl
bad "not JSON, with a split" "'badjson.jsonl' line 2: not valid JSON" badjson.jsonl --val-fraction 0.5
printf '{"text": "a"}\n\n{"body": "b", "id": 3}\n' > nokey.jsonl
bad "key missing" "'nokey.jsonl' line 3: no \"text\" key (it has \"body\", \"id\"; choose the key with --text-key)" nokey.jsonl
printf '{"text": "a"}\n{"text": 42}\n' > number.jsonl
bad "not a string" "'number.jsonl' line 2: \"text\" is a number, not a string" number.jsonl
printf '{"text": "a\xff\xfeb"}\n' > utf8.jsonl
bad "invalid UTF-8" "'utf8.jsonl' line 1: invalid UTF-8 at byte 12 of the line" utf8.jsonl
printf '{"text": "a"}\n{"text": "\\ud800"}\n' > surrogate.jsonl
bad "lone surrogate" "'surrogate.jsonl' line 2: invalid UTF-8 in a string: a lone surrogate" surrogate.jsonl
printf '{"text": "a"}{"text": "b"}\n' > joined.jsonl
python3 -c "print('{\"text\": \"' + 'long ' * 100000)" > open.jsonl
bad "a string never closed" "'open.jsonl' line 1: not valid JSON (column" open.jsonl
bad "two records on a line" "'joined.jsonl' line 1: not valid JSON" joined.jsonl
printf '["text"]\n' > array.jsonl
bad "not an object" "'array.jsonl' line 1: an array, not a JSON object" array.jsonl
head -c $(($(stat -c %s c.jsonl.zst) / 2)) c.jsonl.zst > cut.jsonl.zst
bad "truncated zstd" "'cut.jsonl.zst': the zstd stream ends early in line [0-9]* (the file is cut short)" cut.jsonl.zst
head -c $(($(stat -c %s c.jsonl.gz) / 2)) c.jsonl.gz > cut.jsonl.gz
bad "truncated gzip" "'cut.jsonl.gz': the gzip stream ends early in line [0-9]* (the file is cut short)" cut.jsonl.gz
printf 'plain text' > notgz.jsonl.gz
bad "named gz, not gzip" "'notgz.jsonl.gz' is named as compressed but holds neither gzip nor zstd" notgz.jsonl.gz
# --skip-bad: the good records, and a count.
cat badjson.jsonl nokey.jsonl number.jsonl utf8.jsonl > mixed.jsonl
"$loom" data "${tok[@]}" --format jsonl --skip-bad mixed.jsonl m.bin > m.log 2>&1 || { cat m.log; fail "--skip-bad"; }
grep -q "from 4 documents" m.log && grep -q "^skipped 4 bad records (--skip-bad); the first: 'mixed.jsonl' line 2" m.log ||
  { cat m.log; fail "--skip-bad count"; }
# JSON or compressed data given as text: refused with the option to use (a gzip file named .txt
# by its first bytes); in a directory of text, skipped with a warning naming it, as before.
gzip -c texts/d0000.txt > gz.txt
for input in c.jsonl c.jsonl.zst gz.txt; do
  "$loom" data "${tok[@]}" "$input" keep.bin > out.log 2> err.log
  [ $? = 2 ] && grep -q "is named as JSON.*pass --format jsonl\|is compressed (.*--format jsonl" err.log ||
    { cat err.log; fail "$input as text was not refused naming --format jsonl"; }
done
grep -q "'gz.txt' is compressed (gzip data)" err.log || { cat err.log; fail "gz.txt: not named as gzip data"; }
mkdir jdir && cp texts/d000[0-4].txt jdir/ && cp c.jsonl jdir/README.json && cp c.jsonl.gz jdir/ && cp gz.txt jdir/
mkdir jtexts && cp texts/d000[0-4].txt jtexts/
"$loom" data "${tok[@]}" jdir jd.bin > jd.log 2>&1 && "$loom" data "${tok[@]}" jtexts jt.bin > /dev/null 2>&1 &&
  cmp -s jd.bin jt.bin || { cat jd.log; fail "a text directory holding JSON and compressed files"; }
for f in README.json c.jsonl.gz gz.txt; do
  grep -q "warning: skipping 'jdir/$f' in input directory 'jdir'" jd.log || { cat jd.log; fail "no warning for $f"; }
done

# Bounded memory, streamed: 48 MB and 96 MB of records compressed to a few kB; the larger file's
# peak must stay within a quarter of its extra 48 MB over the smaller's (reading a file whole
# would add all 48 MB, and its byte tokens 190 MB more).
for mb in 48 96; do
  python3 -c "
import json, sys
line = json.dumps({'text': 'a' * 1000}) + '\n'
sys.stdout.write(line * ($mb * 1000))" | zstd -q -19 > big$mb.jsonl.zst
  /usr/bin/time -f "%M" -o rss$mb.txt "$loom" data --format jsonl --threads 2 big$mb.jsonl.zst big.bin > big.log 2>&1 ||
    { cat big.log; fail "big $mb"; }
  [ "$(stat -c %s big.bin)" = $((1024 + mb * 1000 * 1000 * 2)) ] || fail "big.bin is not $mb M byte tokens"
done
rss48=$(($(tail -1 rss48.txt) / 1024)) rss96=$(($(tail -1 rss96.txt) / 1024))
echo "48 and 96 MB of records from $(stat -c %s big96.jsonl.zst) bytes of zstd: resident peaks $rss48 and $rss96 MB"
[ -n "${LOOM_SANITIZED:-}" ] || [ $((rss96 - rss48)) -lt 12 ] || fail "the peak grew by $((rss96 - rss48)) MB with 48 MB more records: not streamed"

# One long record of mostly " the" (a token): memory within --max-record's plan (8 bytes per
# byte of the record over a run of a short one): a record's line is handed over, parsed as
# events, and its pieces made as they are merged (held whole, they took 30 bytes per byte).
python3 -c "
import json, random
random.seed(7)
words = ['the'] * 12 + ['cat', 'sat', 'on', 'caf\u00e9', '\u65e5\u672c']
text = ' '.join(random.choice(words) + (' \n' if random.random() < 0.05 else '') for _ in range(4 << 20))
print(json.dumps({'text': text[:24 << 20]}))" > long.jsonl
printf '{"text": "short"}\n' > short.jsonl
for f in short long; do
  /usr/bin/time -f "%M" -o rss_$f.txt "$loom" data "${tok[@]}" --format jsonl --threads 2 $f.jsonl $f.bin > $f.log 2>&1 ||
    { cat $f.log; fail "$f record"; }
done
grown=$((($(tail -1 rss_long.txt) - $(tail -1 rss_short.txt)) / 1024)) record=$(($(stat -c %s long.jsonl) >> 20))
echo "a record of $record MB: the resident peak $grown MB above a short record's"
# (Under a sanitizer, tests/sanitized.sh, memory is its allocator's: redzones, quarantine.)
[ -n "${LOOM_SANITIZED:-}" ] || [ $grown -lt $((record * 8)) ] || fail "a $record MB record took $grown MB: over 8 bytes per byte"
# Longer than --max-record: a bad record, named with its file and line, or skipped and counted.
python3 -c "
import json
for t in ['a', 'b' * 1500000, 'c']: print(json.dumps({'text': t}))" > over.jsonl
bad "longer than --max-record" "'over.jsonl' line 2 is longer than 1 MB (--max-record)" over.jsonl --max-record 1
"$loom" data --format jsonl --max-record 1 --skip-bad over.jsonl o.bin > o.log 2>&1 &&
  grep -q "from 2 documents" o.log && grep -q "skipped 1 bad record (--skip-bad); the first: 'over.jsonl' line 2: longer than 1 MB" o.log ||
  { cat o.log; fail "--skip-bad over --max-record"; }

finish ok
