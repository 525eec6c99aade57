#!/usr/bin/env bash
# Bad input to `ctrain train`: one clear line each, non-zero exit, nothing written over.
set -uo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
expect() { # expect <pattern> <command...>: exit != 0 and stderr matches
    local pat=$1; shift
    local err; err=$("$@" 2>&1 >/dev/null); local rc=$?
    [ $rc -ne 0 ] || fail "exit 0 for: $*"
    echo "$err" | grep -qE -- "$pat" || fail "expected /$pat/ for: $*; got: $err"
    [ "$(echo "$err" | grep -c .)" -le 2 ] || fail "more than two lines for: $*: $err"
}
expect "--lr expects a number" $C train mlp --lr abc
expect "--batch-size expects an integer" $C train mlp --batch-size 0
expect "unknown option '--bogus'" $C train mlp --bogus
expect "the model expects mlp, cnn, gpt or llama" $C train resnet
expect "gpt needs --text" $C train gpt
expect "--hidden expects comma-separated widths" $C train mlp --hidden 1,,2
expect "is not a ctrain checkpoint" $C train mlp --resume "$d" --output-dir "$d/o"
expect "no train-images-idx3-ubyte.* in --data-dir $d/none" $C train mlp --data-dir "$d/none" --output-dir "$d/o"
# corrupted IDX: a truncated image file
mkdir -p "$d/bad"
printf '\x00\x00\x08\x03\x00\x00\x00\x0a\x00\x00\x00\x1c\x00\x00\x00\x1c\x01\x02' > "$d/bad/train-images-idx3-ubyte"
printf '\x00\x00\x08\x01\x00\x00\x00\x0a\x01\x02\x03\x04\x05\x06\x07\x08\x09\x00' > "$d/bad/train-labels-idx1-ubyte"
expect "train-images-idx3-ubyte" $C train mlp --data-dir "$d/bad" --output-dir "$d/o"
# corrupted token shard
printf 'not a shard' > "$d/x.bin"
expect "x.bin: .*shorter than the 1024-byte shard header" $C train gpt --shards "$d/x.bin" --output-dir "$d/o"
# a checkpoint of another model: refused, and the existing output is not touched
for i in $(seq 1 40); do echo "some text for a tiny model, line $i"; done > "$d/t.txt"
$C train gpt --text "$d/t.txt" --n-layer 1 --n-embd 16 --n-head 2 --block-size 8 --steps 4 --log-every 100 --eval-max 8 --output-dir "$d/g" > /dev/null || fail "tiny gpt run"
before=$(md5sum "$d/g/model.safetensors")
if [ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    expect "checkpoint of a 'gpt' model, this run trains 'mlp'" \
        $C train mlp --steps 2 --resume "$d/g/checkpoints/step-00000004" --output-dir "$d/g"
fi
expect "mismatch|shape|differ" $C train gpt --text "$d/t.txt" --n-layer 1 --n-embd 32 --n-head 2 --block-size 8 --steps 6 \
    --resume auto --output-dir "$d/g"
[ "$(md5sum "$d/g/model.safetensors")" = "$before" ] || fail "a refused resume changed the saved model"
# a corrupted checkpoint is skipped by --resume auto, named by --resume PATH
echo garbage >> "$d/g/checkpoints/step-00000004/model.safetensors"
expect "checksum differs" $C train gpt --text "$d/t.txt" --n-layer 1 --n-embd 16 --n-head 2 --block-size 8 --steps 6 \
    --resume "$d/g/checkpoints/step-00000004" --output-dir "$d/g"
echo "bad input handled"
