#!/usr/bin/env bash
# TensorBoard itself reads ctrain's event files:
#  1. a short `ctrain train` run (2 ranks): TensorBoard's EventAccumulator reads back every
#     scalar of the run's metrics.jsonl, each with its step and value (the float32 of the
#     JSONL's double), and nothing else;
#  2. the fixture written by `test_metrics tensorboard_fixture` (known values), through both
#     the classic EventAccumulator and the plugin accumulator the TensorBoard UI uses.
# TensorBoard comes from /usr/bin/python3 or the venv that scripts/setup-interop.sh makes
# (build/venv-tb); the test skips where neither has it.
cd "$(dirname "$0")/../.." || exit 1
PY=
for p in /usr/bin/python3 build/venv-tb/bin/python; do
    if [ -x "$p" ] && "$p" -c "import tensorboard" 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
    echo "tensorboard not importable by /usr/bin/python3 or build/venv-tb/bin/python (bash scripts/setup-interop.sh installs it)"
    exit 77
fi
[ -x build/tests/test_metrics ] && [ -x build/ctrain ] || { echo "build/ctrain or build/tests/test_metrics not built"; exit 1; }
dir=$(mktemp -d /tmp/ct_metrics_tb_XXXXXX)
trap 'rm -rf "$dir"' EXIT

# 1. a real run: gpt on a small generated text, evaluations in between
for i in $(seq 1 80); do echo "line $i of a small text, $((i * 13 % 97)) words."; done > "$dir/text.txt"
build/ctrain run --standalone --nproc-per-node 2 build/ctrain train gpt --text "$dir/text.txt" --n-layer 1 \
    --n-embd 32 --n-head 2 --block-size 16 --batch-size 4 --steps 20 --eval-every 5 --log-every 2 --threads 1 \
    --output-dir "$dir/run" > "$dir/run.log" 2>&1 || { cat "$dir/run.log"; echo "ctrain train failed"; exit 1; }
"$PY" - "$dir/run" <<'PYEOF' || exit 1
import json, math, os, struct, sys, warnings
warnings.filterwarnings("ignore")
from tensorboard.backend.event_processing import event_accumulator
d = sys.argv[1]
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
want = {}
with open(os.path.join(d, "metrics.jsonl")) as f:
    for line in f:
        row = json.loads(line)
        for k, v in row.items():
            if k not in ("step", "time"):
                want.setdefault(k, []).append((row["step"], v))
assert {"train/loss", "train/lr", "eval/loss", "eval/accuracy"} <= set(want), sorted(want)
assert [s for s, _ in want["eval/loss"]] == [5, 10, 15, 20], want["eval/loss"]
assert len(want["train/loss"]) == 10, want["train/loss"]
events = [n for n in os.listdir(d) if n.startswith("events.out.tfevents.")]
assert len(events) == 1, events  # rank 0 alone writes metrics
ea = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0})
ea.Reload()
assert ea.file_version == 2.0, ea.file_version
assert sorted(ea.Tags()["scalars"]) == sorted(want), (ea.Tags()["scalars"], sorted(want))
n = 0
for tag, pts in want.items():
    got = [(e.step, e.value) for e in ea.Scalars(tag)]
    assert [s for s, _ in got] == [s for s, _ in pts], (tag, got, pts)
    for (s, v), (_, w) in zip(got, pts):
        ok = math.isnan(v) if w is None else v == f32(w)  # JSONL writes a non-finite value as null
        assert ok, (tag, s, v, w)
        n += 1
print("ctrain train: TensorBoard read all %d scalars of %d tags, steps and values as in metrics.jsonl" % (n, len(want)))
PYEOF

# 2. known values
CT_METRICS_KEEP="$dir/fix" build/tests/test_metrics tensorboard_fixture | grep -q '^ok' || exit 1
"$PY" - "$dir/fix" <<'PYEOF' || exit 1
import sys, struct, warnings
warnings.filterwarnings("ignore")
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
import tensorboard
d = sys.argv[1]
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
want = {
    "train/loss": [(s, 2.0 / s) for s in range(1, 51)],
    "train/lr": [(s, 0.001 * s) for s in range(1, 51)],
    "eval/accuracy": [(s, 0.5 + s / 200.0) for s in range(10, 51, 10)],
}
ea = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0})
ea.Reload()
assert ea.file_version == 2.0, ea.file_version
assert sorted(ea.Tags()["scalars"]) == sorted(want), ea.Tags()
for tag, pts in want.items():
    got = [(e.step, e.value) for e in ea.Scalars(tag)]
    assert [s for s, _ in got] == [s for s, _ in pts], (tag, got)
    for (s, v), (_, w) in zip(got, pts):
        assert v == f32(w), (tag, s, v, w)
# The UI path: simple_value converted to a scalars-plugin tensor.
pa = plugin_event_accumulator.EventAccumulator(d, size_guidance={plugin_event_accumulator.TENSORS: 0})
pa.Reload()
assert "scalars" in pa.ActivePlugins(), pa.ActivePlugins()
assert sorted(pa.Tags()["tensors"]) == sorted(want), pa.Tags()
from tensorboard.util import tensor_util
ev = pa.Tensors("eval/accuracy")
vals = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in ev]
assert [e.step for e in ev] == [10, 20, 30, 40, 50], ev
assert all(abs(a - b) < 1e-6 for a, b in zip(vals, [0.55, 0.6, 0.65, 0.7, 0.75])), vals
print("tensorboard %s read %d tags, %d points" % (tensorboard.__version__, len(want), sum(len(v) for v in want.values())))
PYEOF
