# Sourced by tests/scripts/hier_netns.sh and bench/hier_netns.sh: two "hosts" made of
# network namespaces $A and $Bn joined by a veth pair on $net.0/24 ($net.1, .2; net is
# 10.76.0 unless TWO_HOSTS_NET names another /24), each
# with its own /dev/shm, and mpi_2x2 CMD... running CMD as 4 ranks, 2 per host, under
# mpirun with a launch agent that enters the namespace instead of ssh; checks of a 2 x 2 run
# against a one-host run (hier_2x2_ok, same_as_one_host).
# TWO_HOSTS_RATE (a tc rate: 1gbit, 10gbit...; unset: no shaping, as the tests use it) puts a
# token-bucket filter on both ends of the veth, so each direction is limited to that rate.
# Needs skip, die and $tmp from the caller; sets the EXIT trap.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0
A=cth$$a; Bn=cth$$b
net=${TWO_HOSTS_NET:-10.76.0} # another subnet for a caller that may run beside the tests
# tc_burst RATE: a tbf burst for RATE (kbit, mbit, gbit): 1 ms worth of bytes, >= 256 KiB
tc_burst() {
    awk -v r="$1" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
        m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : u == "bit" ? 1 : 0
        if (!(n > 0) || !m) exit 1
        b = n * m / 8 / 1000; if (b < 262144) b = 262144; printf "%d", b }'
}
two_hosts_cleanup() {
    for n in $A $Bn; do ip netns pids $n 2>/dev/null | xargs -r kill -9 2>/dev/null; done # a job left by a failure
    [ -n "${KEEP:-}" ] && { echo "kept $tmp and namespaces $A $Bn"; return; }
    ip netns del $A 2>/dev/null; ip netns del $Bn 2>/dev/null; rm -rf "$tmp"
}
trap two_hosts_cleanup EXIT
ip netns add $A 2>"$tmp/err" || skip "cannot create network namespaces here ($(head -1 "$tmp/err"))"
ip netns add $Bn || skip "cannot create a second namespace"
ip link add v$A type veth peer name v$Bn || skip "cannot create a veth pair"
ip link set v$A netns $A && ip link set v$Bn netns $Bn || die "moving veth"
ip -n $A addr add $net.1/24 dev v$A && ip -n $Bn addr add $net.2/24 dev v$Bn || die "addresses"
for n in $A $Bn; do ip -n $n link set lo up; done
ip -n $A link set v$A up && ip -n $Bn link set v$Bn up || die "link up"
if [ -n "${TWO_HOSTS_RATE:-}" ]; then
    # burst: 1 ms at the rate, at least 256 KiB (a GSO packet over the bucket would be dropped)
    burst=$(tc_burst "$TWO_HOSTS_RATE") || die "TWO_HOSTS_RATE=$TWO_HOSTS_RATE: not a rate like 1gbit"
    for n in $A $Bn; do
        ip netns exec $n tc qdisc add dev v$n root tbf rate "$TWO_HOSTS_RATE" burst "$burst" latency 50ms ||
            die "tc tbf on v$n"
    done
fi
cat >"$tmp/agent" <<AG
#!/bin/sh
# rsh-style launch agent: "agent HOST CMD..." runs CMD in the namespace that owns HOST
host=\$1; shift
case "\$host" in $net.1) ns=$A ;; $net.2) ns=$Bn ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
# each "host" gets its own /dev/shm (ip netns exec runs in a private mount namespace): with
# one host name in both, Open MPI's shared-memory files would collide there
exec ip netns exec \$ns sh -c "mount -t tmpfs ctshm /dev/shm && \$*"
AG
chmod +x "$tmp/agent"
# mpi_on HOSTS NP [mpirun options] CMD...: HOSTS as mpirun's --host (NET.1:2,NET.2:1)
mpi_on() {
    local hosts=$1 np=$2; shift 2
    timeout 120 ip netns exec $A sh -c 'mount -t tmpfs ctshm /dev/shm && exec "$@"' sh mpirun \
        --host "$hosts" -np "$np" --mca plm_rsh_agent "$tmp/agent" --mca btl vader,tcp,self \
        --mca btl_tcp_if_include $net.0/24 --mca oob_tcp_if_include $net.0/24 "$@"
}
mpi_2x2() { mpi_on $net.1:2,$net.2:2 4 "$@"; }
# bytes sent by the second host over the veth
tx_bytes() { ip netns exec $Bn cat /sys/class/net/v$Bn/statistics/tx_bytes; }
# hier_2x2_ok LOG ENGINE: LOG (CTRAIN_DEBUG_SUBSYS=pg) shows one 4-rank job of ${cnn[@]}
# (batch 4), hier with 2 local ranks on each of 2 nodes and ENGINE between the leaders
hier_2x2_ok() {
    grep -q "| 4 ranks × batch 4 = global batch 16 |" "$1" || die "not one 4-rank job: $(head -20 "$1")"
    [ "$(grep -c "hier: rank . is local rank . of 2 on node . of 2.*$2 between 2 leaders" "$1")" = 4 ] ||
        die "not 2 nodes x 2 local ranks on hier($2): $(grep -E 'hier|backend|rendezvous' "$1")"
}
# same_as_one_host WEIGHTS: within 1e-5 relative of a one-host 4-rank `ctrain run` of ${cnn[@]}
# with $C (run once, into $tmp/ref)
same_as_one_host() {
    command -v python3 >/dev/null || skip "no python3 to compare the weights with"
    [ -f "$tmp/ref/model.safetensors" ] ||
        timeout 120 "$C" run --nproc-per-node 4 --standalone "$C" train "${cnn[@]}" --output-dir "$tmp/ref" \
            >"$tmp/ref.log" 2>&1 || die "ctrain run failed: $(tail "$tmp/ref.log")"
    python3 tests/tools/weights_close.py "$1" "$tmp/ref/model.safetensors" 1e-5 ||
        die "$1: the weights differ from the one-host 4-rank run's"
}
