#!/usr/bin/env bash
# bench/cost_model.py on the committed shaped-link measurements gives the figures that
# docs/scaling.md states for them: with the CPUs' floor (the bare veth's runs), the collective
# checks and the training steps within 20% per machine. A change to the model that moves them
# fails here until the page says so.
set -uo pipefail
cd "$(dirname "$0")/../.."
command -v python3 >/dev/null || { echo "needs python3"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
# expect FILE PATTERN...: each pattern a line of the model's summary
expect() {
    local f=$1 out
    shift
    out=$(python3 bench/cost_model.py "docs/bench/$f" 2>&1) || fail "$f: $out"
    for p in "$@"; do
        grep -qF -- "$p" <<<"$out" || fail "$f: no '$p' in: $(grep -E '^- |worst' <<<"$out")"
    done
    echo "$f: $*"
}
expect shaped_links-2026-12-05-zen4.out "- 1gbit: 17 of 20 checks within 20%" "- 10gbit: 15 of 20 checks within 20%" \
    "12 of 12 within 20%"
expect shaped_links-2026-12-05-xeon.out "- 1gbit: 19 of 20 checks within 20%" "- 10gbit: 16 of 20 checks within 20%" \
    "8 of 8 within 20%"
echo ok
