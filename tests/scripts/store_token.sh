#!/usr/bin/env bash
# Issue 12.1: a job started from RANK/WORLD_SIZE/MASTER_PORT (no launcher, no
# CTRAIN_STORE_TOKEN) used to run its store with no token: another local user could SET
# ctrain/0/g0/shmattached and kill the job. Now rank 0 makes a token, shares it through a
# 0600 file, and a client without it is dropped before it touches a key. Also: a multi-node
# launcher binds the master address (not 0.0.0.0) and refuses to run without a secret.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/build/ctrain
die() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d); chmod 755 "$tmp"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
unset CTRAIN_STORE_TOKEN XDG_RUNTIME_DIR

# the stranger: another user when we are root (it cannot read our token file), else us
as_stranger() {
    if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
        setpriv --reuid=65534 --regid=65534 --clear-groups "$@"
    else "$@"; fi
}
# Sends frames (printf escapes) to the store, prints the reply bytes in hex.
cat > "$tmp/poke.sh" <<'EOS'
exec 3<>/dev/tcp/127.0.0.1/$1 || exit 3
shift
for f in "$@"; do printf "$f" >&3; done
timeout 3 cat <&3 >"$TMPF" # cat writes what it reads: nothing is lost when timeout stops it
od -An -tx1 "$TMPF" | tr -d ' \n'
EOS
key='ctrain/0/g0/shmattached'
klen='\x17\x00\x00\x00'
set_frame="\x21\x00\x00\x00\x02$klen$key\x01\x00\x00\x001"
get_frame="\x20\x00\x00\x00\x03$klen${key}\x10\x27\x00\x00"
hello_empty='\x05\x00\x00\x00\x01\x00\x00\x00\x00'
hello_guess='\x0a\x00\x00\x00\x01\x05\x00\x00\x00guess'

port=$((20000 + RANDOM % 20000))
RANK=0 WORLD_SIZE=2 MASTER_PORT=$port CTRAIN_TIMEOUT=20 $B worker allreduce >"$tmp/r0" 2>&1 &
pids+=($!)
for _ in $(seq 100); do ss -ltn | grep -q ":$port " && break; sleep 0.05; done
ss -ltn | grep -q "127.0.0.1:$port " || die "store not listening on 127.0.0.1:$port: $(ss -ltn | grep ":$port ")"
# the attack of the issue, and variants: no HELLO, empty token, a guessed token
for frames in "$set_frame" "$hello_empty$set_frame" "$hello_guess$set_frame" "$hello_empty$get_frame"; do
    touch "$tmp/reply"; chmod 666 "$tmp/reply"
    r=$(TMPF=$tmp/reply as_stranger bash "$tmp/poke.sh" $port "$frames") || die "stranger could not connect"
    # first the challenge (33 bytes: status 0 and a 32-byte nonce), which every connection gets
    [[ $r =~ ^2100000000[0-9a-f]{64} ]] || die "no challenge first: $r"
    r=${r:74}
    # then allowed: nothing, or one 1-byte reply with a non-zero status (the rejection), then EOF
    case "$r" in
    "" | 01000000[0-9a-f][0-9a-f]) [ "$r" = 0100000000 ] && die "stranger's HELLO accepted: $r" ;;
    *) die "stranger got a reply beyond the rejection: $r" ;;
    esac
done
tf=/tmp/ctrain-$(id -u)/store-$port.token
[ -f "$tf" ] || die "no token file $tf"
[ "$(stat -c %a "$tf")" = 600 ] || die "token file mode $(stat -c %a "$tf")"
as_stranger cat "$tf" >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && die "the stranger can read the token file"

RANK=1 WORLD_SIZE=2 MASTER_PORT=$port CTRAIN_TIMEOUT=20 $B worker allreduce >"$tmp/r1" 2>&1 || die "rank 1: $(cat "$tmp/r1")"
wait "${pids[0]}" || die "rank 0: $(cat "$tmp/r0")"
grep -q "all-reduce ok" "$tmp/r0" && grep -q "all-reduce ok" "$tmp/r1" || die "$(cat "$tmp/r0" "$tmp/r1")"
[ -e "$tf" ] && die "token file left behind"

