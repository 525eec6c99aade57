#!/usr/bin/env bash
# Hostile input to `ctrain run` and `ctrain train` (bad flags, odd paths, bad environment):
# each gets exactly one clear line and a non-zero exit, never a crash or a hang.
# CTRAIN_BIN=build-san/ctrain (or CT_BUILD=build-san) runs it against the sanitizer build.
set -u
cd "$(dirname "$0")/../.." || exit 1
C=${CTRAIN_BIN:-${CT_BUILD:-build}/ctrain}
[ -x "$C" ] || { echo "FAIL: $C not built"; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
die() { echo "FAIL: $*"; exit 1; }
one_line() { # one_line <expected rc> <pattern> <command...>
    local want=$1 pat=$2; shift 2
    local out rc; out=$(timeout 60 "$@" 2>&1); rc=$?
    [ $rc -ne 124 ] || die "hung: $*"
    [ $rc = "$want" ] || die "exit $rc, want $want: $*: $out"
    [ "$(printf '%s\n' "$out" | grep -c .)" = 1 ] || die "not one line: $*: $out"
    printf '%s\n' "$out" | grep -qE -- "$pat" || die "expected /$pat/: $*: got: $out"
}

# ctrain run
one_line 2 "bad value '0' for --nproc-per-node" $C run --nproc-per-node 0 $C worker init
one_line 2 "bad value '-1' for --nproc-per-node" $C run --nproc-per-node -1 $C worker init
one_line 2 "bad value 'many' for --nproc-per-node" $C run --nproc-per-node many $C worker init
one_line 2 "bad value '5x' for --timeout" $C run --timeout 5x $C worker init
one_line 2 "bad value '-1' for --grace-period" $C run --grace-period -1 $C worker init
one_line 2 "bad value '70000' for --master-port" $C run --master-port 70000 $C worker init
one_line 2 "unknown option '--nproc'" $C run --nproc 2 $C worker init
one_line 2 "cannot find program '$d/nope'" $C run --standalone "$d/nope"
one_line 2 "cannot find program '$d'" $C run --standalone "$d"
echo x > "$d/file"
one_line 1 "cannot create log directory $d/file/logs" $C run --standalone --log-dir "$d/file/logs" $C worker init

# ctrain train: data
for i in $(seq 1 40); do echo "some text for a tiny model, line $i"; done > "$d/t.txt"
: > "$d/empty.txt"
echo "hello" > "$d/short.txt"
G=(--n-layer 1 --n-embd 16 --n-head 2 --block-size 8 --steps 2 --eval-max 8 --log-every 100)
one_line 1 "$d: is a directory" $C train gpt --text "$d" "${G[@]}" --output-dir "$d/o"
one_line 1 "$d: is a directory" $C train gpt --shards "$d" "${G[@]}" --output-dir "$d/o"
one_line 1 "empty.txt: 0 tokens is too few for one window of 8" $C train gpt --text "$d/empty.txt" "${G[@]}" --output-dir "$d/o"
one_line 1 "short.txt: 6 tokens is too few for one window of 8" $C train gpt --text "$d/short.txt" "${G[@]}" --output-dir "$d/o"
one_line 1 "nope.txt: No such file" $C train gpt --text "$d/nope.txt" "${G[@]}" --output-dir "$d/o"
# ctrain train: output and resume paths
one_line 1 "$d/file.*[Nn]ot a directory" $C train gpt --text "$d/t.txt" "${G[@]}" --resume "$d/file" --output-dir "$d/o"
one_line 1 "$d/file exists and is not a directory" $C train gpt --text "$d/t.txt" "${G[@]}" --output-dir "$d/file/out"
one_line 1 "$d/file exists and is not a directory" $C train gpt --text "$d/t.txt" "${G[@]}" --output-dir "$d/file"
# ctrain train: flags
one_line 2 "gpt.n_embd = 30 must be a multiple of gpt.n_head = 4" $C train gpt --text "$d/t.txt" --n-embd 30 --n-head 4
one_line 2 "--steps expects an integer" $C train gpt --text "$d/t.txt" --steps -5
one_line 2 "--block-size expects a value" $C train gpt --text "$d/t.txt" --block-size

# environment
one_line 2 "CTRAIN_TIMEOUT='abc': expected a number of seconds > 0" env CTRAIN_TIMEOUT=abc $C train gpt --text "$d/t.txt" "${G[@]}" --output-dir "$d/o"
one_line 2 "CTRAIN_TIMEOUT='-3': expected a number of seconds > 0" env CTRAIN_TIMEOUT=-3 $C run --standalone --nproc-per-node 2 $C worker init
one_line 2 "CTRAIN_DEBUG='bogus': expected one of ERROR, WARN, INFO, TRACE" env CTRAIN_DEBUG=bogus $C train gpt --text "$d/t.txt" "${G[@]}" --output-dir "$d/o"
one_line 2 "CTRAIN_DEBUG='bogus': expected one of ERROR, WARN, INFO, TRACE" env CTRAIN_DEBUG=bogus $C run --standalone --nproc-per-node 2 $C worker init
one_line 1 "RANK=5 is not below WORLD_SIZE=2" env RANK=5 WORLD_SIZE=2 $C train gpt --text "$d/t.txt" "${G[@]}" --output-dir "$d/o"
one_line 2 "WORLD_SIZE='2x': expected an integer >= 1" env RANK=0 WORLD_SIZE=2x $C train gpt --text "$d/t.txt" "${G[@]}" --output-dir "$d/o"
# every variable is checked at start-up, whichever command runs
one_line 2 "CTRAIN_DDP_BUCKET_MB='0': expected a number of MiB > 0 and <= 1000000" env CTRAIN_DDP_BUCKET_MB=0 $C train gpt --text "$d/t.txt" "${G[@]}" --output-dir "$d/o"
one_line 2 "CTRAIN_DDP_ZERO_COPY='maybe': expected 1, true, on, yes or 0, false, off, no" env CTRAIN_DDP_ZERO_COPY=maybe $C run --standalone --nproc-per-node 2 $C worker init
one_line 2 "CTRAIN_BACKEND='bogus': expected one of shm, mpi" env CTRAIN_BACKEND=bogus $C worker init
one_line 2 "MASTER_PORT='70000': expected an integer between 1 and 65535" env MASTER_PORT=70000 $C env
one_line 2 "CTRAIN_SHM_CHUNK='1x': expected a size in bytes" env CTRAIN_SHM_CHUNK=1x $C bench allreduce
one_line 2 "RANK='-1': expected an integer >= 0" env RANK=-1 $C env --vars
# rank 0 of 2 alone: the peer never comes, the collective timeout ends it with one line
port=$((20000 + RANDOM % 20000))
one_line 1 "1 of 2 ranks never joined after 2 s: rank\(s\) 1" env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CTRAIN_TIMEOUT=2 \
    $C train gpt --text "$d/t.txt" "${G[@]}" --output-dir "$d/o"
echo "hostile input handled"
