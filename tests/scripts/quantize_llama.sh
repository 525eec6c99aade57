#!/usr/bin/env bash
# `ctrain quantize --model llama`: every Linear (q/k/v/o, gate/up/down and the head, tied or
# not) becomes I8 with F32 scales; the embedding and the RMSNorm weights stay F32, as
# PyTorch's quantize_dynamic({nn.Linear}) leaves them.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
[ -x "$C" ] || { echo "$C not built"; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
head -c 20000 README.md > "$d/t.txt"
a=(--num-hidden-layers 2 --hidden-size 64 --num-attention-heads 4 --num-key-value-heads 2 --intermediate-size 176)
$C train llama --text "$d/t.txt" --steps 5 "${a[@]}" --threads 2 --eval-every 1000 --output-dir "$d/run" > "$d/train.log" 2>&1 ||
    { cat "$d/train.log"; exit 1; }
for mode in "" --per-channel; do
    $C quantize --checkpoint "$d/run" --model llama "${a[@]}" --output "$d/q.safetensors" $mode --threads 2 > "$d/q.log" 2>&1 ||
        { cat "$d/q.log"; echo "quantize ${mode:-per-tensor} failed"; exit 1; }
    grep -q "quantized every Linear to int8" "$d/q.log" || { cat "$d/q.log"; exit 1; }
    hdr=$(head -c 8192 "$d/q.safetensors" | tail -c +9 | tr -d '\0')
    for want in '"lm_head.weight":{"dtype":"I8","shape":[256,64]' '"lm_head.weight_scale":{"dtype":"F32"' \
                '"model.embed_tokens.weight":{"dtype":"F32","shape":[256,64]' '"model.norm.weight":{"dtype":"F32"' \
                '"model.layers.1.input_layernorm.weight":{"dtype":"F32"' '"model":"llama"'; do
        [[ "$hdr" == *"$want"* ]] || { echo "${mode:-per-tensor}: header lacks $want: $hdr"; exit 1; }
    done
    for p in self_attn.q_proj self_attn.k_proj self_attn.v_proj self_attn.o_proj mlp.gate_proj mlp.up_proj mlp.down_proj; do
        for l in 0 1; do
            [[ "$hdr" == *"\"model.layers.$l.$p.weight\":{\"dtype\":\"I8\""* ]] || { echo "model.layers.$l.$p.weight not I8"; exit 1; }
        done
    done
done
grep -q '"lm_head.weight_scale":{"dtype":"F32","shape":\[256\]' <<<"$hdr" || { echo "per-channel head scales not [256]"; exit 1; }
echo "quantized Llama: 15 Linears I8 (per tensor and per channel), embedding and norms F32"
