#!/usr/bin/env bash
# The sharded optimizer step needs a second shared segment (parameters and optimizer state).
# On a /dev/shm with room for the group and the gradients but not for it, every rank warns
# and trains with its own copy instead — the same weights. Runs in a mount namespace with a
# 10 MiB tmpfs on /dev/shm (needs root): 5 MiB of group segment (1 MiB chunks) + 3.3 MiB of
# gradients fit, the 4.9 MiB of parameters and AdamW state do not.
. "$(dirname "$0")/lib/small_shm.sh"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
for i in $(seq 1 60); do echo "the quick brown fox jumps over the lazy dog $i times, said the $((i*7)) cats."; done > "$d/text.txt"
args="train gpt --text $d/text.txt --n-layer 2 --n-embd 128 --n-head 2 --block-size 16 --batch-size 4 --steps 6 --log-every 100 --eval-max 8 --threads 1"
out=$(on_small_shm 10M "$B run --standalone --nproc-per-node 2 $B $args --output-dir $d/full" 2>&1) ||
    die "run on a small /dev/shm: $out"
[ "$(echo "$out" | grep -c "optimizer not sharded, every rank steps its own copy: .*/dev/shm")" = 2 ] || die "warning on both ranks: $out"
echo "$out" | grep -q "^ddp: 2 buckets" || die "not the all-reduce path: $out"
out=$(timeout 120 $B run --standalone --nproc-per-node 2 $B $args --output-dir "$d/roomy" 2>&1) || die "roomy run: $out"
echo "$out" | grep -q "^ddp: sharded optimizer step" || die "not sharded with room: $out"
cmp "$d/full/model.safetensors" "$d/roomy/model.safetensors" || die "the fallback gave other weights"
echo "no room for the sharded step: warned, trained unsharded, same weights"
