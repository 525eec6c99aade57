#!/usr/bin/env bash
# CTRAIN_DEBUG=INFO shows rendezvous, backend choice and segment size; TRACE shows the
# algorithm each collective used (tiny: up to 48 B; small: up to CTRAIN_SHM_SMALL; large: staged
# rounds or cross-memory attach, staged for one round when ranks outnumber the CPUs);
# CTRAIN_DEBUG_SUBSYS filters by subsystem.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=${CT_BUILD:-build}/ctrain
die() { echo "FAIL: $*"; exit 1; }
out=$(CTRAIN_DEBUG=INFO timeout 30 $B run --standalone --nproc-per-node 2 $B worker allreduce 2>&1) || die "$out"
echo "$out" | grep -q "INFO pg: rendezvous through store 127.0.0.1:[0-9]* (launcher's, ctrain protocol)" || die "rendezvous: $out"
echo "$out" | grep -q "backend shm, timeout 300 s, fingerprints on" || die "backend: $out"
echo "$out" | grep -q "INFO shm: group 0: segment /ctrain-.*KiB" || die "segment: $out"
out=$(CTRAIN_DEBUG=TRACE CTRAIN_DEBUG_SUBSYS=shm timeout 30 $B bench allreduce -b 8 -e 1M -f 131072 -n 1 -w 0 2>&1) || die "$out"
echo "$out" | grep -q "TRACE shm: all_reduce #[0-9]*: tiny path, 8 B" || die "tiny path: $out"
# a large all-reduce reads the peers' buffers directly (cross-memory attach) where the kernel
# allows it, else goes through the staging buffers; CTRAIN_SHM_CMA=0 forces the latter
echo "$out" | grep -qE "TRACE shm: all_reduce #[0-9]*: (cross-memory attach|reduce-scatter \+ all-gather), 1048576 B" ||
    die "large path: $out"
out2=$(CTRAIN_DEBUG=TRACE CTRAIN_DEBUG_SUBSYS=shm timeout 30 $B bench allreduce -b 1K -e 1K -n 1 -w 0 2>&1) || die "$out2"
echo "$out2" | grep -q "TRACE shm: all_reduce #[0-9]*: small path, 1024 B" || die "small path: $out2"
out=$(CTRAIN_SHM_CMA=0 CTRAIN_DEBUG=TRACE CTRAIN_DEBUG_SUBSYS=shm timeout 30 $B bench allreduce -b 1M -e 1M -n 1 -w 0 2>&1) || die "$out"
echo "$out" | grep -q "TRACE shm: all_reduce #[0-9]*: reduce-scatter + all-gather, 1048576 B" || die "CTRAIN_SHM_CMA=0: $out"
echo "$out" | grep -q " pg: " && die "subsystem filter ignored: $out"
# ranks outnumbering the CPUs: a message of one staged round (1 MiB) stays on the staged path,
# where cross-memory attach only added system calls to the same two synchronisations; sums right
np=$(($(nproc) + 2))
out=$(CTRAIN_DEBUG=TRACE CTRAIN_DEBUG_SUBSYS=shm timeout 60 $B bench allreduce --np $np -c -b 1M -e 1M -n 3 -w 0 2>&1) || die "$out"
echo "$out" | grep -q "TRACE shm: all_reduce #[0-9]*: reduce-scatter + all-gather, 1048576 B" || die "oversubscribed 1 MiB: $out"
echo "$out" | grep -q "cross-memory attach" && die "oversubscribed 1 MiB went through cross-memory attach: $out"
echo "$out" | awk '$1 == 1048576 && $8 != 0 { bad = 1 } END { exit bad }' || die "oversubscribed 1 MiB: wrong sums: $out"
echo ok
