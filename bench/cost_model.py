"""Alpha-beta cost model of ctrain's collectives and DDP step, calibrated on the figures of
bench/shaped_links.sh, checked against the measurements it covers, and extrapolated to
8-256 hosts (docs/scaling.md).

    python3 bench/cost_model.py [OUT...] [--train-table] [--hosts-table]   (default bench/shaped_links.out)

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
The CPUs' floor: a collective takes at least what the same layout's processes take on the
bare veth (RATES=none, no shaping: the CPUs move the bytes as fast as they can), fitted per
layout and collective as T = a0 + b0 S. Where such runs exist, a collective on a shaped link
is predicted as the 3-norm of the two, (L^3 + F^3)^(1/3) (F the floor, L the link model's
bytes, a = 0: the a fitted on 2 x 1 runs is the per-message cost of those 2 processes' CPUs,
not a wire's (microseconds), and the layout's own a0 holds its processes' cost): on a
VM whose cores are shared by more processes than it has (4 x 1, 2 x 2 on 2 cores), a 10 Gbit/s
link does not bind and the floor does; where the two are close, neither hides the other
entirely (Zen 4, 4 x 1 all-reduce of 64 MiB at 10 Gbit/s: link 103 ms, floor 126, measured
165). The norm's order was chosen on the runs of 2026-12-05 (Zen 4 and Xeon; see
docs/scaling.md): the max (order infinity) left 16-64 MiB checks 23% off, the sum (1) and the
quadratic mean (2) overshot the rest; 3 and 4 tied on the morning's two runs, and 3 was ahead
on the runs after Gloo's event loop stopped spinning (16:35 on), behind on none. The bare
veth's own rows are then calibration, not checks.
A collective's measured time is its median call where the run recorded one (med_us), else the
mean call (us): a call of a few ms that a scheduler time slice falls into takes a slice
longer, which the mean of 40 calls kept (the same 1 MiB all-reduce at 1.8 and 3.2 ms in two
runs) and no alpha-beta model describes.

T_c: the step of the same number of ranks on one host where it was measured (MODES=base: the
contention of ranks sharing this machine's cores included), else the measured single-rank
step (1 thread) times the cores' oversubscription (ranks on the machine / its cores; 1 on a
real cluster); T_comm: the collective model above
(hier: ctrain, flat ring: PyTorch DDP on Gloo, f32); h: the part of the communication hidden
behind backward: ctrain's own measure (the median of its "N% of it hidden behind backward"
over the 2 x 2 runs of the model), PyTorch's fitted on its 2 x 2 runs (one number per model).
Sharded (ZeRO-3/FSDP style): all-gather of the parameters in forward and in backward and a
reduce-scatter of the gradients, 3 (P-1)/P G on the link, the same h (the 8-256-host table).
Measured fully sharded steps (TRAIN_MODELS=gptfsdp: ctrain --shard full, PyTorch FSDP) are
checked as T_c (the one-host run of as many ranks, its shm collectives included) plus the three
collectives' bytes on the link, every block straight to its rank: S g (P - g) / P a host,
nothing hidden (t_fsdp_exchange).
The sharded step's exchange during backward needs to know when gradients are final: the GPT's
equal blocks at an even pace, the MLP's layer by layer (READY; its largest layers finish
last).
The ordered all-reduce's hops go one direction at a time, so each finds its link's token
bucket full: the first `burst` bytes (1 ms of the rate, at least 256 KiB) go at the
machine's own rate, which at 1 Gbit/s is 2 ms of a 1 MiB call's 9 per hop.
"""
import math
import sys
from collections import defaultdict

CORES = 2  # this machine's: the emulated hosts share them
FLOOR_NORM = 3  # how the link's time and the CPUs' floor combine (see the top)
BWD = 2 / 3  # backward's part of a training step (twice forward's FLOPs)
RATES_GBIT = {"1gbit": 1, "10gbit": 10, "25gbit": 25, "none": None}
PARAMS = {"mlp": 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10}
# GPT 6 layers, width 256, context 256, vocab 256 (nanoGPT layout, bias, tied lm_head)
_E, _L, _T, _V = 256, 6, 256, 256
PARAMS["gpt"] = _V * _E + _T * _E + _L * (2 * 2 * _E + 3 * _E * _E + 3 * _E + _E * _E + _E + 2 * 4 * _E * _E + 4 * _E + _E) + 2 * _E
PARAMS["gptfsdp"] = PARAMS["gpt"]  # the same GPT fully sharded (ctrain --shard full, PyTorch FSDP)


