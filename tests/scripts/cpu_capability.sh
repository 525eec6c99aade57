#!/usr/bin/env bash
# CTRAIN_CPU_CAPABILITY caps the kernels ctrain picks at run time, as PyTorch's
# ATEN_CPU_CAPABILITY does: avx2 runs what a CPU without AVX-512 runs (the AVX2 GEMM family,
# the AVX2 GELU and SiLU, the quantized AVX2 kernels, the fused attention's AVX2 kernels, the
# rounded bf16 GEMM), none what a CPU without AVX2 runs (OpenBLAS and the portable loops). On an
# AVX-512 machine those paths otherwise never run. Checked here:
#   - a bad value is refused with the values it takes; `ctrain env` names the cap;
#   - under each cap the kernel, op, module and model tests pass (PyTorch references, gradient
#     checks, bit-identity across thread counts);
#   - short MLP and CNN runs train to the weights of the uncapped run within 1e-4 of each
#     tensor's largest value; a short GPT run (and one under --amp bf16) gives the uncapped
#     run's losses at every step within 3e-4 (1e-3 in bf16). Under none the GPT's weights are
#     not compared: AdamW moves a parameter whose gradient is rounding noise (c_attn's key
#     bias, to which softmax is blind) by about lr a step either way, whichever the noise's sign;
#   - under avx2 the MLP and the GPT train to the uncapped run's bytes, the GPT also under
#     --amp bf16 with CTRAIN_GEMM_BF16=rounded: the AVX2 GEMM family, GELU and fused attention
#     give the bits of the AVX-512 ones (on a CPU without AVX-512 both runs are the AVX2 one).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${CT_BUILD:-build}
C=$B/ctrain
out=$(CTRAIN_CPU_CAPABILITY=avx512x $C env 2>&1) && { echo "a bad CTRAIN_CPU_CAPABILITY was accepted"; exit 1; }
echo "$out" | grep -q "CTRAIN_CPU_CAPABILITY='avx512x': expected one of auto, avx2, none" || { echo "$out"; echo "unclear message"; exit 1; }
CTRAIN_CPU_CAPABILITY=none $C env | grep -q "^simd:.*capped at no AVX2 or AVX-512" || { echo "env: no cap shown for none"; exit 1; }
CTRAIN_CPU_CAPABILITY=none $C env | grep -q "^gemm: *OpenBLAS" || { echo "env: none should leave the GEMMs to OpenBLAS"; exit 1; }
caps=(none)
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    caps+=(avx2)
    CTRAIN_CPU_CAPABILITY=avx2 $C env | grep -q "^gemm: *ctrain's avx2 kernels" || { echo "env: avx2 should run the AVX2 family"; exit 1; }
fi
tests=(test_sgemm test_sgemm_bf16 test_kmath test_ops_torch test_nn_torch test_ops_threads test_flash_attention
    test_flash_qkv test_attention_qkv test_autocast test_autocast_direct test_quant test_llama)
# under the sanitizers (make test-asan) the gradient checks take minutes: CI's ASan pass leaves them out too
[ -n "${ASAN_OPTIONS:-}" ] || tests+=(test_ops_gradcheck)
for cap in "${caps[@]}"; do
    for t in "${tests[@]}"; do
        o=$(CTRAIN_CPU_CAPABILITY=$cap "$B/tests/$t" 2>&1) || { echo "$o" | grep -E "FAIL|:[0-9]+:" | head; echo "$t failed under CTRAIN_CPU_CAPABILITY=$cap"; exit 1; }
        echo "$cap $t: $(echo "$o" | tail -1)"
    done
done
. tests/tools/fashion_mnist.sh
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
for i in $(seq 1 60); do echo "line $i of a text with $((i * 7 % 31)) words, said $((i * 3)) times."; done >"$d/text.txt"
q=(--threads 2 --eval-max 256)
gpt=(gpt --text "$d/text.txt" --n-layer 2 --n-embd 64 --n-head 2 --block-size 32 --batch-size 4 --steps 8 --log-every 1)
run() { # name cap, then the train arguments
    local n=$1 c=$2; shift 2
    CTRAIN_CPU_CAPABILITY=$c $C train "$@" "${q[@]}" --output-dir "$d/$n-$c" >"$d/$n-$c.log" 2>&1 ||
        { tail -5 "$d/$n-$c.log"; echo "$n (CTRAIN_CPU_CAPABILITY=$c) failed"; exit 1; }
}
for c in auto "${caps[@]}"; do
    run mlp $c mlp --hidden 256,128 --steps 10 --batch-size 64 --log-every 5
    run cnn $c cnn --steps 6 --batch-size 32 --log-every 5
    run gpt $c "${gpt[@]}"
    run gptbf16 $c "${gpt[@]}" --amp bf16
    [ $c = none ] || CTRAIN_GEMM_BF16=rounded run gptbf16r $c "${gpt[@]}" --amp bf16
done
if [[ " ${caps[*]} " == *" avx2 "* ]]; then
    for n in mlp gpt gptbf16r; do
        cmp -s "$d/$n-auto/model.safetensors" "$d/$n-avx2/model.safetensors" ||
            { echo "$n under CTRAIN_CPU_CAPABILITY=avx2: weights differ from the uncapped run's (the AVX2 kernels should give the AVX-512 bits)"; exit 1; }
        echo "$n, CTRAIN_CPU_CAPABILITY=avx2 against auto: the same bytes"
    done
fi
losses() { grep -E "^step|^done" "$1" | grep -oE "loss [0-9.]+" | cut -d' ' -f2; }
for c in "${caps[@]}"; do
    for n in mlp cnn; do
        r=$(python3 tests/tools/weights_close.py "$d/$n-auto/model.safetensors" "$d/$n-$c/model.safetensors" 1e-4) ||
            { echo "$r"; echo "$n under CTRAIN_CPU_CAPABILITY=$c: weights beyond 1e-4 of the uncapped run's"; exit 1; }
        echo "$n, CTRAIN_CPU_CAPABILITY=$c against auto: $r"
    done
    for n in gpt:3e-4 gptbf16:1e-3; do
        m=${n%:*} tol=${n#*:}
        a=$(losses "$d/$m-auto.log") b=$(losses "$d/$m-$c.log")
        [ "$(echo "$a" | wc -l)" -ge 9 ] || { cat "$d/$m-auto.log"; echo "$m: expected 8 step losses and a test loss"; exit 1; }
        w=$(paste <(echo "$a") <(echo "$b") | awk -v t="$tol" '{d = $1 - $2; if (d < 0) d = -d; if (d > w) w = d; if ($2 == "") bad = 1}
            END {printf "%.4f", w; exit (bad || w > t)}') ||
            { paste <(echo "$a") <(echo "$b"); echo "$m under CTRAIN_CPU_CAPABILITY=$c: losses beyond $tol of the uncapped run's"; exit 1; }
        echo "$m, CTRAIN_CPU_CAPABILITY=$c against auto: losses within $w ($(echo "$a" | wc -l) values)"
    done
done
