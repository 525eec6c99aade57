"""Alpha-beta cost model of ctrain's collectives and DDP step, calibrated on the figures of
bench/shaped_links.sh, checked against the measurements it covers, and extrapolated to
8-256 hosts (docs/scaling.md).

    python3 bench/cost_model.py [bench/shaped_links.out] [--hosts-table]

Collectives (p ranks in a ring, S bytes: the whole buffer), per link rate:
    all-reduce      T = 2(p-1) a + 2(p-1)/p S b
    all-gather      T =  (p-1) a +  (p-1)/p S b        (reduce-scatter the same)
a (s per step) and b (s per byte on a host's link) are fitted by least squares on the
2-host x 1-rank measurements of all three collectives (relative error weighted), then
predict the 4-host x 1-rank ones and the 2 x 2 hierarchical all-reduce (shm inside each
host, a 2-leader ring between: the link term of H leaders; the shm term from the one-host
2-rank shm all-reduce, fitted the same way).

Training step, H hosts x g ranks, gradient bytes G (f32 params x 4, or x 2 with bf16
compression):
    T_step = T_c + (1 - h) T_comm
T_c: the measured single-rank step (1 thread), times the cores' oversubscription of the run
(ranks on the machine / its cores; 1 on a real cluster); T_comm: the collective model above
(hier: ctrain, flat ring: PyTorch DDP on Gloo, f32); h: the part of the communication hidden
behind backward, one value per implementation and model fitted on the 2 x 2 runs of every rate.
Sharded (ZeRO-3/FSDP style): all-gather of the parameters in forward and in backward and a
reduce-scatter of the gradients, 3 (P-1)/P G on the link, the same h.
"""
import math
import sys
from collections import defaultdict

CORES = 2  # this machine's: the emulated hosts share them
RATES_GBIT = {"1gbit": 1, "10gbit": 10, "25gbit": 25, "none": None}
PARAMS = {"mlp": 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10}
# GPT 6 layers, width 256, context 256, vocab 256 (nanoGPT layout, bias, tied lm_head)
_E, _L, _T, _V = 256, 6, 256, 256
PARAMS["gpt"] = _V * _E + _T * _E + _L * (2 * 2 * _E + 3 * _E * _E + 3 * _E + _E * _E + _E + 2 * 4 * _E * _E + 4 * _E + _E) + 2 * _E


def parse(path):
    coll, train, bulk = defaultdict(list), {}, {}
    for line in open(path):
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        kv = dict(x.split("=", 1) for x in f if "=" in x)
        if f[0] == "bulk":
            bulk.setdefault(f[1], []).append(float(kv["gbit_s"]))
        elif f[0] == "coll":  # coll RATE HxR COLL BYTES us= busbw=
            coll[(f[1], f[2], f[3])].append((int(f[4]), float(kv["us"]) * 1e-6))
        elif f[0] == "train":  # train RATE HxR IMPL MODEL rate= step_ms= ...
            v = {k: float(x) for k, x in kv.items() if x not in ("", "?")}
            train.setdefault((f[1], f[2], f[3], f[4]), []).append(v)
    return coll, train, bulk


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def terms(c, p, s):
    """(latency steps, bytes per link) of collective c on a p-rank ring of S bytes."""
    if c == "allreduce":
        return 2 * (p - 1), 2 * (p - 1) / p * s
    return p - 1, (p - 1) / p * s


def fit(points):
    """least squares of T = a x + b y, relative errors: points (x, y, T)"""
    sxx = sxy = syy = sxt = syt = 0.0
    for x, y, t in points:
        w = 1.0 / (t * t)
        sxx += w * x * x; sxy += w * x * y; syy += w * y * y; sxt += w * x * t; syt += w * y * t
    det = sxx * syy - sxy * sxy
    a, b = (sxt * syy - syt * sxy) / det, (syt * sxx - sxt * sxy) / det
    if a < 0:  # latency below resolution: bandwidth alone
        a, b = 0.0, syt / syy
    return a, b


def by_size(pts):
    d = defaultdict(list)
    for s, t in pts:
        d[s].append(t)
    return sorted((s, median(v)) for s, v in d.items())


