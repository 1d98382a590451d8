"""Report figures (matplotlib, Agg): τ per benchmark and system, acceptance per slot, TPS vs concurrency."""

from __future__ import annotations

from collections import defaultdict

from lilicorr.platform.evaluate.tables import NO_TAU, _mean, _order


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def tau_by_benchmark(records: list[dict]):
    """Grouped bars: τ (T = 0, c = 1, mean over seeds) per benchmark, one bar per speculative system."""
    rs = [r for r in records if r["system"] not in NO_TAU and r["concurrency"] == 1 and "tau" in r["metrics"]]
    if not rs:
        return None
    plt = _figure()
    temps = sorted({r["temperature"] for r in rs})
    benches = sorted({r["benchmark"] for r in rs})
    systems = _order(r["system"] for r in rs)
    fig, axes = plt.subplots(1, len(temps), figsize=(max(5, 1.6 * len(benches) * len(temps)), 3.6), squeeze=False)
    width = 0.8 / len(systems)
    for ax, temp in zip(axes[0], temps):
        for i, s in enumerate(systems):
            ys = [_mean([r["metrics"]["tau"] for r in rs if r["system"] == s and r["benchmark"] == b
                         and r["temperature"] == temp]) for b in benches]
            ax.bar([j + i * width for j in range(len(benches))], ys, width, label=s)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(benches))], benches)
        ax.set_ylabel("τ (accepted tokens / block)")
        ax.set_title(f"T = {temp:g}")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def acceptance_per_slot(records: list[dict]):
    """Per-slot acceptance rate (T = 0, c = 1, pooled over benchmarks), one line per system."""
    curves = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["concurrency"] != 1 or r["temperature"] != min(x["temperature"] for x in records):
            continue
        for k, v in r["metrics"].items():
            if k.startswith("slot_acceptance."):
                curves[r["system"]][int(k.split(".")[1])].append(v)
    if not curves:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for s in _order(curves):
        slots = sorted(curves[s])
        ax.plot(slots, [_mean(curves[s][k]) for k in slots], marker="o", label=s)
    ax.set_xticks(sorted({k for c in curves.values() for k in c}))
    ax.set_xlabel("slot (depth in the block)")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def throughput_vs_concurrency(records: list[dict]):
    """Output tokens/s against concurrency (T = 0, mean over benchmarks), one line per system."""
    rs = [r for r in records if r["temperature"] == 0]
    if len({r["concurrency"] for r in rs}) < 2:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for s in _order(r["system"] for r in rs):
        cs = sorted({r["concurrency"] for r in rs if r["system"] == s})
        ax.plot(cs, [_mean([r["metrics"]["tokens_per_s"] for r in rs if r["system"] == s and r["concurrency"] == c])
                     for c in cs], marker="o", label=s)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("tokens / s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


PLOTS = {"tau_by_benchmark": tau_by_benchmark, "acceptance_per_slot": acceptance_per_slot,
         "throughput_vs_concurrency": throughput_vs_concurrency}
