#!/usr/bin/env bash
# Red-team issue, the store of a multi-node job: two `ctrain run --nnodes 2` on loopback,
# node 0 hosting the store.
# - The secret was given as `--rdzv-id SECRET`, so every local user read it with ps. Now it
#   comes from a file (--rdzv-token-file on node 0, CTRAIN_STORE_TOKEN_FILE on node 1) and no
#   process's /proc/PID/cmdline holds it while the job trains. A file that others could read,
#   a link, a directory, a short secret or another user's file is refused before anything
#   starts; a long --rdzv-id alone is not taken for a secret.
# - A frozen store host (node 0's launcher and worker SIGSTOPped) kept node 1 alive until
#   CTRAIN_TIMEOUT + 60 s; now node 1 fails within CTRAIN_TIMEOUT + 5 s.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
. tests/tools/fashion_mnist.sh
nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_gloo_create" || skip "built without Gloo (apt-get install libgloo-dev)"
tmp=$(mktemp -d)
stopped=()
cleanup() {
    [ ${#stopped[@]} -gt 0 ] && { kill -CONT "${stopped[@]}"; kill -9 "${stopped[@]}"; } 2>/dev/null
    wait 2>/dev/null # node 0's wrapper, killed with its child: no job notice
    rm -rf "$tmp"
}
trap cleanup EXIT
unset CTRAIN_STORE_TOKEN CTRAIN_STORE_TOKEN_FILE
port=$((20000 + RANDOM % 20000))
secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
printf '%s\n' "$secret" >"$tmp/secret"
chmod 600 "$tmp/secret"

# node K of 2 (one worker each) in the background; the rest of the arguments go to ctrain run
node() {
    local k=$1 log=$2; shift 2
    timeout 120 $B run --nnodes 2 --nproc-per-node 1 --node-rank "$k" --master-addr 127.0.0.1 --master-port $port \
        "$@" >"$log" 2>&1 &
}
# every process below PID (not PID itself)
descendants() {
    local c
    for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; descendants "$c"; done
}

# files that must be refused, and the word that says why
refuse() { # WHY OPTIONS...: ctrain run with OPTIONS exits 2 before starting anything, saying WHY
    local why=$1 out rc; shift
    out=$($B run --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port $port "$@" $B worker init 2>&1); rc=$?
    [ $rc = 2 ] && echo "$out" | grep -q "$why" || die "expected a refusal ($why), rc $rc: $out"
}
cp "$tmp/secret" "$tmp/open"; chmod 644 "$tmp/open"
ln -s "$tmp/secret" "$tmp/link"
printf 'short\n' >"$tmp/short"; chmod 600 "$tmp/short"
cp "$tmp/secret" "$tmp/theirs"; chmod 600 "$tmp/theirs"
refuse "readable by others" --rdzv-token-file "$tmp/open"
CTRAIN_STORE_TOKEN_FILE=$tmp/open refuse "readable by others"
refuse "symbolic link" --rdzv-token-file "$tmp/link"
refuse "16 to 255" --rdzv-token-file "$tmp/short"
refuse "not a regular file" --rdzv-token-file "$tmp"
if [ "$(id -u)" = 0 ]; then chown 65534 "$tmp/theirs"; refuse "not this user's" --rdzv-token-file "$tmp/theirs"; fi
refuse "not a secret" --rdzv-id "$secret"

# a job that trains until node 0 is frozen
export CTRAIN_TIMEOUT=5
long=(train cnn --steps 100000 --batch-size 8 --threads 1 --eval-max 16 --log-every 1 --output-dir "$tmp/out")
node 0 "$tmp/n0" --rdzv-token-file "$tmp/secret" $B "${long[@]}"; p0=$!
CTRAIN_STORE_TOKEN_FILE=$tmp/secret node 1 "$tmp/n1" $B "${long[@]}"; p1=$!
for _ in $(seq 600); do grep -q "^step " "$tmp/n0" 2>/dev/null && break; sleep 0.1; done
grep -q "^step " "$tmp/n0" || die "the job did not start: $(tail -5 "$tmp/n0" "$tmp/n1")"
procs=$(descendants $p0; descendants $p1)
[ "$(echo "$procs" | wc -w)" -ge 6 ] || die "expected 2 launchers, 2 keepers and 2 workers: $(ps -o pid,args -p "$(echo $procs | tr ' ' ,)")"
for f in /proc/[0-9]*/cmdline; do
    if grep -qa "$secret" "$f" 2>/dev/null; then die "the secret is in $f: $(tr '\0' ' ' <"$f")"; fi
done
ps -eo args | grep -v grep | grep -q "$secret" && die "ps shows the secret"
grep -q "$secret" "$tmp/n0" "$tmp/n1" && die "the secret is in a log"

# freeze node 0: its launcher (the store's thread) and everything below it
stopped=($(descendants $p0))
kill -STOP "${stopped[@]}"
t0=$(date +%s.%N)
wait $p1 && die "node 1 succeeded with node 0 frozen"
dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
awk -v d="$dt" -v t=$CTRAIN_TIMEOUT 'BEGIN { exit !(d <= t + 5) }' || die "node 1 took $dt s to fail: $(tail -8 "$tmp/n1")"
grep -qi "timed out\|no reply" "$tmp/n1" || die "node 1 did not say it timed out: $(tail -8 "$tmp/n1")"
echo "6 bad secret files refused; the secret in no command line of $(echo "$procs" | wc -w) processes;" \
     "node 1 failed $dt s after node 0 froze (CTRAIN_TIMEOUT=$CTRAIN_TIMEOUT)"
