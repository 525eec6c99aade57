#!/usr/bin/env bash
# ctrain run failure handling: a rank exits 3, a rank dies by signal, --max-restarts.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=${CT_BUILD:-build}/ctrain
die() { echo "FAIL: $*"; exit 1; }

# rank 1 exits 3: the others (sleeping 60 s) are stopped within the grace period
s=$(date +%s.%N)
out=$(timeout 30 $B run --standalone --nproc-per-node 3 --grace-period 2 $B worker exit 1 3 2>&1); rc=$?
t=$(echo "$(date +%s.%N) - $s" | bc -l)
[ $rc = 1 ] || die "exit code $rc (want 1): $out"
echo "$out" | grep -q "root cause: rank 1 (local rank 1, pid [0-9]*) exited with code 3" || die "report: $out"
echo "$out" | grep -q "| worker 1: something went wrong, exiting with 3" || die "stderr tail: $out"
# the root cause comes before the other ranks
[ "$(echo "$out" | grep -n 'root cause' | cut -d: -f1)" -lt "$(echo "$out" | grep -n '  rank 0 ' | cut -d: -f1)" ] || die "order: $out"
awk -v t="$t" 'BEGIN { exit !(t < 4) }' || die "took ${t}s to stop the others"

# killed by a signal: workers ignoring SIGTERM are SIGKILLed after the grace period
out=$(timeout 30 $B run --standalone --nproc-per-node 2 --grace-period 1 $B worker signal 1 9 2>&1); rc=$?
[ $rc = 1 ] || die "signal exit code $rc"
echo "$out" | grep -q "rank 1 .* was killed by signal 9 (Killed)" || die "signal report: $out"

# the report names the program's pid (the one in its own output), not its keeper's
log=$(mktemp)
timeout 30 $B run --standalone --nproc-per-node 2 --grace-period 1 $B worker sleep 30 >"$log" 2>&1 & lp=$!
for _ in $(seq 100); do [ "$(grep -c '^pid ' "$log")" = 2 ] && break; sleep 0.05; done
wp=$(grep -m1 '^pid ' "$log" | cut -d' ' -f2)
[ -n "$wp" ] || die "no worker pid: $(cat "$log")"
kill -9 "$wp"; wait $lp
grep -q "root cause: rank [01] (local rank [01], pid $wp) was killed by signal 9" "$log" || die "pid $wp not named: $(cat "$log")"
other=$(grep '^pid ' "$log" | grep -v "^pid $wp\$" | cut -d' ' -f2)
grep -q "  rank [01] (pid $other): " "$log" || die "the other worker's pid $other not named: $(cat "$log")"
rm -f "$log"

# --max-restarts 2 with a worker that fails once: the second attempt succeeds
out=$(timeout 30 $B run --standalone --nproc-per-node 2 --max-restarts 2 $B worker fail-once 1 2>&1); rc=$?
[ $rc = 0 ] || die "restart run exit $rc: $out"
echo "$out" | grep -q "restarting all workers (restart 1 of 2)" || die "no restart message: $out"
[ "$(echo "$out" | grep -c 'all-reduce ok')" = 2 ] || die "second attempt: $out"

# out of restarts: exit 1 after max+1 attempts
out=$(timeout 30 $B run --standalone --nproc-per-node 2 --max-restarts 1 $B worker exit 0 4 2>&1); rc=$?
[ $rc = 1 ] || die "exhausted restarts exit $rc"
[ "$(echo "$out" | grep -c 'root cause: rank 0')" = 2 ] || die "two attempts expected: $out"
echo "$out" | grep -q "giving up after 1 restart" || die "$out"
ls /dev/shm | grep -q '^ctrain-' && die "segments left"
echo ok
