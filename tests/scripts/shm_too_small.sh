#!/usr/bin/env bash
# Issue 12.5: a /dev/shm too small for the segment killed the ranks with SIGBUS at the first
# page that did not fit. Now rank 0 checks the free space and reserves the pages, and every
# rank fails at rendezvous with a message saying what to do. Runs in a mount namespace with
# a 2 MiB tmpfs on /dev/shm (needs root).
. "$(dirname "$0")/lib/small_shm.sh"
out=$(on_small_shm 2M "CTRAIN_SHM_CHUNK=1M CTRAIN_TIMEOUT=30 $B run --standalone --nproc-per-node 2 $B worker allreduce" 2>&1); rc=$?
[ $rc = 1 ] || die "exit $rc (want 1): $out"
echo "$out" | grep -q "Bus error\|signal 7" && die "SIGBUS: $out"
echo "$out" | grep -q "/dev/shm has .* MiB free, the shm backend needs .* MiB for 2 ranks" || die "message: $out"
# whichever rank exits first is the root cause (a race: rank 1 says what rank 0 found, or
# rank 0 exits before rank 1 has a chance to and the launcher stops rank 1)
echo "$out" | grep -q "root cause: rank [01] .*exited with code 1" || die "root cause: $out"
# fits: 2 ranks with the default chunk need about 2 MiB... the small chunk fits in 2 MiB
out=$(on_small_shm 2M "CTRAIN_SHM_CHUNK=64k $B run --standalone --nproc-per-node 2 $B worker allreduce" 2>&1) ||
    die "64k chunk in 2 MiB: $out"
exit 0
