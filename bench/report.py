"""Formats bench/run.sh's RESULT lines as the Markdown tables of docs/benchmarks.md.
    python3 bench/report.py build/bench/results.txt
Best rate over repetitions (and, for PyTorch, over its OMP_WAIT_POLICY settings); peak
memory = largest seen for that configuration. Every rate is also given as a fraction of the
machine's arithmetic peak measured in the same run: ctrain's GEMM at 1024^3 on as many
threads (DDP: per rank, of the 1-thread peak)."""
import sys


# gpt: explicit attention on both sides; gptf: ctrain's fused attention (the built-in GPT's
# default) against PyTorch's F.scaled_dot_product_attention
MODELS = (("mlp", "samples/s"), ("gpt", "tokens/s"), ("gptf", "tokens/s"), ("cnn", "samples/s"), ("llama", "tokens/s"),
          ("llama_bf16", "tokens/s"))
LABEL = {"gptf": "GPT fused attention", "llama": "Llama GQA 8/2 heads", "llama_bf16": "Llama GQA, bf16 autocast"}


def parse(path):
    rows, machine = [], {}
    for ln in open(path):
        if ln.startswith("MACHINE "):
            import shlex
            for kv in shlex.split(ln)[1:]:
                k, _, v = kv.partition("=")
                machine[k] = v
        if not ln.startswith("RESULT "):
            continue
        d = {}
        for kv in ln.split()[1:]:
            if "=" in kv:
                k, v = kv.split("=", 1)
                d[k] = v.strip('"')
        rows.append(d)
    return rows, machine


def main():
    rows, machine = parse(sys.argv[1])
    peak = {int(r["threads"]): float(r["gflops"]) for r in rows if r.get("model") == "sgemm" and r["impl"] == "ctrain"}
    blas = {int(r["threads"]): float(r["gflops"]) for r in rows if r.get("model") == "sgemm" and r["impl"] == "openblas"}

    best = {}  # (impl, model, threads, ranks) -> [rate, peak_mb, flops, hidden, version]
    for r in rows:
        if r.get("model") == "sgemm" or "rate" not in r:
            continue
        impl = r["impl"] if r.get("ref") != "debian" else "debian"
        key = (impl, r["model"], int(r["threads"]), int(r["ranks"]))
        rate, mb = float(r["rate"]), float(r["peak_rss_mb"])
        old = best.get(key)
        if old is None:
            best[key] = [rate, mb, float(r["flops_per_step"]), float(r.get("hidden_frac", "nan")), r.get("torch", ""),
                         r.get("ddp", "")]
        else:
            if rate > old[0]:
                old[0], old[3], old[5] = rate, float(r.get("hidden_frac", "nan")), r.get("ddp", "")
            old[1] = max(old[1], mb)
    ver = lambda impl: next((v[4] for k, v in best.items() if k[0] == impl and v[4]), "?")
    has_deb = any(k[0] == "debian" for k in best)
    items = lambda model: 8 * 256 if model in ("gpt", "gptf", "llama", "llama_bf16") else 128

    def frac(v, model, threads):
        if not v or peak.get(threads, 0) <= 0:
            return "–"
        gf = v[0] / items(model) * v[2] / 1e9
        return f"{100 * gf / peak[threads]:.0f}% ({gf:.0f} GF/s)"

    f = lambda v: f"{v[0]:,.0f}" if v else "–"
    ratio = lambda a, b: f"{a[0] / b[0]:.2f}×" if a and b else "–"
    mb = lambda v: f"{v[1]:,.0f}" if v else "–"
    mratio = lambda a, b: f"{a[1] / b[1]:.2f}×" if a and b else "–"
    pt = f"PyTorch {ver('pytorch')}"
    deb = f"PyTorch {ver('debian')} (Debian)"

    print(f"Machine: {machine.get('cpu', '?')}, CPU family {machine.get('family', '?')} model {machine.get('model', '?')}, "
          f"{machine.get('cores', '?')} cores; load average at the start {machine.get('load', '?')}; {machine.get('date', '')}. "
          f"Reference: {pt}" + (f"; second column {deb}" if has_deb else "") + ".\n")
    print(f"Arithmetic peak of this run (ctrain's GEMM, 1024³): {peak.get(1, 0):.1f} GFLOP/s on 1 thread, "
          f"{peak.get(2, 0):.1f} on 2 (OpenBLAS sgemm: {blas.get(1, 0):.1f} / {blas.get(2, 0):.1f}). "
          "\"% peak\" = model FLOPs per second / that peak at the same thread count.\n")
    print(f"### Single process, fp32 — ctrain vs {pt}\n")
    hdr = f"| model (unit) | threads | ctrain | {pt} | ratio |"
    sep = "|---|---|---|---|---|"
    if has_deb:
        hdr += f" {deb} | ratio |"
        sep += "---|---|"
    hdr += " ctrain % peak | PyTorch % peak | ctrain peak MB | PyTorch peak MB | memory ratio |"
    sep += "---|---|---|---|---|"
    print(hdr)
    print(sep)
    for model, unit in MODELS:
        for t in (1, 2):
            c = best.get(("ctrain", model, t, 1))
            if not c:
                continue
            p = best.get(("pytorch", model, t, 1))
            line = f"| {LABEL.get(model, model.upper())} ({unit}) | {t} | {f(c)} | {f(p)} | {ratio(c, p)} |"
            if has_deb:
                d = best.get(("debian", model, t, 1))
                line += f" {f(d)} | {ratio(c, d)} |"
            line += f" {frac(c, model, t)} | {frac(p, model, t)} | {mb(c)} | {mb(p)} | {mratio(c, p)} |"
            print(line)
    print(f"\n### DDP: 2 ranks × 1 thread (ctrain shm backend vs {pt} DDP gloo), per rank\n")
    print(f"| model (unit) | ctrain / rank | {pt} / rank | ratio | ctrain % peak | PyTorch % peak | ctrain peak MB / rank | "
          "PyTorch peak MB / rank | memory ratio | ctrain scaling eff. | PyTorch scaling eff. | ctrain gradient averaging |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model, unit in MODELS:
        c = best.get(("ctrain", model, 1, 2))
        if not c:
            continue
        p = best.get(("pytorch", model, 1, 2))
        c1, p1 = best.get(("ctrain", model, 1, 1)), best.get(("pytorch", model, 1, 1))
        eff = lambda a, b: f"{a[0] / b[0]:.2f}" if a and b else "–"
        hid = ("in the sharded optimizer step" if c[5] == "sharded_step"
               else f"all-reduce, {100 * c[3]:.0f}% hidden" if c[3] == c[3] else "–")
        print(f"| {LABEL.get(model, model.upper())} ({unit}) | {f(c)} | {f(p)} | {ratio(c, p)} | {frac(c, model, 1)} | {frac(p, model, 1)} | "
              f"{mb(c)} | {mb(p)} | {mratio(c, p)} | {eff(c, c1)} | {eff(p, p1)} | {hid} |")
    print("\nScaling efficiency = per-rank throughput at 2 ranks × 1 thread / throughput of 1 rank × 1 thread "
          "(the single-process 1-thread row of the same implementation).")


if __name__ == "__main__":
    main()
