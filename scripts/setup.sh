#!/usr/bin/env bash
# Installs what ctrain needs from Debian's packages when it is missing (idempotent).
# Build: gcc, make, pkg-config, OpenBLAS (+ its OpenMP build, which the Makefile prefers), cJSON, zlib; optional: Open MPI (mpi backend,
# multi-host tests), Gloo (gloo backend: `ctrain run --nnodes N` without mpirun), iproute2 (network-namespace tests); data: Fashion-MNIST.
set -euo pipefail
pkgs=(build-essential pkg-config libopenblas-dev libopenblas-openmp-dev libcjson-dev zlib1g-dev libopenmpi-dev openmpi-bin libgloo-dev
      iproute2 dataset-fashion-mnist)
. "$(dirname "$0")/apt-missing.sh"
apt_missing setup "${pkgs[@]}"
