#!/usr/bin/env bash
# Run on a machine that reaches Debian's registry, before a GPU lease: downloads the .deb files
# of the libraries loom builds with into .deps/debs (ignored by git; name `.deps` in the device
# tool's carry list). tools/device_check.sh unpacks them into .deps/root, not into /, and
# points CMake there, because the GPU machine reaches no registry. Open MPI comes with the
# runtime libraries its launcher and plugins load (relocated through OPAL_PREFIX), so that
# 2-rank layouts can be checked on one GPU over the MPI-staged path.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
cd .deps/debs
apt-get download libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libtomlplusplus-dev libtomlplusplus3 libcli11-dev \
  nlohmann-json3-dev libgtest-dev googletest libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev \
  libgfortran5 libquadmath0
# TensorBoard's event files: protobuf and its compiler.
apt-get download libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32
# Checkpoints: HDF5 (serial) and xxHash (libhdf5's libcurl is assumed present on the GPU host).
apt-get download libhdf5-dev libhdf5-103-1 libhdf5-hl-100 libaec0 libsz2 libxxhash-dev libxxhash0
apt-get download openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libhwloc15 libevent-core-2.1-7 \
  libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200 \
  libpsm2-2 libpsm-infinipath1 libnuma1 libpciaccess0 libmunge2 libxnvctrl0 libx11-6 libxext6 libxcb1 libxau6 \
  libxdmcp6 libbsd0 libmd0 libxml2 libicu72 ocl-icd-libopencl1 libatomic1
ls -1 | wc -l
