#!/usr/bin/env bash
# Attacks on the store and faults around the launcher, each tried several times; prints one
# line per fault: trials, survived, data lost, time to detect. The figures in
# docs/reliability.md ("Store and launcher") come from this script. Run as root (the stranger
# is user nobody, /dev/shm is shrunk in a private mount namespace); takes about 3 minutes.
#   scripts/measure_store_faults.sh [path/to/ctrain]
set -u
cd "$(dirname "$0")/.." || exit 1
B=$(realpath "${1:-build/ctrain}")
PY=/usr/bin/python3
tmp=$(mktemp -d); chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
unset CTRAIN_STORE_TOKEN XDG_RUNTIME_DIR
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc -l; }
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
port() { echo $((20000 + RANDOM % 20000)); }
wait_listen() { for _ in $(seq 200); do ss -ltn | grep -q ":$1 " && return 0; sleep 0.02; done; return 1; }
cpu_ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
row() { printf '%-58s %3s trials, %3s survived, data lost %s, %s\n' "$@"; }

cat >"$tmp/stranger.py" <<'EOS'
import socket, struct, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
def frame(b): return struct.pack('<I', len(b)) + b
def s(b): return struct.pack('<I', len(b)) + b
key = b'ctrain/0/g0/shmattached'
if mode == 'attack':  # the issue's attack, then variants; prints what got through
    got = 0
    for pre in [b'', frame(b'\x01' + s(b'')), frame(b'\x01' + s(b'guess'))]:
        c = socket.create_connection(('127.0.0.1', port))
        t = time.time()
        c.sendall(pre + frame(b'\x02' + s(key) + s(b'1')) + frame(b'\x03' + s(key) + struct.pack('<I', 1000)))
        data = b''
        while True:
            d = c.recv(100)
            if not d: break
            data += d
        # a reply to SET or GET means the stranger touched a key
        if len(data) > 5 or data == b'\x01\x00\x00\x00\x00': got += 1
        print('closed after %.4f s' % (time.time() - t), file=sys.stderr)
    print(got)
else:  # hold N idle connections for S seconds
    n, secs = int(sys.argv[3]), float(sys.argv[4])
    cs = []
    for i in range(n):
        try:
            c = socket.socket(); c.setblocking(False); c.connect_ex(('127.0.0.1', port)); cs.append(c)
        except OSError: pass
    time.sleep(secs)
    print(len(cs))
EOS

# 1. the issue's attack from another user on a job started from RANK/WORLD_SIZE
ok=0; N=10; through=0
for i in $(seq $N); do
    p=$(port)
    RANK=0 WORLD_SIZE=2 MASTER_PORT=$p CTRAIN_TIMEOUT=20 $B worker allreduce >"$tmp/r0" 2>&1 &
    r0=$!
    wait_listen $p
    g=$(nobody $PY "$tmp/stranger.py" $p attack 2>>"$tmp/close_times"); through=$((through + g))
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$p CTRAIN_TIMEOUT=20 $B worker allreduce >"$tmp/r1" 2>&1 && wait $r0 && ok=$((ok + 1))
done
worst=$(awk '{print $3}' "$tmp/close_times" | sort -g | tail -1)
row "stranger (nobody) SET/GET without the token, 3 variants" $N $ok "none ($through requests got through)" "rejected within ${worst}s"

# 2. 4,300 idle connections from nobody while the ranks rendezvous
ok=0; N=5; maxcpu=0
for i in $(seq $N); do
    p=$(port)
    RANK=0 WORLD_SIZE=2 MASTER_PORT=$p CTRAIN_TIMEOUT=20 $B worker allreduce >"$tmp/r0" 2>&1 &
    r0=$!
    wait_listen $p
    (ulimit -n 20000; nobody $PY "$tmp/stranger.py" $p idle 4300 6 >/dev/null) &
    att=$!
    sleep 1
    c0=$(cpu_ticks $r0); t0=$(now)
    sleep 2
    cpu=$(echo "($(cpu_ticks $r0) - $c0) / 100 / $(since $t0)" | bc -l)
    maxcpu=$(echo "if ($cpu > $maxcpu) $cpu else $maxcpu" | bc -l)
    s=$(now)
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$p CTRAIN_TIMEOUT=20 $B worker allreduce >"$tmp/r1" 2>&1 && wait $r0 && ok=$((ok + 1))
    echo "$(since $s)" >>"$tmp/join2"
    wait $att
