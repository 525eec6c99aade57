#!/usr/bin/env bash
# `ctrain train --shard full|grad-optim|optim` (FSDP) on 4 ranks against DDP (--shard none)
# over 50 steps: the per-step losses (metrics.jsonl, full precision) within 1e-6, and
# model.safetensors compared bit for bit, for a 2-block GPT on the shm, gloo, mpi and hier backends
# and an MLP; FULL_SHARD also with clipping, bf16 autocast, fp16 with loss scaling, activation
# checkpointing with dropout, prefetching (--shard-prefetch) and gradient accumulation. The memory line's shards
# are 1/4 of the unsharded sizes; evaluations (an MLP's, uneven across the ranks) give DDP's figures.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
die() { echo "$*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE CTRAIN_BACKEND
# Under ASan (make test-asan): Open MPI is built without frame pointers, so leak stacks taken
# the fast way stop inside it and tests/asan.supp cannot recognise its own leaks.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
for i in $(seq 1 120); do echo "line $i of a text with $((i*7 % 31)) words and $((i*13 % 17)) commas,"; done > "$d/t.txt"
gpt=(gpt --text "$d/t.txt" --n-layer 2 --n-embd 64 --n-head 4 --block-size 96 --batch-size 2 --steps 50 --log-every 1
     --eval-every 0 --threads 1)
# train NAME BACKEND ARGS...: 4 ranks
train() {
    local name=$1 be=$2; shift 2
    if [ "$be" = mpi ]; then
        CTRAIN_BACKEND=mpi timeout 300 mpirun -np 4 --oversubscribe "$C" train "$@" --output-dir "$d/$name" > "$d/$name.log" 2>&1
    else
        CTRAIN_BACKEND=$be timeout 300 "$C" run --nproc-per-node 4 --standalone "$C" train "$@" --output-dir "$d/$name" \
            > "$d/$name.log" 2>&1
    fi || die "$name failed: $(tail -20 "$d/$name.log")"
}
losses() { grep -o '"train/loss": [0-9.e+-]*' "$1/metrics.jsonl" | cut -d' ' -f2; }
# same REF RUN [bits]: losses within 1e-6 over 50 steps; with "bits" the weights equal bit for bit
report=""
same() {
    paste <(losses "$d/$1") <(losses "$d/$2") > "$d/pairs"
    [ "$(wc -l < "$d/pairs")" -eq 50 ] || die "$2: $(wc -l < "$d/pairs") logged steps, expected 50"
    local m
    m=$(awk '{ x = $1 - $2; if (x < 0) x = -x; if (x > m) m = x } END { printf "%g", m }' "$d/pairs")
    awk -v m="$m" 'BEGIN { exit !(m <= 1e-6) }' || die "$2: losses differ from $1 by up to $m"
    local bits=differ
    cmp -s "$d/$1/model.safetensors" "$d/$2/model.safetensors" && bits=identical
    [ "${3:-}" != bits ] || [ $bits = identical ] || die "$2: weights differ from $1's (loss diff $m)"
    # evaluations (FSDP: units gathered one at a time, ranks in lockstep) give DDP's figures
    [ "$(grep -o '"eval/[a-z]*": [0-9.e+-]*' "$d/$1/metrics.jsonl")" = "$(grep -o '"eval/[a-z]*": [0-9.e+-]*' "$d/$2/metrics.jsonl")" ] ||
        die "$2: evaluations differ from $1's"
    report+="$2: loss diff $m, weights $bits"$'\n'
}
for be in shm gloo mpi hier; do
    train g_${be}_none $be "${gpt[@]}" --shard none
    train g_${be}_full $be "${gpt[@]}" --shard full
    grep -q "^fsdp: --shard full" "$d/g_${be}_full.log" || die "no memory line: $(cat "$d/g_${be}_full.log")"
    same g_${be}_none g_${be}_full bits
done
for m in grad-optim optim; do train g_shm_$m shm "${gpt[@]}" --shard $m; same g_shm_none g_shm_$m bits; done
# the Hugging Face export after FSDP training (the released units gathered for it) is DDP's
train h_none shm "${gpt[@]}" --export hf
train h_full shm "${gpt[@]}" --export hf --shard full
cmp "$d/h_none/hf/model.safetensors" "$d/h_full/hf/model.safetensors" || die "--export hf after --shard full differs from DDP's"
report+="h_full: --export hf identical to DDP's"$'\n'
# the shards are a quarter of the whole (each unit padded to 16 floats x 4 ranks)
line=$(grep "^fsdp:" "$d/g_shm_full.log")
shard=$(echo "$line" | sed -E 's/.*shard params ([0-9.]+) MB.*/\1/'); whole=$(echo "$line" | sed -E 's/.*unsharded \(DDP\): params ([0-9.]+) MB.*/\1/')
awk -v s="$shard" -v w="$whole" 'BEGIN { exit !(s > 0 && s <= w / 4 + 0.01) }' || die "shard $shard MB of $whole MB: $line"
# 65 samples evaluated by 4 ranks in batches of 16: rank 0 runs 2 batches, the others 1 (and
# under --shard an uncounted one, so that the units' gathers match)
mlp=(mlp --hidden 64 --steps 50 --batch-size 16 --log-every 1 --eval-max 65 --eval-every 20 --threads 1)
. tests/tools/fashion_mnist.sh
for m in none full optim; do train m_$m shm "${mlp[@]}" --data-dir "$data" --shard $m; done
same m_none m_full bits; same m_none m_optim bits
# FULL_SHARD with the step's other parts; accumulation reduce-scatters each micro-batch
# (DDP reduces the sum once): another order of additions, so within 1e-6, not the bits
for o in "--clip 0.5" "--amp bf16" "--checkpoint-activations --dropout 0.1" "--shard-prefetch" "--grad-accum 2" \
         "--amp fp16 --loss-scale-init 1e9 --clip 1"; do
    t=$(echo "$o" | tr -dc 'a-z0-9')
    train o_${t}_none shm "${gpt[@]}" $o
    train o_${t}_full shm "${gpt[@]}" $o --shard full
    if [ "$o" = "--grad-accum 2" ]; then same o_${t}_none o_${t}_full; else same o_${t}_none o_${t}_full bits; fi
done
# bf16 gathers (FSDP's MixedPrecision(param_dtype=bf16)): about half the bytes gathered, the
# losses within bf16's rounding of the f32 gathers (2.7e-3 measured), the same bits on shm and
# gloo, and the saved weights are the f32 masters (a bf16-rounded float has 16 zero low bits)
train o_bf16g_full shm "${gpt[@]}" --amp bf16 --shard full --shard-param-dtype bf16
train o_bf16g_gloo gloo "${gpt[@]}" --amp bf16 --shard full --shard-param-dtype bf16
same o_bf16g_full o_bf16g_gloo bits
m=$(paste <(losses "$d/o_ampbf16_full") <(losses "$d/o_bf16g_full") |
    awk '{ x = $1 - $2; if (x < 0) x = -x; if (x > m) m = x } END { printf "%g", m }')
awk -v m="$m" 'BEGIN { exit !(m > 0 && m <= 1e-2) }' || die "bf16 gathers: losses differ from f32 gathers by $m"
report+="o_bf16g_full: loss diff $m from f32 gathers"$'\n'
mb() { grep -o "all-gathers $1, [0-9.]* MB" "$d/$2.log" | awk '{print $3}'; }
awk -v a="$(mb bf16 o_bf16g_full)" -v b="$(mb f32 o_ampbf16_full)" 'BEGIN { exit !(a > 0 && a < 0.55 * b) }' ||
    die "bf16 gathers: $(mb bf16 o_bf16g_full) MB against $(mb f32 o_ampbf16_full) MB in f32"
python3 - "$d/o_bf16g_full/model.safetensors" <<'PY' || die "bf16 gathers: the saved weights are rounded to bf16"
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
low = sum((x & 0xFFFF) != 0 for k, v in h.items() if k != "__metadata__"
          for (x,) in struct.iter_unpack("<I", b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]))
