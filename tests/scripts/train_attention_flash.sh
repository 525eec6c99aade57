#!/usr/bin/env bash
# `ctrain train gpt --attention flash` (fused attention, O(T) memory) trains like the plain
# attention: the same losses and evaluation to the printed digits, on 2 ranks under DDP.
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
echo "flash follows plain: $(tr '\t\n' '= ' < "$d/pairs")"
