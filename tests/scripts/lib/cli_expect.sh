# Sourced by the ctrain command tests (cli_eval_generate.sh, text_cli.sh), from the repository
# root: C (the ctrain binary: $CTRAIN_BIN, else the CT_BUILD build's), d (a temporary
# directory, removed on exit), q (one thread), fail and expect.
C=${CTRAIN_BIN:-${CT_BUILD:-build}/ctrain} # CT_BUILD=build-san (make test-asan): the sanitizer build
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
expect() { # expect <pattern> <command...>: exit != 0, one line on stderr matching pattern
    local pat=$1; shift
    local err; err=$("$@" 2>&1 >/dev/null); local rc=$?
    [ $rc -ne 0 ] || fail "exit 0 for: $*"
    echo "$err" | grep -qE -- "$pat" || fail "expected /$pat/ for: $*; got: $err"
    [ "$(echo "$err" | grep -c .)" -le 1 ] || fail "more than one line for: $*: $err"
}
q=(--threads 1)
