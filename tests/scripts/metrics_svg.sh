#!/usr/bin/env bash
# The chart of a short `ctrain train` run (training.svg) is well-formed XML (Python's
# xml.etree parses it), an <svg> document with one series per metric of metrics.jsonl: a
# group titled with the tag whose line has one vertex per recorded point, drawn higher for
# larger values.
cd "$(dirname "$0")/../.." || exit 1
PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "no python3 to parse the SVG with"; exit 77; }
[ -x build/ctrain ] || { echo "build/ctrain not built"; exit 1; }
dir=$(mktemp -d /tmp/ct_metrics_svg_XXXXXX)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 1 80); do echo "line $i of a small text, $((i * 13 % 97)) words."; done > "$dir/text.txt"
build/ctrain train gpt --text "$dir/text.txt" --n-layer 1 --n-embd 32 --n-head 2 --block-size 16 --batch-size 4 \
    --steps 30 --eval-every 10 --log-every 3 --threads 1 --output-dir "$dir/run" > "$dir/run.log" 2>&1 \
    || { cat "$dir/run.log"; echo "ctrain train failed"; exit 1; }
"$PY" - "$dir/run" <<'PYEOF' || exit 1
import json, os, sys
import xml.etree.ElementTree as ET
d = sys.argv[1]
want = {}
with open(os.path.join(d, "metrics.jsonl")) as f:
    for line in f:
        row = json.loads(line)
        for k, v in row.items():
            if k not in ("step", "time"):
                want.setdefault(k, []).append((row["step"], v))
assert len(want) >= 6 and all(v is not None for pts in want.values() for _, v in pts), want
S = "{http://www.w3.org/2000/svg}"
root = ET.parse(os.path.join(d, "training.svg")).getroot()  # raises on malformed XML
assert root.tag == S + "svg", root.tag
series = {}
for g in root.iter(S + "g"):
    t = g.find(S + "title")
    if t is None:
        continue
    assert t.text not in series, "two series for " + t.text
    series[t.text] = g
assert sorted(series) == sorted(want), (sorted(series), sorted(want))
for tag, g in series.items():
    lines = g.findall(S + "polyline")
    assert len(lines) == 1, (tag, len(lines))
    xy = [tuple(map(float, p.split(","))) for p in lines[0].get("points").split()]
    pts = sorted(want[tag])
    assert len(xy) == len(pts), (tag, len(xy), len(pts))
    # x grows with the step; y (downwards in SVG) falls as the value rises, to the 0.1 px
    # the file is written with
    for (x0, y0), (x1, y1), (s0, v0), (s1, v1) in zip(xy, xy[1:], pts, pts[1:]):
        assert x1 > x0, (tag, s0, s1, x0, x1)
        if v1 > v0: assert y1 <= y0 + 0.1, (tag, s0, s1, v0, v1, y0, y1)
        if v1 < v0: assert y1 >= y0 - 0.1, (tag, s0, s1, v0, v1, y0, y1)
print("training.svg: valid XML, %d series (one per metric), %d points" % (len(series), sum(len(v) for v in want.values())))
PYEOF
