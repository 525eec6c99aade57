#!/usr/bin/env bash
# A rank of node 1 hangs (SIGSTOP) in a 2 nodes x 2 ranks job on loopback (gloo backend).
# Node 0's report used to blame its own rank 0 (Gloo's timeout names nobody); now the gloo
# backend names the peers whose messages never came, and node 0's report names rank 2 and
# its node; node 1's names it with its pid and state.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/${CT_BUILD:-build}/ctrain
nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_gloo_create" || { echo "skip: built without Gloo"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
printf '0123456789abcdef-stall\n' >"$tmp/s"; chmod 600 "$tmp/s"
port=$((20000 + RANDOM % 20000))
for k in 0 1; do
    CTRAIN_TIMEOUT=3 timeout 60 $B run --nnodes 2 --node-rank $k --nproc-per-node 2 --master-addr 127.0.0.1 \
        --master-port $port --rdzv-token-file "$tmp/s" --grace-period 1 $B worker stall 2 >"$tmp/n$k" 2>&1 &
done
wait
grep -q "root cause: rank 2 (node 1, local rank 0) never reached all_reduce #1 (f32 x 256, sum): rank [01] (pid [0-9]*) timed out waiting for it" "$tmp/n0" ||
    die "node 0's report: $(cat "$tmp/n0")"
grep -q "root cause: rank 2 (local rank 0, pid [0-9]*) never reached all_reduce #1 (f32 x 256, sum): rank 3 (pid [0-9]*) timed out waiting for it" "$tmp/n1" ||
    die "node 1's report: $(cat "$tmp/n1")"
grep -q "it was stopped (SIGSTOP" "$tmp/n1" || die "node 1: state: $(cat "$tmp/n1")"
echo "both nodes name rank 2 on node 1"
