#!/usr/bin/env bash
# Data a model cannot take fails before the first step, naming the file, the first bad
# index and the value: labels beyond the model's classes (the dataset derives its class
# count from the labels, so only the model can say 12 is too many), images of another size,
# token ids beyond the vocabulary, a FIFO as --text (used to hang). Before this, each of the
# label and size cases stopped inside cross_entropy with abort() at some step.
set -uo pipefail
cd "$(dirname "$0")/../.."
C=$PWD/${CT_BUILD:-build}/ctrain
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
be32() { printf "\\x$(printf %02x $(($1 >> 24 & 255)))\\x$(printf %02x $(($1 >> 16 & 255)))\\x$(printf %02x $(($1 >> 8 & 255)))\\x$(printf %02x $(($1 & 255)))"; }
# mkidx DIR PREFIX N H W [BAD_INDEX BAD_LABEL]: random images, labels i % 10 but one
mkidx() {
    local dir=$1 pre=$2 n=$3 h=$4 w=$5 bi=${6:--1} bl=${7:-0}
    mkdir -p "$dir"
    { printf '\x00\x00\x08\x03'; be32 "$n"; be32 "$h"; be32 "$w"; head -c $((n * h * w)) /dev/urandom; } > "$dir/$pre-images-idx3-ubyte"
    { printf '\x00\x00\x08\x01'; be32 "$n"
      for ((i = 0; i < n; i++)); do
          if [ $i -eq "$bi" ]; then printf "\\x$(printf %02x "$bl")"; else printf "\\x0$((i % 10))"; fi
      done; } > "$d/lab.tmp" && mv "$d/lab.tmp" "$dir/$pre-labels-idx1-ubyte"
}
# expect PATTERN CMD...: fails within 20 s, stderr matches, no training step was printed
expect() {
    local pat=$1; shift
    local out rc; out=$(timeout 20 "$@" 2>&1); rc=$?
    [ $rc -ne 0 ] || fail "exit 0 for: $*"
    [ $rc -ne 124 ] || fail "timed out: $*"
    [ $rc -lt 128 ] || fail "killed by signal $((rc - 128)) (abort?): $*: $out"
    echo "$out" | grep -qE -- "$pat" || fail "expected /$pat/ for: $*; got: $out"
    ! echo "$out" | grep -q "^step " || fail "trained before failing: $*"
}
q=(--steps 3 --batch-size 16 --threads 1 --log-every 1)

mkidx "$d/l12" train 200 28 28 137 12
expect "l12/train-labels-idx1-ubyte: label 12 at index 137 is outside \[0, 10\).*10 classes" \
    $C train mlp --data-dir "$d/l12" --output-dir "$d/o1" "${q[@]}"
[ ! -e "$d/o1/model.safetensors" ] || fail "a refused run wrote weights"
mkidx "$d/l200" train 200 28 28 0 200
expect "l200/train-labels-idx1-ubyte: label 200 at index 0 " $C train cnn --data-dir "$d/l200" --output-dir "$d/o2" "${q[@]}"
# a bad label in the test set only: named too (evaluation would have aborted at the end)
mkidx "$d/t" train 200 28 28
mkidx "$d/t" t10k 50 28 28 49 10
expect "t10k-labels-idx1-ubyte: label 10 at index 49 " $C train mlp --data-dir "$d/t" --output-dir "$d/o3" "${q[@]}"
# images of another size than the model's
mkidx "$d/s32" train 200 32 32
expect "s32/train-images-idx3-ubyte: samples are \[1, 32, 32\] but the model 'cnn' takes \[1, 28, 28\]" \
    $C train cnn --data-dir "$d/s32" --output-dir "$d/o4" "${q[@]}"
expect "samples are \[1, 32, 32\] \(1024 values\) but the model 'mlp' takes 784 values" \
    $C train mlp --data-dir "$d/s32" --output-dir "$d/o5" "${q[@]}"
# token ids beyond --vocab-size: file, token index and window
for i in $(seq 1 40); do echo "some text for a tiny model, line $i"; done > "$d/t.txt"
{ head -c 500 "$d/t.txt"; printf '\xc8'; tail -c +502 "$d/t.txt"; } > "$d/bad.txt"
g=(--n-layer 1 --n-embd 16 --n-head 2 --block-size 8 --steps 2 --threads 1)
# (a text's bytes are tokens only for a model of 256 of them: the bytes go in as a shard)
tobin() { perl -e 'local $/; my @t = unpack("C*", <STDIN>); print pack("l<256", 20240520, 1, scalar(@t), (0) x 253), pack("S<*", @t)'; }
tobin < "$d/bad.txt" > "$d/bad.bin"
tobin < "$d/t.txt" > "$d/t.bin"
expect "bad.bin: token id 200 at token index 500 \(window 62\) is outside \[0, 128\).*vocabulary of 128" \
    $C train gpt --shards "$d/bad.bin" --vocab-size 128 "${g[@]}" --output-dir "$d/o6"
expect "--text without --tokenizer trains on bytes \(vocabulary 256\), but the gpt's vocabulary is 128: give --tokenizer" \
    $C train gpt --text "$d/t.txt" --vocab-size 128 "${g[@]}" --output-dir "$d/o6"
# --text on a FIFO: refused at once instead of blocking forever in open()
mkfifo "$d/fifo"
expect "fifo: is a FIFO, not a regular file" $C train gpt --text "$d/fifo" "${g[@]}" --output-dir "$d/o7"
expect "null: is a character device" $C train gpt --text /dev/null "${g[@]}" --output-dir "$d/o7"
# a text too short to hold windows out: nothing is evaluated, and said so (was "accuracy nan")
head -c 150 "$d/t.txt" > "$d/short.txt"
out=$($C train gpt --text "$d/short.txt" "${g[@]}" --batch-size 4 --output-dir "$d/o10" 2>&1) || fail "short text: $out"
echo "$out" | grep -q "no evaluation: the evaluation data (.*short.txt) has no samples" || fail "short text: $out"
echo "$out" | grep -q "^done: .* | nothing evaluated | " || fail "short text: $out"
! echo "$out" | grep -qi "nan" || fail "short text: nan reported: $out"
# and good data still trains
mkidx "$d/ok" train 200 28 28
$C train cnn --data-dir "$d/ok" --output-dir "$d/o8" "${q[@]}" > "$d/ok.log" 2>&1 || { cat "$d/ok.log"; fail "good data refused"; }
$C train gpt --shards "$d/t.bin" --vocab-size 128 "${g[@]}" --output-dir "$d/o9" > "$d/ok.log" 2>&1 || { cat "$d/ok.log"; fail "good text refused"; }
# gzipped images beside plain labels: each file is found in either form
mkidx "$d/mix" train 200 28 28
gzip "$d/mix/train-images-idx3-ubyte"
$C train mlp --data-dir "$d/mix" --output-dir "$d/o11" "${q[@]}" > "$d/mix.log" 2>&1 || { cat "$d/mix.log"; fail "mixed .gz and plain files refused"; }
# and a missing labels file is named as such, not as missing images
rm "$d/mix/train-labels-idx1-ubyte"
expect "no train-labels-idx1-ubyte\(.gz\) in .*mix beside train-images-idx3-ubyte.gz" \
    $C train mlp --data-dir "$d/mix" --output-dir "$d/o12" "${q[@]}"
echo "bad data refused before training"
