#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and the CUDA toolkit, build ctrain with CUDA
# and run what cannot run without a GPU, in under 8 minutes. Exit status 0 only when every
# step passed; the log is also written to build/gpu-check.log.
#
#   scripts/gpu-check.sh            # all steps
#   GPU_CHECK_STEPS="env kernels" scripts/gpu-check.sh
#
# Steps (each prints its time; a failed step does not stop the later ones):
#   env      nvidia-smi and `ctrain env`: the GPU, driver, runtime and library versions
#   kernels  tests/gpu: every CUDA kernel against the CPU op on random inputs
#            (<= 1e-5 relative in f32, <= 1e-2 in bf16), the allocator, NCCL at world size 1
#   ops      tests/gpu/test_gpu_ops: bias_add, softmax, log_softmax, mse_loss, plain attention
#            and cast through the op table on cuda:0 against the CPU ops (forward and backward)
#   train    tests/gpu/test_gpu_train: an MLP step (forward, backward, AdamW) on cuda:0 against the
#            CPU loss and gradients, the GPT ops through the op table's device column, an op
#            without a CUDA kernel failing cleanly, DDP at world size 1 on NCCL; bf16 autocast on
#            cuda:0 (op by op, an MLP, the GPT, ct_train_step) against CPU autocast (<= 1e-2)
#   conv     tests/gpu/test_gpu_conv: conv2d (cuDNN), max/relu-max/avg pooling on cuda:0
#            against the CPU ops, forward and backward (<= 1e-5; max pooling bit-equal)
#   device   the CPU-side tests of the device plumbing (test_device) in this build
#   trainer  tests/scripts/gpu_train.sh: `ctrain train mlp|gpt --device cuda` a few steps against
#            the CPU run (losses within 2e-3), GPU memory in the progress line and metrics, a
#            resume on the GPU, --clip with --loss-scaling, --export hf, gpt --amp bf16 against
#            the CPU's --amp bf16 (losses within 2e-2)
#   dist     tests/gpu/test_gpu_dist where there are two GPUs or more: every collective of the
#            nccl backend between ranks, DDP on NCCL against one process, a stuck peer timing out
#            (with one GPU it is not run: NCCL needs a GPU per rank)
#   cli      `ctrain env --check` (the NCCL all-reduce across the visible GPUs) and
#            `ctrain run --nproc-per-node gpu -- ctrain bench allreduce --backend nccl`
#   units    the CPU-side tests of the same arithmetic (test_kmath) in this build
#   bench    GPT-2 small (124M) training steps, batch 8 x 1024, under bf16 autocast: ctrain
#            (bench/gpu_gpt2) with register-tile tensor-core (mma), tensor-core (tc, the default), tiled
#            and row attention, and tensor-core with f32
#            activation gradients (CTRAIN_CUDA_LOWP_GRADS=0, to measure what the bf16 ones save);
#            PyTorch eager (bench/gpu_gpt2_torch.py, SDPA) in bf16 autocast; tokens/s, peak
#            memory, MFU (needs python3 with torch)
#   profile  per-op profiles (CTRAIN_DEVICE_PROFILE) of the bf16 step, mma and tc attention, 5
#            steps after the warm-up
#   bench32  the same in f32: ctrain's f32 GEMMs in f32 and on bf16 tensor cores, the tiled
#            attention, and PyTorch in f32
#   ncu      where Nsight Compute is installed: one layer's attention kernels (forward, dK/dV,
#            dQ; tc's and mma's) and its first 14 GEMMs, each's duration, throughput and occupancy
#   The bf16 comparison comes before the slower tests, so a short lease still measures it.
#
# GPU_CHECK_PREBUILT=1 skips the build and runs what scripts/gpu-bundle.sh packed (unpacked
# into build/), for a GPU machine without ctrain's other build dependencies.
# Only the GPU's own architecture is compiled (CUDA_ARCHS), which keeps the build short.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
BUDGET=${GPU_CHECK_BUDGET:-470} # seconds for everything, under the 8 minutes a GPU machine gives
steps=${GPU_CHECK_STEPS:-env kernels ops train conv bench profile trainer dist cli device units bench32 ncu}
mkdir -p build
log=build/gpu-check.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }
failed=()

if [ -n "${GPU_CHECK_PREBUILT:-}" ]; then
    # the bundle's libraries, then NCCL and cuBLAS wherever this machine has them (the CUDA
    # toolkit's folder, or the Python wheels PyTorch brings)
    libs=$PWD/build/lib
    for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia.nccl, nvidia.cublas, os
for m in (nvidia.nccl, nvidia.cublas): print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null); do
        [ -d "$d" ] && libs=$libs:$d
    done
    export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    say "gpu-check: $(date -u '+%Y-%m-%d %H:%M UTC'), GPU $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), prebuilt; libraries from $LD_LIBRARY_PATH"
    ldd build/ctrain | grep 'not found' | tee -a "$log"
