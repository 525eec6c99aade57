#!/usr/bin/env bash
# Bad flags, missing programs, a port in use and bad rank variables each get one clear line.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=${CT_BUILD:-build}/ctrain
die() { echo "FAIL: $*"; exit 1; }
one_line() { # cmd expected_rc pattern
    local out rc; out=$(timeout 20 "${@:3}" 2>&1); rc=$?
    [ "$rc" = "$1" ] || die "'${*:3}': exit $rc, want $1: $out"
    [ "$(echo "$out" | wc -l)" = 1 ] || die "'${*:3}': more than one line: $out"
    echo "$out" | grep -q -- "$2" || die "'${*:3}': '$out' lacks '$2'"
}
one_line 2 "bad value 'x' for --nproc-per-node" $B run --nproc-per-node x $B worker init
one_line 2 "unknown option '--frobnicate'" $B run --frobnicate $B worker init
one_line 2 "no program to run" $B run --standalone
one_line 2 "cannot find program 'no-such-prog'" $B run --standalone no-such-prog
one_line 2 "node-rank 2 is not below --nnodes 2" $B run --nnodes 2 --node-rank 2 $B worker init
one_line 2 "needs a value" $B run --master-port
one_line 1 "RANK=3 is not below WORLD_SIZE=2" env RANK=3 WORLD_SIZE=2 $B worker init
one_line 2 "WORLD_SIZE='two': expected an integer >= 1" env RANK=0 WORLD_SIZE=two $B worker init

# a port in use
port=$((20000 + RANDOM % 20000))
$B run --nproc-per-node 1 --master-port $port $B worker sleep 20 >/dev/null 2>&1 &
holder=$!
sleep 0.3
one_line 1 "port $port is already in use" $B run --nproc-per-node 2 --master-port $port $B worker init
kill $holder; wait $holder 2>/dev/null
echo ok
