#!/usr/bin/env bash
# The tiled flash attention kernels (src/cuda/attention_tiled_kernels.cuh) run on the CPU by
# tests/tools/cuda_emu_attention.cc (a host thread per CUDA thread, barriers for
# __syncthreads and the shuffles) against the row functions of ops/kmath.h: forward and
# backward, head dims 32 and 64, causal or not, sequence lengths on and off the 64-row tiles.
# Needs a C++ compiler only (no CUDA), so it runs everywhere.
set -uo pipefail
cd "$(dirname "$0")/../.."
command -v g++ >/dev/null || { echo "no g++"; exit 1; }
bin=$(mktemp)
trap 'rm -f "$bin"' EXIT
g++ -std=c++17 -O2 -Wall -Wextra -Werror -Wno-unknown-pragmas -Iinclude -Isrc tests/tools/cuda_emu_attention.cc -o "$bin" \
    -lpthread || exit 1
rc=0
for c in "257 64 1" "100 32 0" "130 32 1" "64 64 0" "1 32 1" "65 64 0"; do
    # shellcheck disable=SC2086
    "$bin" $c || rc=1
done
exit $rc