done
row "4,300 idle connections (nobody) during rendezvous" $N $ok none \
    "rank 1 joined in $(sort -g "$tmp/join2" | tail -1 | cut -c1-5)s max; store CPU $(printf %.0f "$(echo "$maxcpu*100" | bc -l)")%"

# 3. descriptor limit 64 and 100 idle connections
ok=0; N=3; maxcpu=0
for i in $(seq $N); do
    p=$(port)
    (ulimit -n 64; RANK=0 WORLD_SIZE=2 MASTER_PORT=$p CTRAIN_TIMEOUT=20 exec $B worker allreduce) >"$tmp/r0" 2>&1 &
    r0=$!
    wait_listen $p
    nobody $PY "$tmp/stranger.py" $p idle 100 5 >/dev/null &
    att=$!
    sleep 1
    c0=$(cpu_ticks $r0); t0=$(now)
    sleep 3
    cpu=$(echo "($(cpu_ticks $r0) - $c0) / 100 / $(since $t0)" | bc -l)
    maxcpu=$(echo "if ($cpu > $maxcpu) $cpu else $maxcpu" | bc -l)
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$p CTRAIN_TIMEOUT=20 $B worker allreduce >"$tmp/r1" 2>&1 && wait $r0 && ok=$((ok + 1))
    wait $att
done
row "ulimit -n 64 on the store, 100 idle connections" $N $ok none "store CPU $(printf %.0f "$(echo "$maxcpu*100" | bc -l)")% (max over 3 s)"

# 4. launcher SIGKILLed, program behind a wrapper script
printf '#!/bin/sh\n"$@"\nexit $?\n' >"$tmp/wrap.sh"; chmod +x "$tmp/wrap.sh"
ok=0; N=10; worst=0
for i in $(seq $N); do
    rm -f "$tmp/out"
    $B run --standalone --nproc-per-node 2 "$tmp/wrap.sh" $B worker sleep 60 >"$tmp/out" 2>/dev/null &
    lp=$!
    for _ in $(seq 200); do [ "$(grep -c '^pid' "$tmp/out" 2>/dev/null)" = 2 ] && break; sleep 0.02; done
    pids=$(awk '/^pid/ {print $2}' "$tmp/out")
    kill -9 $lp; s=$(now)
    for _ in $(seq 500); do
        alive=0
        for q in $pids; do [ -r /proc/$q/stat ] && [ "$(awk '{print $3}' /proc/$q/stat 2>/dev/null)" != Z ] && alive=1; done
        [ $alive = 0 ] && break; sleep 0.005
    done
    t=$(since $s); wait $lp 2>/dev/null
    [ $alive = 0 ] && ok=$((ok + 1)) || kill -9 $pids
    worst=$(echo "if ($t > $worst) $t else $worst" | bc -l)
done
row "launcher SIGKILLed, workers behind a wrapper script" $N $ok "n/a" "all workers gone within $(printf %.3f $worst)s"

# 5. a second job on the same output directory
for i in $(seq 1 60); do echo "the quick brown fox jumps over the lazy dog $i times."; done >"$tmp/text.txt"
T=(gpt --text "$tmp/text.txt" --n-layer 1 --n-embd 16 --n-head 2 --block-size 8 --batch-size 2 --log-every 100000
   --eval-max 8 --threads 1 --workers 1 --save-every 500 --keep 2)