def _mlp_ready():
    """When the MLP's gradients are final during backward: (fraction of backward, fraction of
    the bytes final from then on), layer by layer from the last: each layer's gradient is final
    when its weight gradient GEMM ends, backward's time taken as its FLOPs (dW and dX per layer,
    no dX for the first). The GPT's six equal blocks are near an even pace (None)."""
    dims = [(784, 1024), (1024, 1024), (1024, 10)]
    size = [i * o + o for i, o in dims]
    flops = [i * o * (1 if k == 0 else 2) for k, (i, o) in enumerate(dims)]
    pts, t, b = [], 0, 0
    for k in reversed(range(len(dims))):
        t += flops[k]; b += size[k]
        pts.append((t / sum(flops), b / sum(size)))
    return pts


READY = {"mlp": _mlp_ready()}


def parse(paths):
    """coll, train, bulk, and launches: (rate, layout, collective, size) -> [(least, greatest
    median call)] of the runs that launched the small sizes more than once
    (bench/shaped_links.sh since 2026-12-05 night)"""
    coll, train, bulk, launches = defaultdict(list), {}, {}, defaultdict(list)
    lines = []
    for path in paths:
        lines += open(path).read().splitlines()
    # runs (by header) that measured the ordered all-reduce under its own label: their plain
    # "allreduce" is the rail's, whatever the header's default
    labelled, r = set(), 0
    for line in lines:
        r += line.startswith("#")
        if " allreduce-ordered " in line:
            labelled.add(r)
    hier, run, shard, early = "ordered", 0, False, False
    for line in lines:
        f = line.split()
        if f and f[0] == "#":  # a run's header: "| hier rail" since the rail runs; ordered before
            hier = "rail" if "hier rail" in line else "ordered"
            shard = "shard_hier 1" in line  # the sharded step across machines (the default since 2026-12-03)
            early = "chain_early 1" in line  # its chain's chunks going on during backward (since 2026-12-05)
            run += 1
        if not f or f[0].startswith("#"):
            continue
        kv = dict(x.split("=", 1) for x in f if "=" in x)
        if f[0] == "bulk":
            bulk.setdefault(f[1], []).append(float(kv["gbit_s"]))
        elif f[0] == "coll":  # coll RATE HxR COLL BYTES us= busbw=
            c = f[3]
            if c == "allreduce" and hier == "ordered" and run not in labelled and f[2] != "1x2" and not f[2].endswith("x1"):
                c = "allreduce-ordered"  # the hier all-reduce of a run before the rail one was measured
            # the median call where the run has it (med_us, since 2026-12-05 afternoon): the
            # model's a and b describe a call, not the scheduler's slices some calls take
            coll[(f[1], f[2], c)].append((int(f[4]), float(kv.get("med_us") or kv["us"]) * 1e-6))
            if "med_lo" in kv:  # launched several times in the run: the launches' least and greatest median
                launches[(f[1], f[2], c, int(f[4]))].append((float(kv["med_lo"]) * 1e-6, float(kv["med_hi"]) * 1e-6))
        elif f[0] == "train":  # train RATE HxR IMPL MODEL rate= step_ms= ...
            v = {k: float(x) for k, x in kv.items() if x not in ("", "?")}
            v["run"] = run
            # ctrain across hosts: which hierarchical all-reduce (one host has none)
            impl = f[3] + ("-ordered" if f[3] == "ctrain" and hier == "ordered" and not f[2].startswith("1x") else "")
            if f[4] == "gptfsdp" and not f[2].startswith("1x"):
                impl = f[3] + "-fsdp"  # fully sharded on both sides: neither DDP's exchange
            elif f[3] == "ctrain" and shard and not f[2].startswith("1x"):
                # its own rows: not mixed into the medians of the overlapped all-reduce's step
                impl = "ctrain-shardhier" + ("-rail" if hier == "rail" else "") + ("-early" if early else "")
            train.setdefault((f[1], f[2], impl, f[4]), []).append(v)
    return coll, train, bulk, launches


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


