#!/usr/bin/env bash
# `make bench`: ctrain vs PyTorch, side by side in one run (docs/benchmarks.md holds the
# latest table). Every configuration runs in a fresh process (its peak RSS is its own);
# each is run REPEAT times, interleaved, and the best rate kept (this 2-core machine is
# shared, so the best of a few runs is the least disturbed one).
#
#   bash bench/run.sh               core engine (1 and 2 threads) + DDP (2 ranks x 1 thread), ~6-8 min,
#                                   then the all-reduce comparison (bench/allreduce.sh: 2 and 4 ranks,
#                                   3 interleaved rounds, ~3 min), DDP scaling (bench/ddp_scaling.sh, ~3 min)
#                                   and tokenizer throughput vs `tokenizers` (bench/tokenizers.sh, ~2-8 min)
#   bash bench/run.sh --quick       one repetition, shorter runs (~3 min)
#   bash bench/run.sh --accuracy    also Fashion-MNIST accuracy, CNN and MLP, 2 ranks, default
#                                   settings (slow: tens of minutes)
#   bash bench/run.sh --only-accuracy
#   bash bench/run.sh --demo        also the README's demo vs the same training under torchrun
#                                   (bench/demo.sh: 2 rounds each, ~7 min)
#   bash bench/run.sh --debian-torch  also Debian's PyTorch (/usr/bin/python3) as a second column
#   bash bench/run.sh --setup-dry-run print how the reference PyTorch would be installed, run nothing
#   bash bench/run.sh --setup-only    install the reference PyTorch if missing, run nothing
# The reference is the current `torch` from PyPI (what a user installs today), in a virtual
# environment build/venv-bench created on first use (`python3 -m venv` + `pip install
# torch`: a large download, once), or the interpreter given by PYTHON=.
# Environment: PYTHON (reference interpreter; default build/venv-bench/bin/python), REPEAT
# (default 2), SECS_MLP / SECS_GPT / SECS_CNN (measured seconds per run, default 5 / 10 / 5),
# BENCH_OUT (results file), BENCH_MODELS (default: mlp gpt gptf cnn llama llama_bf16), TORCH_PIP_SPEC (default torch), BENCH_VENV (default build/venv-bench).
set -u
cd "$(dirname "$0")/.." || exit 1
VENV=${BENCH_VENV:-build/venv-bench}
PY=${PYTHON:-$VENV/bin/python}
DEB_PY=/usr/bin/python3
REPEAT=${REPEAT:-2}
SECS_MLP=${SECS_MLP:-5}
SECS_GPT=${SECS_GPT:-10}
SECS_CNN=${SECS_CNN:-5}
MODELS=${BENCH_MODELS:-mlp gpt gptf cnn llama llama_bf16}
OUT=${BENCH_OUT:-build/bench/results.txt}
CT=build/bench/train_bench
core=1; acc=0; coll=1; deb=0; dry=0; setup_only=0; demo=0; tok=1
for a in "$@"; do
    case "$a" in
    --quick) REPEAT=1; SECS_MLP=3; SECS_GPT=6; SECS_CNN=3 ;;
    --accuracy) acc=1 ;;
    --only-accuracy) acc=1; core=0; coll=0; tok=0 ;;
    --no-collectives) coll=0 ;;
    --no-tokenizers) tok=0 ;;
    --debian-torch) deb=1 ;;
    --setup-dry-run) dry=1 ;;
    --setup-only) setup_only=1 ;;
    --demo) demo=1 ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
    esac
done

