#!/usr/bin/env bash
# Preemption under Slurm, on the private two-node cluster of tests/tools/slurm_cluster.sh
# (ranks from PMIx, no ctrain variables), `ctrain train mlp` stopped mid-epoch:
# - 2 tasks, one per node (the mpi backend), the job cancelled with `scancel`: what Slurm does
#   at the time limit or on preemption (SIGTERM to every task, SIGKILL after KillWait);
# - 4 tasks, 2 per node (hier: shm inside a node, MPI between the leaders), SIGUSR1 (what
#   `sbatch --signal=USR1@T` sends) to one task of the second node only.
# Checks: the ranks agree on the step to stop at (the all-reduce of the caught signal after
# each step, over MPI / hier), rank 0 writes a checkpoint at that step, every task exits 75 and
# srun reports it (its own exit code 75), long before KillWait; `--resume auto` (same output
# directory, a new srun) ends with the model.safetensors of an uninterrupted srun job, by cmp.
set -u
cd "$(dirname "$0")/../.." || exit 1
C=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
. tests/tools/fashion_mnist.sh
nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_mpi_create" || die "built without MPI (scripts/setup.sh installs libopenmpi-dev)"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE CTRAIN_BACKEND MASTER_ADDR MASTER_PORT CTRAIN_STORE_TOKEN CTRAIN_PREEMPT_SIGNALS
tmp=$(mktemp -d)
TWO_HOSTS_NET=10.82.0 # beside the other two-host tests
. tests/tools/two_hosts.sh
# Slurm's default KillWait is 30 s; this cluster's 2 s would do for an MLP's save (milliseconds)
# but not for a large model's: set it above the step time plus one checkpoint write
slurm_kill_wait=30
. tests/tools/slurm_cluster.sh
t0=$(date +%s.%N)
since() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
slurm_up
echo "Slurm up (2 nodes, KillWait=$slurm_kill_wait) in $(since) s"

steps=3000
[ "${CT_BUILD:-build}" = build ] || steps=600
mlp=(mlp --hidden 64,32 --steps $steps --batch-size 32 --eval-max 256 --save-every 100000 --threads 1 --log-every 50)
job() { # LAYOUT LOG ARGS...: one srun job; LAYOUT 1 (2 tasks, one per node) or 2 (4 tasks)
    local per=$1 log=$2; shift 2
    CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=pg timeout 100 ip netns exec $A srun --mpi=pmix -N 2 --ntasks-per-node $per \
        "$C" train "${mlp[@]}" "$@" >"$log" 2>&1
}
# ctrain processes in the second node's namespace
workers() { for p in $(ip netns pids $Bn); do [ "$(cat /proc/$p/comm 2>/dev/null)" = ctrain ] && echo $p; done; }

# $1: name, $2: tasks per node, $3: how to stop it (scancel | usr1-one)
preempt_and_resume() {
    local n=$1 per=$2 how=$3 np=$(($2 * 2)) jp id rc s ck t1 took
    job $per "$tmp/$n.ref.log" --output-dir "$tmp/$n.ref" || die "$n: uninterrupted srun job: $(tail -20 "$tmp/$n.ref.log")"
    grep -q "| $np ranks × batch 32 = global batch $((np * 32)) |" "$tmp/$n.ref.log" ||
        die "$n: not one $np-rank job: $(head -20 "$tmp/$n.ref.log")"
    job $per "$tmp/$n.log" --output-dir "$tmp/$n" &
    jp=$!
    for _ in $(seq 400); do grep -q "^step  *[0-9]*/$steps" "$tmp/$n.log" 2>/dev/null && break; sleep 0.025; done
    grep -q "^step  *[0-9]*/$steps" "$tmp/$n.log" || die "$n: training did not start: $(tail -5 "$tmp/$n.log")"
    t1=$(date +%s.%N)
    if [ "$how" = scancel ]; then
        id=$(ip netns exec $A squeue -h -o %i | head -1)
        [ -n "$id" ] || die "$n: no job in squeue"
        ip netns exec $A scancel "$id" || die "$n: scancel $id failed"
    else
        local w
        w=$(workers | head -1)
        [ -n "$w" ] || die "$n: no task on node n2"
        kill -USR1 "$w"
    fi
    wait $jp; rc=$?
    took=$(awk -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    [ $rc = 75 ] || die "$n: srun exited $rc, want 75: $(tail -10 "$tmp/$n.log")"
    # srun's "n1: tasks 0-1: Exited with exit code 75", one line per node and exit code
    grep "Exited with exit code" "$tmp/$n.log" | grep -vq "exit code 75$" && die "$n: a task exited otherwise: $(grep srun: "$tmp/$n.log")"
    [ "$(sed -n 's/.*: tasks\? \([-0-9,]*\): Exited with exit code 75$/\1/p' "$tmp/$n.log" | tr , '\n' |
        awk -F- '{ c += NF == 2 ? $2 - $1 + 1 : 1 } END { print c + 0 }')" = $np ] ||
        die "$n: srun does not report 75 for each of the $np tasks: $(grep srun: "$tmp/$n.log")"
    awk -v t="$took" -v k=$slurm_kill_wait 'BEGIN { exit !(t < k) }' || die "$n: took $took s, KillWait is $slurm_kill_wait"
    s=$(sed -n 's/^preempted by .* at step \([0-9]*\): checkpoint saved.*/\1/p' "$tmp/$n.log")
    [ -n "$s" ] || die "$n: no 'preempted' line: $(tail -10 "$tmp/$n.log")"
    [ "$s" -lt $steps ] || die "$n: the signal came after the end"
    ck=$(printf "step-%08d" "$s")
    [ -d "$tmp/$n/checkpoints/$ck" ] || die "$n: no checkpoint $ck: $(ls "$tmp/$n/checkpoints")"
    [ ! -e "$tmp/$n/model.safetensors" ] || die "$n: model.safetensors written at a preemption"
    job $per "$tmp/$n.r.log" --output-dir "$tmp/$n" --resume auto || die "$n: resumed job: $(tail -10 "$tmp/$n.r.log")"
    grep -q "resumed from .*$ck at step $s " "$tmp/$n.r.log" || die "$n: did not resume at $s: $(head -5 "$tmp/$n.r.log")"
    cmp "$tmp/$n.ref/model.safetensors" "$tmp/$n/model.safetensors" || die "$n: resumed job differs from the uninterrupted one"
    local be="flat mpi"
    if [ $per = 2 ]; then
        be="hier, mpi between the leaders"
        [ "$(grep -c "hier: rank . is local rank . of 2 on node . of 2.*mpi between 2 leaders" "$tmp/$n.log")" = 4 ] ||
            die "$n: not 2 nodes x 2 local ranks on hier(mpi): $(grep -E 'hier|backend' "$tmp/$n.log")"
    else
        grep -q "2 rank(s) on 2 machine(s): flat mpi backend" "$tmp/$n.log" || die "$n: not flat mpi: $(grep -E 'backend' "$tmp/$n.log")"
    fi
    echo "$n: $np tasks ($be) exited 75 $took s after the signal, at step $s of $steps; resumed bit for bit ($(since) s)"
}
preempt_and_resume scancel 1 scancel
preempt_and_resume usr1-one 2 usr1-one
echo "ok ($(since) s)"
