#!/usr/bin/env bash
# TensorBoard itself reads ctrain's event file: tags, steps and values of the fixture written by
# `test_metrics tensorboard_fixture`, through both the classic EventAccumulator and the
# plugin accumulator the TensorBoard UI uses. Skips where TensorBoard is not installed
# (/usr/bin/python3 or a throwaway venv at /tmp/tbvenv:
#   /usr/bin/python3 -m venv /tmp/tbvenv && /tmp/tbvenv/bin/pip install tensorboard).
cd "$(dirname "$0")/../.." || exit 1
PY=
for p in /usr/bin/python3 /tmp/tbvenv/bin/python; do
    if [ -x "$p" ] && "$p" -c "import tensorboard" 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then echo "tensorboard not importable by /usr/bin/python3 or /tmp/tbvenv/bin/python"; exit 77; fi
[ -x ${CT_BUILD:-build}/tests/test_metrics ] || { echo "${CT_BUILD:-build}/tests/test_metrics not built"; exit 1; }
dir=$(mktemp -d /tmp/ct_metrics_tb_XXXXXX)
trap 'rm -rf "$dir"' EXIT
CT_METRICS_KEEP="$dir" ${CT_BUILD:-build}/tests/test_metrics tensorboard_fixture | grep -q '^ok' || exit 1
"$PY" - "$dir" <<'PYEOF' || exit 1
import sys, math, warnings
warnings.filterwarnings("ignore")
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
import tensorboard
d = sys.argv[1]
f32 = lambda x: __import__("struct").unpack("f", __import__("struct").pack("f", x))[0]
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
