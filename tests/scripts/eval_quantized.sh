#!/usr/bin/env bash
# `ctrain eval` and `ctrain generate` of a file `ctrain quantize` wrote (its metadata carries
# the config, so the file opens alone): a Llama (grouped-query, per tensor and per channel)
# and a GPT. The int8 model's test loss is within 0.05 of the f32 model's on the same text
# (a few-step model; docs/llama.md has the figures of longer runs).
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
[ -x "$C" ] || { echo "$C not built"; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
head -c 20000 README.md > "$d/t.txt"
la=(--num-hidden-layers 2 --hidden-size 64 --num-attention-heads 4 --num-key-value-heads 2 --intermediate-size 176)
ga=(--n-layer 2 --n-embd 64 --n-head 4)
loss() { sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' "$1"; }
check() { # kind, flags...
    local kind=$1; shift
    $C train "$kind" --text "$d/t.txt" --steps 20 "$@" --threads 2 --eval-every 1000 --output-dir "$d/$kind" > "$d/train.log" 2>&1 ||
        { cat "$d/train.log"; exit 1; }
    $C eval --checkpoint "$d/$kind" --text "$d/t.txt" --threads 2 > "$d/f32.log" 2>&1 || { cat "$d/f32.log"; exit 1; }
    for mode in "" --per-channel; do
        $C quantize --checkpoint "$d/$kind" --model "$kind" "$@" --output "$d/q.safetensors" $mode --threads 2 > "$d/q.log" 2>&1 ||
            { cat "$d/q.log"; exit 1; }
        $C eval --checkpoint "$d/q.safetensors" --text "$d/t.txt" --threads 2 > "$d/int8.log" 2>&1 || { cat "$d/int8.log"; exit 1; }
        grep -q "int8 Linears (dynamic quantization)" "$d/int8.log" || { cat "$d/int8.log"; echo "eval did not say int8"; exit 1; }
        local a b
        a=$(loss "$d/f32.log"); b=$(loss "$d/int8.log")
        [ -n "$a" ] && [ -n "$b" ] || { cat "$d/f32.log" "$d/int8.log"; exit 1; }
        awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.05) }' ||
            { echo "$kind ${mode:-per-tensor}: int8 loss $b vs f32 $a"; exit 1; }
        echo "$kind ${mode:-per-tensor}: test loss f32 $a, int8 $b"
        $C generate --checkpoint "$d/q.safetensors" --prompt-tokens 1,2,3 --max-new-tokens 8 --temperature 0 > "$d/g.log" 2>&1 ||
            { cat "$d/g.log"; echo "generate of the int8 $kind failed"; exit 1; }
    done
}
check llama "${la[@]}"
check gpt "${ga[@]}"
