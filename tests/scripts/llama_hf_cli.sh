#!/usr/bin/env bash
# `ctrain train llama --init-from DIR` from a Hugging Face directory (config.json +
# model.safetensors in BF16, tests/torch/gen_llama.py), `--export hf` of the result, and
# `ctrain eval` of the export: the training run's test loss, config.json's LlamaConfig;
# `ctrain generate` of a Llama.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${CT_BUILD:-build}
[ -x "$B/ctrain" ] || { echo "$B/ctrain missing: build first"; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
head -c 20000 README.md > "$d/t.txt"
$B/ctrain train llama --init-from tests/fixtures/models/llama_hf_gqa --text "$d/t.txt" --steps 3 --threads 2 --export hf \
    --output-dir "$d/run" > "$d/train.log" 2>&1 || { cat "$d/train.log"; fail "ctrain train llama --init-from DIR"; }
grep -q '^initialised from tests/fixtures/models/llama_hf_gqa: Llama(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2' \
    "$d/train.log" || { cat "$d/train.log"; fail "not initialised from the directory"; }
[ -f "$d/run/hf/model.safetensors" ] && [ -f "$d/run/hf/config.json" ] || fail "no OUTPUT/hf/"
for want in '"LlamaForCausalLM"' '"model_type":[[:space:]]*"llama"' '"num_key_value_heads":[[:space:]]*2,' \
    '"rope_scaling":[[:space:]]*null' '"torch_dtype":[[:space:]]*"float32"'; do
    grep -q "$want" "$d/run/hf/config.json" || fail "config.json lacks $want"
done
tl=$(sed -n 's/^done: .*test loss \([0-9.]*\).*/\1/p' "$d/train.log")
el=$($B/ctrain eval --checkpoint "$d/run/hf" --text "$d/t.txt" --threads 2 | sed -n 's/^test split: .* loss \([0-9.]*\) .*/\1/p')
[ -n "$tl" ] && [ "$tl" = "$el" ] || fail "eval of the export: test loss '$el', training's '$tl'"
# the export is also a starting point
$B/ctrain train llama --init-from "$d/run/hf" --text "$d/t.txt" --steps 1 --threads 2 --output-dir "$d/run2" > "$d/train2.log" 2>&1 ||
    { cat "$d/train2.log"; fail "--init-from the export"; }
# generate: transformers 4.40.2's greedy tokens for this model (test_llama_generate.c), and a byte prompt
g=$($B/ctrain generate --checkpoint tests/fixtures/models/llama_hf_gqa --prompt-tokens 216,103,110,206,145 --temperature 0 \
    --max-new-tokens 12 --threads 2 2>/dev/null)
[ "$g" = "193,77,39,8,29,171,201,165,63,77,8,8" ] || fail "ctrain generate of the Llama: '$g'"
$B/ctrain generate --checkpoint "$d/run" --prompt "Hi" --max-new-tokens 40 --threads 2 > "$d/gen.txt" 2>&1 || { cat "$d/gen.txt"; fail "--prompt"; }
echo "llama: HF directory → train → export → eval (test loss $el)"
