#!/usr/bin/env bash
# `ctrain train` gives the same bits as the recording in tests/fixtures/train/golden.txt
# (weights, checkpoint files and printed losses of short MLP, CNN and GPT runs, 1 and 2
# ranks, a resume, gradient clipping, bf16 gradient traffic), made before the trainer moved
# into the library (re-recorded when model.safetensors gained the ctrain.* config metadata:
# every file was byte-identical to the earlier recording without those header entries; and
# when the build began preferring 512-bit vectors: printed losses unchanged, weights differing
# in the last bits of the sums gcc now vectorizes 16 lanes wide).
# On a CPU other than the recording's (name, family and model) the kernels may round
# differently (OpenBLAS picks its kernels by core type): there only the printed losses are compared, as for a build with
# other compiler flags (CT_BUILD=build-san: -O1 sums in another order).
# RECORD=1 rewrites the recording.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
G=tests/fixtures/train/golden.txt
. tests/tools/fashion_mnist.sh
d=${KEEP_DIR:-$(mktemp -d)}; [ -n "${KEEP_DIR:-}" ] || trap 'rm -rf "$d"' EXIT
for i in $(seq 1 80); do echo "a golden line number $i, with $((i*13 % 97)) words of $((i*7)) letters."; done > "$d/text.txt"
R=(run --nproc-per-node 2 --standalone)
q=(--threads 1 --log-every 5)
mlp=(mlp --hidden 64,32 --steps 30 --batch-size 32 --eval-max 512 --save-every 10 --keep 5)
cnn=(cnn --steps 12 --batch-size 16 --eval-max 256 --clip 1.0 --grad-compression bf16 --save-every 6)
gpt=(gpt --attention plain --text "$d/text.txt" --n-layer 2 --n-embd 32 --n-head 2 --block-size 16 --batch-size 4 --steps 24 --eval-every 12 --save-every 12 --warmup 4)
run() { # name, then the command
    local n=$1; shift
    "$@" --output-dir "$d/$n" > "$d/$n.log" 2>&1 || { cat "$d/$n.log"; echo "$n failed"; exit 1; }
}
run mlp2 $C "${R[@]}" $C train "${mlp[@]}" "${q[@]}"
mkdir -p "$d/mlp2r/checkpoints"; cp -r "$d/mlp2/checkpoints/step-00000020" "$d/mlp2r/checkpoints/"
run mlp2r $C "${R[@]}" $C train "${mlp[@]}" "${q[@]}" --resume auto
run cnn2 $C "${R[@]}" $C train "${cnn[@]}" "${q[@]}"
run gpt1 $C train "${gpt[@]}" "${q[@]}"
run gpt2 $C "${R[@]}" $C train "${gpt[@]}" "${q[@]}" --schedule linear
mkdir -p "$d/gpt1r/checkpoints"; cp -r "$d/gpt1/checkpoints/step-00000012" "$d/gpt1r/checkpoints/"
run gpt1r $C train "${gpt[@]}" "${q[@]}" --resume auto
{
    # the family and model too: VMs of two Xeon generations both say "Intel(R) Xeon(R) Processor",
    # and Debian's OpenBLAS 0.3.21 runs its SSE3 kernel on model 207, which it does not know
    echo "cpu $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //') | family $(grep -m1 'cpu family' /proc/cpuinfo | sed 's/.*: //') model $(grep -m1 -E '^model[[:space:]]' /proc/cpuinfo | sed 's/.*: //') | avx512f $(grep -c -m1 -w avx512f /proc/cpuinfo)"
    for n in mlp2 mlp2r cnn2 gpt1 gpt2 gpt1r; do
        (cd "$d/$n" && find . -name '*.safetensors' | sort | xargs sha256sum | sed "s|  ./|  $n/|")
        # losses and evaluations, without timings
        grep -E "^(step|eval|done)" "$d/$n.log" | sed -E 's/ \| [0-9]+ (samples|tokens)\/s.*//; s/^done: ([0-9]+) steps in [0-9.]+ s/done: \1 steps/; s/ \| weights .*//' | sed "s|^|$n: |"
    done
} > "$d/now.txt"
if [ -n "${RECORD:-}" ]; then cp "$d/now.txt" "$G"; echo "recorded $G"; exit 0; fi
if [ "$(head -1 "$d/now.txt")" = "$(head -1 "$G")" ] && [ "$C" = build/ctrain ]; then
    diff "$G" "$d/now.txt" || { echo "training output differs from the recording"; exit 1; }
    echo "bit-identical to the recording"
else
    diff <(grep -v sha256 "$G" | grep -v '  ' | tail -n +2) <(grep -v '  ' "$d/now.txt" | tail -n +2) || { echo "losses differ from the recording"; exit 1; }
    echo "other CPU or build than the recording's ($(head -1 "$G"), build/): printed losses identical"
fi
