#!/usr/bin/env bash
# Installs what ctrain needs from Debian's packages when it is missing (idempotent).
# Build: gcc, make, pkg-config, OpenBLAS (+ its OpenMP build, which the Makefile prefers), cJSON, zlib; optional: Open MPI (mpi backend,
# multi-host tests), Gloo (gloo backend: `ctrain run --nnodes N` without mpirun), iproute2 (network-namespace tests); data: Fashion-MNIST.
set -euo pipefail
pkgs=(build-essential pkg-config libopenblas-dev libopenblas-openmp-dev libcjson-dev zlib1g-dev libopenmpi-dev openmpi-bin libgloo-dev
      iproute2 dataset-fashion-mnist)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then echo "setup: all packages present"; exit 0; fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
