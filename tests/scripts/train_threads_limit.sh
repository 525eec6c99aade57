#!/usr/bin/env bash
# Thread counts that cannot work are refused or bounded, never a hang: --threads above the
# CPU count is refused with a message; under `ulimit -v 6G`, 60 threads (from
# OMP_NUM_THREADS, which is not refused) used to spin forever inside OpenBLAS's allocator
# (128 MiB reserved per thread, a failed reservation retried without end); now the count is
# bounded by what the limit leaves room for, with a warning, and the run finishes.
set -uo pipefail
cd "$(dirname "$0")/../.."
C=$PWD/build/ctrain
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for i in $(seq 1 40); do echo "some text for a tiny model, line $i"; done > "$d/t.txt"
g=(gpt --text "$d/t.txt" --n-layer 1 --n-embd 16 --n-head 2 --block-size 8 --steps 2 --batch-size 4 --log-every 1)
cpus=$(getconf _NPROCESSORS_ONLN)
out=$($C train "${g[@]}" --threads $((cpus + 1)) --output-dir "$d/a" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "--threads $((cpus + 1)) on $cpus CPUs: exit $rc: $out"
echo "$out" | grep -q "more than this machine's $cpus CPUs" || fail "no message: $out"
# a sanitizer build reserves terabytes of address space: it cannot run under ulimit -v at all
(ulimit -v 6291456; "$C" --help > /dev/null 2>&1) || { echo "ctrain cannot run under ulimit -v 6G here (a lower hard limit, or a sanitizer build)"; exit 77; }
out=$(ulimit -v 6291456; OMP_NUM_THREADS=60 timeout -s KILL 60 "$C" train "${g[@]}" --output-dir "$d/b" 2>&1); rc=$?
[ $rc -ne 137 ] || fail "60 threads under ulimit -v 6G: still running after 60 s"
[ $rc -eq 0 ] || fail "60 threads under ulimit -v 6G: exit $rc: $out"
echo "$out" | grep -q "WARN threads: 60 threads asked, [0-9]* used: the address-space limit" || fail "no warning: $out"
echo "thread counts bounded"