def by_size(pts, spread=False):
    """(size, median time) per size; with spread, also the runs' (min, max)"""
    d = defaultdict(list)
    for s, t in pts:
        d[s].append(t)
    if spread:
        return sorted((s, median(v), min(v), max(v), len(v)) for s, v in d.items())
    return sorted((s, median(v)) for s, v in d.items())


class Model:
    def __init__(self, coll, train, launches=None):
        self.coll, self.train = coll, train
        self.launches = launches or {}  # parse()'s: each launched size's range of medians
        self.ab, self.shm = {}, None
        for rate in {k[0] for k in coll}:
            for c in ("allreduce", "allgather", "reducescatter"):
                pts = [(*terms(c, 2, s), t) for s, t in by_size(coll.get((rate, "2x1", c), []))]
                if len(pts) >= 2:
                    self.ab[(rate, c)] = fit(pts)
        self.rates = {r for r, _ in self.ab}
        self.bulk_b = {}  # s per byte of one TCP stream, one way (MODES=bulk), per link rate
        shm = [(*terms("allreduce", 2, s), t) for s, t in by_size(coll.get(("one", "1x2", "allreduce"), []))]
        self.shm = fit(shm) if len(shm) >= 2 else (0.0, 0.0)
        self.h = {}
        # the CPUs' floor per layout and collective (the bare veth's runs)
        self.floor = {}
        for (rate, lay, c), pts in coll.items():
            pts = [(1.0, s, t) for s, t in by_size(pts)]
            if rate == "none" and len(pts) >= 2:
                self.floor[(lay, c)] = fit(pts)

    def floored(self, rate, lay, c):
        """whether the floor applies to this rate's collective c on layout lay"""
        return rate != "none" and (lay, c) in self.floor

    def t_floor(self, lay, c, s):
        """the CPUs' floor of layout lay's collective c of S bytes (fitted on the bare veth)"""
        a0, b0 = self.floor[(lay, c)]
        return a0 + b0 * s

    def t_coll(self, rate, c, hosts, g, s, scheme):
        key = (f"{hosts}x{g}", "allreduce-ordered" if scheme == "hier-ordered" else c)
        if self.floored(rate, *key):
            t = self.t_link(rate, c, hosts, g, s, scheme, alpha=False)
            f = self.t_floor(*key, s)
            return (t ** FLOOR_NORM + f ** FLOOR_NORM) ** (1 / FLOOR_NORM)
        return self.t_link(rate, c, hosts, g, s, scheme)

    def t_link(self, rate, c, hosts, g, s, scheme, alpha=True):
        """alpha False: the bytes alone (where the layout's floor holds its per-message cost)"""
        a, b = self.ab[(rate, c)]
        if not alpha:
            a = 0.0
        bl = min(b, self.bulk_b.get(rate, b))  # one TCP stream one way (MODES=bulk), where measured
        if scheme == "ring":  # one ring over every rank; a host's link carries the ring's bytes
            x, y = terms(c, hosts * g, s)
            return a * x + b * y
        if scheme == "sharded":  # all-gather x 2 + reduce-scatter on the flat ring
            return self.t_gathers_scatter(rate, *terms("allgather", hosts * g, s), alpha)
        sa, sb = self.shm
        if not alpha:
            sa = 0.0
        xi, yi = terms(c, g, s) if g > 1 else (0, 0)
        if scheme == "hier-ordered":
            # leaders in a chain: host 0 to H-1 and back, S per hop, one direction at a time: a
            # one-way TCP stream, the bulk rate (where measured), not the two-way ring's b. Each
            # hop's link was idle while the others sent, so its token bucket is full: its first
            # `burst` bytes go at the machine's own rate (the bare veth's bulk), not the link's
            free = burst(rate) * max(0.0, 1 - self.bulk_b.get("none", bl) / bl)
            return 2 * (hosts - 1) * (a + bl * max(s - free, 0.0)) + sa * xi + sb * yi
        # hier: shm reduce-scatter + all-gather inside (one all-reduce's worth), leaders' ring between
        x, y = terms(c, hosts, s)
        return a * x + b * y + sa * xi + sb * yi

    def t_shard_exchange(self, rate, hosts, g, s, rail=False):
        """The sharded step's exchange across hosts of the machines' sums (S bytes per host, in
        g shares, one per local rank, each on its own connection, all sharing the host's link).
        Ordered (the default on 2 hosts): a chain in chunks of what the link carries in 4 ms
        (the probe), the finished chunks coming back while the next go on: with 2 hosts the two
        directions overlap, S b_l + c b_l + K a. From 3 hosts a machine in the middle passes
        chunk c on while chunk c+1 comes in, and receives both the running sum and the
        broadcast back (2 S on its link's way in), while the last host's broadcast (Gloo's
        binomial tree) sends the share ceil(log2 H) times: max(2, ceil(log2 H)) S b_l, plus a
        chunk per hop to fill the pipe. Rail: each share all-reduced over a ring of the hosts,
        2(H-1)/H S on the link."""
        a, b = self.ab[(rate, "allgather")]
        if rail:
            x, y = terms("allreduce", hosts, s)
            return a * x + b * y
        bl = min(b, self.bulk_b.get(rate, b))
        share = s / g
        c = min(share, max(256 << 10, min(8 << 20, 4e-3 / bl)))
        k = math.ceil(share / c)
        load = 1 if hosts == 2 else max(2, math.ceil(math.log2(hosts)))
        return load * s * bl + (hosts - 1) * c * bl + 2 * k * a

    def t_shard_early(self, rate, hosts, g, s, tx, tc, m, rail=False):
        """What is left of the chained exchange tx after backward when its chunks go on as
        backward finishes them (CTRAIN_HIER_CHAIN_EARLY, the default since 2026-12-05): the
        gradients taken as finished at an even pace over backward (BWD of the step tc), the link
        carries what backward gives it, and after backward the part it could not keep up with
        is left, and at least the last chunk's trip: H - 1 hops to the last host and its
        broadcast back (ceil(log2 H) sends), plus 2 a; never more than the chain after
        backward. On the rails (H all-reduces of each chunk) see below."""
        a, b = self.ab[(rate, "allgather")]
        bl = min(b, self.bulk_b.get(rate, b))
        c = min(s / g, max(256 << 10, min(8 << 20, 4e-3 / bl)))
        if rail:
            # K = share / c all-reduces in turn on each rail (the g rails side by side), each
            # with the ring's 2(H - 1) steps: the latency K times, the bytes once; the last
            # chunk of every rail at the end
            a, b = self.ab[(rate, "allreduce")]
            x, y = terms("allreduce", hosts, s)
            k = math.ceil(s / g / c)
            return max(left_after(k * a * x + b * y, BWD * tc, READY.get(m)), a * x + b * y * g * c / s)
        tail = (hosts - 1 + max(1, math.ceil(math.log2(hosts)))) * c * bl + 2 * a
        return min(tx, left_after(tx, BWD * tc, READY.get(m)) + tail)

    def compute(self, impl, m, procs, cores=CORES):
        # Where the same number of processes ran on one host (MODES=base), that run's step is
        # the compute: on a machine whose cores the emulated hosts share, 4 ranks on 2 cores
        # take more than twice one rank's step (memory, caches, switches), and the one-host
        # run measures it, with its local all-reduce (quiet run of 2026-12-02: MLP 46.3 ms
        # against 2 x 15.9). Otherwise the single-rank step times the oversubscription.
        same = self.train.get(("one", f"1x{procs}", impl.split("-")[0], m)) if procs > 1 else None
        if same:
            return median([v["step_ms"] for v in same]) * 1e-3
        one = self.train.get(("one", "1x1", impl.split("-")[0], m))
        if not one:
            return None
        return median([v["step_ms"] for v in one]) * 1e-3 * max(1.0, procs / cores)

    def grad_bytes(self, impl, m):
        return PARAMS[m] * (2 if impl.startswith("ctrain") else 4)

    def step_parts(self, rate, impl, m, hosts, g, scheme=None, cores=CORES):
        scheme = scheme or {"ctrain": "hier", "ctrain-ordered": "hier-ordered"}.get(impl, "ring")
        tc = self.compute(impl, m, hosts * g if cores else 1, cores or 1)
        return tc, self.t_coll(rate, "allreduce", hosts, g, self.grad_bytes(impl, m), scheme)

    def fit_overlap(self):
        for impl in ("ctrain", "ctrain-ordered", "pytorch"):
            for m in ("mlp", "gpt"):
                hid = [x["hidden_pct"] / 100 for (r, lay, i, mm), v in self.train.items() for x in v
                       if i == impl and mm == m and lay == "2x2" and "hidden_pct" in x]
                if hid:  # ctrain measures it (its "ddp: ... % of it hidden behind backward" line)
                    self.h[(impl, m)] = median(hid)
                    continue
                num = den = 0.0
                for (rate, lay, i, mm), v in self.train.items():
                    if i != impl or mm != m or rate not in self.rates or lay != "2x2":
                        continue
                    tc, tm = self.step_parts(rate, impl, m, 2, 2)
                    if tc is None:
                        continue
                    t = median([x["step_ms"] for x in v]) * 1e-3
                    # (1 - h) tm = t - tc, relative-error least squares
                    w = 1 / (t * t)
                    num += w * tm * (t - tc); den += w * tm * tm
                self.h[(impl, m)] = min(1.0, max(0.0, 1 - num / den)) if den else 0.0

    def t_fsdp_exchange(self, rate, hosts, g, s):
        """Fully sharded across hosts (ctrain --shard full, PyTorch FSDP FULL_SHARD), S bytes of
        f32 parameters: every step all-gathers them twice (forward, backward) and reduce-scatters
        the gradients, each over the flat group of all P = H g ranks, every block straight to
        its rank (Gloo's direct all-gather and all-to-all on ctrain's side): a host's link
        carries its g ranks' blocks (S / P each) to the P - g ranks elsewhere, S g (P - g) / P
        (with g = 1 the ring's (P - 1) / P S), P - 1 messages a rank. The one-host run of as many
        ranks (MODES=base) holds the same collectives on shm, so what the link adds is taken
        whole: nothing hidden."""
        p = hosts * g
        return self.t_gathers_scatter(rate, p - 1, s * g * (p - g) / p)

    def t_gathers_scatter(self, rate, x, y, alpha=True):
        """two all-gathers and a reduce-scatter of x messages and y bytes each on a host's link"""
        (aa, ba), (ar, br) = self.ab[(rate, "allgather")], self.ab[(rate, "reducescatter")]
        if not alpha:
            aa = ar = 0.0
        return 2 * (aa * x + ba * y) + ar * x + br * y

    def step(self, rate, impl, m, hosts, g, scheme=None, cores=CORES):
        if impl.endswith("-fsdp"):
            tc = self.compute(impl, m, hosts * g if cores else 1, cores or 1)
            return tc + self.t_fsdp_exchange(rate, hosts, g, 4 * PARAMS[m])
        if impl.startswith("ctrain-shardhier"):
            # the one-host step of as many ranks (MODES=base: the sharded step on shm, its waits
            # for the other ranks included) plus the exchange across hosts, after backward
            tc = self.compute("ctrain", m, hosts * g if cores else 1, cores or 1)
            tx = self.t_shard_exchange(rate, hosts, g, self.grad_bytes(impl, m), "-rail" in impl)
            if impl.endswith("early"):
                tx = self.t_shard_early(rate, hosts, g, self.grad_bytes(impl, m), tx, tc, m, "-rail" in impl)
            return tc + tx

        tc, tm = self.step_parts(rate, impl, m, hosts, g, scheme, cores)
        return tc + (1 - self.h[(impl, m)]) * tm


