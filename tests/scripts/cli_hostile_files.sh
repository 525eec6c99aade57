#!/usr/bin/env bash
# Hostile model files and data for `ctrain eval`, `generate`, `train --init-from` and
# `quantize`: each is refused with one clear line and a non-zero exit, fast and small, never
# a crash, a hang or a huge allocation.
# - a 1 KB edit of a model file's metadata, or of the config.json beside a GPT-2 checkpoint,
#   declaring a model far larger than the file's tensors (used to allocate ~19 GB and be
#   OOM-killed): refused in under a second and 100 MB (run under `ulimit -v`, so that an
#   attempt to allocate fails instead of taking the machine's memory);
# - quantize asked for a model far beyond the file's tensors: refused likewise;
# - eval on labels outside the model's classes, generate --logits on a token outside the
#   vocabulary (both used to abort);
# - a config.json that is a FIFO (used to hang) or a directory (used to say "Success");
# - eval on an empty evaluation set (used to print nan and exit 0).
# CT_BUILD=build-san runs it against the sanitizer build.
set -uo pipefail
cd "$(dirname "$0")/../.."
C=${CTRAIN_BIN:-$PWD/${CT_BUILD:-build}/ctrain}
F=tests/fixtures/models/gpt2_hf
[ -x "$C" ] || { echo "FAIL: $C not built"; exit 1; }
command -v python3 >/dev/null || { echo "no python3 to write the files"; exit 77; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# expect PATTERN CMD...: exit 1 or 2 within 20 s, one line on stderr matching PATTERN
expect() {
    local pat=$1; shift
    local err rc; err=$(timeout 20 "$@" 2>&1 >/dev/null); rc=$?
    [ $rc -ne 124 ] || fail "hung: $*"
    [ $rc -ne 0 ] || fail "exit 0 for: $*"
    [ $rc -lt 128 ] || fail "killed by signal $((rc - 128)): $*: $err"
    echo "$err" | grep -qE -- "$pat" || fail "expected /$pat/ for: $*; got: $err"
    [ "$(echo "$err" | grep -c .)" -le 1 ] || fail "more than one line for: $*: $err"
}
# small PATTERN CMD...: as expect, under 1 GB of address space, and (where /usr/bin/time
# is) in under 1 s and 100 MB resident
small() {
    local pat=$1; shift
    # the sanitizer build reserves terabytes of address space for its shadow memory: no
    # ulimit -v there, and its resident size is its own (the plain build's figures count)
    if [ "${CT_BUILD:-build}" = build-san ]; then expect "$pat" "$@"; return; fi
    ( ulimit -v 1000000; expect "$pat" "$@" ) || exit 1
    if [ -x /usr/bin/time ]; then
        ( ulimit -v 1000000; /usr/bin/time -f "%e %M" -o "$d/time" "$@" >/dev/null 2>&1 )
        read -r secs kb < <(tail -1 "$d/time")
        awk -v s="$secs" 'BEGIN { exit !(s < 1.0) }' || fail "$secs s to refuse: $*"
        [ "$kb" -lt 100000 ] || fail "$kb KB resident to refuse: $*"
        echo "refused in $secs s, $((kb / 1024)) MB: ${*:2:2}"
    fi
}
q=(--threads 1)

# a small GPT (byte level, context 8)
for i in $(seq 1 40); do echo "some text for a tiny model, line $i"; done > "$d/t.txt"
$C train gpt --text "$d/t.txt" --n-layer 1 --n-embd 16 --n-head 2 --block-size 8 --batch-size 4 --steps 2 --log-every 100 \
    "${q[@]}" --output-dir "$d/g" > "$d/train.log" 2>&1 || fail "train: $(tail -3 "$d/train.log")"
M=$d/g/model.safetensors

# set_meta IN OUT KEY=VALUE...: the safetensors file with its metadata edited, tensors unchanged
set_meta() {
    python3 - "$@" <<'PY'
import json, struct, sys
src, dst, kv = sys.argv[1], sys.argv[2], sys.argv[3:]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for a in kv:
    k, v = a.split("=", 1)
    h.setdefault("__metadata__", {})[k] = v
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(dst, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
}

# 1. metadata declaring a GPT of ~4.8e9 parameters (19 GB) over a file of a few thousand
mkdir -p "$d/big"
set_meta "$M" "$d/big/model.safetensors" ctrain.n_layer=24 ctrain.n_embd=4096 || fail "python3 could not edit the metadata"
pat="big/model.safetensors: its metadata describes a gpt of [0-9,]+ parameters but the file holds [0-9,]+ float values"
small "$pat" $C eval --checkpoint "$d/big/model.safetensors" --text "$d/t.txt" "${q[@]}"
small "$pat" $C generate --checkpoint "$d/big" --prompt hi "${q[@]}"
small "$pat" $C train gpt --init-from "$d/big/model.safetensors" --text "$d/t.txt" --steps 1 "${q[@]}" --output-dir "$d/o1"
# the same through quantize, whose shape comes from its flags
small "$M: the flags describe a gpt of [0-9,]+ parameters but the file holds [0-9,]+ float values" \
    $C quantize --checkpoint "$M" --model gpt --n-layer 24 --n-embd 4096 --n-head 2 --block-size 8 --output "$d/q.safetensors" "${q[@]}"
small "$M: the flags describe a mlp of [0-9,]+ parameters but" \
    $C quantize --checkpoint "$M" --model mlp --hidden 65536,65536 --output "$d/q.safetensors" "${q[@]}"
# the metadata's own bounds still hold
set_meta "$M" "$d/neg.safetensors" ctrain.n_embd=-4
expect "neg.safetensors: the model in its metadata is invalid: gpt.n_embd" $C eval --checkpoint "$d/neg.safetensors" --text "$d/t.txt"

# 2. a GPT-2 checkpoint whose config.json declares a far larger model than its tensors
mkdir -p "$d/hf"
cp "$F/model.safetensors" "$d/hf/"
# set_json IN OUT JSON: the JSON object IN with the keys of JSON set
set_json() {
    python3 - "$@" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(json.loads(sys.argv[3]))
json.dump(c, open(sys.argv[2], "w"))
PY
}
set_json "$F/config.json" "$d/hf/config.json" '{"n_layer": 24, "n_embd": 4096, "n_head": 32}' || fail "python3 could not edit config.json"
pat="hf/model.safetensors: its config.json describes a gpt of [0-9,]+ parameters but the file holds [0-9,]+ float values"
small "$pat" $C eval --checkpoint "$d/hf" --text "$d/t.txt" "${q[@]}"
small "$pat" $C generate --checkpoint "$d/hf/model.safetensors" --prompt hi "${q[@]}"
small "$pat" $C train gpt --init-from "$d/hf/model.safetensors" --text "$d/t.txt" --steps 1 "${q[@]}" --output-dir "$d/o2"
# numbers no int or float can hold are refused, not cast
for kv in '"n_embd": 1e300' '"n_layer": -1e300' '"n_inner": 1e300' '"layer_norm_epsilon": 1e300'; do
    set_json "$F/config.json" "$d/hf/config.json" "{$kv}"
    expect "hf/config.json: (n_embd = 1e\\+300 is not an integer|n_layer = -1e\\+300 is not an integer|n_inner = 1e\\+300 is not an integer|layer_norm_epsilon = 1e\\+300 must be in \\[0, 1\\))" \
        $C eval --checkpoint "$d/hf" --text "$d/t.txt" "${q[@]}"
done

# 3. a config.json that is no regular file: a FIFO no one writes, a directory
mkdir -p "$d/fifo" "$d/dir/config.json"
cp "$F/model.safetensors" "$d/fifo/"
cp "$F/model.safetensors" "$d/dir/"
mkfifo "$d/fifo/config.json"
for src in "$d/fifo" "$d/dir"; do
    pat="$src/config.json: not a regular file"
    expect "$pat" $C eval --checkpoint "$src" --text "$d/t.txt" "${q[@]}"
    expect "$pat" $C generate --checkpoint "$src/model.safetensors" --prompt hi "${q[@]}"
    expect "$pat" $C train gpt --init-from "$src/model.safetensors" --text "$d/t.txt" --steps 1 "${q[@]}" --output-dir "$d/o3"
done

# 4. generate --logits with a token outside the vocabulary (256): the prompt is checked first
expect "prompt token 300 at position 1 is outside the vocabulary" \
    $C generate --checkpoint "$M" --prompt-tokens 1,300 --logits "$d/l.safetensors" "${q[@]}"
[ ! -e "$d/l.safetensors" ] || fail "--logits wrote a file for a refused prompt"

# 5. eval on labels outside the model's classes, and on an empty test set
python3 - "$d" <<'PY' || fail "python3 could not write the IDX files"
import os, random, struct, sys
d = sys.argv[1]
r = random.Random(5)
def idx(dir, name, n, labels):
    os.makedirs(dir, exist_ok=True)
    imgs = bytes(r.randrange(256) for _ in range(n * 784))
    open(f"{dir}/{name}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, 28, 28) + imgs)
    open(f"{dir}/{name}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + bytes(labels))
idx(f"{d}/ok", "train", 64, [i % 10 for i in range(64)])
idx(f"{d}/ok", "t10k", 16, [i % 10 for i in range(16)])
idx(f"{d}/l12", "t10k", 16, [i % 10 for i in range(15)] + [12])
idx(f"{d}/empty", "t10k", 0, [])
PY
$C train mlp --data-dir "$d/ok" --hidden 8 --batch-size 16 --steps 2 --log-every 100 "${q[@]}" --output-dir "$d/m" > "$d/mlp.log" 2>&1 ||
    fail "train mlp: $(tail -3 "$d/mlp.log")"
expect "l12/t10k-labels-idx1-ubyte: label 12 at index 15 is outside \[0, 10\).*10 classes" \
    $C eval --checkpoint "$d/m" --data-dir "$d/l12" "${q[@]}"
expect "no samples to evaluate" $C eval --checkpoint "$d/m" --data-dir "$d/empty" "${q[@]}"
# a GPT on a text with no held-out window of its context (8 tokens): 9 bytes make one
# window to train on and none to test
printf 'abcdefgh\n' > "$d/short.txt"
expect "no samples to evaluate" $C eval --checkpoint "$d/g" --text "$d/short.txt" "${q[@]}"
echo "ok: oversized metadata, config.json and quantize flags refused small and fast; bad labels, out-of-vocabulary --logits, FIFO and directory config.json, empty evaluation sets refused"
