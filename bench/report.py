"""Formats bench/run.sh's RESULT lines as the Markdown tables of docs/benchmarks.md.
    python3 bench/report.py build/bench/results.txt
Best rate over repetitions; peak memory = largest seen for that configuration."""
import sys


def parse(path):
    rows = []
    for ln in open(path):
        if not ln.startswith("RESULT "):
            continue
        d = {}
        for kv in ln.split()[1:]:
            if "=" in kv:
                k, v = kv.split("=", 1)
                d[k] = v
        rows.append(d)
    return rows


def main():
    rows = parse(sys.argv[1])
    gemm = {int(r["threads"]): float(r["gflops"]) for r in rows if r.get("model") == "sgemm" and r["impl"] == "openblas"}
    own = {int(r["threads"]): float(r["gflops"]) for r in rows if r.get("model") == "sgemm" and r["impl"] == "ctrain"}

    best = {}  # (impl, wait, model, threads, ranks) -> (rate, peak, flops, hidden)
    for r in rows:
        if r.get("model") == "sgemm" or "rate" not in r:
            continue
        key = (r["impl"], r.get("omp_wait", "-"), r["model"], int(r["threads"]), int(r["ranks"]))
        rate, peak = float(r["rate"]), float(r["peak_rss_mb"])
        hid = float(r.get("hidden_frac", "nan"))
        old = best.get(key)
        if old is None:
            best[key] = [rate, peak, float(r["flops_per_step"]), hid, r.get("unit", "")]
        else:
            if rate > old[0]:
                old[0], old[3] = rate, hid
            old[1] = max(old[1], peak)

    def get(impl, model, threads, ranks, wait=None):
        if impl == "ctrain":
            return best.get(("ctrain", "-", model, threads, ranks))
        if wait:
            return best.get(("pytorch", wait, model, threads, ranks))
        c = [v for k, v in best.items() if k[0] == "pytorch" and k[2:] == (model, threads, ranks)]
        return max(c, key=lambda v: v[0]) if c else None

    def items_per_step(model):
        return 8 * 256 if model == "gpt" else 128

    def frac(v, model, threads, ceiling):
        if not v or ceiling.get(threads, 0) <= 0:
            return "–"
        gf = v[0] / items_per_step(model) * v[2] / 1e9
        return f"{100 * gf / ceiling[threads]:.0f}% ({gf:.0f} GF/s)"

    f = lambda v: f"{v[0]:,.0f}" if v else "–"
    ratio = lambda a, b: f"{a[0] / b[0]:.2f}×" if a and b else "–"
    mratio = lambda a, b: f"{a[1] / b[1]:.2f}×" if a and b else "–"
    mb = lambda v: f"{v[1]:,.0f}" if v else "–"

    print(f"GEMM ceilings, sgemm 1024³ measured in this run: OpenBLAS (what PyTorch calls) {gemm.get(1, 0):.1f} GFLOP/s "
          f"on 1 thread, {gemm.get(2, 0):.1f} on 2; ctrain's own GEMM {own.get(1, 0):.1f} on 1 thread, {own.get(2, 0):.1f} on 2. "
          "Each library's fraction below is of its own GEMM's ceiling at that thread count.\n")
    print("### Core engine: single process, fp32\n")
    print("| model (unit) | threads | ctrain | PyTorch default | PyTorch passive | ctrain / PyTorch best | ctrain peak MB | PyTorch peak MB | memory ratio | ctrain GEMM ceiling | PyTorch GEMM ceiling |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model, unit in (("mlp", "samples/s"), ("gpt", "tokens/s"), ("cnn", "samples/s")):
        for t in (1, 2):
            c = get("ctrain", model, t, 1)
            if not c:
                continue
            pd, pp, pb = get("pytorch", model, t, 1, "default"), get("pytorch", model, t, 1, "passive"), get("pytorch", model, t, 1)
            print(f"| {model.upper()} ({unit}) | {t} | {f(c)} | {f(pd)} | {f(pp)} | {ratio(c, pb)} | {mb(c)} | {mb(pb)} | {mratio(c, pb)} | {frac(c, model, t, own)} | {frac(pb, model, t, gemm)} |")
    print("\n### DDP: 2 ranks × 1 thread (ctrain shm backend vs PyTorch DDP gloo), per rank\n")
    print("| model (unit) | ctrain / rank | PyTorch / rank | ratio | ctrain peak MB / rank | PyTorch peak MB / rank | memory ratio | ctrain scaling eff. | PyTorch scaling eff. | all-reduce hidden behind backward (ctrain) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model, unit in (("mlp", "samples/s"), ("gpt", "tokens/s"), ("cnn", "samples/s")):
        c = get("ctrain", model, 1, 2)
        if not c:
            continue
        p = get("pytorch", model, 1, 2)
        c1, p1 = get("ctrain", model, 1, 1), get("pytorch", model, 1, 1)
        eff = lambda a, b: f"{a[0] / b[0]:.2f}" if a and b else "–"
        hid = f"{100 * c[3]:.0f}%" if c[3] == c[3] else "–"
        print(f"| {model.upper()} ({unit}) | {f(c)} | {f(p)} | {ratio(c, p)} | {mb(c)} | {mb(p)} | {mratio(c, p)} | {eff(c, c1)} | {eff(p, p1)} | {hid} |")
    print("\nScaling efficiency = per-rank throughput at 2 ranks × 1 thread / throughput of 1 rank × 1 thread "
          "(the single-process 1-thread row of the same implementation).")


if __name__ == "__main__":
    main()
