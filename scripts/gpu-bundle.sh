#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs, here, for a GPU machine that has the driver, the CUDA
# runtime and NCCL but not ctrain's other build dependencies (OpenBLAS, cJSON headers), and
# packs it with the shared libraries it needs beyond those:
#
#   scripts/gpu-bundle.sh [OUT.tar.xz]     default gpu-bundle/bundle.tar.xz; CUDA_ARCHS (90)
#   # there:  tar xJf bundle.tar.xz && GPU_CHECK_PREBUILT=1 scripts/gpu-check.sh
#
# The code is built for x86-64-v3 (AVX2, FMA), not -march=native, as the other machine's
# processor is not this one's; MPI and Gloo are left out (NCCL is the GPU backend).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle/bundle.tar.xz}
archs=${CUDA_ARCHS:-90}
B=build-gpu
make -j"$(nproc)" BUILD=$B CUDA=1 CUDA_ARCHS="$archs" PKG_MPI= HAVE_GLOO= OPT="-O3 -march=x86-64-v3" \
    $B/ctrain $B/tests/test_gpu_kernels $B/tests/test_gpu_ops $B/tests/test_gpu_train $B/tests/test_gpu_conv $B/tests/test_device \
    $B/tests/test_gpu_dist $B/tests/test_kmath $B/bench/gpu_gpt2 >&2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/tests" "$stage/build/bench" "$stage/build/lib"
cp $B/ctrain "$stage/build/"
cp $B/tests/test_gpu_kernels $B/tests/test_gpu_ops $B/tests/test_gpu_train $B/tests/test_gpu_conv $B/tests/test_device $B/tests/test_gpu_dist $B/tests/test_kmath \
    "$stage/build/tests/"
cp $B/bench/gpu_gpt2 "$stage/build/bench/"
# every library the binaries load but the C library, the C++ runtime, the driver's and the
# CUDA toolkit's (those come with the GPU machine)
ldd $B/ctrain $B/tests/test_gpu_train | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/usr/local/cuda' |
    while read -r lib; do cp -L "$lib" "$stage/build/lib/"; done
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" build
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1)): $(cd "$stage" && find build -type f | sort | tr '\n' ' ')"
