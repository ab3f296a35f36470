#!/usr/bin/env bash
# Run on a machine that reaches Debian's registry, before a GPU lease: downloads the .deb files
# of the libraries loom builds with into .deps/debs (ignored by git; name `.deps` in the device
# tool's carry list). launch/device_check.sh unpacks them into .deps/root, not into /, and
# points CMake there, because the GPU machine reaches no registry.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
cd .deps/debs
apt-get download libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libtomlplusplus-dev libtomlplusplus3 libcli11-dev \
  nlohmann-json3-dev libgtest-dev googletest libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev \
  libgfortran5 libquadmath0
ls -1 | wc -l