# the reference PyTorch: PYTHON= as given, else the venv, created and filled on first use
setup_torch() {
    local run=()
    [ $dry -eq 1 ] && run=(echo "would run:")
    if [ -n "${PYTHON:-}" ]; then
        if "$PY" -c 'import torch' 2>/dev/null; then
            [ $dry -eq 1 ] && echo "reference PyTorch: PYTHON=$PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
            return 0
        fi
        echo "bench: PYTHON=$PY cannot import torch" >&2; return 1
    fi
    if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
        [ $dry -eq 1 ] && echo "reference PyTorch present: $VENV ($("$VENV/bin/python" -c 'import torch; print(torch.__version__)'))"
        return 0
    fi
    echo "bench: installing the current torch from PyPI into $VENV (first use; a large download)" >&2
    [ -x "$VENV/bin/python" ] || "${run[@]}" /usr/bin/python3 -m venv "$VENV" || return 1
    "${run[@]}" "$VENV/bin/python" -m pip install --quiet --upgrade pip || return 1
    "${run[@]}" "$VENV/bin/python" -m pip install --quiet "${TORCH_PIP_SPEC:-torch}" || return 1
    [ $dry -eq 1 ] && return 0
    "$PY" -c 'import torch' 2>/dev/null
}
if [ $dry -eq 1 ] || [ $setup_only -eq 1 ]; then setup_torch; exit $?; fi
[ -x "$CT" ] || { echo "build first: make -j2" >&2; exit 1; }
have_torch=1
setup_torch || { have_torch=0; echo "bench: no reference PyTorch ($PY); ctrain only" >&2; }
if [ $deb -eq 1 ] && ! $DEB_PY -c 'import torch' 2>/dev/null; then
    deb=0; echo "bench: no Debian PyTorch at $DEB_PY (apt-get install python3-torch); no second column" >&2
fi
mkdir -p "$(dirname "$OUT")"

secs() { case "$1" in gpt|gptf|llama*) echo "$SECS_GPT" ;; cnn) echo "$SECS_CNN" ;; *) echo "$SECS_MLP" ;; esac; }
record() { # runs a command, keeps its RESULT lines (tagged with the extra fields in $1)
    local tag="$1"; shift
    local o
    o=$("$@" 2>&1); local rc=$?
    if [ $rc -ne 0 ] || ! grep -q '^RESULT' <<<"$o"; then
        echo "bench: FAILED ($rc): $*" >&2; echo "$o" | tail -5 >&2; return 1
    fi
    grep '^RESULT' <<<"$o" | sed "s/\$/ $tag/" | tee -a "$OUT"
}

if [ $core -eq 1 ]; then
    : >"$OUT"
    cpu=$(lscpu | sed -n 's/^Model name: *//p')
    fam=$(lscpu | sed -n 's/^CPU family: *//p'); mod=$(lscpu | sed -n 's/^Model: *//p')
    echo "MACHINE cpu=\"$cpu\" family=$fam model=$mod cores=$(nproc) load=\"$(cut -d' ' -f1-3 /proc/loadavg)\" date=$(date -u +%FT%TZ)" | tee -a "$OUT"
    # the arithmetic peak of this run: ctrain's GEMM at 1024^3 per thread count
    for t in 1 2; do record "" "$CT" sgemm $t; done
    for r in $(seq "$REPEAT"); do
        for m in $MODELS; do
            # gptf: the GPT with fused attention, ctrain's flash kernel (the built-in model's
            # default) against PyTorch's F.scaled_dot_product_attention (nanoGPT's own choice
            # on PyTorch >= 2); gpt keeps the explicit attention on both sides.
            # llama: 8 query / 2 key-value heads, ctrain's fused grouped-query attention against
            # SDPA(enable_gqa=True); llama_bf16 the same under bf16 autocast on both sides
            ctm=$m; var=(); tag=""; pym=$m; pyv=()
            [ $m = gptf ] && { ctm=gpt; var=(flash); tag="model=gptf"; }
            [ $m = llama ] && var=(flash)
            [ $m = llama_bf16 ] && { ctm=llama; var=(flash,amp=bf16); tag="model=llama_bf16"; pym=llama; pyv=(amp=bf16); }
            [ $have_torch -eq 1 ] && [[ $m = llama* ]] && ! $PY -c 'import torch; torch.nn.RMSNorm' 2>/dev/null && continue
            for t in 1 2; do
                # both OpenMP wait policies, as for PyTorch: on a loaded machine libgomp's default
                # spinning makes 2-thread runs collapse (docs/bench/cnn.md)
                record "omp_wait=default $tag" env -u OMP_WAIT_POLICY "$CT" single $ctm $t "$(secs $m)" "${var[@]}"
                [ $t -gt 1 ] && record "omp_wait=passive $tag" env OMP_WAIT_POLICY=passive "$CT" single $ctm $t "$(secs $m)" "${var[@]}"
                if [ $have_torch -eq 1 ]; then
                    # OPENBLAS_NUM_THREADS=t: where torch calls OpenBLAS (Debian's), torch.set_num_threads
                    # does not limit it (at "1 thread" its GEMMs would run on both cores)
                    record "$tag" env -u OMP_WAIT_POLICY OPENBLAS_NUM_THREADS=$t $PY bench/torch_train.py single $pym $t "$(secs $m)" "${pyv[@]}"
                    record "$tag" env OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=$t $PY bench/torch_train.py single $pym $t "$(secs $m)" "${pyv[@]}"
                fi
                [ $deb -eq 1 ] && [ $m != gptf ] && [[ $m != llama* ]] && record "ref=debian" env OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=$t $DEB_PY bench/torch_train.py single $m $t "$(secs $m)"
            done
            record "$tag" "$CT" ddp $ctm 2 "$(secs $m)" "${var[@]}"
            [ $have_torch -eq 1 ] && record "$tag" env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $PY bench/torch_train.py ddp $pym 2 "$(secs $m)" "${pyv[@]}"
            [ $deb -eq 1 ] && [ $m != gptf ] && [[ $m != llama* ]] && record "ref=debian" env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $DEB_PY bench/torch_train.py ddp $m 2 "$(secs $m)"
        done
    done
    echo "MACHINE_END load=\"$(cut -d' ' -f1-3 /proc/loadavg)\"" | tee -a "$OUT"
    echo
    python3 bench/report.py "$OUT"
