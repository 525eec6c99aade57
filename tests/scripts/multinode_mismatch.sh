#!/usr/bin/env bash
# Two `ctrain run --nnodes 2` on loopback that disagree about the job: node 0 with
# --nproc-per-node 2, node 1 with 1. Every worker fails at the rendezvous with one line naming
# both nodes' values (it used to be Gloo's internal `sizeof(impl_) == bytes.size()`). Then a
# rendezvous that times out (node 0 of 3 alone) names every missing rank, compactly (2-5).
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_gloo_create" || skip "built without Gloo (apt-get install libgloo-dev)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '0123456789abcdef-mismatch\n' >"$tmp/s"; chmod 600 "$tmp/s"
port=$((29600 + RANDOM % 300))
export CTRAIN_TIMEOUT=20
run() { # NODE NPROC LOG [NNODES]
    timeout 60 $B run --nnodes "${4:-2}" --nproc-per-node "$2" --node-rank "$1" --master-addr 127.0.0.1 \
        --master-port $port --rdzv-token-file "$tmp/s" $B worker allreduce >"$3" 2>&1
}
s=$(date +%s)
run 0 2 "$tmp/n0" & p0=$!
run 1 1 "$tmp/n1" & p1=$!
wait $p1 && die "node 1 ran with a different --nproc-per-node: $(cat "$tmp/n1")"
wait $p0 && die "node 0 ran with a different --nproc-per-node on node 1: $(cat "$tmp/n0")"
dt=$(( $(date +%s) - s ))
[ $dt -lt 15 ] || die "took $dt s to fail (the timeout is $CTRAIN_TIMEOUT s)"
h=$(hostname | cut -c1-63)
line="the nodes disagree about the job: node 1 ($h, rank 1) was started with --nnodes 2 --nproc-per-node 1 (world size 2), node 0 ($h, rank 0) with --nnodes 2 --nproc-per-node 2 (world size 4)"
grep -qF "$line" "$tmp/n1" || die "node 1's report: $(cat "$tmp/n1")"
grep -qF "$line" "$tmp/n0" || die "node 0's report: $(cat "$tmp/n0")"
grep -q "sizeof(impl_)" "$tmp/n0" "$tmp/n1" && die "Gloo's internal check still shows: $(cat "$tmp/n0" "$tmp/n1")"

# node 0 of 3 alone: ranks 2-5 never come
port=$((port + 1))
CTRAIN_TIMEOUT=2 run 0 2 "$tmp/t0" 3 && die "node 0 of 3 ran alone"
grep -q "rendezvous: 4 of 6 ranks never joined after 2 s: rank(s) 2-5 " "$tmp/t0" || die "timeout report: $(cat "$tmp/t0")"
echo "mismatch named on both nodes in $dt s; timeout names ranks 2-5"
