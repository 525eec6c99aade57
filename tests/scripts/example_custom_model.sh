#!/usr/bin/env bash
# examples/custom_model.c: a model the library does not ship, trained by the trainer on 2
# ranks under `ctrain run`; a run resumed from its mid-way checkpoint ends with the same
# weights as the uninterrupted one, and the loss goes down.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/tools/fashion_mnist.sh
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
R=(${CT_BUILD:-build}/ctrain run --standalone --nproc-per-node 2 ${CT_BUILD:-build}/examples/custom_model)
"${R[@]}" "$d/a" 60 > "$d/a.log" 2>&1 || { cat "$d/a.log"; exit 1; }
grep -q "^resmlp | 2 ranks" "$d/a.log" || { cat "$d/a.log"; echo "not a 2-rank run"; exit 1; }
l0=$(sed -n 's/^step *25\/60 .* loss \([0-9.]*\) .*/\1/p' "$d/a.log")
l1=$(sed -n 's/^step *60\/60 .* loss \([0-9.]*\) .*/\1/p' "$d/a.log")
awk -v a="$l0" -v b="$l1" 'BEGIN { exit !(b < a) }' || { cat "$d/a.log"; echo "loss did not go down: $l0 -> $l1"; exit 1; }
grep -q "^eval  step 60: test loss" "$d/a.log"
mkdir -p "$d/b/checkpoints"
cp -r "$d/a/checkpoints/step-00000030" "$d/b/checkpoints/"
"${R[@]}" "$d/b" 60 > "$d/b.log" 2>&1 || { cat "$d/b.log"; exit 1; }
grep -q "resumed from .*step-00000030 at step 30" "$d/b.log" || { cat "$d/b.log"; echo "did not resume"; exit 1; }
cmp "$d/a/model.safetensors" "$d/b/model.safetensors" || { echo "resumed run differs from the uninterrupted one"; exit 1; }
# the same command with more steps continues from the newest checkpoint (docs/tutorial.md)
"${R[@]}" "$d/a" 80 > "$d/c.log" 2>&1 || { cat "$d/c.log"; exit 1; }
grep -q "resumed from .*step-00000060 at step 60" "$d/c.log" && grep -q "^done: 20 steps" "$d/c.log" || { cat "$d/c.log"; echo "longer run did not continue"; exit 1; }
echo "custom model: trained on 2 ranks, loss $l0 -> $l1, resume bit-identical"