sys.exit(0 if low > 1000 else 1)
PY
CTRAIN_BACKEND=shm "$C" run --nproc-per-node 2 --standalone "$C" train "${gpt[@]}" --shard-param-dtype bf16 \
    --output-dir "$d/refused" > "$d/refused.log" 2>&1 && die "--shard-param-dtype without --shard ran"
grep -q "shard-param-dtype expects --shard full" "$d/refused.log" || die "refusal: $(cat "$d/refused.log")"
# fp16 loss scaling over the shards (ShardedGradScaler): a first scale of 1e9 overflows, and
# the ranks agree to skip the same steps as DDP (14 here), then the bits above
sk() { grep -o "[0-9]* steps skipped (overflow)" "$d/$1.log" | cut -d' ' -f1; }
t=ampfp16lossscaleinit1e9clip1
[ "$(sk o_${t}_none)" -gt 0 ] && [ "$(sk o_${t}_none)" = "$(sk o_${t}_full)" ] ||
    die "fp16: DDP skipped $(sk o_${t}_none) steps, --shard full $(sk o_${t}_full)"
report+="fp16 loss scaling: $(sk o_${t}_full) steps skipped by both"$'\n'
# the scale and its growth tracker travel in a sharded checkpoint: resumed at step 10 (in the
# middle of the overflows), the run ends with the uninterrupted run's bits
f16=(--amp fp16 --loss-scale-init 1e9 --shard full --steps 20)
train f16_whole shm "${gpt[@]}" "${f16[@]}"
train f16_saved shm "${gpt[@]}" "${f16[@]}" --save-every 10
train f16_resumed shm "${gpt[@]}" "${f16[@]}" --resume "$d/f16_saved/checkpoints/step-00000010"
cmp -s "$d/f16_whole/model.safetensors" "$d/f16_resumed/model.safetensors" || die "fp16 resumed: other weights"
[ "$(sk f16_resumed)" = 4 ] || die "fp16 resumed: $(sk f16_resumed) steps skipped after step 10, expected 4 of 14"
printf '%s' "$report"
echo "$line"
