#!/usr/bin/env bash
# The CUDA kernels of src/cuda run on the CPU: tests/tools/cuda_emu/transform.py rewrites each
# .cu (kernel launches, dynamic shared memory) for tests/tools/cuda_emu/cuda_emu.h, which
# emulates blocks, __syncthreads and warp shuffles with host threads; emu_kernels.cc then
# checks the kernels against the CPU ops of libctrain (elementwise, views, softmax, layer
# norm, cross-entropy, embedding, max pooling, bias_add, mse, casts, Llama's rms_norm, silu, rope and
# repeat_kv, the optimizer and norm
# passes, flash attention in rows and in tiles, f32, bf16 and f16). Needs a C++ compiler and
# python3, not CUDA; it checks the kernels' code (indexing, masks, reduction order), not the GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${CT_BUILD:-build}
[ -f "$B/libctrain.a" ] || { echo "no $B/libctrain.a (make first)"; exit 1; }
command -v g++ >/dev/null && command -v python3 >/dev/null || { echo "needs g++ and python3"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. tests/scripts/lib/cuda_emu.sh
emu_flags "$B/libctrain.a"
emu_objects "$tmp" || exit 1
g++ "${emu_cxx[@]}" -fopenmp tests/tools/cuda_emu/emu_kernels.cc tests/tools/cuda_emu/emu_runtime.cc "${objs[@]}" "$B/libctrain.a" \
    $(emu_libs) -fopenmp -lpthread -lm -o "$tmp/emu_kernels" || exit 1
"$tmp/emu_kernels"
