#!/usr/bin/env bash
# Outputs never replace a user's files, through the binary:
#    2 a directory export (export.final = DIR/, ckpt export STEP DIR/) checks every file it
#      writes as it checks the weights: a user's config.json, vocab.json, merges.txt is refused,
#      named, and stays; loom's own earlier export is replaced;
#    3 a user's file named OUTPUT.tmp stays as it was (loom data, ckpt export, report --out,
#      export.final, log.dir's config.toml): loom's temporaries have names of their own;
#   11 an existing directory given without the trailing '/' (export.final, ckpt export) is
#      refused, not written into.
#   outputs_keep_user_files.sh LOOM
set -uo pipefail
loom=$1
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir"
common=(--set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.vocab_size=64
        --set model.seq_len=8 --set train.global_batch=2 --set train.micro_batch=2 --set train.threads=1
        --set train.device=cpu --set data.val_batches=0)
ok() {  # CASE LOOM-ARGS...: status 0
  local name=$1
  shift
  n=$((n + 1))
  timeout -k 5 60 "$loom" "$@" > "out$n.log" 2>&1 < /dev/null || { fail "$name: exit $?"; tail -3 "out$n.log"; }
}
same() { cmp -s "$1" "$2" || fail "$3: '$1' was replaced"; }

run_or_show r0.log "$loom" train "${common[@]}" --set train.steps=2 --set checkpoint.every=2 \
  --set checkpoint.dir=ck --set log.dir=r0
step=ck/step-00000002
mkdir -p tok && echo '{"a": 0, "b": 1, "<|endoftext|>": 2}' > tok/vocab.json && printf '#version: 0.2\na b\n' > tok/merges.txt
gpt2=(--set data.tokenizer=gpt2 --set data.tokenizer_dir="$dir/tok")

echo "2 directory exports"
mkdir -p app && echo '{"theme": "dark"}' > app/config.json && cp app/config.json config.orig
refused "export.final DIR/ over a config.json" "would replace 'app/config.json', which is not a Hugging Face model config" \
  train "${common[@]}" --set train.steps=1 --set export.final=app/ --set log.dir=r1
refused "ckpt export DIR/ over a config.json" "would replace 'app/config.json'" ckpt export $step app/
same app/config.json config.orig "a user's config.json"
[ ! -e app/model.safetensors ] || fail "a refused export wrote model.safetensors"
mkdir -p t1 && echo "my words" > t1/vocab.json && cp t1/vocab.json vocab.orig
refused "export.final over a vocab.json" "would replace 't1/vocab.json', which is not a tokenizer vocabulary" \
  train "${common[@]}" "${gpt2[@]}" --set train.steps=1 --set export.final=t1/ --set log.dir=r2
same t1/vocab.json vocab.orig "a user's vocab.json"
mkdir -p t2 && echo "my merges" > t2/merges.txt && cp t2/merges.txt merges.orig
refused "export.final over a merges.txt" "would replace 't2/merges.txt', which is not a merges file" \
  train "${common[@]}" "${gpt2[@]}" --set train.steps=1 --set export.final=t2/ --set log.dir=r3
same t2/merges.txt merges.orig "a user's merges.txt"
# loom's own export, and then the same again over it.
ok "export.final into a new directory" train "${common[@]}" "${gpt2[@]}" --set train.steps=1 --set export.final=hf/ \
  --set log.dir=r4
ok "export.final over loom's own export" train "${common[@]}" "${gpt2[@]}" --set train.steps=1 --set export.final=hf/ \
  --set log.dir=r5
ok "ckpt export over loom's own export" ckpt export $step hf/
[ -s hf/model.safetensors ] && [ -s hf/config.json ] && [ -s hf/vocab.json ] && [ -s hf/merges.txt ] ||
  fail "the export is not whole: $(ls hf)"

echo "11 a directory named without '/'"
refused "export.final DIR" "is a directory; a Hugging Face directory export names it with a trailing '/'" \
  train "${common[@]}" --set train.steps=1 --set export.final=app --set log.dir=r6
refused "ckpt export STEP DIR" "is a directory; a Hugging Face directory export names it with a trailing '/'" \
  ckpt export $step app
same app/config.json config.orig "export into a directory named without '/'"
touch afile
refused "export.final FILE/" "'afile' is a file, not a directory" train "${common[@]}" --set train.steps=1 \
  --set export.final=afile/ --set log.dir=r7

echo "3 a user's OUTPUT.tmp"
printf 'some text to make a shard of\n' > in.txt
for f in shard.bin.tmp w.safetensors.tmp page.html.tmp; do echo "the user's $f" > "$f"; cp "$f" "$f.orig"; done
mkdir -p r8 && echo "the user's config.toml.tmp" > r8/config.toml.tmp && cp r8/config.toml.tmp ctmp.orig
ok "loom data" data in.txt shard.bin
ok "ckpt export" ckpt export $step w.safetensors
ok "export.final and log.dir" train "${common[@]}" --set train.steps=1 --set export.final="$dir/w.safetensors" \
  --set log.dir=r8
ok "report --out" report r8 --out page.html
for f in shard.bin.tmp w.safetensors.tmp page.html.tmp; do same "$f" "$f.orig" "a user's $f"; done
same r8/config.toml.tmp ctmp.orig "a user's config.toml.tmp"
left=$(find . -name '*.tmp-*' | head -3)
[ -z "$left" ] || fail "temporaries left behind: $left"

finish "outputs keep user files: all held"
