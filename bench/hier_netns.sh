#!/usr/bin/env bash
# All-reduce bus bandwidth across two "hosts" (network namespaces joined by a veth pair,
# tests/tools/two_hosts.sh), 2 ranks on each, under mpirun: ctrain's hier backend (ordered,
# tree and rail all-reduce) against flat Open MPI (vader inside a host, tcp between them).
# The configurations alternate for ROUNDS rounds (default 3) and the median busbw of each
# size is printed, so that a busy machine hurts them alike.
# Both "hosts" share this machine's cores, which the shm backend cannot see from inside a
# namespace: CTRAIN_SHM_SPIN_US=2 stops its waits from spinning on a core a peer needs.
# Also prints the bytes the second host sent over the veth per run (every size, warm-up
# included): the hierarchical path sends one copy per machine instead of one per rank.
# Usage: bench/hier_netns.sh [ctrain bench allreduce options]   (default 16 MiB to 64 MiB)
set -u
cd "$(dirname "$0")/.." || exit 1
C=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || skip "mpirun not installed"
tmp=$(mktemp -d)
. tests/tools/two_hosts.sh
opts=("$@")
[ ${#opts[@]} -gt 0 ] || opts=(-b 16M -e 64M -f 2 -n 10 -w 3)
cfgs=("hier ordered" "hier tree" "hier rail" "mpi flat")
for r in $(seq 1 "${ROUNDS:-3}"); do
    for i in "${!cfgs[@]}"; do
        set -- ${cfgs[$i]}
        tx0=$(tx_bytes)
        mpi_2x2 -x CTRAIN_SHM_SPIN_US=2 -x CTRAIN_HIER_ALLREDUCE=${2/flat/ordered} "$C" bench allreduce \
            --backend "$1" "${opts[@]}" >"$tmp/out" 2>&1 || die "${cfgs[$i]}: $(tail "$tmp/out")"
        grep -E '^ *[0-9]+ ' "$tmp/out" | awk -v c=$i '{ print c, $1, $7 }' >>"$tmp/all"
        echo "$i $(($(tx_bytes) - tx0))" >>"$tmp/tx"
    done
done
echo "# busbw GB/s, median of ${ROUNDS:-3} rounds, 2 x 2 ranks across two namespaces ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
printf "%12s" "bytes"; for c in "${cfgs[@]}"; do printf "%14s" "${c/ /-}"; done; echo
for size in $(awk '{ print $2 }' "$tmp/all" | sort -un); do
    printf "%12s" "$size"
    for i in "${!cfgs[@]}"; do
        printf "%14s" "$(awk -v c=$i -v s=$size '$1 == c && $2 == s { print $3 }' "$tmp/all" | sort -g |
            awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')"
    done
    echo
done
# what crossed the veth (both directions are alike): bytes sent by the second host per run
printf "%12s" "veth MB/run"
for i in "${!cfgs[@]}"; do
    printf "%14s" "$(awk -v c=$i '$1 == c { t += $2; n++ } END { printf "%.0f", t / n / 1e6 }' "$tmp/tx")"
done
echo