class Model:
    def __init__(self, coll, train):
        self.coll, self.train = coll, train
        self.ab, self.shm = {}, None
        for rate in {k[0] for k in coll}:
            pts = []
            for c in ("allreduce", "allgather", "reducescatter"):
                for s, t in by_size(coll.get((rate, "2x1", c), [])):
                    pts.append((*terms(c, 2, s), t))
            if len(pts) >= 2:
                self.ab[rate] = fit(pts)
        shm = [(*terms("allreduce", 2, s), t) for s, t in by_size(coll.get(("one", "1x2", "allreduce"), []))]
        self.shm = fit(shm) if len(shm) >= 2 else (0.0, 0.0)
        self.h = {}

    def t_coll(self, rate, c, hosts, g, s, scheme):
        a, b = self.ab[rate]
        if scheme == "ring":  # one ring over every rank; a host's link carries the ring's bytes
            x, y = terms(c, hosts * g, s)
            return a * x + b * y
        if scheme == "sharded":  # all-gather x 2 + reduce-scatter on the flat ring
            x, y = terms("allgather", hosts * g, s)
            return 3 * (a * x + b * y)
        # hier: shm reduce-scatter + all-gather inside (one all-reduce's worth), leaders' ring between
        x, y = terms(c, hosts, s)
        sa, sb = self.shm
        xi, yi = terms(c, g, s) if g > 1 else (0, 0)
        return a * x + b * y + sa * xi + sb * yi

    def compute(self, impl, m, procs, cores=CORES):
        one = self.train.get(("one", "1x1", impl, m))
        if not one:
            return None
        return median([v["step_ms"] for v in one]) * 1e-3 * max(1.0, procs / cores)

    def grad_bytes(self, impl, m):
        return PARAMS[m] * (2 if impl == "ctrain" else 4)

    def step_parts(self, rate, impl, m, hosts, g, scheme=None, cores=CORES):
        scheme = scheme or ("hier" if impl == "ctrain" else "ring")
        tc = self.compute(impl, m, hosts * g if cores else 1, cores or 1)
        return tc, self.t_coll(rate, "allreduce", hosts, g, self.grad_bytes(impl, m), scheme)

    def fit_overlap(self):
        for impl in ("ctrain", "pytorch"):
            for m in ("mlp", "gpt"):
                num = den = 0.0
                for (rate, lay, i, mm), v in self.train.items():
                    if i != impl or mm != m or rate not in self.ab or lay != "2x2":
                        continue
                    tc, tm = self.step_parts(rate, impl, m, 2, 2)
                    if tc is None:
                        continue
                    t = median([x["step_ms"] for x in v]) * 1e-3
                    # (1 - h) tm = t - tc, relative-error least squares
                    w = 1 / (t * t)
                    num += w * tm * (t - tc); den += w * tm * tm
                self.h[(impl, m)] = min(1.0, max(0.0, 1 - num / den)) if den else 0.0

    def step(self, rate, impl, m, hosts, g, scheme=None, cores=CORES):
        tc, tm = self.step_parts(rate, impl, m, hosts, g, scheme, cores)
        return tc + (1 - self.h[(impl, m)]) * tm


def pct(p, t):
    return f"{100 * (p - t) / t:+.0f}%"


def check(model):
    rows, worst = [], 0.0
    print("| collective | link | hosts x ranks | size | measured ms | predicted ms | error |")
    print("|---|---|---|---|---|---|---|")
    for (rate, lay, c), pts in sorted(model.coll.items()):
        if rate not in model.ab:
            continue
        h, g = map(int, lay.split("x"))
        for s, t in by_size(pts):
            p = model.t_coll(rate, c, h, g, s, "hier" if g > 1 else "ring")
            e = abs(p - t) / t
            role = "fit" if lay == "2x1" else "check"
            worst = max(worst, e) if role == "check" else worst
            print(f"| {c} ({role}) | {rate} | {lay} | {s >> 20} MiB | {1e3 * t:.1f} | {1e3 * p:.1f} | {pct(p, t)} |")
    print(f"\nworst error of the collectives' checks (4 x 1, 2 x 2): {100 * worst:.0f}%\n")
    worst = 0.0
    print("| model | impl | link | measured step ms | predicted ms | error |")
    print("|---|---|---|---|---|---|")
    for (rate, lay, impl, m), v in sorted(model.train.items()):
        if lay != "2x2" or rate not in model.ab:
            continue
        t = median([x["step_ms"] for x in v]) * 1e-3
        p = model.step(rate, impl, m, 2, 2)
        worst = max(worst, abs(p - t) / t)
        print(f"| {m} | {impl} | {rate} | {1e3 * t:.1f} | {1e3 * p:.1f} | {pct(p, t)} |")
    print(f"\nworst error of the step model: {100 * worst:.0f}%; hidden fraction h: " +
          ", ".join(f"{i} {m} {h:.2f}" for (i, m), h in sorted(model.h.items())))


def hosts_table(model, g=2):
    """weak scaling, real hosts (their own cores), g ranks each: efficiency T_c / T_step"""
    for m in ("mlp", "gpt"):
        print(f"\n{m.upper()} ({PARAMS[m] / 1e6:.2f} M parameters), {g} ranks per host, "
              "efficiency = compute / step (ring and sharded f32, hier bf16):\n")
        head = "| hosts |"
        for rate in ("1gbit", "10gbit", "25gbit"):
            head += f" ring {rate} | hier {rate} | sharded {rate} |"
        print(head)
        print("|---" * (1 + 9) + "|")
        for hosts in (2, 8, 16, 32, 64, 128, 256):
            row = f"| {hosts} |"
            for rate in ("1gbit", "10gbit", "25gbit"):
                if rate not in model.ab:
                    row += " - | - | - |"
                    continue
                for scheme, impl in (("ring", "pytorch"), ("hier", "ctrain"), ("sharded", "pytorch")):
                    tc, tm = model.step_parts(rate, "ctrain", m, hosts, g, scheme, cores=None)
                    tm = model.t_coll(rate, "allreduce", hosts, g, PARAMS[m] * (2 if scheme == "hier" else 4), scheme)
                    h = model.h[("ctrain", m)]
                    row += f" {100 * tc / (tc + (1 - h) * tm):.0f}% |"
            print(row)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    coll, train, bulk = parse(args[0] if args else "bench/shaped_links.out")
    model = Model(coll, train)
    print("link | bulk TCP Gbit/s (median) | a (us per step) | 1/b (Gbit/s on a host's link)")
    for rate in sorted(model.ab, key=lambda r: RATES_GBIT.get(r) or 1e9):
        a, b = model.ab[rate]
        bk = median(bulk[rate]) if rate in bulk else float("nan")
        print(f"{rate} | {bk:.2f} | {1e6 * a:.0f} | {8 / b / 1e9:.2f}")
    sa, sb = model.shm
    print(f"shm (one host): a {1e6 * sa:.0f} us, 1/b {8 / sb / 1e9 if sb else math.inf:.1f} Gbit/s\n")
    model.fit_overlap()
    check(model)
    if "--hosts-table" in sys.argv:
        hosts_table(model)


if __name__ == "__main__":
    main()
