#!/usr/bin/env bash
# `ctrain train --grad-accum K`: K micro-batches of B per optimizer step train like one batch
# of K x B (2 ranks: the same losses and test accuracy to the printed digits), and a run
# resumed mid-epoch ends with the same bits as the uninterrupted one.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
. tests/tools/fashion_mnist.sh
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
R=(run --nproc-per-node 2 --standalone)
common=(mlp --hidden 64 --steps 30 --log-every 5 --eval-max 1000 --threads 1 --save-every 10)
$C "${R[@]}" $C train "${common[@]}" --batch-size 48 --output-dir "$d/big" > "$d/big.log" 2>&1 || { cat "$d/big.log"; exit 1; }
$C "${R[@]}" $C train "${common[@]}" --batch-size 16 --grad-accum 3 --output-dir "$d/acc" > "$d/acc.log" 2>&1 || { cat "$d/acc.log"; exit 1; }
grep -q "2 ranks × batch 16 × 3 micro-batches = global batch 96" "$d/acc.log" || { cat "$d/acc.log"; echo "header"; exit 1; }
losses() { sed -n 's/^step .* loss \([0-9.]*\) .*/\1/p' "$1"; }
paste <(losses "$d/big.log") <(losses "$d/acc.log") > "$d/pairs"
[ "$(wc -l < "$d/pairs")" -eq 6 ] || { cat "$d/big.log" "$d/acc.log"; echo "expected 6 progress lines each"; exit 1; }
awk '{ if ($1 - $2 > 2e-4 || $2 - $1 > 2e-4) { print "loss " $1 " vs " $2; bad = 1 } } END { exit bad }' "$d/pairs" ||
    { echo "accumulated steps do not follow the larger batch"; exit 1; }
acc() { sed -n 's/^done: .* test accuracy \([0-9.]*\) .*/\1/p' "$1"; }
[ "$(acc "$d/big.log")" = "$(acc "$d/acc.log")" ] || { echo "test accuracy $(acc "$d/big.log") vs $(acc "$d/acc.log")"; exit 1; }
# resume from step 20 (mid-epoch) with accumulation
mkdir -p "$d/res/checkpoints"; cp -r "$d/acc/checkpoints/step-00000020" "$d/res/checkpoints/"
$C "${R[@]}" $C train "${common[@]}" --batch-size 16 --grad-accum 3 --output-dir "$d/res" --resume auto > "$d/res.log" 2>&1 || { cat "$d/res.log"; exit 1; }
grep -q "resumed from .*step-00000020 at step 20" "$d/res.log" || { cat "$d/res.log"; exit 1; }
cmp "$d/acc/model.safetensors" "$d/res/model.safetensors" || { echo "resumed accumulation run differs"; exit 1; }
echo "grad-accum 3 x 16 follows batch 48 ($(tr '\n' ' ' < "$d/pairs")); resume bit-identical"
