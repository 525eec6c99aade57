# Sourced by the tests that run ctrain on a /dev/shm too small for it (shm_too_small.sh,
# zero_shm_full.sh): a private tmpfs in a mount namespace. Needs root; exits 77 (skip) where
# that cannot be had. Defines B (the ctrain binary), die, and on_small_shm.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/build/ctrain
[ "$(id -u)" = 0 ] || { echo "skip: needs root for a private /dev/shm"; exit 77; }
unshare -m true 2>/dev/null || { echo "skip: unshare -m not permitted here"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
# on_small_shm SIZE COMMAND: runs the shell command with a SIZE tmpfs on /dev/shm (2 min at most)
on_small_shm() { timeout 120 unshare -m sh -c "mount -t tmpfs -o size=$1 tmpfs /dev/shm && $2"; }
