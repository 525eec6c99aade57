#!/usr/bin/env bash
# Registers and spills of every CUDA kernel for the H100/H200 (sm_90), from ptxas itself:
# each src/cuda/*.cu compiled to a cubin with -Xptxas -v (no GPU needed), one line per kernel
# written to $CT_BUILD/ptxas-sm_90.txt:
#   file  registers  stack_bytes  spill_store_bytes  spill_load_bytes  kernel
# A kernel that spills fails the test unless tests/fixtures/ptxas_spills.txt lists it (file,
# a prefix of its demangled name, the most spill-store bytes allowed), so a hot kernel that
# starts spilling, or a listed one that spills more, is seen here rather than on a GPU.
# Listed now: the row-per-thread flash attention of attention.cu (CTRAIN_CUDA_ATTENTION=rows),
# whose per-thread accumulators of a 64- or 128-wide head do not fit the registers, and the
# tiled backward's dq at head dim 32 in f16/bf16 (8 bytes).
# ARCH=sm_XX for another target (its own spills are not checked against the list).
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${CT_BUILD:-build}
NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
[ -n "$NVCC" ] || { echo "no nvcc: the CUDA toolkit is not installed here"; exit 77; }
command -v c++filt >/dev/null || { echo "needs c++filt (binutils)"; exit 1; }
arch=${ARCH:-sm_90}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$B"
out=$B/ptxas-$arch.txt
# two at a time: ptxas is single-threaded and the .cu files take 1-15 s each
printf '%s\n' src/cuda/*.cu | xargs -P 2 -I{} sh -c \
    '"$1" -std=c++17 -O3 -cubin -arch='"$arch"' -Xptxas -v -Iinclude -Isrc -DCT_HAVE_CUDA=1 -c "$2" \
        -o "$3/$(basename "$2").cubin" >"$3/$(basename "$2").log" 2>&1 || echo "nvcc failed on $2" >>"$3/failed"' \
    sh "$NVCC" {} "$tmp"
if [ -s "$tmp/failed" ]; then
    cat "$tmp/failed"
    for f in $(sed 's/nvcc failed on //' "$tmp/failed"); do tail -5 "$tmp/$(basename "$f").log"; done
    exit 1
fi
# ptxas -v: "Function properties for NAME", then "N bytes stack frame, S bytes spill stores,
# L bytes spill loads", then "Used R registers, ..."
for f in src/cuda/*.cu; do
    awk -v F="$(basename "$f")" '
        /Function properties for/ { fn = $NF }
        /bytes spill stores/ { st = $1; ss = $5; sl = $9 }
        /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") r = $(i + 1)
                                  if (fn != "") print F, r, st, ss, sl, fn; fn = "" }' "$tmp/$(basename "$f").log"
done | while read -r file regs stack ss sl name; do
    echo "$file $regs $stack $ss $sl $(echo "$name" | c++filt)"
done >"$out"
n=$(wc -l <"$out")
[ "$n" -gt 0 ] || { echo "no kernel found in ptxas's output"; head -20 "$tmp"/*.log; exit 1; }
echo "$n kernels for $arch: most registers $(awk '{print $2}' "$out" | sort -n | tail -1), $(awk '$4 > 0' "$out" | wc -l) spill (table: $out)"
[ "$arch" = sm_90 ] || exit 0
bad=0
while read -r file regs stack ss sl name; do
    [ "$ss" -gt 0 ] || [ "$sl" -gt 0 ] || continue
    allowed=$(awk -v F="$file" -v N="$name" '!/^#/ && NF >= 3 && $1 == F {
        p = $3; for (i = 4; i <= NF; i++) p = p " " $i
        if (index(N, p) == 1) { print $2; exit } }' tests/fixtures/ptxas_spills.txt)
    if [ -z "$allowed" ]; then
        echo "FAIL: $file: $name spills ($ss bytes stored, $sl loaded; $regs registers) and is not in tests/fixtures/ptxas_spills.txt"
        bad=1
    elif [ "$ss" -gt "$allowed" ]; then
        echo "FAIL: $file: $name spills $ss bytes, more than the $allowed tests/fixtures/ptxas_spills.txt allows"
        bad=1
    fi
done <"$out"
[ $bad = 0 ] && echo "no kernel spills beyond tests/fixtures/ptxas_spills.txt"
exit $bad
