#!/usr/bin/env bash
# Adding a model kind is its own file plus one table row (docs/adding-a-model.md): a copy of
# the tree gets tests/tools/toy_model/toy.c as src/models/toy.c and one row in
# CT_MODEL_KINDS, nothing else, and is built (reusing this build's objects, so only what the
# change touches compiles). Its `ctrain` then trains the toy on Fashion-MNIST with the
# toy's own flag, lists the flag in --help, refuses a bad value of it and another kind's
# flag with one line, saves the toy's config as metadata and evaluates the saved model.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${CT_BUILD:-build}
data=${CTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -r "$data/t10k-images-idx3-ubyte.gz" ] && [ ! -r "$data/t10k-images-idx3-ubyte" ]; then
    echo "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77
fi
[ -x "$B/ctrain" ] || { echo "$B/ctrain missing: build first"; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# the tree as git has it (plus this checkout's uncommitted sources), and the build's objects
# with their times, so that make rebuilds only what the two changes touch
mkdir -p "$d/tree"
cp -a Makefile src include "$d/tree/"
mkdir -p "$d/tree/$B"
cp -a "$B/obj" "$B"/*.stamp "$d/tree/$B/" 2>/dev/null || true
# the change: one file, one row
cp tests/tools/toy_model/toy.c "$d/tree/src/models/toy.c"
rows=$(grep -c 'X(ct_[a-z0-9]*_kind_)' "$d/tree/src/models/model_internal.h")
sed -i 's|^    /\* a new kind: one row above this line \*/$|    X(ct_toy_kind_)       \\\n&|' "$d/tree/src/models/model_internal.h"
[ "$(grep -c 'X(ct_[a-z0-9]*_kind_)' "$d/tree/src/models/model_internal.h")" -eq $((rows + 1)) ] || fail "the table row was not added"
diff -r src "$d/tree/src" | grep -E '^(Only in|[<>] )' > "$d/diff" || true
[ "$(grep -c '^Only in' "$d/diff")" -eq 1 ] && [ "$(grep -c '^> ' "$d/diff")" -eq 1 ] && [ "$(grep -c '^< ' "$d/diff")" -eq 0 ] ||
    { cat "$d/diff"; fail "the change is more than one file and one row"; }
san=(); [ "$B" = build-san ] && san=(SAN=1)
make -C "$d/tree" -s "${san[@]}" -j2 "$B/ctrain" > "$d/build.log" 2>&1 || { tail -20 "$d/build.log"; fail "the tree with a toy kind does not build"; }
C=$d/tree/$B/ctrain
# --help lists the toy's flag; the kinds in the usage line include it
$C train --help > "$d/help" || fail "train --help"
grep -q '^model toy (images' "$d/help" && grep -q -- '--hidden N .*hidden width (default 32)' "$d/help" || { cat "$d/help"; fail "--help lacks the toy"; }
grep -q 'usage: ctrain train mlp|cnn|gpt|llama|toy ' "$d/help" || { head -2 "$d/help"; fail "usage line lacks the toy"; }
# bad values and another kind's flags: one line, exit 2
set +e
out=$($C train toy --hidden 0 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "ctrain train: --hidden expects an integer in [1, 4096], got '0'" ] || fail "bad --hidden: rc $rc: $out"
out=$($C train toy --n-layer 2 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "ctrain train: --n-layer is a flag of gpt, not of toy" ] || fail "gpt flag on the toy: rc $rc: $out"
set -e
# train, then the file alone says what it is, and eval reads it
$C train toy --hidden 24 --steps 40 --batch-size 32 --eval-max 500 --threads 1 --log-every 20 --data-dir "$data" \
    --output-dir "$d/run" > "$d/train.log" 2>&1 || { cat "$d/train.log"; fail "ctrain train toy"; }
grep -q 'Toy(784-24-10)' "$d/train.log" || { cat "$d/train.log"; fail "the log does not describe the toy"; }
hdr=$(head -c 4096 "$d/run/model.safetensors" | tail -c +9 | tr -d '\0')
for want in '"ctrain.model":"toy"' '"ctrain.hidden":"24"' '"ctrain.in":"784"' '"0.weight":{"dtype":"F32","shape":[24,784]'; do
    [[ "$hdr" == *"$want"* ]] || fail "model.safetensors lacks $want: $hdr"
done
$C eval --checkpoint "$d/run" --data-dir "$data" --eval-max 500 --threads 1 > "$d/eval.log" 2>&1 || { cat "$d/eval.log"; fail "ctrain eval"; }
acc=$(sed -n 's/.*test split: 500 samples | loss [0-9.]* | accuracy \([0-9.]*\).*/\1/p' "$d/eval.log")
[ -n "$acc" ] || { cat "$d/eval.log"; fail "no accuracy line"; }
awk -v a="$acc" 'BEGIN { exit !(a > 0.4) }' || { cat "$d/eval.log"; fail "accuracy $acc: the toy did not train"; }
echo "a toy kind from one file and one row: trained, saved, evaluated (accuracy $acc)"