def burst(rate):
    """the token bucket's size at a shaped rate (tests/tools/two_hosts.sh's tc_burst: 1 ms of
    the rate, at least 256 KiB); none for the bare veth or the extrapolation's rates"""
    gbit = RATES_GBIT.get(rate)
    return max(gbit * 1e9 / 8 / 1000, 256 << 10) if gbit else 0.0


def left_after(link, tb, ready):
    """Of an exchange that takes the link `link` seconds, what is left when a backward of tb
    seconds ends, the link sending whatever is final as soon as it is: ready None, the bytes
    final at an even pace (max(link - tb, 0)); else [(fraction of backward, fraction of the
    bytes final from then on)]. A sender that keeps up has sent by tb the least over tau of
    what was final by tau plus what the link carries in tb - tau."""
    if link <= 0:
        return 0.0
    if ready is None:
        return max(link - tb, 0.0)
    sent, before = 1.0, 0.0
    for t, b in ready:
        sent = min(sent, before + (1 - t) * tb / link)
        before = b
    return (1 - max(0.0, min(1.0, sent))) * link


def pct(p, t):
    return f"{100 * (p - t) / t:+.0f}%"


def check(model, fits=True):
    worst, per_rate = 0.0, defaultdict(list)
    print("| collective | link | hosts x ranks | size | measured ms (median; runs' or launches' range) | predicted ms | error |")
    print("|---|---|---|---|---|---|---|")
    for (rate, lay, c), pts in sorted(model.coll.items()):
        if rate not in model.rates:
            continue
        h, g = map(int, lay.split("x"))
        for s, t, lo, hi, n in by_size(pts, spread=True):
            # the launches of one run spread as runs do: their medians widen the range
            for a, b in model.launches.get((rate, lay, c, s), []):
                lo, hi, n = min(lo, a), max(hi, b), n + 1
            cc, scheme = ("allreduce", "hier-ordered") if c == "allreduce-ordered" else (c, "hier" if g > 1 else "ring")
            p = model.t_coll(rate, cc, h, g, s, scheme)
            e = abs(p - t) / t
            # fits: the 2 x 1 link's, and the bare veth's rows where they fit the floor; a check
            # that the floor decides says so
            role = "fit" if lay == "2x1" or (rate == "none" and (lay, c) in model.floor) else "check"
            fk = (lay, "allreduce-ordered" if scheme == "hier-ordered" else cc)
            if role == "check" and model.floored(rate, *fk) and \
                    model.t_floor(*fk, s) > model.t_link(rate, cc, h, g, s, scheme, alpha=False):
                role = "check, floor"  # the floor is the larger of the two
            worst = max(worst, e) if role.startswith("check") else worst
            if role.startswith("check"):
                per_rate[rate].append((e, s, n > 1 and lo <= p <= hi))
            if role == "fit" and not fits:
                continue
            rng = f"; {1e3 * lo:.1f}-{1e3 * hi:.1f}" if n > 1 else ""
            print(f"| {c} ({role}) | {rate} | {lay} | {s >> 20} MiB | {1e3 * t:.1f}{rng} | {1e3 * p:.1f} | {pct(p, t)} |")
    print(f"\nworst error of the collectives' checks (4 x 1, 2 x 2): {100 * worst:.0f}%")
    for rate, es in sorted(per_rate.items(), key=lambda k: RATES_GBIT.get(k[0]) or 1e9):
        big = [e for e, s, _ in es if s >= 16 << 20]
        within = sum(e <= 0.2 for e, _, _ in es)
        # where the same measurement was repeated (runs, or launches in a run): a prediction
        # inside their own range is as close as the measurement can tell
        inside = sum(e <= 0.2 or r for e, _, r in es)
        print(f"- {rate}: {within} of {len(es)} checks within 20%; median error {100 * median([e for e, _, _ in es]):.0f}%, "
              f"16-64 MiB: median {100 * median(big):.0f}%, worst {100 * max(big):.0f}%; "
              f"within 20% or inside the runs' (launches') range: {inside} of {len(es)}")
    print()
    worst = 0.0
    n_in = n_all = 0
    print("| model | impl | link | hosts x ranks | measured step ms | predicted ms | error |")
    print("|---|---|---|---|---|---|---|")
    for (rate, lay, impl, m), v in sorted(model.train.items()):
        if lay not in ("2x2", "2x1") or rate not in model.rates or impl not in (
                "ctrain", "ctrain-ordered", "ctrain-shardhier", "ctrain-shardhier-rail", "ctrain-shardhier-early",
                "ctrain-shardhier-rail-early", "pytorch", "ctrain-fsdp", "pytorch-fsdp"):
            continue
        h, g = map(int, lay.split("x"))
        t = median([x["step_ms"] for x in v]) * 1e-3
        if model.compute(impl, m, h * g) is None:  # no single-rank run yet
            continue
        p = model.step(rate, impl, m, h, g)
        worst = max(worst, abs(p - t) / t)
        n_in += abs(p - t) / t <= 0.2
        n_all += 1
        print(f"| {m} | {impl} | {rate} | {lay} | {1e3 * t:.1f} | {1e3 * p:.1f} | {pct(p, t)} |")
    print(f"\nworst error of the step model: {100 * worst:.0f}%, {n_in} of {n_all} within 20%; hidden fraction h: " +
          ", ".join(f"{i} {m} {h:.2f}" for (i, m), h in sorted(model.h.items())))


