#!/usr/bin/env bash
# `ctrain train --device cuda` on a GPU against the same run on the CPU: an MLP (on a small
# synthetic IDX set, so no dataset package is needed) and a GPT (on a generated text) train a
# few steps with the same losses and evaluation within 2e-3 (f32 on both; the GPU's sums run
# in another order); the progress line and metrics report the GPU memory; a checkpoint
# written on the GPU resumes there to the same losses; --export hf works after GPU training;
# gradient clipping with loss scaling follows the CPU too; --amp bf16 (autocast through the
# device dispatch) follows the CPU's --amp bf16 within bf16 tolerance (2e-2), and so do the GPT
# under --amp fp16 with loss scaling and the CNN under --amp bf16 (cuDNN's low-precision path);
# --checkpoint-activations (blocks recomputed on the device) follows the CPU in f32; a small
# grouped-query Llama follows the CPU in f32 (2e-3) and under --amp bf16 (2e-2); `ctrain eval
# --device cuda` evaluates the GPU-trained model as the CPU does (2e-3).
# Exits 77 "no CUDA GPU" where there is none (tests/scripts/train_device.sh covers that).
set -uo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
fail() { echo "FAIL: $*"; exit 1; }
if ! $C env | grep -qE "^cuda: +[0-9]+ GPUs? visible"; then echo "no CUDA GPU"; exit 77; fi
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
# 512 training and 128 test images of 28 x 28 bytes, labels by the brightness of a quadrant
python3 - "$d/idx" <<'PY' || fail "python3 could not write the IDX files"
import os, random, struct, sys
d = sys.argv[1]; os.makedirs(d)
r = random.Random(5)
for name, n in (("train", 512), ("t10k", 128)):
    imgs = [bytes(r.randrange(256) for _ in range(784)) for _ in range(n)]
    labs = bytes(min(9, sum(im[:392]) // 10000) for im in imgs)
    with open(f"{d}/{name}-images-idx3-ubyte", "wb") as f: f.write(struct.pack(">IIII", 0x803, n, 28, 28) + b"".join(imgs))
    with open(f"{d}/{name}-labels-idx1-ubyte", "wb") as f: f.write(struct.pack(">II", 0x801, n) + labs)
PY
for i in $(seq 1 200); do echo "line $i of a text with $((i*7 % 31)) words and $((i*13 % 17)) commas,"; done > "$d/t.txt"
mlp=(mlp --data-dir "$d/idx" --hidden 128 --batch-size 32 --steps 12 --log-every 3 --eval-every 6 --lr 0.01)
gpt=(gpt --text "$d/t.txt" --n-layer 2 --n-embd 64 --n-head 4 --block-size 64 --batch-size 8 --steps 12 --log-every 3
     --eval-every 6 --save-every 6 --export hf)
gptclip=("${gpt[@]}" --clip 0.5 --loss-scaling)
gptck=("${gpt[@]}" --checkpoint-activations)
# a grouped-query Llama (rms_norm, rope, repeat_kv, silu on the device)
llama=(llama --text "$d/t.txt" --num-hidden-layers 2 --hidden-size 64 --num-attention-heads 4 --num-key-value-heads 2
       --intermediate-size 176 --max-position-embeddings 64 --batch-size 8 --steps 12 --log-every 3 --eval-every 6)
nums() { grep -E "^(step|eval)" "$1" | sed -E 's/.*loss ([0-9.]+).*/\1/'; }
close() { # LOG_A LOG_B WHAT [TOL]: the same number of progress and eval lines, losses within TOL (2e-3)
    paste <(nums "$1") <(nums "$2") > "$d/pairs"
    [ "$(wc -l < "$d/pairs")" -ge 3 ] || { cat "$1" "$2"; fail "$3: too few progress lines"; }
    awk -v t="${4:-2e-3}" '{ if ($1 - $2 > t || $2 - $1 > t || NF != 2) { print "loss " $1 " vs " $2; bad = 1 } } END { exit bad }' "$d/pairs" ||
        { cat "$1" "$2"; fail "$3: the GPU run does not follow the CPU run"; }
    echo "$3: $(tr '\t\n' '= ' < "$d/pairs")"
}
for m in mlp gpt gptclip gptck llama; do
    eval "args=(\"\${$m[@]}\")"
    for dev in cpu cuda; do
        $C train "${args[@]}" --device $dev --output-dir "$d/$m-$dev" > "$d/$m-$dev.log" 2>&1 ||
            { cat "$d/$m-$dev.log"; fail "$m on $dev"; }
    done
    grep -q "| on cuda:0" "$d/$m-cuda.log" || { cat "$d/$m-cuda.log"; fail "$m: the header does not say cuda:0"; }
    grep -qE "^step .*\| gpu [0-9]+ MB \(peak [0-9]+ MB\)" "$d/$m-cuda.log" || { cat "$d/$m-cuda.log"; fail "$m: no GPU memory in the progress line"; }
    grep -q '"train/gpu_peak_mb"' "$d/$m-cuda/metrics.jsonl" || fail "$m: no train/gpu_peak_mb in metrics.jsonl"
    close "$d/$m-cpu.log" "$d/$m-cuda.log" "$m cpu=cuda"
done
# resume on the GPU from the checkpoint the GPU run wrote at step 6
mkdir -p "$d/res/checkpoints" && cp -r "$d/gpt-cuda/checkpoints/step-00000006" "$d/res/checkpoints/"
$C train "${gpt[@]}" --device cuda --output-dir "$d/res" --resume auto > "$d/res.log" 2>&1 || { cat "$d/res.log"; fail "resume on cuda"; }
grep -q "resumed from .*step-00000006 at step 6" "$d/res.log" || { cat "$d/res.log"; fail "did not resume"; }
[ "$(stat -c %s "$d/gpt-cuda/hf/model.safetensors")" = "$(stat -c %s "$d/gpt-cpu/hf/model.safetensors")" ] ||
    fail "--export hf after training on cuda: not the CPU run's file size"
grep -E "^(step|eval)" "$d/gpt-cuda.log" | tail -n "$(grep -cE "^(step|eval)" "$d/res.log")" > "$d/tail.log"
close "$d/tail.log" "$d/res.log" "gpt resumed on cuda"
for dev in cpu cuda; do
    $C train "${gpt[@]}" --amp bf16 --device $dev --output-dir "$d/amp-$dev" > "$d/amp-$dev.log" 2>&1 ||
        { cat "$d/amp-$dev.log"; fail "gpt --amp bf16 on $dev"; }
done
close "$d/amp-cpu.log" "$d/amp-cuda.log" "gpt --amp bf16 cpu=cuda" 2e-2
cnn=(cnn --data-dir "$d/idx" --batch-size 32 --steps 12 --log-every 3 --eval-every 6 --lr 0.01 --amp bf16)
for run in "gpt16:${gpt[*]} --amp fp16" "cnn16:${cnn[*]}" "llama16:${llama[*]} --amp bf16"; do
    name=${run%%:*}
    read -r -a args <<<"${run#*:}"
    for dev in cpu cuda; do
        $C train "${args[@]}" --device $dev --output-dir "$d/$name-$dev" > "$d/$name-$dev.log" 2>&1 ||
            { cat "$d/$name-$dev.log"; fail "$name on $dev"; }
    done
    close "$d/$name-cpu.log" "$d/$name-cuda.log" "$name cpu=cuda" 2e-2
done
# ctrain eval --device cuda of the GPU-trained GPT: the CPU's evaluation of the same file
for dev in cpu cuda; do
    $C eval --checkpoint "$d/gpt-cuda" --text "$d/t.txt" --device $dev > "$d/eval-$dev.log" 2>&1 || { cat "$d/eval-$dev.log"; fail "eval on $dev"; }
done
grep -q "^device: cuda" "$d/eval-cuda.log" || { cat "$d/eval-cuda.log"; fail "eval --device cuda does not say where it ran"; }
ev() { sed -nE 's/^test split: .* loss ([0-9.]+) \| perplexity.*accuracy ([0-9.]+).*/\1 \2/p' "$1"; }
read -r lc ac <<<"$(ev "$d/eval-cpu.log")"; read -r lg ag <<<"$(ev "$d/eval-cuda.log")"
awk -v a="$lc" -v b="$lg" -v x="$ac" -v y="$ag" 'BEGIN { exit !(a != "" && b != "" && a - b < 2e-3 && b - a < 2e-3 && x - y < 2e-3 && y - x < 2e-3) }' ||
    { cat "$d/eval-cpu.log" "$d/eval-cuda.log"; fail "eval on cuda: loss $lg accuracy $ag, on the CPU $lc $ac"; }
echo "eval cpu=cuda: loss $lc=$lg accuracy $ac=$ag"
echo ok
