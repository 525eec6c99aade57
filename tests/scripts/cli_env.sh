#!/usr/bin/env bash
# `ctrain env` names the version, CPU, SIMD level, cores, memory, BLAS and backends;
# `--check` runs a correct 2-rank all-reduce; a bad flag is one line and exit 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(${CT_BUILD:-build}/ctrain env --check)
for k in "^ctrain [0-9]" "^cpu:" "^simd:" "^cores:" "^memory:" "^blas: .*OpenBLAS" "^backends: .*shm" "^check: .*correct"; do
    echo "$out" | grep -qE "$k" || { echo "$out"; echo "missing: $k"; exit 1; }
done
set +e
err=$(${CT_BUILD:-build}/ctrain env --bogus 2>&1); rc=$?
set -e
[ $rc -eq 2 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] || { echo "bad flag: exit $rc: $err"; exit 1; }
echo ok
