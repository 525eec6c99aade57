#!/usr/bin/env bash
# The GPT's memory savers on 2 ranks under DDP: `--attention flash` (fused attention, O(T)
# memory) trains like the plain attention (the same losses and evaluation to the printed
# digits); `--checkpoint-activations` (blocks recomputed in backward) gives the same bits as
# without, dropout on.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=build/ctrain
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
for i in $(seq 1 120); do echo "line $i of a text with $((i*7 % 31)) words and $((i*13 % 17)) commas,"; done > "$d/t.txt"
common=(gpt --text "$d/t.txt" --n-layer 2 --n-embd 64 --n-head 4 --block-size 96 --batch-size 4 --steps 20
        --log-every 5 --eval-every 10 --threads 1)
for a in plain flash; do
    $C run --nproc-per-node 2 --standalone $C train "${common[@]}" --attention $a --output-dir "$d/$a" > "$d/$a.log" 2>&1 ||
        { cat "$d/$a.log"; exit 1; }
done
nums() { grep -E "^(step|eval)" "$1" | sed -E 's/.*loss ([0-9.]+).*/\1/'; }
paste <(nums "$d/plain.log") <(nums "$d/flash.log") > "$d/pairs"
[ "$(wc -l < "$d/pairs")" -eq 6 ] || { cat "$d/plain.log" "$d/flash.log"; exit 1; }
awk '{ if ($1 - $2 > 2e-4 || $2 - $1 > 2e-4) { print "loss " $1 " vs " $2; bad = 1 } } END { exit bad }' "$d/pairs" ||
    { echo "flash attention training differs from plain"; exit 1; }
for c in "" "--checkpoint-activations"; do
    $C run --nproc-per-node 2 --standalone $C train "${common[@]}" --dropout 0.1 $c --output-dir "$d/ck$c" > "$d/ck$c.log" 2>&1 ||
        { cat "$d/ck$c.log"; exit 1; }
done
cmp "$d/ck/model.safetensors" "$d/ck--checkpoint-activations/model.safetensors" ||
    { echo "checkpointed training differs from plain"; exit 1; }
echo "checkpointed == plain (bit-identical); flash follows plain: $(tr '\t\n' '= ' < "$d/pairs")"
