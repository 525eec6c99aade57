#!/usr/bin/env bash
# Issue 12.6: when a rank hangs (SIGSTOP), the healthy ranks time out first; the report's
# "root cause" line used to name the first healthy rank that gave up. It names the rank that
# never arrived, the collective, and the state it was in.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=build/ctrain
die() { echo "FAIL: $*"; exit 1; }
for r in 1 0 2; do
    s=$(date +%s.%N)
    out=$(timeout 60 $B run --standalone --nproc-per-node 3 --timeout 3 --grace-period 1 $B worker stall $r 2>&1); rc=$?
    t=$(echo "$(date +%s.%N) - $s" | bc -l)
    [ $rc = 1 ] || die "stall $r: exit $rc: $out"
    echo "$out" | grep -q "root cause: rank $r (local rank $r, pid [0-9]*) never reached all_reduce #1 (f32 x 256, sum): rank [0-9] (pid [0-9]*) timed out waiting for it" ||
        die "stall $r: root cause line: $out"
    echo "$out" | grep -q "it was stopped (SIGSTOP" || die "stall $r: state: $out"
    awk -v t="$t" 'BEGIN { exit !(t < 10) }' || die "stall $r: took ${t}s"
    echo "stalled rank $r named, job over in ${t}s (timeout 3 s)"
done
# a chain of waits (rank 0 timed out on rank 1, which had timed out on the hung rank 2): the
# rank at the chain's end is named, not the one the first report names
out=$(timeout 60 $B run --standalone --nproc-per-node 3 --grace-period 1 $B worker timeout-chain 2>&1)
echo "$out" | grep -q "root cause: rank 2 (local rank 2, pid [0-9]*) never reached all_reduce #1 (f32 x 256, sum): rank 1 (pid [0-9]*) timed out waiting for it" ||
    die "timeout chain: $out"
echo "$out" | grep -q "it was stopped (SIGSTOP" || die "timeout chain: state: $out"
echo "a chain of timeouts: the hung rank at its end named"
# a plain failure still names the failing rank
out=$(timeout 30 $B run --standalone --nproc-per-node 2 --grace-period 1 $B worker exit 1 3 2>&1)
echo "$out" | grep -q "root cause: rank 1 (local rank 1, pid [0-9]*) exited with code 3" || die "plain failure: $out"
exit 0
