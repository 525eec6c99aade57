#!/usr/bin/env bash
# All-reduce bus bandwidth across two "hosts" (network namespaces joined by a veth pair,
# tests/tools/two_hosts.sh), 2 ranks on each, under mpirun: ctrain's hier backend (ordered
# and tree all-reduce) against flat Open MPI (vader inside a host, tcp between them).
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
[ ${#opts[@]} -gt 0 ] || opts=(-b 16M -e 64M -f 2 -n 10 -w 3 -c)
for cfg in "hier ordered" "hier tree" "mpi -"; do
    set -- $cfg
    echo "== backend $1 ${2#-}"
    mpi_2x2 -x CTRAIN_HIER_ALLREDUCE=${2/-/ordered} "$C" bench allreduce --backend "$1" "${opts[@]}" 2>&1 |
        grep -E '^#|^ *[0-9]+ ' || die "$cfg failed"
done
