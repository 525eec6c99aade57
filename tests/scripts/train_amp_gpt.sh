#!/usr/bin/env bash
# `ctrain train gpt --amp bf16` (fused attention, on AMX tiles where the CPU has them: bf16
# tile products as PyTorch's CPU flash attention) follows the f32 run: the mean training loss
# of the last 20 of 60 steps within 0.02 of f32's, on a byte-level model of this repository's
# README; and the same with CTRAIN_GEMM_BF16=rounded (the f32 attention kernels).
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
[ -x "$C" ] || { echo "$C not built"; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
g=(gpt --text README.md --n-layer 2 --n-embd 64 --n-head 2 --block-size 96 --batch-size 8 --steps 60 --log-every 1 --threads 2
   --eval-every 1000 --seed 3)
run() { # name, env / args
    local n=$1; shift
    env "$@" > "$d/$n.log" 2>&1 || { tail -5 "$d/$n.log"; echo "$n run failed"; exit 1; }
}
run f32 "$C" train "${g[@]}" --output-dir "$d/f32"
run bf16 "$C" train "${g[@]}" --amp bf16 --output-dir "$d/bf16"
run bf16r CTRAIN_GEMM_BF16=rounded "$C" train "${g[@]}" --amp bf16 --output-dir "$d/bf16r"
# mean of the last 20 step losses ("step N/60 | ... | loss X |")
tail_loss() { sed -n 's/^step *\([0-9]*\)\/60 .*| loss \([0-9.]*\) .*/\1 \2/p' "$d/$1.log" | awk '$1 > 40 { s += $2; n++ } END { if (n < 20) exit 1; printf "%.4f", s / n }'; }
l32=$(tail_loss f32) || { tail -5 "$d/f32.log"; echo "no step losses in the f32 log"; exit 1; }
lb=$(tail_loss bf16) || { echo "no step losses in the bf16 log"; exit 1; }
lr=$(tail_loss bf16r) || { echo "no step losses in the bf16 (rounded) log"; exit 1; }
echo "mean loss of steps 41-60: f32 $l32 | bf16 $lb | bf16, f32 attention kernels $lr"
awk -v a="$l32" -v b="$lb" -v c="$lr" 'BEGIN { d = a - b; e = a - c; if (d < 0) d = -d; if (e < 0) e = -e; exit !(d <= 0.02 && e <= 0.02) }' \
    || { echo "bf16 loss further than 0.02 from f32"; exit 1; }
echo "bf16 GPT training within 0.02 of f32 (AMX attention and f32 attention kernels)"
