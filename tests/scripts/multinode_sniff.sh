#!/usr/bin/env bash
# Red-team issue, a sniffer on the link: the store's HELLO carried the secret, so anyone who
# could read the network between the nodes could join the job. Two "hosts" (network namespaces
# joined by a veth pair, 10.83.0.1 and .2), `ctrain run --nnodes 2 --rdzv-token-file F` on each
# (gloo backend, node 0 hosting the store), tcpdump on node 0's end of the veth for the whole
# job. Checks: the capture holds the store's traffic and the gradients, and no copy of the
# secret: not its text, not the hex of its text, not the bytes its hex spells. That the HELLO
# bytes such a sniffer records are refused when replayed to the store (the MAC answers one
# nonce only) is tests/unit/test_store.c's store_hello_is_not_replayable.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
. tests/tools/fashion_mnist.sh
nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_gloo_create" || skip "built without Gloo (apt-get install libgloo-dev)"
command -v tcpdump >/dev/null || skip "tcpdump is not installed (apt-get install tcpdump; scripts/setup-interop.sh installs it)"
unset CTRAIN_STORE_TOKEN CTRAIN_STORE_TOKEN_FILE CTRAIN_BACKEND
tmp=$(mktemp -d)
TWO_HOSTS_NET=10.83.0 # beside the other two-host tests
. tests/tools/two_hosts.sh # namespaces $A and $Bn joined by a veth (its EXIT trap kills what runs in them)
port=29483

secret=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
for k in 0 1; do printf '%s\n' "$secret" >"$tmp/secret$k" && chmod 600 "$tmp/secret$k"; done

# a 64 MiB capture buffer, written out in blocks (not a write per packet): under ASan on 2
# cores the kernel dropped 15 of 2,984 packets with the default buffer and -U
ip netns exec $A tcpdump -i v$A -B 65536 -s 0 -w "$tmp/cap.pcap" tcp >"$tmp/tcpdump.log" 2>&1 &
td=$!
for _ in $(seq 100); do grep -q "listening on" "$tmp/tcpdump.log" && break; sleep 0.05; done
grep -q "listening on" "$tmp/tcpdump.log" || die "tcpdump did not start: $(cat "$tmp/tcpdump.log")"

steps=30
mlp=(train mlp --hidden 64,32 --steps $steps --batch-size 32 --eval-max 64 --threads 1 --log-every 10)
node() { # K: node K of 2 (2 workers) in its namespace, in the background, the secret from its own 0600 file
    ip netns exec "$([ "$1" = 0 ] && echo $A || echo $Bn)" timeout 80 $B run --nnodes 2 --nproc-per-node 2 \
        --node-rank "$1" --master-addr $net.1 --master-port $port --rdzv-token-file "$tmp/secret$1" \
        $B "${mlp[@]}" --output-dir "$tmp/out$1" >"$tmp/n$1.log" 2>&1 &
}
node 0; p0=$!
node 1; p1=$!
wait $p1 || die "node 1: $(tail -8 "$tmp/n1.log")"
wait $p0 || die "node 0: $(tail -8 "$tmp/n0.log")"
grep -q "4 ranks × batch 32 .* $steps steps" "$tmp/n0.log" || die "not a 4-rank job: $(head -3 "$tmp/n0.log")"
sleep 0.3 # the last FINs
kill -INT $td; wait $td
grep -q "0 packets dropped by kernel" "$tmp/tcpdump.log" || die "tcpdump dropped packets: $(cat "$tmp/tcpdump.log")"

# the capture saw the job: the store's connections (both ways) and the gradients
store=$(tcpdump -r "$tmp/cap.pcap" -nn "tcp port $port and tcp[tcpflags] & tcp-push != 0" 2>/dev/null | wc -l)
[ "$store" -ge 8 ] || die "only $store store packets with data in the capture"
size=$(stat -c %s "$tmp/cap.pcap")
[ "$size" -gt $((steps * 2 * 52650 * 4)) ] || die "the capture holds $size bytes, less than the job's gradients"

# no copy of the secret: its text, the hex of its text, the 24 bytes its hex spells
count() { LC_ALL=C grep -c -aP "$1" "$tmp/cap.pcap"; }
bytes() { sed 's/../\\x&/g'; } # hex -> grep -P's \xHH escapes
text_hex=$(printf '%s' "$secret" | od -An -tx1 -v | tr -d ' \n')
n_text=$(count "\Q$secret\E") n_hex=$(count "(?i)$text_hex") n_bytes=$(count "$(bytes <<<"$secret")")
[ "$n_text$n_hex$n_bytes" = 000 ] ||
    die "the secret is in the capture: as text $n_text, hex of the text $n_hex, its bytes $n_bytes"
# the same search finds what the store does send in the clear: its keys
n_keys=$(count "$(printf 'ctrain/0/gloo/' | od -An -tx1 -v | tr -d ' \n' | bytes)")
[ "$n_keys" -gt 0 ] || die "the search does not find the store's keys in the capture either"
echo "tcpdump on the veth: $size bytes, $store store packets with data, store keys found in the clear ($n_keys);" \
     "the secret (its text, its hex, its bytes) in none"