$B train "${T[@]}" --steps 4000 --output-dir "$tmp/out1" >"$tmp/a.log" 2>&1 &
a=$!
for _ in $(seq 200); do [ -s "$tmp/out1/.lock" ] && break; sleep 0.05; done
ok=0; N=5; worst=0
for i in $(seq $N); do
    s=$(now)
    if ! $B train "${T[@]}" --steps 2 --output-dir "$tmp/out1" >"$tmp/b.log" 2>&1; then
        grep -q "in use by another job" "$tmp/b.log" && ok=$((ok + 1))
    fi
    t=$(since $s); worst=$(echo "if ($t > $worst) $t else $worst" | bc -l)
done
kill -0 $a 2>/dev/null && running=1 || running=0
wait $a; arc=$?
[ $running = 1 ] || echo "note: the first job ended before the trials"
row "second ctrain train on the same --output-dir (refused)" $N $ok "$([ $arc = 0 ] && [ -s "$tmp/out1/model.safetensors" ] && echo none || echo "FIRST JOB FAILED")" "refused in $(printf %.2f $worst)s"

# 6. leftovers of a dead launcher listed in its pid file
ok=0; N=3
for i in $(seq $N); do
    setsid sleep 60 & left=$!; sleep 0.1
    mkdir -p "$tmp/logs$i"
    printf 'supervisor 999999\nworker %d %s\n' $left "$(awk '{print $22}' /proc/$left/stat)" >"$tmp/logs$i/.ctrain-run.pid"
    $B run --standalone --nproc-per-node 2 --log-dir "$tmp/logs$i" $B worker init >/dev/null 2>&1
    sleep 0.05
    { [ ! -r /proc/$left/stat ] || [ "$(awk '{print $3}' /proc/$left/stat)" = Z ]; } && ok=$((ok + 1)) || kill -9 $left
    wait $left 2>/dev/null
done
row "leftover worker of a dead launcher (same --log-dir)" $N $ok "n/a" "killed at the next start"

# 7. /dev/shm of 2 MiB, segment of 5 MiB
ok=0; N=5; worst=0
for i in $(seq $N); do
    s=$(now)
    out=$(unshare -m sh -c "mount -t tmpfs -o size=2M tmpfs /dev/shm && CTRAIN_SHM_CHUNK=1M $B run --standalone --nproc-per-node 2 $B worker allreduce" 2>&1)
    t=$(since $s); worst=$(echo "if ($t > $worst) $t else $worst" | bc -l)
    echo "$out" | grep -q "/dev/shm has .* MiB free" && ! echo "$out" | grep -q "signal 7" && ok=$((ok + 1))
done
row "/dev/shm 2 MiB for a 5 MiB segment" $N $ok "n/a" "error at rendezvous, job over in $(printf %.2f $worst)s (no SIGBUS)"

# 8. a rank stopped (SIGSTOP) before an all-reduce, timeout 3 s
ok=0; N=5; worst=0
for i in $(seq $N); do
    r=$((i % 3)); s=$(now)
    out=$($B run --standalone --nproc-per-node 3 --timeout 3 --grace-period 1 $B worker stall $r 2>&1)
    t=$(since $s); worst=$(echo "if ($t > $worst) $t else $worst" | bc -l)
    echo "$out" | grep -q "root cause: rank $r (local rank $r, pid [0-9]*) never reached" && ok=$((ok + 1))
done
row "SIGSTOPped rank, --timeout 3: root cause names it" $N $ok "n/a" "named, job over in $(printf %.2f $worst)s"

# 9. hostile values
ok=0; N=0
for e in 1e30 18446744073709549568 inf nan -1 2T; do
    N=$((N + 1)); timeout 20 $B bench allreduce -e $e >/dev/null 2>&1; [ $? = 2 ] && ok=$((ok + 1))
done
for v in 4611686018427387904 inf 18446744073709551616 1e30; do
    N=$((N + 1)); CTRAIN_SHM_CHUNK=$v timeout 20 $B run --standalone --nproc-per-node 2 $B worker allreduce >/dev/null 2>&1
    [ $? = 2 ] && ok=$((ok + 1))
done
row "bench -e / CTRAIN_SHM_CHUNK out of range" $N $ok "n/a" "refused before start (exit 2)"
