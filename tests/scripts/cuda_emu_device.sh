#!/usr/bin/env bash
# The GPU tests on an emulated GPU: tests/gpu's programs built against the real src/cuda op
# entries, allocator and device hooks (its C files, compiled against the runtime API of
# tests/tools/cuda_emu/crt), the emulated kernels of src/cuda/*.cu (cuda_emu.sh's), and
# tests/tools/cuda_emu/emu_device.cc (host memory as device memory, a plain-loop GEMM for
# cuBLASLt), over a CPU-only build of the library (build-emu/). So the device column runs end
# to end on the CPU: forward and backward of the models on "cuda:0" against the CPU, autocast
# with the low-precision kernels, checkpointing, the optimizers; and, through the emulated NCCL
# (tests/tools/cuda_emu/emu_nccl.cc) with the real src/distributed/nccl.c, test_gpu_dist's
# collectives, DDP and failures between rank processes. Left out: test_gpu_conv and
# test_gpu_kernels (cuDNN, cuBLASLt and the allocator's cudaMalloc failures need the real
# libraries).
set -uo pipefail
cd "$(dirname "$0")/../.."
command -v g++ >/dev/null && command -v python3 >/dev/null || { echo "needs g++ and python3"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. tests/scripts/lib/cuda_emu.sh
emu_library || exit 1
emu_device "$E" "$tmp" || exit 1
# the tests may hold the emulated device to what only it promises (one GEMM summation order)
export CT_EMU_DEVICE=1
rc=0
for t in ${CT_EMU_TESTS:-test_gpu_ops test_gpu_train test_gpu_dist}; do
    gcc "${cflags[@]}" "tests/gpu/$t.c" "${objs[@]}" "$E/libctrain.a" "${libs[@]}" -lstdc++ -o "$tmp/$t" ||
        { echo "cannot build $t for the emulated device"; exit 1; }
    for name in $(sed -n 's/^CT_TEST(\([a-z0-9_]*\)).*/\1/p' "tests/gpu/$t.c"); do
        # CT_EMU_NAMES="a b": only these tests (while working on them)
        [ -n "${CT_EMU_NAMES:-}" ] && [[ " $CT_EMU_NAMES " != *" $name "* ]] && continue
        out=$("$tmp/$t" "$name" 2>&1)
        res=$(echo "$out" | sed -n 's/^RESULT //p')
        if [ "$res" = "1 0 0" ]; then echo "ok   $t $name"; else echo "$out"; echo "FAIL $t $name"; rc=1; fi
        [ -n "${CT_EMU_VERBOSE:-}" ] && echo "$out"
    done
    # CTRAIN_CUDA_LOWP_GRADS=0 takes the declarations away: the bf16-gradient test then finds none
    if [ "$t" = test_gpu_train ]; then
        out=$(CTRAIN_CUDA_LOWP_GRADS=0 "$tmp/$t" lowp_activation_grads_on_cuda 2>&1)
        if grep -q "declare no bf16 gradients" <<<"$out"; then echo "ok   $t CTRAIN_CUDA_LOWP_GRADS=0 turns them off"
        else echo "$out"; echo "FAIL $t CTRAIN_CUDA_LOWP_GRADS=0 left bf16 gradients on"; rc=1; fi
    fi
    # grouped-query flash attention also through the row, tiled and register-tile (mma) kernel
    # families (the WMMA tensor-core ones are the default)
    [ "$t" = test_gpu_ops ] && for fam in rows tiled mma; do
        name=flash_attention_gqa_on_cuda_matches_cpu
        out=$(CTRAIN_CUDA_ATTENTION=$fam "$tmp/$t" "$name" 2>&1)
        res=$(echo "$out" | sed -n 's/^RESULT //p')
        if [ "$res" = "1 0 0" ]; then echo "ok   $t $name ($fam)"; else echo "$out"; echo "FAIL $t $name ($fam)"; rc=1; fi
    done
    # the packed-qkv attention on the register-tile kernels reads qkv and writes y and dqkv where
    # they lie (strided heads, no head-layout copies)
    if [ "$t" = test_gpu_ops ]; then
        name=flash_attention_qkv_on_cuda_matches_cpu_and_chain
        out=$(CTRAIN_CUDA_ATTENTION=mma "$tmp/$t" "$name" 2>&1)
        res=$(echo "$out" | sed -n 's/^RESULT //p')
        if [ "$res" = "1 0 0" ]; then echo "ok   $t $name (mma)"; else echo "$out"; echo "FAIL $t $name (mma)"; rc=1; fi
    fi
done
exit $rc
