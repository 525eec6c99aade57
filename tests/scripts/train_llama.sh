#!/usr/bin/env bash
# `ctrain train llama` on a small text: a few steps with grouped-query heads, the file alone
# says what it is (its metadata), and `ctrain eval` of it gives the training run's test loss.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${CT_BUILD:-build}
[ -x "$B/ctrain" ] || { echo "$B/ctrain missing: build first"; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
head -c 20000 README.md > "$d/t.txt"
$B/ctrain train llama --text "$d/t.txt" --steps 5 --num-hidden-layers 2 --hidden-size 64 --num-attention-heads 4 \
    --num-key-value-heads 2 --intermediate-size 176 --threads 2 --output-dir "$d/run" > "$d/train.log" 2>&1 ||
    { cat "$d/train.log"; fail "ctrain train llama"; }
grep -q 'Llama(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2' "$d/train.log" ||
    { cat "$d/train.log"; fail "the log does not describe the Llama"; }
hdr=$(head -c 8192 "$d/run/model.safetensors" | tail -c +9 | tr -d '\0')
for want in '"ctrain.model":"llama"' '"ctrain.num_key_value_heads":"2"' '"model.layers.1.self_attn.k_proj.weight":{"dtype":"F32","shape":[32,64]'; do
    [[ "$hdr" == *"$want"* ]] || fail "model.safetensors lacks $want"
done
tl=$(sed -n 's/^done: .*test loss \([0-9.]*\).*/\1/p' "$d/train.log")
el=$($B/ctrain eval --checkpoint "$d/run" --text "$d/t.txt" --threads 2 | sed -n 's/^test split: .* loss \([0-9.]*\) .*/\1/p')
[ -n "$tl" ] && [ "$tl" = "$el" ] || fail "eval's test loss '$el' is not training's '$tl'"
echo "llama: trained 5 steps, saved, evaluated (test loss $el)"
