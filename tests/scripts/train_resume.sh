#!/usr/bin/env bash
# `ctrain train`: a run resumed from a mid-epoch checkpoint ends with the same bits as a run
# that never stopped; the same command twice gives the same weights.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
d=${KEEP_DIR:-$(mktemp -d)}; [ -n "${KEEP_DIR:-}" ] || trap 'rm -rf "$d"' EXIT
for i in $(seq 1 60); do echo "the quick brown fox jumps over the lazy dog $i times, said the $((i*7)) cats."; done > "$d/text.txt"
common=(gpt --text "$d/text.txt" --n-layer 2 --n-embd 32 --n-head 2 --block-size 16 --batch-size 4 --steps 30
        --log-every 100 --eval-max 64 --threads 1 --workers 2 --save-every 10 --keep 5)
$C train "${common[@]}" --output-dir "$d/a" > "$d/a.log"
$C train "${common[@]}" --output-dir "$d/b" > "$d/b.log"
cmp "$d/a/model.safetensors" "$d/b/model.safetensors" || { echo "same command twice gave different weights"; exit 1; }
# resume from step 20: 30 steps of 4 windows each = 1.5 epochs of the 76 training windows... step 20 is mid-epoch
mkdir -p "$d/c/checkpoints"
cp -r "$d/a/checkpoints/step-00000020" "$d/c/checkpoints/"
$C train "${common[@]}" --output-dir "$d/c" --resume auto > "$d/c.log"
grep -q "resumed from .*step-00000020 at step 20" "$d/c.log" || { cat "$d/c.log"; echo "did not resume"; exit 1; }
cmp "$d/a/model.safetensors" "$d/c/model.safetensors" || { echo "resumed run differs from the uninterrupted one"; exit 1; }
ls "$d/a/checkpoints" | grep -q step-00000030
test -s "$d/a/metrics.jsonl" && test -s "$d/a/training.svg" && ls "$d/a"/events.out.tfevents.* > /dev/null
# the same under DDP with 2 ranks, and a 2-rank checkpoint resumed by 1 rank
R=(run --nproc-per-node 2 --standalone)
$C "${R[@]}" $C train "${common[@]}" --output-dir "$d/m" > "$d/m.log" 2>&1 || { cat "$d/m.log"; exit 1; }
mkdir -p "$d/n/checkpoints" "$d/s/checkpoints"
cp -r "$d/m/checkpoints/step-00000020" "$d/n/checkpoints/"
cp -r "$d/m/checkpoints/step-00000010" "$d/s/checkpoints/"
$C "${R[@]}" $C train "${common[@]}" --output-dir "$d/n" --resume auto > "$d/n.log" 2>&1 || { cat "$d/n.log"; exit 1; }
cmp "$d/m/model.safetensors" "$d/n/model.safetensors" || { echo "2-rank resumed run differs from the uninterrupted one"; exit 1; }
# the trainer's sharded optimizer step (ct_zero): the bits, checkpointed optimizer state
# included, of every rank stepping its own copy after an all-reduce
grep -q "^ddp: sharded optimizer step, gradients averaged in it" "$d/m.log" || { cat "$d/m.log"; echo "not sharded"; exit 1; }
CTRAIN_DDP_SHARD_OPTIM=0 $C "${R[@]}" $C train "${common[@]}" --output-dir "$d/u" > "$d/u.log" 2>&1 || { cat "$d/u.log"; exit 1; }
grep -q "^ddp: [0-9]* buckets" "$d/u.log" || { cat "$d/u.log"; echo "CTRAIN_DDP_SHARD_OPTIM=0 still sharded"; exit 1; }
cmp "$d/m/model.safetensors" "$d/u/model.safetensors" || { echo "sharded and unsharded 2-rank runs differ"; exit 1; }
cmp "$d/m/checkpoints/step-00000020/train_state.safetensors" "$d/u/checkpoints/step-00000020/train_state.safetensors" ||
    { echo "sharded and unsharded optimizer states differ"; exit 1; }
$C train "${common[@]}" --output-dir "$d/s" --resume auto > "$d/s.log" 2>&1 || { cat "$d/s.log"; exit 1; }
grep -q "resumed from .*step-00000010 at step 10 (epoch 0, sample 80)" "$d/s.log" || { cat "$d/s.log"; echo "1-rank resume of a 2-rank checkpoint"; exit 1; }
grep -q "^done: 20 steps" "$d/s.log" || { cat "$d/s.log"; exit 1; }
echo "resume and determinism ok"
