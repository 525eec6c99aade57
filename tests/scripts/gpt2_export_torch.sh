#!/usr/bin/env bash
# A GPT trained by ctrain and written with `--export hf` (Hugging Face GPT2LMHeadModel layout
# + config.json) loads into a GPT-2 written in plain PyTorch (tests/torch/gpt2_plain.py) and
# gives ctrain's logits (`ctrain generate --logits`), for exact GELU and for GPT-2's tanh GELU
# (a model started from the tanh fixture). Skips without PyTorch.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
if ! [ -x "$PY" ] || ! "$PY" -c "import torch" 2>/dev/null; then echo "no PyTorch at $PY (bash scripts/setup-interop.sh installs python3-torch)"; exit 77; fi
C=build/ctrain
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
for i in $(seq 1 60); do echo "an exported model line $i, with $((i*7 % 23)) words."; done > "$d/t.txt"
$C train gpt --text "$d/t.txt" --n-layer 2 --n-embd 48 --n-head 3 --block-size 32 --batch-size 4 --steps 15 --log-every 100 \
    --threads 1 --export hf --output-dir "$d/exact" > "$d/exact.log" 2>&1 || { cat "$d/exact.log"; exit 1; }
$C train gpt --init-from tests/fixtures/models/gpt2_hf/model.safetensors --text "$d/t.txt" --batch-size 4 --steps 5 \
    --block-size 32 --log-every 100 --threads 1 --export hf --output-dir "$d/tanh" > "$d/tanh.log" 2>&1 || { cat "$d/tanh.log"; exit 1; }
grep -Eq '"activation_function":[[:space:]]*"gelu_new"' "$d/tanh/hf/config.json" || { cat "$d/tanh/hf/config.json"; echo "tanh GELU not exported"; exit 1; }
for m in exact tanh; do
    $C generate --checkpoint "$d/$m/hf/model.safetensors" --prompt "an exported model" --max-new-tokens 1 --temperature 0 \
        --logits "$d/$m.logits.safetensors" > "$d/$m.gen" 2>&1 || { cat "$d/$m.gen"; exit 1; }
    "$PY" tests/torch/gpt2_plain.py "$d/$m/hf" "$d/$m.logits.safetensors"
done
