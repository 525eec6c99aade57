#!/usr/bin/env bash
# Runs every unit-test binary (build/tests/*) and every script test (tests/scripts/*.sh),
# then prints "N passed, N failed, N skipped". Script tests exit 0 (pass), 77 (skip, with
# the reason on their last output line) or anything else (fail).
# Usage: tests/run.sh [pattern]   — only tests whose file name contains pattern.
# CT_BUILD names the build directory to test (default build; `make test-asan` sets build-san);
# it is exported so that the script tests run the same build's binaries.
# CT_TEST_LEAVE_OUT: names of tests not to run (CI uses it to keep the sanitizer run short);
# they are listed at the end, not counted.
cd "$(dirname "$0")/.." || exit 1
export CT_BUILD="${CT_BUILD:-build}"
left_out=()
leave_out() { [[ " ${CT_TEST_LEAVE_OUT:-} " == *" $1 "* ]] && left_out+=("$1"); }
pat="${1:-}"
# CT_TEST_TIMEOUT: seconds each test may run (default 600; CI gives the sanitizer run more)
limit=${CT_TEST_TIMEOUT:-600}
[[ "$limit" =~ ^[1-9][0-9]*$ ]] || { echo "CT_TEST_TIMEOUT must be a positive number of seconds, not '$limit'"; exit 2; }
pass=0; fail=0; skip=0; failed_names=()
for t in "$CT_BUILD"/tests/*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    [[ -n "$pat" && "$name" != *"$pat"* ]] && continue
    leave_out "$name" && continue
    echo "== $name"
    out=$(timeout "$limit" "$t" 2>&1); rc=$?
    echo "$out" | grep -v '^RESULT ' | sed 's/^/  /'
    res=$(echo "$out" | grep '^RESULT ' | tail -1)
    if [ -z "$res" ]; then
        echo "  FAIL $name: crashed or timed out (exit $rc)"; fail=$((fail+1)); failed_names+=("$name"); continue
    fi
    read -r _ p f s <<<"$res"
    pass=$((pass+p)); fail=$((fail+f)); skip=$((skip+s))
    [ "$f" -gt 0 ] && failed_names+=("$name")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "  FAIL $name: exit $rc"; fail=$((fail+1)); failed_names+=("$name")
    fi
done
for t in tests/scripts/*.sh; do
    [ -f "$t" ] || continue
    name=$(basename "$t" .sh)
    [[ -n "$pat" && "$name" != *"$pat"* ]] && continue
    leave_out "$name" && continue
    out=$(timeout "$limit" bash "$t" 2>&1); rc=$?
    if [ $rc -eq 0 ]; then echo "ok   script/$name"; pass=$((pass+1))
    elif [ $rc -eq 77 ]; then echo "skip script/$name: $(echo "$out" | tail -1)"; skip=$((skip+1))
    else echo "FAIL script/$name (exit $rc)"; echo "$out" | tail -20 | sed 's/^/  /'; fail=$((fail+1)); failed_names+=("script/$name")
    fi
done
[ ${#left_out[@]} -gt 0 ] && echo "left out (CT_TEST_LEAVE_OUT): ${left_out[*]}"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
