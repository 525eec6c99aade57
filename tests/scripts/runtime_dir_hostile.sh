#!/usr/bin/env bash
# Another local user can make /tmp/ctrain-<uid> before us (0777, theirs). The store token of
# a job started from RANK/WORLD_SIZE lives there, so it is refused, not used; that used to be
# the end of the user's env-launched jobs until root removed it. Now the job goes on in
# $HOME/.cache/ctrain with one warning naming both directories; CTRAIN_RUNTIME_DIR chooses
# the directory outright, and when nothing works the error names the directory, the reason
# and the variable. Run as root: the victim is `nobody`, the squatter root.
# CTRAIN_OLD_BIN=<old ctrain> shows that build refusing the job.
set -u
cd "$(dirname "$0")/../.." || exit 1
C=$PWD/${CT_BUILD:-build}/ctrain
[ -x "$C" ] || { echo "FAIL: $C not built"; exit 1; }
[ "$(id -u)" = 0 ] && command -v setpriv >/dev/null || { echo "skip: needs root and setpriv"; exit 77; }
vu=65534
squat=/tmp/ctrain-$vu
[ -e "$squat" ] && { echo "skip: $squat exists already (not ours to remove)"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
home=$(mktemp -d); chown $vu:$vu "$home"; chmod 755 "$home"
trap 'rm -rf "$home" "$squat"' EXIT
# a checkout under a private directory (mktemp's 0700) is out of the other user's reach: run a copy
if ! setpriv --reuid=$vu --regid=$vu --clear-groups test -x "$C"; then cp "$C" "$home/ctrain" && C=$home/ctrain; fi
setpriv --reuid=$vu --regid=$vu --clear-groups test -x "$C" || die "$C not reachable by uid $vu"
mkdir -m 0777 "$squat"; chmod 0777 "$squat" # as another user (root), before the victim

# job <bin> <out-prefix> [VAR=value...]: a 2-rank env-launched job as uid 65534
job() {
    local bin=$1 out=$2; shift 2
    local port=$((20000 + RANDOM % 20000)) p0 p1 r0 r1
    for r in 0 1; do
        setpriv --reuid=$vu --regid=$vu --clear-groups env -i PATH=/usr/bin:/bin HOME="$home" "$@" RANK=$r \
            WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CTRAIN_TIMEOUT=20 CTRAIN_BACKEND=shm \
            timeout 60 "$bin" worker init >"$out.$r" 2>&1 &
        [ $r = 0 ] && p0=$! || p1=$!
    done
    wait $p0; r0=$?; wait $p1; r1=$?
    echo "$r0 $r1"
}

if [ -n "${CTRAIN_OLD_BIN:-}" ]; then
    rc=$(job "$CTRAIN_OLD_BIN" "$home/old")
    [ "$rc" != "0 0" ] || die "the old build ran in $squat"
    grep -q "$squat is not a private directory" "$home/old.0" || die "old build: $(cat "$home/old.0")"
    echo "old build refuses: $(head -1 "$home/old.0")"
fi

# the fallback: both ranks agree on $HOME/.cache/ctrain, one warning each
rc=$(job "$C" "$home/fb")
[ "$rc" = "0 0" ] || die "fallback job exit $rc: $(cat "$home/fb.0" "$home/fb.1")"
for r in 0 1; do
    n=$(grep -c "$squat: not a private directory of this user (owner 0, mode 777); using $home/.cache/ctrain instead" "$home/fb.$r")
    [ "$n" = 1 ] || die "rank $r: want one warning naming both directories: $(cat "$home/fb.$r")"
    grep -q CTRAIN_RUNTIME_DIR "$home/fb.$r" || die "rank $r: warning does not name CTRAIN_RUNTIME_DIR"
done
[ "$(stat -c '%u %a' "$home/.cache/ctrain")" = "$vu 700" ] || die "fallback: $(stat -c '%u %a' "$home/.cache/ctrain")"
[ -z "$(ls -A "$squat")" ] || die "something was written to $squat: $(ls -A "$squat")"
echo "fallback: trains in $home/.cache/ctrain"

# CTRAIN_RUNTIME_DIR: used as given, no warning
rc=$(job "$C" "$home/rt" CTRAIN_RUNTIME_DIR="$home/rt")
[ "$rc" = "0 0" ] || die "CTRAIN_RUNTIME_DIR job exit $rc: $(cat "$home/rt.0" "$home/rt.1")"
! grep -q "$squat" "$home/rt.0" "$home/rt.1" || die "CTRAIN_RUNTIME_DIR job still looked at $squat"
[ "$(stat -c '%u %a' "$home/rt")" = "$vu 700" ] || die "CTRAIN_RUNTIME_DIR: $(stat -c '%u %a' "$home/rt")"
echo "CTRAIN_RUNTIME_DIR: trains in $home/rt"

# CTRAIN_RUNTIME_DIR naming someone else's directory: refused, naming it, why, and the variable
rc=$(job "$C" "$home/bad" CTRAIN_RUNTIME_DIR="$squat")
[ "$rc" != "0 0" ] || die "ran in $squat given as CTRAIN_RUNTIME_DIR"
grep -q "CTRAIN_RUNTIME_DIR=$squat: not a private directory of this user (owner 0, mode 777)" "$home/bad.0" \
    || die "CTRAIN_RUNTIME_DIR=$squat: $(cat "$home/bad.0")"

# nothing works (no usable HOME): one error naming the directory, the reason, the variable
port=$((20000 + RANDOM % 20000))
out=$(setpriv --reuid=$vu --regid=$vu --clear-groups env -i PATH=/usr/bin:/bin HOME=/nonexistent RANK=0 WORLD_SIZE=2 \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CTRAIN_TIMEOUT=5 timeout 30 "$C" worker init 2>&1) && die "ran without a directory"
echo "$out" | grep -q "$squat: not a private directory of this user (owner 0, mode 777); the fallback /nonexistent/.cache/ctrain: cannot create it: .*: set CTRAIN_RUNTIME_DIR" \
    || die "no-directory error: $out"
echo "no directory: $out"
echo "a squatted /tmp/ctrain-<uid> no longer blocks the user's jobs"
