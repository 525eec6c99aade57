#!/usr/bin/env bash
# `ctrain train` under PyTorch's torchrun --no-python: the ranks rendezvous through the
# agent's c10d TCPStore (TORCHELASTIC_USE_AGENT_STORE=True) and train as under `ctrain run`
# (final weights within 1e-5 relative); after a killed worker, --max-restarts restarts them
# and they resume from the newest checkpoint (TORCHELASTIC_RESTART_COUNT > 0), ending as
# the uninterrupted run. Debian's torchrun (PyTorch 1.13) always; a PyTorch >= 2 (PYTHON=,
# else /tmp/gpt2-venv) where one is installed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
C=$PWD/${CT_BUILD:-build}/ctrain
die() { echo "FAIL: $*"; exit 1; }
. tests/tools/fashion_mnist.sh
/usr/bin/python3 -c "import torch.distributed.run" 2>/dev/null ||
    { echo "Debian's python3-torch (torchrun) not installed (scripts/setup-interop.sh)"; exit 77; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
export CTRAIN_BIND=0 OMP_NUM_THREADS=1
common=(cnn --log-every 10 --eval-max 500 --threads 1 --save-every 10)
port=47930
# Debian's 1.13 under Python 3.11 turns --redirects/--tee 0 into None and crashes: pass 2
# (stderr to a file and echoed), which 2.x takes too
torchrun() { # PYTHON OUTDIR STEPS [torchrun options...]
    local py=$1 out=$2 steps=$3; shift 3
    port=$((port + 1))
    timeout 300 "$py" -m torch.distributed.run --no_python --redirects 2 --tee 2 --monitor_interval 1 --nnodes 1 --nproc_per_node 2 \
        --master_port $port "$@" "$C" train "${common[@]}" --steps "$steps" --output-dir "$out"
}
# 1e-5 relative per tensor (max |a-b| / max |a|, tests/tools/weights_close.py)
same() { cmp -s "$1" "$2" || /usr/bin/python3 tests/tools/weights_close.py "$1" "$2" 1e-5; }
# bad input: a clear one-line error each
out=$(TORCHELASTIC_USE_AGENT_STORE=maybe RANK=0 WORLD_SIZE=2 MASTER_PORT=47929 "$C" worker init 2>&1) && die "bad value accepted"
echo "$out" | grep -q "TORCHELASTIC_USE_AGENT_STORE='maybe': expected" || die "bad value: $out"
out=$(TORCHELASTIC_USE_AGENT_STORE=True CTRAIN_TIMEOUT=1 RANK=1 WORLD_SIZE=2 MASTER_PORT=47929 "$C" worker init 2>&1) &&
    die "no agent store accepted"
echo "$out" | grep -q "nobody listening after 1 s (torchrun's agent store" || die "no agent store: $out"
"$C" run --nproc-per-node 2 --standalone "$C" train "${common[@]}" --steps 40 --output-dir "$d/ref" > "$d/ref.log" 2>&1 ||
    { cat "$d/ref.log"; die "ctrain run reference"; }
"$C" run --nproc-per-node 2 --standalone "$C" train "${common[@]}" --steps 60 --output-dir "$d/ref60" > "$d/ref60.log" 2>&1 ||
    { cat "$d/ref60.log"; die "ctrain run reference (60 steps)"; }

check_launcher() { # NAME PYTHON
    local name=$1 py=$2 w todo
    CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=pg torchrun "$py" "$d/$name" 40 > "$d/$name.log" 2>&1 ||
        { cat "$d/$name.log"; die "$name: torchrun failed"; }
    grep -q "2 ranks × batch 64" "$d/$name.log" || { cat "$d/$name.log"; die "$name: not a 2-rank job"; }
    grep -q "launcher's, c10d-v[12] protocol" "$d/$name.log" || { cat "$d/$name.log"; die "$name: not torchrun's store"; }
    same "$d/ref/model.safetensors" "$d/$name/model.safetensors" || die "$name: weights differ from ctrain run's"
    # --standalone: c10d rendezvous on a free port (2.x shares its store with the workers,
    # 1.13 does not and rank 0 hosts a ctrain store)
    port=$((port + 1))
    CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=pg timeout 300 "$py" -m torch.distributed.run --no_python --redirects 2 \
        --tee 2 --standalone --nproc_per_node 2 "$C" train "${common[@]}" --steps 10 --eval-max 100 \
        --output-dir "$d/$name-sa" > "$d/$name-sa.log" 2>&1 || { cat "$d/$name-sa.log"; die "$name: --standalone failed"; }
    grep -q "^done: 10 steps" "$d/$name-sa.log" && grep -q "rendezvous through store" "$d/$name-sa.log" ||
        { cat "$d/$name-sa.log"; die "$name: --standalone did not train"; }
    # restart: rank 1 killed after the step-10 checkpoint; the group restarts and resumes
    torchrun "$py" "$d/$name-restart" 60 --max_restarts 1 > "$d/$name-restart.log" 2>&1 &
    local agent=$!
    for _ in $(seq 600); do [ -d "$d/$name-restart/checkpoints/step-00000010" ] && break; sleep 0.05; done
    [ -d "$d/$name-restart/checkpoints/step-00000010" ] || { kill $agent; cat "$d/$name-restart.log"; die "$name: no checkpoint"; }
    w="" todo=$agent
    while [ -n "$todo" ] && [ -z "$w" ]; do # the workers are descendants of this job (subshell, timeout, agent)
        local next=""
        for p in $todo; do
            tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -q "^$C train" &&
                [ "$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -c '^RANK=1$')" = 1 ] && w=$p
            next="$next $(pgrep -P $p | tr '\n' ' ')"
        done
        todo=$(echo $next)
    done
    [ -n "$w" ] || { kill $agent; cat "$d/$name-restart.log"; die "$name: rank 1 not found"; }
    grep -q "step     60/60" "$d/$name-restart.log" && die "$name: the run ended before the kill (too fast)"
    kill -9 "$w"
    wait $agent || { cat "$d/$name-restart.log"; die "$name: the restarted job failed"; }
    grep -q "resumed from .*step-000000[1-9]0 at step [1-9]0" "$d/$name-restart.log" ||
        { cat "$d/$name-restart.log"; die "$name: the restart did not resume"; }
    same "$d/ref60/model.safetensors" "$d/$name-restart/model.safetensors" ||
        die "$name: the restarted run differs from the uninterrupted one"
    echo "$name: --standalone: $(grep -o '([^)]* protocol)' "$d/$name-sa.log" | head -1)"
    echo "$name: 2 ranks equal to ctrain run; restart after kill -9 of rank 1 $(grep -o 'resumed from [^ ]*' "$d/$name-restart.log" | sed 's|.*/||') and matched"
}
check_launcher "torchrun-$(/usr/bin/python3 -c 'import torch; print(torch.__version__)')" /usr/bin/python3

. tests/tools/torch2.sh
if [ -n "$v2" ]; then check_launcher "torchrun-$v2" "$py2"; else echo "$no_torch2"; fi
echo ok
