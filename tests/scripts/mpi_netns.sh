#!/usr/bin/env bash
# The mpi backend across two "hosts": two network namespaces joined by a veth pair, one rank
# in each, launched by mpirun with a launch agent that enters the namespace instead of ssh.
# Checks all-reduces of several sizes and dtypes, and that the bytes crossed the veth link.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/build/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || skip "mpirun not installed"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0
A=cta$$ ; Bn=ctb$$
tmp=$(mktemp -d)
cleanup() { ip netns del $A 2>/dev/null; ip netns del $Bn 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
ip netns add $A 2>"$tmp/err" || skip "cannot create network namespaces here ($(head -1 "$tmp/err"))"
ip netns add $Bn || skip "cannot create a second namespace"
ip link add v$A type veth peer name v$Bn || skip "cannot create a veth pair"
ip link set v$A netns $A && ip link set v$Bn netns $Bn || die "moving veth"
ip -n $A addr add 10.77.0.1/24 dev v$A && ip -n $Bn addr add 10.77.0.2/24 dev v$Bn || die "addresses"
for n in $A $Bn; do ip -n $n link set lo up; done
ip -n $A link set v$A up && ip -n $Bn link set v$Bn up || die "link up"
cat >"$tmp/agent" <<AG
#!/bin/sh
# rsh-style launch agent: "agent HOST CMD..." runs CMD in the namespace that owns HOST
host=\$1; shift
case "\$host" in 10.77.0.1) ns=$A ;; 10.77.0.2) ns=$Bn ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec \$ns sh -c "\$*"
AG
chmod +x "$tmp/agent"
cat >"$tmp/whereami" <<'WH'
#!/bin/sh
echo "rank $OMPI_COMM_WORLD_RANK in netns $(ip netns identify $$)"
WH
chmod +x "$tmp/whereami"
mpi() { timeout 120 ip netns exec $A mpirun --host 10.77.0.1,10.77.0.2 -np 2 --mca plm_rsh_agent "$tmp/agent" \
    --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 "$@"; }
out=$(mpi "$tmp/whereami" 2>&1) || die "mpirun across namespaces failed: $out"
echo "$out" | grep -q "rank 0 in netns $A" && echo "$out" | grep -q "rank 1 in netns $Bn" || die "placement: $out"
tx0=$(ip netns exec $Bn cat /sys/class/net/v$Bn/statistics/tx_bytes)
for dt in f32 bf16 i64; do
    out=$(mpi $B bench allreduce --backend mpi -c -b 8 -e 4M -f 8 --dtype $dt -n 3 -w 1 2>&1) || die "bench $dt: $out"
    # data rows only: Open MPI's rsh launcher sometimes adds a "setpgid ... failed" warning
    rows=$(echo "$out" | grep -E '^ *[0-9]+ ')
    echo "$rows" | awk '$8 != 0 { bad = 1 } END { exit bad }' || die "wrong results ($dt): $out"
    [ "$(echo "$rows" | wc -l)" -ge 7 ] || die "missing sizes: $out"
done
out=$(mpi $B worker allreduce 2>&1) || die "worker: $out"
[ "$(echo "$out" | grep -c 'all-reduce ok')" = 2 ] || die "$out"
tx1=$(ip netns exec $Bn cat /sys/class/net/v$Bn/statistics/tx_bytes)
moved=$((tx1 - tx0))
echo "bytes sent by the rank in $Bn over the veth: $moved"
[ $moved -gt 10000000 ] || die "too little traffic on the veth ($moved bytes): not a network path?"
echo ok
