# Sourced after tests/tools/two_hosts.sh: a private Slurm cluster on its two "hosts". munged
# (own key and socket under $tmp), slurmctld in $A, and one slurmd per namespace (nodes n1 at
# $net.1 and n2 at $net.2), each with its own /dev/shm and its own scratch directory (the PMIx
# plugin's server sockets are named by job and step only, so two nodes on one file system
# would collide). No cgroups: proctrack/linuxproc, task/none. MpiDefault=pmix.
#   slurm_up                start the daemons, wait until both nodes are idle
#   slurm_srun ARGS...      srun ARGS in $A (SLURM_CONF set)
# slurm_kill_wait (set before sourcing): slurm.conf's KillWait, the seconds between SIGTERM
# and SIGKILL when a job is cancelled or preempted (default 2 here; Slurm's own is 30).
# Needs skip, die and $tmp from the caller; replaces two_hosts.sh's EXIT trap with one that
# also stops munged (the daemons in the namespaces go with them).
# a test run inside a Slurm job must not hand its own job's variables to this cluster's srun
for v in $(env | sed -n 's/^\(SLURM_[A-Z_]*\)=.*/\1/p; s/^\(PMIX_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
export SLURM_CONF=$tmp/slurm/slurm.conf
slurm_cleanup() {
    [ -f "$tmp/slurm/munged.pid" ] && kill "$(cat "$tmp/slurm/munged.pid")" 2>/dev/null
    two_hosts_cleanup
}
trap slurm_cleanup EXIT
trap 'exit 143' TERM INT # a timeout (tests/run.sh) must not leave the daemons running
slurm_up() {
    local s=$tmp/slurm h
    for t in munged slurmctld slurmd srun; do command -v $t >/dev/null || die "$t not installed (scripts/setup-slurm.sh)"; done
    [ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ] || die "Slurm's mpi_pmix plugin is missing (slurm-wlm-basic-plugins)"
    mkdir -p "$s/ctld" "$s/scratch" "$s/spool-n1" "$s/spool-n2" && chmod 700 "$s" || die "mkdir $s"
    # munged refuses a key or socket directory that others can write; -f: the /tmp above is sticky
    dd if=/dev/urandom of="$s/munge.key" bs=1024 count=1 status=none && chmod 600 "$s/munge.key"
    munged -f --key-file="$s/munge.key" --socket="$s/munge.sock" --pid-file="$s/munged.pid" \
        --log-file="$s/munged.log" --seed-file="$s/munged.seed" 2>"$s/munged.err" || die "munged: $(cat "$s/munged.err")"
    h=$(hostname -s)
    cat >"$SLURM_CONF" <<EOF
ClusterName=ctrain
SlurmctldHost=$h($net.1)
SlurmctldPort=6917
SlurmdPort=6918
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$s/munge.sock
CredType=cred/munge
StateSaveLocation=$s/ctld
SlurmdSpoolDir=$s/spool-%n
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd-%n.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdLogFile=$s/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$s/scratch
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/linear
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=${slurm_kill_wait:-2}
MinJobAge=10
NodeName=n1 NodeAddr=$net.1 CPUs=2 State=UNKNOWN
NodeName=n2 NodeAddr=$net.2 CPUs=2 State=UNKNOWN
PartitionName=ct Nodes=n1,n2 Default=YES State=UP MaxTime=INFINITE
EOF
    # slurmd loads a cgroup plugin even when nothing uses it; autodetection fails on a hybrid
    # v1 layout (a tmpfs on /sys/fs/cgroup), so name v1, which only has to load
    printf 'CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n' >"$s/cgroup.conf"
    ip netns exec $A slurmctld -i -f "$SLURM_CONF" 2>"$s/slurmctld.err" || die "slurmctld: $(cat "$s/slurmctld.err")"
    local n=1
    for ns in $A $Bn; do
        # a private /dev/shm and scratch per node, in the mount namespace ip netns exec makes
        ip netns exec $ns sh -c "mount -t tmpfs ctshm /dev/shm && mount -t tmpfs ctscratch '$s/scratch' &&
            exec slurmd -f '$SLURM_CONF' -N n$n" 2>"$s/slurmd-n$n.err" || die "slurmd n$n: $(cat "$s/slurmd-n$n.err")"
        n=$((n + 1))
    done
    for _ in $(seq 150); do
        [ "$(ip netns exec $A sinfo -h -o '%t' -n n1,n2 2>/dev/null | sort -u)" = idle ] && return 0
        sleep 0.2
    done
    die "the Slurm nodes did not come up: $(ip netns exec $A sinfo 2>&1; tail -5 "$s/slurmctld.log" "$s"/slurmd-n*.log)"
}
slurm_srun() { ip netns exec $A srun "$@"; }
