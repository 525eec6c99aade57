#!/usr/bin/env bash
# Issue 12.6: hostile sizes and names. `ctrain bench allreduce -e 1e30` and
# `-e 18446744073709549568` segfaulted (an undefined double->size_t cast, a wrapped buffer
# size); CTRAIN_SHM_CHUNK=4611686018427387904 or inf must be refused by the table's range;
# --log-dir names over 1,023 characters were silently cut.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/build/ctrain
die() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

for e in 1e30 18446744073709549568 inf nan -1 2T 1e400; do
    out=$(timeout 20 $B bench allreduce -e "$e" 2>&1); rc=$?
    [ $rc = 2 ] && echo "$out" | grep -q "bad value '$e' for -e" || die "-e $e: exit $rc: $out"
done
for f in nan inf 1 0.5 x; do
    out=$(timeout 20 $B bench allreduce -f "$f" 2>&1); rc=$?
    [ $rc = 2 ] || die "-f $f: exit $rc: $out"
done
timeout 60 $B bench allreduce -b 4k -e 8k -n 2 -w 0 -c >"$tmp/bench" 2>&1 || die "a sane bench: $(cat "$tmp/bench")"
# median(us), the last column: of 2 calls on each rank their mean, so the mean call's figure
awk '/^ *[0-9]+ / { n++; if (NF != 9 || $9 <= 0 || $9 - $5 > 0.02 || $5 - $9 > 0.02) bad = 1 } END { exit bad || n != 2 }' \
    "$tmp/bench" || die "median column of 2 calls is not their mean: $(cat "$tmp/bench")"

for v in 4611686018427387904 inf 18446744073709551616 1e30 -4096; do
    out=$(CTRAIN_SHM_CHUNK=$v timeout 20 $B run --standalone --nproc-per-node 2 $B worker allreduce 2>&1); rc=$?
    [ $rc = 2 ] && echo "$out" | grep -q "CTRAIN_SHM_CHUNK='$v': expected a size in bytes between 4096" ||
        die "CTRAIN_SHM_CHUNK=$v: exit $rc: $out"
done

# a log directory of 1,100+ characters is used whole; one past PATH_MAX is an error
d=$tmp
for c in a b c d e; do d=$d/$(printf "$c%.0s" $(seq 220)); done
[ ${#d} -gt 1100 ] || die "test setup"
timeout 30 $B run --standalone --nproc-per-node 2 --log-dir "$d" --tee 3 $B worker allreduce >"$tmp/o" 2>&1 || die "long log dir: $(cat "$tmp/o")"
grep -q "rank 1 of 2: all-reduce ok" "$d/attempt_0/1/stdout.log" || die "logs not under the whole name: $(find "$tmp" -name stdout.log | head -3)"
long=$tmp/$(printf 'x%.0s' $(seq 4100))
out=$($B run --standalone --log-dir "$long" $B worker init 2>&1); rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "too long" || die "over-long log dir: exit $rc: $out"
exit 0
