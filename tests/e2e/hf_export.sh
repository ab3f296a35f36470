#!/usr/bin/env bash
# export.final = "DIR/" writes a directory transformers loads as it is: hf_reader.py reads its
# config.json and model.safetensors with nothing of loom's, runs GPT-2 and LLaMA (GQA) forward
# as transformers defines them, and its loss on a text must be loom eval's on the same text.
#   hf_export.sh LOOM READER
set -euo pipefail
loom=$1 reader=$2
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir"
python3 -c "
import random
random.seed(3)
words = 'the quick brown fox jumps over lazy dog and cat'.split()
open('text.txt', 'w').write(' '.join(random.choice(words) for _ in range(400)))"
common=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=256
        --set model.seq_len=16 --set train.micro_batch=4 --set train.global_batch=4 --set train.threads=1
        --set train.steps=20 --set data.val_batches=1 --set data.source=text --set data.path=text.txt)
for arch in gpt2 llama; do
  extra=()
  [ $arch = llama ] && extra=(--set model.arch=llama --set model.n_kv_head=2)
  "$loom" train "${common[@]}" "${extra[@]}" --set log.dir="log_$arch" --set export.final="$arch/" > "$arch.log" 2>&1 ||
    { cat "$arch.log"; exit 1; }
  [ -f "$arch/config.json" ] && [ -f "$arch/model.safetensors" ] || die "$arch/ is not a Hugging Face directory"
  ours=$("$loom" eval --from "$arch/" --data text.txt --batches 1 | sed -n 's/.*: loss \([0-9.]*\),.*/\1/p')
  seqs=$("$loom" eval --from "$arch/" --data text.txt --batches 1 | sed -n 's/.*(1 batch of \([0-9]*\) x.*/\1/p')
  theirs=$(python3 "$reader" "$arch" text.txt "$seqs" 16 | awk '{print $3}')
  echo "$arch: loom eval $ours, read as transformers reads it $theirs"
  python3 -c "import sys; a, b = float('$ours'), float('$theirs'); sys.exit(abs(a - b) > 1e-4 * abs(b))" ||
    die "$arch: the exported directory computes another model"
  [ $arch = gpt2 ] && gpt2_loss=$theirs gpt2_seqs=$seqs
done
# The reader has teeth: a config.json that says another epsilon changes its loss.
sed -i 's/"layer_norm_epsilon": 1e-05/"layer_norm_epsilon": 0.5/' gpt2/config.json
grep -q '"layer_norm_epsilon": 0.5' gpt2/config.json || die "the config was not changed"
bad=$(python3 "$reader" gpt2 text.txt "$gpt2_seqs" 16 | awk '{print $3}')
python3 -c "import sys; sys.exit(abs(float('$bad') - float('$gpt2_loss')) < 1e-3)" ||
  die "the reader did not read the config's epsilon"
echo "hf_export: ok"
