#!/usr/bin/env bash
# The AVX2 GEMM family (src/ops/cpu/sgemm_avx2.c), as a CPU without AVX-512 runs it, forced
# with CTRAIN_GEMM=avx2: the GEMM, op and module tests pass on it, and short training runs
# (MLP, CNN, GPT in f32; the GPT under --amp bf16 with CTRAIN_GEMM_BF16=rounded, the one
# bf16 path both families have) write byte-identical weights with either family. On a CPU
# without AVX-512 the family is the same either way: only the tests run.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${CT_BUILD:-build}
C=$B/ctrain
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo || { echo "no AVX2 and FMA on this CPU"; exit 77; }
CTRAIN_GEMM=avx2 $C env | grep -q "^gemm: *ctrain's avx2 kernels" || { CTRAIN_GEMM=avx2 $C env | grep gemm; echo "CTRAIN_GEMM=avx2: not the AVX2 family"; exit 1; }
for t in test_sgemm test_sgemm_bf16 test_ops_torch test_nn_torch test_ops_threads test_autocast_direct test_attention_qkv; do
    out=$(CTRAIN_GEMM=avx2 "$B/tests/$t" 2>&1) || { echo "$out" | grep -E "FAIL|:[0-9]+:" | head; echo "$t failed under CTRAIN_GEMM=avx2"; exit 1; }
    echo "$t: $(echo "$out" | grep '^RESULT')"
done
grep -qw avx512f /proc/cpuinfo || { echo "no AVX-512: nothing to compare the AVX2 family's training with"; exit 0; }
. tests/tools/fashion_mnist.sh
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
for i in $(seq 1 60); do echo "line $i of a text with $((i * 7 % 31)) words, said $((i * 3)) times."; done >"$d/text.txt"
q=(--threads 2 --log-every 5 --eval-max 256)
gpt=(gpt --text "$d/text.txt" --n-layer 2 --n-embd 64 --n-head 2 --block-size 32 --batch-size 4 --steps 8)
run() { # name gemm-family, then the train arguments
    local n=$1 g=$2; shift 2
    CTRAIN_GEMM=$g CTRAIN_GEMM_BF16=rounded $C train "$@" "${q[@]}" --output-dir "$d/$n-$g" >"$d/$n-$g.log" 2>&1 ||
        { tail -5 "$d/$n-$g.log"; echo "$n ($g) failed"; exit 1; }
}
for g in auto avx2; do
    run mlp $g mlp --hidden 256,128 --steps 10 --batch-size 64
    run cnn $g cnn --steps 6 --batch-size 32
    run gpt $g "${gpt[@]}"
    run gptbf16 $g "${gpt[@]}" --amp bf16
done
for n in mlp cnn gpt gptbf16; do
    cmp "$d/$n-auto/model.safetensors" "$d/$n-avx2/model.safetensors" ||
        { echo "$n: the AVX2 family's weights differ from the AVX-512 family's"; exit 1; }
done
echo "MLP, CNN, GPT and bf16 GPT: the same weights from both families"
