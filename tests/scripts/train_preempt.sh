#!/usr/bin/env bash
# Preemption: SIGTERM to `ctrain run` (what Slurm and Kubernetes send before they take a node)
# or SIGUSR1 to one worker alone: every rank stops after the same step, a checkpoint is written
# there, the job exits 75 (CT_EXIT_PREEMPTED), and `--resume auto` ends with the bits of a run
# that was never interrupted. CTRAIN_PREEMPT_SIGNALS=none keeps the old behaviour (killed, 143).
set -u
cd "$(dirname "$0")/../.." || exit 1
C=${CT_BUILD:-build}/ctrain
die() { echo "FAIL: $*"; exit 1; }
. tests/tools/fashion_mnist.sh
d=${KEEP_DIR:-$(mktemp -d)}; [ -n "${KEEP_DIR:-}" ] || trap 'rm -rf "$d"' EXIT
R=(run --nproc-per-node 2 --standalone)
# about 1 ms a step here: long enough that the signal lands mid-epoch, well before the end
mlp=(mlp --hidden 64,32 --steps 6000 --batch-size 32 --eval-max 256 --save-every 2500 --threads 1 --log-every 50)

$C "${R[@]}" $C train "${mlp[@]}" --output-dir "$d/ref" > "$d/ref.log" 2>&1 || die "reference run: $(tail -n 5 "$d/ref.log")"

wait_step() { # until the log shows a step line
    for _ in $(seq 400); do grep -q "^step  *[0-9]*/6000" "$1" 2>/dev/null && return 0; sleep 0.025; done; return 1
}
# $1: name, $2: how to signal (launcher | worker)
preempt_and_resume() {
    local n=$1 how=$2
    $C "${R[@]}" $C train "${mlp[@]}" --output-dir "$d/$n" > "$d/$n.log" 2>&1 &
    local lp=$!
    wait_step "$d/$n.log" || { kill -9 $lp; die "$n: training did not start: $(tail -n 3 "$d/$n.log")"; }
    if [ "$how" = launcher ]; then
        kill -TERM $lp
    else # one worker only, as a signal that reaches ranks at different times: the last keeper's program
        local keeper prog
        keeper=$(pgrep -P $lp | sort -n | tail -1)
        prog=$(pgrep -P "$keeper" | head -1)
        [ -n "$prog" ] || { kill -9 $lp; die "$n: no worker process found"; }
        kill -USR1 "$prog"
    fi
    wait $lp; local rc=$?
    [ $rc = 75 ] || die "$n: exit $rc, want 75: $(tail -n 5 "$d/$n.log")"
    local s
    s=$(sed -n 's/^preempted by .* at step \([0-9]*\): checkpoint saved.*/\1/p' "$d/$n.log")
    [ -n "$s" ] || die "$n: no 'preempted' line: $(tail -n 5 "$d/$n.log")"
    [ "$s" -lt 6000 ] || die "$n: the signal came after the end"
    local ck
    ck=$(printf "step-%08d" "$s")
    [ -d "$d/$n/checkpoints/$ck" ] || die "$n: no checkpoint $ck: $(ls "$d/$n/checkpoints")"
    [ ! -e "$d/$n/model.safetensors" ] || die "$n: model.safetensors written at a preemption"
    grep -q "^ctrain run: preempted.*: 2 worker(s) saved and exited 75" "$d/$n.log" || die "$n: launcher line: $(tail -n 3 "$d/$n.log")"
    $C "${R[@]}" $C train "${mlp[@]}" --output-dir "$d/$n" --resume auto > "$d/$n.r.log" 2>&1 ||
        die "$n: resumed run: $(tail -n 5 "$d/$n.r.log")"
    grep -q "resumed from .*$ck at step $s " "$d/$n.r.log" || die "$n: did not resume at $s: $(head -3 "$d/$n.r.log")"
    cmp "$d/ref/model.safetensors" "$d/$n/model.safetensors" || die "$n: resumed run differs from the uninterrupted one"
    echo "$n: stopped at step $s"
}
preempt_and_resume term launcher
preempt_and_resume usr1 worker

# CTRAIN_PREEMPT_SIGNALS=none: SIGTERM kills as before (nothing saved, 128+15)
CTRAIN_PREEMPT_SIGNALS=none $C "${R[@]}" $C train "${mlp[@]}" --output-dir "$d/none" > "$d/none.log" 2>&1 &
lp=$!
wait_step "$d/none.log" || { kill -9 $lp; die "none: training did not start"; }
kill -TERM $lp; wait $lp; rc=$?
[ $rc = 143 ] || die "CTRAIN_PREEMPT_SIGNALS=none: exit $rc, want 143"
CTRAIN_PREEMPT_SIGNALS=TERM,BOGUS $C train "${mlp[@]}" --output-dir "$d/bad" > "$d/bad.log" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "CTRAIN_PREEMPT_SIGNALS: 'BOGUS'" "$d/bad.log" || die "bad CTRAIN_PREEMPT_SIGNALS: exit $rc: $(cat "$d/bad.log")"
echo "preemption ok"