else
    # prerequisites: what the build needs, named instead of a compiler error later
    missing=()
    command -v nvidia-smi >/dev/null || missing+=("nvidia-smi (NVIDIA driver)")
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || missing+=("nvcc (CUDA toolkit)")
    for p in openblas libcjson zlib; do pkg-config --exists "$p" 2>/dev/null || missing+=("$p (scripts/setup.sh installs it)"); done
    if [ ${#missing[@]} -gt 0 ]; then
        say "gpu-check: cannot build here, missing: ${missing[*]}"
        exit 2
    fi

    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    archs=${CUDA_ARCHS:-${cc:-80 86 89 90}}
    say "gpu-check: $(date -u '+%Y-%m-%d %H:%M UTC'), GPU $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), building for sm_$archs"
    tb=$SECONDS
    if ! make -j"$(nproc)" CUDA=1 CUDA_ARCHS="$archs" build/ctrain build/tests/test_gpu_kernels build/tests/test_gpu_ops build/tests/test_gpu_train build/tests/test_gpu_conv build/tests/test_device \
        build/tests/test_gpu_dist build/tests/test_kmath build/bench/gpu_gpt2 >>"$log" 2>&1; then
        tail -30 "$log"
        say "gpu-check: FAIL build ($((SECONDS - tb)) s)"
        exit 1
    fi
    say "gpu-check: build $((SECONDS - tb)) s"
fi

# cuDNN is opened with dlopen (the toolkit's lib64 first, then the loader's path): where it
# came as the nvidia-cudnn-cu13 wheel, put the wheel's lib directory on the loader's path
if ! ls /usr/local/cuda/lib64/libcudnn.so.9 >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9'; then
    d=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
    [ -n "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && say "gpu-check: cuDNN from $d"
fi

# run_step NAME SCRIPT: runs SCRIPT with bash, bounded by what is left of the budget
run_step() {
    local name=$1 script=$2
    local left=$((BUDGET - (SECONDS - t0)))
    [ $left -gt "${GPU_CHECK_STEP_MAX:-180}" ] && left=${GPU_CHECK_STEP_MAX:-180} # a hung step leaves time for the rest
    if [ $left -le 10 ]; then
        say "gpu-check: SKIP $name (time budget spent)"
        failed+=("$name")
        return
    fi
    local ts=$SECONDS
    if timeout "$left" bash -c "$script" 2>&1 | tee -a "$log"; then
        say "gpu-check: ok   $name ($((SECONDS - ts)) s)"
    else
        say "gpu-check: FAIL $name ($((SECONDS - ts)) s)"
        failed+=("$name")
    fi
}
# a test binary passes only with no failure and no skip, except the no-GPU checks, which
# skip because a GPU is present
tests_pass() {
    echo "out=\$($1 2>&1); rc=\$?; echo \"\$out\"; [ \$rc -eq 0 ] && ! echo \"\$out\" | grep '^skip ' | grep -qv 'a CUDA GPU is present'"
}

for s in $steps; do
    case "$s" in
    env) run_step env 'nvidia-smi && build/ctrain env' ;;
    kernels) run_step kernels "$(tests_pass build/tests/test_gpu_kernels)" ;;
    ops) run_step ops "$(tests_pass build/tests/test_gpu_ops)" ;;
    train) run_step train "$(tests_pass build/tests/test_gpu_train)" ;;
    conv) run_step conv "$(tests_pass build/tests/test_gpu_conv)" ;;
    device) run_step device "$(tests_pass build/tests/test_device)" ;;
    trainer) run_step trainer 'bash tests/scripts/gpu_train.sh' ;;
    cli) run_step cli 'build/ctrain env --check | grep -E "^(check|gpu check):" && ! build/ctrain env --check | grep -q "^gpu check: not run" &&
                       CTRAIN_BACKEND=nccl build/ctrain run --nproc-per-node gpu -- build/ctrain bench allreduce --backend nccl -b 1M -e 64M -f 4 -c' ;;
    dist) if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then run_step dist "$(tests_pass build/tests/test_gpu_dist)"
          else say "gpu-check: not run: dist (one GPU; NCCL needs a GPU per rank)"; fi ;;
    units) run_step units "$(tests_pass build/tests/test_kmath)" ;;
    bench) run_step bench 'for a in mma tc tiled rows; do CTRAIN_CUDA_ATTENTION=$a build/bench/gpu_gpt2 20 8 1024 12 bf16 || exit 1; done
                           python3 bench/gpu_gpt2_torch.py --amp bf16 || exit 1
                           CTRAIN_CUDA_LOWP_GRADS=0 CTRAIN_CUDA_ATTENTION=tc build/bench/gpu_gpt2 20 8 1024 12 bf16' ;;
    profile) run_step profile 'for a in mma tc; do CTRAIN_DEVICE_PROFILE=1 CTRAIN_CUDA_ATTENTION=$a build/bench/gpu_gpt2 5 8 1024 12 bf16 || exit 1; done' ;;
    bench32) run_step bench32 'for p in highest medium; do CTRAIN_CUDA_MATMUL=$p build/bench/gpu_gpt2 || exit 1; done
                               CTRAIN_CUDA_ATTENTION=tiled CTRAIN_CUDA_MATMUL=medium build/bench/gpu_gpt2 || exit 1
                               python3 bench/gpu_gpt2_torch.py --amp none' ;;
    ncu) run_step ncu 'if ! command -v ncu >/dev/null; then echo "gpu-check: no ncu here"; exit 0; fi
                       export GPU_GPT2_PROBES=0
                       for a in tc mma; do
                           CTRAIN_CUDA_ATTENTION=$a ncu --clock-control none --section SpeedOfLight --section Occupancy \
                               -k regex:"^(fwd_k|dkv_k|dq_k)$" -c 3 build/bench/gpu_gpt2 1 8 1024 1 bf16 || exit 1
                       done
                       ncu --clock-control none --section SpeedOfLight -k regex:"gemm|nvjet|cutlass|xmma" -c 14 \
                           build/bench/gpu_gpt2 1 8 1024 1 bf16' ;;
    *) say "gpu-check: unknown step '$s'"; failed+=("$s") ;;
    esac
done
say "gpu-check: total $((SECONDS - t0)) s; ${#failed[@]} step(s) failed${failed:+: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]
