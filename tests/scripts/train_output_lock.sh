#!/usr/bin/env bash
# Issue 12.5: two jobs on one output directory. The second is refused with a message naming
# the running one's pid (rank 0 holds output_dir/.lock); a job killed with SIGKILL leaves no
# lock behind.
set -u
cd "$(dirname "$0")/../.." || exit 1
C=$PWD/build/ctrain
die() { echo "FAIL: $*"; exit 1; }
d=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$d"' EXIT
for i in $(seq 1 60); do echo "the quick brown fox jumps over the lazy dog $i times, said the $((i*7)) cats."; done >"$d/text.txt"
common=(gpt --text "$d/text.txt" --n-layer 1 --n-embd 16 --n-head 2 --block-size 8 --batch-size 2
        --log-every 1000 --eval-max 8 --threads 1 --workers 1)
$C train "${common[@]}" --steps 1000000 --output-dir "$d/out" >"$d/a.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$d/out/.lock" ] && break; sleep 0.05; done
[ "$(cat "$d/out/.lock" 2>/dev/null)" = "${pids[0]}" ] || die "no lock with the first job's pid: $(cat "$d/out/.lock" 2>/dev/null) $(tail -3 "$d/a.log")"
out=$($C train "${common[@]}" --steps 2 --output-dir "$d/out" 2>&1); rc=$?
[ $rc != 0 ] || die "a second job on the same output directory ran"
echo "$out" | grep -q "in use by another job (pid ${pids[0]}" || die "message: $out"
out=$(timeout 60 $C run --standalone --nproc-per-node 2 $C train "${common[@]}" --steps 2 --output-dir "$d/out" 2>&1); rc=$?
[ $rc != 0 ] && echo "$out" | grep -q "in use by another job" || die "2 ranks: rc $rc: $out"
kill -0 "${pids[0]}" || die "the first job did not survive the attempts: $(cat "$d/a.log")"
kill -9 "${pids[0]}"; wait "${pids[0]}" 2>/dev/null
$C train "${common[@]}" --steps 2 --output-dir "$d/out" >"$d/c.log" 2>&1 || die "after SIGKILL the lock stayed: $(cat "$d/c.log")"
exit 0
