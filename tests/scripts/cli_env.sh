#!/usr/bin/env bash
# `ctrain env` names the version, CPU, SIMD level, cores, memory, BLAS and backends;
# `--check` runs a correct 2-rank all-reduce; a bad flag is one line and exit 2. A CUDA
# build lists each GPU with the driver and library versions, or says plainly that no GPU is
# usable and why (no driver, no device); a build without CUDA says nccl is not built.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(${CT_BUILD:-build}/ctrain env --check)
for k in "^ctrain [0-9]" "^cpu:" "^simd:" "^cores:" "^memory:" "^blas: .*OpenBLAS" "^backends: .*shm" "^check: .*correct"; do
    echo "$out" | grep -qE "$k" || { echo "$out"; echo "missing: $k"; exit 1; }
done
if echo "$out" | grep -q "nccl (yes"; then
    want=("^cuda: +([0-9]+ GPUs? visible|built with CUDA \((sm_[0-9/]+ \+ PTX|PTX compute_[0-9]+ only)\), but no GPU is usable here: .+)" \
          "^versions: .*runtime [0-9]+\.[0-9]+, cuBLASLt [1-9][0-9]*\.[0-9]+.*NCCL [0-9]")
    echo "$out" | grep -qE "^cuda: +[0-9]+ GPU" && want+=("^gpu 0: .*GiB, compute capability [0-9]+\.[0-9]+")
else
    want=("nccl \(not built" "^cuda: +not built")
fi
for k in "${want[@]}"; do
    echo "$out" | grep -qE "$k" || { echo "$out"; echo "missing: $k"; exit 1; }
done
set +e
err=$(${CT_BUILD:-build}/ctrain env --bogus 2>&1); rc=$?
set -e
[ $rc -eq 2 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] || { echo "bad flag: exit $rc: $err"; exit 1; }
echo ok
