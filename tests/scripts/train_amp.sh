#!/usr/bin/env bash
# `ctrain train --amp`: a short CNN run under bf16 autocast ends close to the f32 run (loss
# within 0.1, test accuracy within 3 points after 60 steps: the full-length comparison is in
# docs/bench/amp.md); `--amp fp16` turns loss scaling on, finishes with no
# NaN and logs the steps it skipped; a bad type is refused in one line.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
. tests/tools/fashion_mnist.sh
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
cnn=(cnn --steps 60 --batch-size 32 --eval-max 1000 --threads 1 --log-every 20)
for amp in f32 bf16 fp16; do
    a=(); [ $amp = f32 ] || a=(--amp $amp)
    [ $amp = bf16 ] && a=(--amp) # no type: bf16
    $C train "${cnn[@]}" "${a[@]}" --output-dir "$d/$amp" > "$d/$amp.log" 2>&1 || { cat "$d/$amp.log"; echo "$amp run failed"; exit 1; }
done
final() { sed -n 's/^done: .*test accuracy \([0-9.]*\) | test loss \([0-9.na]*\).*/\1 \2/p' "$d/$1.log"; }
read -r acc32 loss32 < <(final f32)
read -r accbf lossbf < <(final bf16)
read -r acc16 loss16 < <(final fp16)
echo "f32: accuracy $acc32 loss $loss32 | bf16: $accbf $lossbf | fp16: $acc16 $loss16"
grep -q "autocast bf16" "$d/bf16.log" || { echo "--amp did not pick bf16"; exit 1; }
grep -q "autocast f16 + loss scaling" "$d/fp16.log" || { echo "--amp fp16 did not turn loss scaling on"; exit 1; }
awk -v a="$acc32" -v b="$accbf" -v la="$loss32" -v lb="$lossbf" 'BEGIN { d = a - b; e = la - lb; if (d < 0) d = -d; if (e < 0) e = -e;
    exit !(d <= 0.03 && e <= 0.1) }' || { echo "bf16 run too far from f32"; exit 1; }
if grep -Eqi "loss -?(nan|inf)" "$d/fp16.log"; then cat "$d/fp16.log"; echo "NaN in the fp16 run"; exit 1; fi
grep -q "optimizer step skipped; loss scale now" "$d/fp16.log" || { echo "fp16: no skipped step logged"; exit 1; }
grep -q "steps skipped (overflow)" "$d/fp16.log" || { echo "fp16: no skipped-step count at the end"; exit 1; }
if $C train cnn --amp fp8 --output-dir "$d/bad" > "$d/bad.log" 2>&1; then echo "--amp fp8 accepted"; exit 1; fi
[ "$(wc -l < "$d/bad.log")" -eq 1 ] && grep -q "fp8" "$d/bad.log" || { cat "$d/bad.log"; echo "--amp fp8: not one clear line"; exit 1; }
echo "bf16 within 0.03 accuracy / 0.1 loss of f32; fp16 no NaN, skipped steps logged; bad type refused"
