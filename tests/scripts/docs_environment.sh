#!/usr/bin/env bash
# docs/environment.md is generated from the configuration table: the committed file must
# equal `ctrain env --vars --markdown` (regenerate with that command after changing the table).
set -u
cd "$(dirname "$0")/../.." || exit 1
C=${CTRAIN_BIN:-${CT_BUILD:-build}/ctrain}
[ -x "$C" ] || { echo "FAIL: $C not built"; exit 1; }
want=$(env -i PATH=/usr/bin:/bin "$C" env --vars --markdown) || { echo "FAIL: ctrain env --vars --markdown failed"; exit 1; }
if ! diff -u docs/environment.md <(printf '%s\n' "$want"); then
    echo "FAIL: docs/environment.md is out of date: build/ctrain env --vars --markdown > docs/environment.md"
    exit 1
fi
echo "docs/environment.md is up to date"
