#!/usr/bin/env bash
# Issue 12.5: workers die with the launcher in every case. A SIGKILLed launcher whose program
# is a wrapper script used to leave the script's children running (only the direct child had
# PR_SET_PDEATHSIG); now a keeper per worker kills the worker's process group.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/build/ctrain
die() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# alive and not a zombie (a killed orphan waits for init to reap it)
alive() { for p in $1; do [ -r /proc/$p/stat ] && [ "$(awk '{print $3}' /proc/$p/stat 2>/dev/null)" != Z ] && return 0; done; return 1; }
wait_pids() { for _ in $(seq 200); do [ "$(grep -c '^pid' "$1" 2>/dev/null)" = "$2" ] && return 0; sleep 0.05; done; return 1; }

# a wrapper that does not exec: the shell stays between the keeper and the program
printf '#!/bin/sh\n"$@"\nrc=$?\necho wrapper done\nexit $rc\n' >"$tmp/wrap.sh"
chmod +x "$tmp/wrap.sh"
for round in 1 2 3; do
    rm -f "$tmp/out"
    $B run --standalone --nproc-per-node 2 "$tmp/wrap.sh" $B worker sleep 60 >"$tmp/out" 2>/dev/null &
    lp=$!
    wait_pids "$tmp/out" 2 || die "workers did not start: $(cat "$tmp/out")"
    pids=$(awk '/^pid/ {print $2}' "$tmp/out")
    kill -9 $lp; wait $lp 2>/dev/null
    s=$(date +%s.%N)
    for _ in $(seq 100); do alive "$pids" || break; sleep 0.02; done
    t=$(echo "$(date +%s.%N) - $s" | bc -l)
    alive "$pids" && { kill -9 $pids; die "round $round: workers of a wrapper script outlived a SIGKILLed launcher"; }
    echo "round $round: workers gone ${t}s after the launcher's SIGKILL"
done

# the exit code and the signal of the program still reach the report through the keeper
out=$($B run --standalone --nproc-per-node 2 "$tmp/wrap.sh" $B worker exit 1 7 2>&1); rc=$?
[ $rc = 1 ] && echo "$out" | grep -q "root cause: rank 1 .* exited with code 7" || die "exit code through the keeper: $out"
out=$($B run --standalone --nproc-per-node 2 $B worker signal 0 11 2>&1)
echo "$out" | grep -q "root cause: rank 0 .* killed by signal 11" || die "signal through the keeper: $out"

# Cleanup at the next start: a launcher that finds the pid file of a dead one (same --log-dir)
# kills the process groups listed there, if they are still the same processes.
setsid sleep 60 &
left=$!
sleep 0.2
[ "$(ps -o pgid= -p $left | tr -d ' ')" = "$left" ] || die "test setup: sleep is not a group leader"
start=$(awk '{print $22}' /proc/$left/stat)
setsid sleep 60 &
reused=$!
sleep 0.2
mkdir -p "$tmp/logs"
printf 'supervisor 999999\nworker %d %s\nworker %d 12345\n' $left "$start" $reused >"$tmp/logs/.ctrain-run.pid"
out=$($B run --standalone --nproc-per-node 2 --log-dir "$tmp/logs" $B worker init 2>&1) || die "run after a dead launcher: $out"
echo "$out" | grep -q "killed 1 leftover worker process group" || die "no cleanup message: $out"
[ -e "$tmp/logs/.ctrain-run.pid" ] && die "the pid file outlived its launcher"
for _ in $(seq 50); do alive $left || break; sleep 0.02; done
alive $left && { kill -9 $left $reused; die "the leftover worker of the dead launcher survived"; }
alive $reused || die "a process whose pid matched but start time did not was killed"
kill -9 $reused

# two launchers on one --log-dir: the second is refused while the first runs
rm -f "$tmp/out"
$B run --standalone --nproc-per-node 1 --log-dir "$tmp/logs" --tee 3 $B worker sleep 30 >"$tmp/out" 2>&1 &
lp=$!
wait_pids "$tmp/out" 1 || die "first launcher did not start: $(cat "$tmp/out")"
out=$($B run --standalone --nproc-per-node 1 --log-dir "$tmp/logs" $B worker init 2>&1); rc=$?
kill $lp; wait $lp 2>/dev/null
[ $rc != 0 ] && echo "$out" | grep -q "another ctrain run (pid $lp) is running" || die "second launcher on one log dir: rc $rc: $out"
exit 0
