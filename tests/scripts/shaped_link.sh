#!/usr/bin/env bash
# The shaped link of bench/shaped_links.sh, on tests/tools/two_hosts.sh's veth:
# TWO_HOSTS_RATE=100mbit puts a token-bucket filter on both ends, and
#  - one TCP stream (bench/bulk_rate.py) arrives at 75-105 Mbit/s, where the bare veth of the
#    same run carries more than twice that;
#  - ctrain's all-gather and reduce-scatter of 4 MiB between the two hosts (mpirun, 1 rank
#    each, `ctrain bench allgather|reducescatter`) take at least the 2 MiB each rank sends at
#    100 Mbit/s (0.17 s), and the all-reduce the 4 MiB it sends (0.34 s).
set -u
cd "$(dirname "$0")/../.." || exit 1
C=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || skip "mpirun not installed"
command -v tc >/dev/null || skip "tc not installed (iproute2)"
tmp=$(mktemp -d)
# Under ASan (make test-asan): Open MPI is built without frame pointers, so leak stacks taken
# the fast way stop inside it and tests/asan.supp cannot recognise its own leaks.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
TWO_HOSTS_NET=10.83.0 TWO_HOSTS_RATE=100mbit
. tests/tools/two_hosts.sh
rate() { # the Mbit/s of a 2 s stream from the second host to the first
    ip netns exec $A python3 bench/bulk_rate.py recv $net.1 47811 >"$tmp/bulk" 2>&1 &
    local r=$!
    sleep 0.5
    ip netns exec $Bn python3 bench/bulk_rate.py send $net.1 47811 2 || die "bulk sender"
    wait $r || die "bulk receiver: $(cat "$tmp/bulk")"
    sed -E 's/gbit_s=([0-9.]+) .*/\1/' "$tmp/bulk" | awk '{ printf "%.0f", 1000 * $1 }'
}
shaped=$(rate)
[ "$shaped" -ge 75 ] && [ "$shaped" -le 105 ] || die "100mbit link carried $shaped Mbit/s"
declare -A took # microseconds per collective
for c in allgather reducescatter allreduce; do
    mpi_on $net.1:1,$net.2:1 2 "$C" bench $c -b 4M -e 4M -n 2 -w 1 >"$tmp/$c" 2>&1 || die "$c: $(tail -30 "$tmp/$c")"
    us=$(awk '/^ *[0-9]+ / { print int($5) }' "$tmp/$c")
    min=167772; [ $c = allreduce ] && min=335544 # bytes each rank sends x 8 / 100 Mbit/s, in us
    [ -n "$us" ] && [ "$us" -ge $min ] || die "$c of 4 MiB over 100 Mbit/s took $us us (< $min): $(cat "$tmp/$c")"
    took[$c]=$us
done
for n in $A $Bn; do ip netns exec $n tc qdisc del dev v$n root || die "removing the filter"; done
bare=$(rate)
[ "$bare" -gt $((2 * shaped)) ] || die "the bare veth carried $bare Mbit/s, the shaped one $shaped"
echo "100mbit: $shaped Mbit/s (bare veth $bare); 4 MiB all-gather ${took[allgather]} us, reduce-scatter" \
     "${took[reducescatter]} us, all-reduce ${took[allreduce]} us"
