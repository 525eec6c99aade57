#!/usr/bin/env bash
# Ctrl-C and SIGTERM reach every worker; no worker outlives the launcher, even a SIGKILLed one.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=${CT_BUILD:-build}/ctrain
die() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

alive() { for p in $1; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
wait_pids() { # wait until the workers printed their pids
    for _ in $(seq 100); do [ "$(grep -c '^pid' "$1" 2>/dev/null)" = "$2" ] && return 0; sleep 0.05; done; return 1; }

for sig in INT TERM; do
    # a stale out file from the previous round would let wait_pids return before this
    # launcher has even started (and installed its signal handlers)
    rm -f "$tmp/out" "$tmp/err"
    setsid $B run --standalone --nproc-per-node 2 --grace-period 2 $B worker sleep 60 >"$tmp/out" 2>"$tmp/err" &
    lp=$!
    wait_pids "$tmp/out" 2 || die "workers did not start"
    pids=$(awk '/^pid/ {print $2}' "$tmp/out")
    kill -$sig $lp
    s=$(date +%s.%N)
    wait $lp; rc=$?
    t=$(echo "$(date +%s.%N) - $s" | bc -l)
    want=$((128 + $(kill -l $sig)))
    [ $rc = $want ] || die "SIG$sig: launcher exit $rc, want $want: $(cat "$tmp/err")"
    alive "$pids" && die "SIG$sig: workers still alive"
    awk -v t="$t" 'BEGIN { exit !(t < 2) }' || die "SIG$sig: took ${t}s"
    grep -q "interrupted by signal" "$tmp/err" || die "SIG$sig report: $(cat "$tmp/err")"
done

# launcher SIGKILLed: workers die too (PR_SET_PDEATHSIG)
rm -f "$tmp/out"
$B run --standalone --nproc-per-node 2 $B worker sleep 60 >"$tmp/out" 2>/dev/null &
lp=$!
wait_pids "$tmp/out" 2 || die "workers did not start"
pids=$(awk '/^pid/ {print $2}' "$tmp/out")
kill -9 $lp; wait $lp 2>/dev/null
for _ in $(seq 40); do alive "$pids" || break; sleep 0.05; done
alive "$pids" && { kill -9 $pids; die "workers outlived a SIGKILLed launcher"; }
echo ok