# ranks started by hand on several machines take the secret from a 0600 file as ctrain run
# does (CTRAIN_STORE_TOKEN_FILE); another file's secret is refused
printf '0123456789abcdef-by-hand\n' > "$tmp/sec"; printf '0123456789abcdef-other\n' > "$tmp/sec2"; chmod 600 "$tmp/sec" "$tmp/sec2"
port=$((port + 1))
CTRAIN_STORE_TOKEN_FILE="$tmp/sec" RANK=0 WORLD_SIZE=2 MASTER_PORT=$port CTRAIN_TIMEOUT=20 $B worker allreduce >"$tmp/f0" 2>&1 &
p0=$!
CTRAIN_STORE_TOKEN_FILE="$tmp/sec" RANK=1 WORLD_SIZE=2 MASTER_PORT=$port CTRAIN_TIMEOUT=20 $B worker allreduce >"$tmp/f1" 2>&1 ||
    die "rank 1 with CTRAIN_STORE_TOKEN_FILE: $(cat "$tmp/f1")"
wait $p0 || die "rank 0 with CTRAIN_STORE_TOKEN_FILE: $(cat "$tmp/f0")"
[ -e "/tmp/ctrain-$(id -u)/store-$port.token" ] && die "a token file was published although the secret was given"
port=$((port + 1))
CTRAIN_STORE_TOKEN_FILE="$tmp/sec" RANK=0 WORLD_SIZE=2 MASTER_PORT=$port CTRAIN_TIMEOUT=3 $B worker allreduce >"$tmp/g0" 2>&1 &
p0=$!
CTRAIN_STORE_TOKEN_FILE="$tmp/sec2" RANK=1 WORLD_SIZE=2 MASTER_PORT=$port CTRAIN_TIMEOUT=3 $B worker allreduce >"$tmp/g1" 2>&1 &&
    die "rank 1 with another secret joined: $(cat "$tmp/g1")"
grep -q "rejected this process" "$tmp/g1" || die "rank 1 with another secret: $(cat "$tmp/g1")"
wait $p0 && die "rank 0 trained without its peer"
chmod 644 "$tmp/sec"
CTRAIN_STORE_TOKEN_FILE="$tmp/sec" RANK=1 WORLD_SIZE=2 MASTER_PORT=$port $B worker allreduce >"$tmp/h1" 2>&1 && die "a 0644 secret file accepted"
grep -q "$tmp/sec" "$tmp/h1" || die "a 0644 secret file: $(cat "$tmp/h1")"

# a launcher for several nodes: no address or (beyond node 0, which makes one up) no secret,
# no job; with one, the master address only
out=$($B run --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port $port $B worker init 2>&1); rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "needs a shared secret" || die "multi-node without a token: rc $rc: $out"
out=$($B run --nnodes 2 --node-rank 0 --master-port $port $B worker init 2>&1); rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "needs --master-addr" || die "multi-node without an address: rc $rc: $out"
out=$($B run --nnodes 2 --node-rank 0 --rdzv-id short --master-addr 127.0.0.1 --master-port $port $B worker init 2>&1)
echo "$out" | grep -q "needs a shared secret" || die "a short --rdzv-id accepted: $out"
printf '0123456789abcdef-job\n' >"$tmp/secret"; chmod 600 "$tmp/secret"
CTRAIN_DEBUG=INFO $B run --nnodes 2 --node-rank 0 --rdzv-token-file "$tmp/secret" --master-addr 127.0.0.2 \
    --master-port $port $B worker sleep 2 >"$tmp/l" 2>&1 &
pids+=($!)
for _ in $(seq 100); do ss -ltn | grep -q ":$port " && break; sleep 0.05; done
ss -ltn | grep ":$port " | grep -q "127.0.0.2:$port" || die "multi-node store bind: $(ss -ltn | grep ":$port ")"
wait "${pids[1]}"
grep -q "0123456789abcdef-job" "$tmp/l" && die "the secret is in the log: $(cat "$tmp/l")"
# the token is never printed
out=$(CTRAIN_STORE_TOKEN=sup3rsecret-tok $B env --vars 2>&1)
echo "$out" | grep -q sup3rsecret && die "ctrain env --vars printed the token"
echo "$out" | grep -q "^CTRAIN_STORE_TOKEN .*(hidden)" || die "no (hidden) for the token: $(echo "$out" | grep TOKEN)"
echo "stranger rejected 4/4, job survived"
exit 0
