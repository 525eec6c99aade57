#!/usr/bin/env bash
# The CUDA kernels of src/cuda run on the CPU: tests/tools/cuda_emu/transform.py rewrites each
# .cu (kernel launches, dynamic shared memory) for tests/tools/cuda_emu/cuda_emu.h, which
# emulates blocks, __syncthreads and warp shuffles with host threads; emu_kernels.cc then
# checks the kernels against the CPU ops of libctrain (elementwise, views, softmax, layer
# norm, cross-entropy, embedding, max pooling, bias_add, mse, casts, the optimizer and norm
# passes, flash attention in rows and in tiles, f32, bf16 and f16). Needs a C++ compiler and
# python3, not CUDA; it checks the kernels' code (indexing, masks, reduction order), not the GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${CT_BUILD:-build}
[ -f "$B/libctrain.a" ] || { echo "no $B/libctrain.a (make first)"; exit 1; }
command -v g++ >/dev/null && command -v python3 >/dev/null || { echo "needs g++ and python3"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cuda"
for h in src/cuda/*.cuh; do python3 tests/tools/cuda_emu/transform.py "$h" "$tmp/cuda/$(basename "$h")" || exit 1; done
flags=(-std=c++17 -O1 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -Wno-unused-parameter -DCT_HAVE_CUDA=1
       -Itests/tools/cuda_emu/include -Itests/tools/cuda_emu -I"$tmp" -Iinclude -Isrc)
# a sanitizer build of the library (make test-asan) takes the same instrumentation here
if nm "$B/libctrain.a" 2>/dev/null | grep ' U __asan_' >/dev/null; then
    flags+=(-fsanitize=address,undefined -fno-omit-frame-pointer)
fi
objs=()
for f in src/cuda/*.cu; do
    n=$(basename "$f" .cu)
    python3 tests/tools/cuda_emu/transform.py "$f" "$tmp/$n.cc" || exit 1
    g++ "${flags[@]}" -c "$tmp/$n.cc" -o "$tmp/$n.o" || { echo "cannot compile $f for the emulation"; exit 1; }
    objs+=("$tmp/$n.o")
done
g++ "${flags[@]}" -fopenmp tests/tools/cuda_emu/emu_kernels.cc "${objs[@]}" "$B/libctrain.a" \
    $(pkg-config --libs openblas libcjson zlib 2>/dev/null || echo -lopenblas -lcjson -lz) -fopenmp -lpthread -lm \
    -o "$tmp/emu_kernels" || exit 1
"$tmp/emu_kernels"