def hosts_table(model, g=2):
    """Weak scaling on real hosts (their own cores, g ranks each): efficiency T_c / T_step.
    The link's cost per byte is the 1 Gbit/s calibration's (the only rate whose shaping binds
    on this machine: the CPUs carry 3-5 Gbit/s) scaled to the rate; each cell gives the
    efficiency with the measured a, then with a = 0 (bandwidth alone)."""
    base = {c: model.ab[("1gbit", c)] for c in ("allreduce", "allgather", "reducescatter")}
    for m in ("mlp", "gpt"):
        tc = model.compute("ctrain", m, 1, 1)
        h = model.h[("ctrain", m)]
        print(f"\n{m.upper()} ({PARAMS[m] / 1e6:.2f} M parameters, {1e3 * tc:.0f} ms single-rank step), "
              f"{g} ranks per host, h = {h:.2f}; ring and sharded f32, hier bf16; measured a / a = 0:\n")
        schemes = ("ring", "hier", "sharded", "chain", "early", "rail", "rearly")
        print("| hosts |" + "".join(f" ring {r} | hier {r} | sharded {r} | chain {r} | early {r} | rail {r} | rearly {r} |"
                                    for r in (1, 10, 25)))
        print("|---" * (1 + 3 * len(schemes)) + "|")
        for hosts in (2, 4, 8, 16, 32, 64, 128, 256):
            row = f"| {hosts} |"
            for gbit in (1, 10, 25):
                for scheme in schemes:
                    cell = []
                    shm, bulk = model.shm, model.bulk_b
                    model.bulk_b = {}  # the link's b scaled to the rate, both ways alike
                    for alpha in (True, False):
                        for c, (a, b) in base.items():
                            model.ab[("x", c)] = (a if alpha else 0.0, b / gbit)
                        model.shm = shm if alpha else (0.0, shm[1])
                        if scheme in ("chain", "early", "rail", "rearly"):  # the sharded step across hosts, bf16
                            rail = scheme.startswith("r")
                            t = model.t_shard_exchange("x", hosts, g, PARAMS[m] * 2, rail)
                            if scheme.endswith("early"):  # during backward (CTRAIN_HIER_CHAIN_EARLY)
                                t = model.t_shard_early("x", hosts, g, PARAMS[m] * 2, t, tc, m, rail)
                            t += tc
                        else:
                            tm = model.t_coll("x", "allreduce", hosts, g, PARAMS[m] * (2 if scheme == "hier" else 4), scheme)
                            t = tc + (1 - h) * tm
                        cell.append(f"{100 * tc / t:.0f}")
                    model.bulk_b = bulk
                    model.shm = shm
                    row += f" {cell[0]} / {cell[1]}% |"
            print(row)