fi

if [ $coll -eq 1 ]; then
    echo
    echo "## Collectives (shm backend vs Open MPI and gloo; 2 ranks and 4 ranks, interleaved rounds)"
    bash bench/allreduce.sh
    echo
    echo "## DDP scaling (2 ranks x 1 thread vs 1 x 1; with and without the sharded optimizer step)"
    [ $REPEAT -eq 1 ] && export ROUNDS=${ROUNDS:-1} SECS=${SECS:-3}
    bash bench/ddp_scaling.sh
fi

if [ $tok -eq 1 ]; then
    echo
    echo "## Tokenizers: encode throughput, one thread, ctrain vs tokenizers"
    PYTHON=$PY REPEAT=$REPEAT bash bench/tokenizers.sh
fi

if [ $acc -eq 1 ]; then
    # Fashion-MNIST, default settings, 2 ranks x 1 thread (ranks launched by hand with the
    # torchrun environment, so this does not depend on `ctrain run`).
    ACC_OUT=${ACC_OUT:-build/bench/accuracy}
    mkdir -p "$ACC_OUT"
    for spec in "cnn 3" "mlp 3"; do
        set -- $spec; m=$1; ep=$2
        port=$((29500 + RANDOM % 1000))
        t0=$(date +%s)
        for r in 0 1; do
            WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                build/ctrain train $m --epochs $ep --output-dir "$ACC_OUT/$m" --log-every 200 >"$ACC_OUT/$m.rank$r.log" 2>&1 &
        done
        wait
        t1=$(date +%s)
        a=$(grep -oiE 'acc(uracy)?[ =:]+[0-9.]+' "$ACC_OUT/$m.rank0.log" | tail -1 | grep -oE '[0-9.]+$')
        echo "RESULT impl=ctrain model=$m accuracy=${a:-?} epochs=$ep ranks=2 wall_s=$((t1 - t0))" | tee -a "$ACC_OUT/results.txt"
        grep -iE 'acc' "$ACC_OUT/$m.rank0.log" | tail -4
    done
fi

if [ $demo -eq 1 ] && [ $have_torch -eq 1 ]; then
    echo
    echo "## The README's demo vs PyTorch under torchrun"
    PYTHON=$PY bash bench/demo.sh
fi
