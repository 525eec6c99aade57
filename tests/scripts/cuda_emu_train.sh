#!/usr/bin/env bash
# `ctrain train --device cuda --shard ...` as a user runs it, on the emulated GPU: the CLI built
# over tests/scripts/lib/cuda_emu.sh's device (the kernels, src/cuda's allocator and device
# hooks, the nccl backend over the emulated NCCL; each rank process has a GPU of its own), a GPT
# of two blocks on a text made here:
#   - `--shard full` on 2 ranks over NCCL against the same run on the CPU over gloo: the losses
#     within 1e-6 over 4 steps, model.safetensors (streamed from the device shards a unit at a
#     time) within 1e-5 normwise of the CPU's;
#   - `--shard grad-optim` with bf16 autocast, bf16 gathers, prefetching and clipping, the same
#     against the CPU: the losses within 1e-4 (bf16 kernels on either side);
#   - DDP on NCCL (`--shard none`) checkpoints at step 2 of 4, and `--shard full` on the device
#     resumes it (an unsharded checkpoint read into device shards): steps 3 and 4 give the
#     uninterrupted run's losses within 1e-6;
#   - the device's sharded checkpoint (2 ranks) resumed on 1 rank, on the device and on the
#     CPU: the same losses.
set -uo pipefail
cd "$(dirname "$0")/../.."
command -v g++ >/dev/null && command -v python3 >/dev/null || { echo "needs g++ and python3"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
die() { echo "FAIL: $*"; exit 1; }
. tests/scripts/lib/cuda_emu.sh
emu_library || exit 1
emu_device "$E" "$tmp" || exit 1
C=$tmp/ctrain
gcc "${cflags[@]}" "${defs[@]}" -DCT_CUDA_TARGETS='"emulated"' src/cli/*.c "${objs[@]}" "$E/libctrain.a" "${libs[@]}" -lstdc++ \
    -o "$C" || die "cannot build the CLI over the emulated device"
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE CTRAIN_BACKEND
d=$tmp/runs
mkdir -p "$d"
for i in $(seq 1 60); do echo "line $i of a text with $((i * 7 % 31)) words and $((i * 13 % 17)) commas,"; done > "$d/t.txt"
gpt=(gpt --text "$d/t.txt" --n-layer 2 --n-embd 32 --n-head 2 --block-size 32 --batch-size 2 --log-every 1 --eval-every 0
     --threads 1)
# train NAME BACKEND RANKS ARGS...
train() {
    local name=$1 be=$2 n=$3
    shift 3
    CTRAIN_BACKEND=$be timeout 300 "$C" run --nproc-per-node "$n" --standalone "$C" train "${gpt[@]}" "$@" --output-dir "$d/$name" \
        > "$d/$name.log" 2>&1 || die "$name: $(tail -15 "$d/$name.log")"
}
losses() { grep -o '"train/loss": [0-9.e+-]*' "$d/$1/metrics.jsonl" | cut -d' ' -f2; }
# same A B [TOL]: B's losses are A's last ones (B resumed), each within TOL (1e-6)
same() {
    local m tol=${3:-1e-6}
    m=$(paste <(losses "$1" | tail -n "$(losses "$2" | wc -l)") <(losses "$2") |
        awk '{ x = $1 - $2; if (x < 0) x = -x; if (x > m) m = x; n++ } END { if (n == 0) print "none"; else printf "%g", m }')
    [ "$m" != none ] && awk -v m="$m" -v t="$tol" 'BEGIN { exit !(m <= t) }' || die "$2: losses differ from $1's by up to $m"
    echo "$2: $(losses "$2" | wc -l) losses within $m of $1's"
}

train dev_full nccl 2 --steps 4 --device cuda --shard full
grep -q "on cuda:0" "$d/dev_full.log" && grep -q "| gpu .* MB" "$d/dev_full.log" || die "dev_full: not on the GPU: $(head -3 "$d/dev_full.log")"
grep -q "^fsdp: --shard full" "$d/dev_full.log" || die "dev_full: no memory line: $(tail -5 "$d/dev_full.log")"
train cpu_full gloo 2 --steps 4 --shard full
same cpu_full dev_full
e=$(python3 tests/tools/weights_close.py "$d/cpu_full/model.safetensors" "$d/dev_full/model.safetensors" 1e-5 --normwise) ||
    die "dev_full: model.safetensors differs from the CPU's: $e"
echo "dev_full: model.safetensors: $e from the CPU's"

mixed=(--steps 4 --shard grad-optim --amp bf16 --shard-param-dtype bf16 --shard-prefetch --clip 0.5)
train dev_mixed nccl 2 "${mixed[@]}" --device cuda
train cpu_mixed gloo 2 "${mixed[@]}"
same cpu_mixed dev_mixed 1e-4

# an unsharded checkpoint (DDP on NCCL) resumed into device shards
train dev_ddp nccl 2 --steps 4 --save-every 2 --device cuda --shard none
same dev_full dev_ddp
cp -r "$d/dev_ddp" "$d/dev_resumed" && rm -rf "$d/dev_resumed/checkpoints/step-00000004" "$d/dev_resumed/metrics.jsonl"
train dev_resumed nccl 2 --steps 4 --device cuda --shard full --resume "$d/dev_resumed/checkpoints/step-00000002"
grep -q "resumed from .*step-00000002 at step 2" "$d/dev_resumed.log" || die "dev_resumed: $(head -3 "$d/dev_resumed.log")"
same dev_full dev_resumed

# the device's sharded checkpoint at 2 ranks, resumed at 1 on the device and on the CPU
train dev_one nccl 1 --steps 6 --device cuda --shard full --resume "$d/dev_full/checkpoints/step-00000004"
train cpu_one gloo 1 --steps 6 --shard full --resume "$d/dev_full/checkpoints/step-00000004"
same cpu_one dev_one
echo ok