def train_table(train):
    """ctrain vs PyTorch per link and layout: each run's rate (global, in order) and the ratio
    within each run; efficiency (H x 1 only): the rate over H single-rank runs' (scaling)."""
    def rates(key):
        return [v["rate"] for v in train.get(key, []) if "rate" in v]
    print("| link | hosts x ranks | model | ctrain | PyTorch DDP | ctrain / PyTorch, same run | "
          "efficiency ctrain | efficiency PyTorch |")
    print("|---|---|---|---|---|---|---|---|")
    # ctrain's variants, labelled: DDP's overlapped all-reduce on the rails or ordered, and the
    # sharded optimizer step across hosts (the default since 2026-12-03), ordered or on the rails
    variants = (("ctrain", "rail"), ("ctrain-ordered", "ordered"), ("ctrain-shardhier", "sharded step"),
                ("ctrain-shardhier-rail", "sharded step, rails"), ("ctrain-shardhier-early", "sharded step, early"),
                ("ctrain-shardhier-rail-early", "sharded step, rails, early"))
    for rate in ("1gbit", "10gbit", "25gbit", "none"):
        for lay in ("2x2", "2x1"):
            for m in ("mlp", "gpt"):
                t = rates((rate, lay, "pytorch", m))
                mine = [(impl, label, rates((rate, lay, impl, m))) for impl, label in variants]
                mine = [x for x in mine if x[2]]
                if not t or not mine:
                    continue
                h, g = map(int, lay.split("x"))
                eff = []
                for impl, r in (("ctrain", mine[0][2]), ("pytorch", t)):
                    # H x 1 only: H x g on 2 cores has no load-free reference (see docs/multinode.md)
                    ref = [h * x for x in rates(("one", "1x1", impl, m))] if g == 1 else []
                    eff.append(f"{median(r) / median(ref):.2f}" if ref else "-")
                cs = "; ".join(" / ".join(f"{x:.0f}" for x in r) + " " + label for _, label, r in mine)
                # ctrain / PyTorch of the same run (ctrain's run, then PyTorch's, as the script does)
                same = []
                for impl, label, _ in mine:
                    for cv in train.get((rate, lay, impl, m), []):
                        tv = [x["rate"] for x in train[(rate, lay, "pytorch", m)] if x["run"] == cv["run"]]
                        if tv and "rate" in cv:
                            same.append(f"{cv['rate'] / tv[0]:.2f}" + ("" if label == "rail" else f" {label}"))
                print(f"| {rate} | {lay} | {m} | {cs} | {' / '.join(f'{x:.0f}' for x in t)} | "
                      f"{'; '.join(same)} | {eff[0]} | {eff[1]} |")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    coll, train, bulk, launches = parse(args or ["bench/shaped_links.out"])
    model = Model(coll, train, launches)
    model.bulk_b = {r: 8 / (median(v) * 1e9) for r, v in bulk.items() if r in model.rates}
    print("| link | bulk TCP Gbit/s (median) | collective | a (us per step) | 1/b (Gbit/s on a host's link) |")
    print("|---|---|---|---|---|")
    for rate, c in sorted(model.ab, key=lambda k: (RATES_GBIT.get(k[0]) or 1e9, k[1])):
        a, b = model.ab[(rate, c)]
        bk = median(bulk[rate]) if rate in bulk else float("nan")
        print(f"| {rate} | {bk:.2f} | {c} | {1e6 * a:.0f} | {8 / b / 1e9:.2f} |")
    sa, sb = model.shm
    print(f"shm (one host): a {1e6 * sa:.0f} us, 1/b {8 / sb / 1e9 if sb else math.inf:.1f} Gbit/s")
    if model.floor:
        print("the CPUs' floor (bare veth, T = a0 + b0 S, S the whole buffer): " +
              "; ".join(f"{lay} {c} {1e6 * a:.0f} us + S / {8 / b / 1e9:.2f} Gbit/s" for (lay, c), (a, b) in sorted(model.floor.items())))
    print()
    model.fit_overlap()
    check(model, fits="--no-fits" not in sys.argv)
    if "--train-table" in sys.argv:
        train_table(train)
    if "--hosts-table" in sys.argv:
        hosts_table(model)


if __name__ == "__main__":
    main()
