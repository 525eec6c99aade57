#!/usr/bin/env bash
# `ctrain train --device` where there is no GPU: a misspelt device is a flag error (exit 2,
# one line naming the flag, the value and what it takes); cuda and cuda:N fail at once with
# exit 2 and the reason, before any data is read or the output directory is made; auto
# falls back to the CPU and trains exactly as --device cpu and as no flag (the same bits).
# On a machine with a GPU the no-GPU half is skipped (tests/scripts/gpu_train.sh covers it).
set -uo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
fail() { echo "FAIL: $*"; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
for i in $(seq 1 60); do echo "line $i of a text with $((i*7 % 31)) words and $((i*13 % 17)) commas,"; done > "$d/t.txt"
gpt=(gpt --text "$d/t.txt" --n-layer 1 --n-embd 32 --n-head 2 --block-size 32 --batch-size 4 --steps 3 --log-every 1 --threads 1)

# expect_rc2 PATTERN ARGS...: exit 2 with exactly one line matching PATTERN, nothing created
expect_rc2() {
    local pat=$1; shift
    rm -rf "$d/o"
    out=$($C train "${gpt[@]}" --output-dir "$d/o" "$@" 2>&1); rc=$?
    [ $rc -eq 2 ] || fail "$* : exit $rc, not 2: $out"
    [ "$(echo "$out" | wc -l)" -eq 1 ] || fail "$* : more than one line: $out"
    echo "$out" | grep -qE "$pat" || fail "$* : unclear message: $out"
    [ ! -e "$d/o" ] || fail "$* : the output directory was made before the device was checked"
    echo "  $*: $out"
}
for v in gpu cuda: cuda:x cuda:-1 CUDA " cuda" cuda:0x mps; do
    expect_rc2 "^ctrain train: --device expects cpu, cuda, cuda:N or auto, got '$v'$" --device "$v"
done
expect_rc2 "^ctrain train: --device expects a value, got '\(nothing\)'$" --device

gpus=$($C env | grep -cE "^cuda: +[0-9]+ GPUs? visible")
if [ "$gpus" -eq 0 ]; then
    for v in cuda cuda:0 cuda:3; do
        expect_rc2 "^ctrain train: --device $v: no CUDA GPU usable here \(.+\)$" --device "$v"
    done
    # under a launcher too: every rank says it, the launcher reports the failure
    out=$($C run --nproc-per-node 2 --standalone $C train "${gpt[@]}" --output-dir "$d/o" --device cuda 2>&1); rc=$?
    [ $rc -ne 0 ] || fail "ctrain run ... --device cuda succeeded without a GPU: $out"
    echo "$out" | grep -q "no CUDA GPU usable here" || fail "ctrain run ... --device cuda: unclear: $out"
    for v in none cpu auto; do
        flag=(); [ $v = none ] || flag=(--device $v)
        $C train "${gpt[@]}" --output-dir "$d/$v" "${flag[@]}" > "$d/$v.log" 2>&1 || { cat "$d/$v.log"; fail "--device $v did not train"; }
        ! grep -q "| on cuda" "$d/$v.log" || fail "--device $v: trained on a GPU that is not there"
        ! grep -q "| gpu " "$d/$v.log" || fail "--device $v: GPU memory reported on the CPU"
    done
    cmp -s "$d/none/model.safetensors" "$d/cpu/model.safetensors" || fail "--device cpu trains differently from no flag"
    cmp -s "$d/none/model.safetensors" "$d/auto/model.safetensors" || fail "--device auto without a GPU differs from the CPU run"
    echo "no GPU: cuda/cuda:N refused at once (exit 2); auto = cpu = no flag (same bits)"
else
    echo "a GPU is visible: the flag errors checked; the no-GPU paths are not taken here"
fi
echo ok
