#!/usr/bin/env bash
# bench/cost_model.py on the committed shaped-link measurements gives the figures that
# docs/scaling.md and docs/shaped_links.md state for them: with the CPUs' floor (the bare veth's
# runs), the collective checks and the training steps within 20% per machine, and the GPT's
# ctrain ÷ PyTorch per run. A change to the model that moves them
# fails here until the page says so.
set -uo pipefail
cd "$(dirname "$0")/../.."
command -v python3 >/dev/null || { echo "needs python3"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
# expect FILE PATTERN...: each pattern a line of the model's summary (or of its ctrain ÷
# PyTorch table)
expect() {
    local f=$1 out
    shift
    out=$(python3 bench/cost_model.py "docs/bench/$f" --train-table 2>&1) || fail "$f: $out"
    for p in "$@"; do
        grep -qF -- "$p" <<<"$out" || fail "$f: no '$p' in: $(grep -E '^- |worst' <<<"$out")"
    done
    echo "$f: $*"
}
expect shaped_links-2026-12-05-zen4.out "- 1gbit: 19 of 20 checks within 20%" "- 10gbit: 19 of 20 checks within 20%" \
    "12 of 12 within 20%" "| 10gbit | 2x2 | gpt | 5550 sharded step | 3678 | 1.51 sharded step |"
expect shaped_links-2026-12-05-xeon.out "- 1gbit: 19 of 20 checks within 20%" "- 10gbit: 15 of 20 checks within 20%" \
    "8 of 8 within 20%" "| 10gbit | 2x2 | gpt | 7363 / 7338 sharded step | 4995 / 4682 | 1.47 sharded step; 1.57 sharded step |"
# the second Zen 4 run (1 and 4 MiB over 40 calls) and the chain during backward alternated
# with the chain after it (the GPT's steps)
expect shaped_links-2026-12-05b-zen4.out "- 1gbit: 19 of 20 checks within 20%" "- 10gbit: 18 of 20 checks within 20%" \
    "12 of 12 within 20%"
expect shaped_links-2026-12-05-zen4-early.out "| 1gbit | 2x2 | gpt | 5305 / 5130 sharded step; 5560 / 5412 sharded step, early |"
expect shaped_links-2026-12-05c-zen4.out "- 1gbit: 19 of 20 checks within 20%" "- 10gbit: 20 of 20 checks within 20%" \
    "12 of 12 within 20%" "| 10gbit | 2x2 | gpt | 5536 sharded step, early | 3861 | 1.43 sharded step, early |"
expect shaped_links-2026-12-05-zen4-rail-early.out "| 1gbit | 2x2 | gpt | 5186 / 5300 sharded step, rails; 5386 / 5432 sharded step, rails, early |"
# three runs after the reduce-scatter went direct, with the median call: every 1 Gbit/s check
# within 20%, the fully sharded steps (gptfsdp) among the 18 steps checked
expect shaped_links-2026-12-05d-zen4.out "- 1gbit: 20 of 20 checks within 20%" "- 10gbit: 19 of 20 checks within 20%" \
    "18 of 18 within 20%" "| gptfsdp | ctrain-fsdp | 1gbit | 2x2 |"
# four runs with Gloo's event loop at nice 19 (its spin no longer sets the 4-process floor):
# every check within 20% at both rates on the runs' medians
expect shaped_links-2026-12-05e-zen4.out "- 1gbit: 20 of 20 checks within 20%" "- 10gbit: 20 of 20 checks within 20%" \
    "18 of 18 within 20%" "| 10gbit | 2x2 | gpt | 5366 sharded step, early | 3704 | 1.45 sharded step, early |"
# a full run after the attention's causal trim: every training figure of the issue in one run
expect shaped_links-2026-12-05h-zen4.out "- 1gbit: 20 of 20 checks within 20%" "- 10gbit: 17 of 20 checks within 20%" \
    "18 of 18 within 20%" "| 10gbit | 2x2 | gpt | 5492 sharded step, early | 3502 | 1.57 sharded step, early |"
# the small collectives launched 3 times (median of the launches' medians): a full run and a
# collectives run, every check within 20% on their medians
expect shaped_links-2026-12-05i-zen4.out "- 1gbit: 20 of 20 checks within 20%" "- 10gbit: 20 of 20 checks within 20%" \
    "18 of 18 within 20%" "| 10gbit | 2x2 | gpt | 5414 sharded step, early | 3587 | 1.51 sharded step, early |" \
    "| allreduce (check, floor) | 10gbit | 4x1 | 1 MiB | 3.4; 3.1-4.1 |"
# a third full run after the trim: every collective and step check within 20% in one run; the
# GPT at 10 Gbit/s 1.48x (the one training figure this run misses)
expect shaped_links-2026-12-06-zen4.out "- 1gbit: 20 of 20 checks within 20%" "- 10gbit: 20 of 20 checks within 20%" \
    "18 of 18 within 20%" "| 10gbit | 2x2 | gpt | 5392 sharded step, early | 3654 | 1.48 sharded step, early |"
# a fourth full run, the VM slower: the GPT 1.48x at 10 Gbit/s and 1.46x at 1 Gbit/s (its
# compute part 1,869 ms there against 1,484 at 10 Gbit/s in the same run)
expect shaped_links-2026-12-06b-zen4.out "- 1gbit: 20 of 20 checks within 20%" "- 10gbit: 18 of 20 checks within 20%" \
    "17 of 18 within 20%" "| 10gbit | 2x2 | gpt | 5289 sharded step, early | 3578 | 1.48 sharded step, early |" \
    "| 1gbit | 2x2 | gpt | 4297 sharded step, early | 2942 | 1.46 sharded step, early |"
echo ok
