"""The paper's tables from evaluation records (one record per cell: cell fields + metrics).

| table    | layout                                                                               |
|----------|--------------------------------------------------------------------------------------|
| table1   | speedup over AR [95% interval], benchmarks x systems, per T, c = 1, mean over seeds; Average row |
| table5   | τ / TPS / speedup per cell (Table 5/6 layout), same selection; seed sd in the CSV    |
| table3   | stage ms per block (Table 3), systems with --timing, T = 0, c = 1, mean over benchmarks |
| table13  | τ / TPS / speedup against concurrency (Tables 2 and 13), T = 0                        |
| table11  | loss-term ablation: τ per benchmark for each LiLiCorr objective (γ, λ, μ), T = 0, c = 1 |
| table12  | decode rule: greedy walk vs Viterbi τ and Δ per benchmark, T = 0, c = 1               |
`format_table5` is the fixed-width Table-5 text the demo prints (moved here from jobs/demo.py).
"""

from __future__ import annotations

import csv
import io
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from lilicorr.engine.stats import STAGES

SYSTEM_ORDER = ("ar", "lilicorr", "lilicorr-margin", "lilicorr-viterbi", "domino", "dspark", "dspark-sampled",
                "dflash", "ddtree", "hf", "hf-pld")
NO_TAU = ("ar", "hf", "hf-pld")  # AR does not speculate; the peers do not report acceptance
# The CSV columns of a cell after its (T, benchmark, system) or (benchmark, c, system).
T5_COLUMNS = ("seeds", "prompts", "rounds", "tau", "tau_sd", "tau_lo", "tau_hi", "tokens_per_s", "tokens_per_s_sd",
              "speedup", "speedup_lo", "speedup_hi")
T13_COLUMNS = ("prompts", "tau", "tokens_per_s", "speedup", "speedup_lo", "speedup_hi")


def speedup_text(speedup: float, lo: float = float("nan"), hi: float = float("nan")) -> str:
    """`1.12x [1.05, 1.19]` (the 95% interval when one was measured), `1.12x`, or '–'."""
    if speedup != speedup:
        return "–"
    return f"{speedup:.2f}x [{lo:.2f}, {hi:.2f}]" if lo == lo and hi == hi else f"{speedup:.2f}x"


def _sizes(agg: dict) -> str:
    """'N prompts x R interleaved rounds per cell' from aggregated cells (the largest, if they differ)."""
    n = max((a["prompts"] for a in agg.values()), default=0)
    r = max((a["rounds"] for a in agg.values()), default=1)
    return (f"{n} prompts" if n else "prompts: see the cells") + f" x {r} interleaved round{'s' * (r > 1)} per cell"


def cell_text(system: str, tau: float, tps: float, ar_tps: float) -> str:
    """One Table-5 cell: `τ / TPS / speedup×` ('–' for τ where a system does not speculate)."""
    t = "–" if system in NO_TAU or tau != tau else f"{tau:.2f}"
    return f"{t} / {tps:.1f} / {tps / ar_tps:.2f}x" if ar_tps else f"{t} / {tps:.1f} / –"


def format_table5(results: dict[tuple[str, str], dict], benchmarks: list[str], systems: list[str]) -> str:
    """Paper Table 5 layout as fixed-width text: per benchmark, τ / tok/s / speedup over AR per system, and
    under it the speedup's 95% interval where the cells were measured interleaved beside AR."""
    w = max([12, *(len(b) + 1 for b in benchmarks)])  # mmath-multilingual is 18 characters
    header = f"{'Benchmark':<{w}}" + "".join(f"{s:>26}" for s in systems)
    lines = [header, f"{'':<{w}}" + "".join(f"{'τ / tok/s / speedup':>26}" for _ in systems)]
    for bench in benchmarks:
        ar_tps = results[(bench, "ar")]["tokens_per_s"]
        cells = [cell_text(s, results[(bench, s)].get("tau", float("nan")), results[(bench, s)]["tokens_per_s"],
                           ar_tps) for s in systems]
        lines.append(f"{bench:<{w}}" + "".join(f"{c:>26}" for c in cells))
        lo_hi = [(results[(bench, s)].get("speedup_lo"), results[(bench, s)].get("speedup_hi")) for s in systems]
        if any(lo is not None for lo, _ in lo_hi):
            lines.append(f"{'  95% interval':<{w}}" + "".join(f"{f'[{lo:.2f}, {hi:.2f}]' if lo is not None else '':>26}"
                                                           for lo, hi in lo_hi))
    return "\n".join(lines)


@dataclass
class Table:
    name: str
    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    data: list[dict] = field(default_factory=list)  # numeric rows for CSV / MLflow log_table

    def markdown(self) -> str:
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.header) + " |",
                 "|" + "|".join("---" for _ in self.header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines)

    def csv(self) -> str:
        buf = io.StringIO()
        keys = list(dict.fromkeys(k for d in self.data for k in d))
        w = csv.DictWriter(buf, fieldnames=keys)
        w.writeheader()
        w.writerows(self.data)
        return buf.getvalue()


def _order(systems) -> list[str]:
    def key(s: str):  # a labelled system (`dflash@shipped`, evaluate/variants.py) right after its system
        base = s.split("@", 1)[0]
        return (SYSTEM_ORDER.index(base) if base in SYSTEM_ORDER else 99, s)

    return sorted(set(systems), key=key)


def _mean(xs):
    xs = [x for x in xs if x == x]
    return statistics.fmean(xs) if xs else float("nan")


def _sd(xs):
    xs = [x for x in xs if x == x]
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def aggregate(records: list[dict], concurrency: int | None = 1) -> dict[tuple, dict]:
    """(T, benchmark, system[, c]) -> mean/sd over seeds of tau, tokens_per_s, speedup."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if concurrency is not None and r["concurrency"] != concurrency:
            continue
        key = (r["temperature"], r["benchmark"], r["system"]) + (() if concurrency is not None else (r["concurrency"],))
        groups[key].append(r)
    out = {}
    for key, rs in groups.items():
        agg = {"seeds": len(rs), "prompts": max(int(r["metrics"].get("prompts", 0)) for r in rs),
               "rounds": max(int(r["metrics"].get("rounds", 1)) for r in rs)}
        for m in ("tau", "tokens_per_s", "speedup"):
            vals = [r["metrics"].get(m, float("nan")) for r in rs]
            agg[m], agg[f"{m}_sd"] = _mean(vals), _sd(vals)
        for m in ("tau", "speedup"):  # one seed: its 95% interval (over prompts, over interleaved units)
            lo, hi = rs[0]["metrics"].get(f"{m}_lo", float("nan")), rs[0]["metrics"].get(f"{m}_hi", float("nan"))
            agg[f"{m}_lo"], agg[f"{m}_hi"] = (lo, hi) if len(rs) == 1 else (float("nan"), float("nan"))
        out[key] = agg
    return out


def table5(records: list[dict]) -> tuple[Table, Table]:
    agg = aggregate(records)
    systems = _order(k[2] for k in agg)
    t5 = Table("table5", f"Table 5: τ / TPS / speedup over AR (c = 1; {_sizes(agg)}; mean over seeds at T > 0)",
               ["T", "Benchmark", *systems])
    t1 = Table("table1", f"Table 1: speedup over AR with its 95% interval (c = 1; {_sizes(agg)}; mean over seeds "
               "at T > 0)", ["T", "Benchmark", *systems])
    for temp in sorted({k[0] for k in agg}):
        benches = sorted({k[1] for k in agg if k[0] == temp})
        speedups = defaultdict(list)
        for b in benches:
            row5, row1 = [f"{temp:g}", b], [f"{temp:g}", b]
            for s in systems:
                a = agg.get((temp, b, s))
                if a is None:
                    row5.append("")
                    row1.append("")
                    continue
                ar = agg.get((temp, b, "ar"), {}).get("tokens_per_s", 0.0)
                row5.append(cell_text(s, a["tau"], a["tokens_per_s"], ar))
                row1.append(speedup_text(a["speedup"], a["speedup_lo"], a["speedup_hi"]))  # AR: no interval
                speedups[s].append(a["speedup"])
                t5.data.append({"temperature": temp, "benchmark": b, "system": s, **{k: a[k] for k in T5_COLUMNS}})
            t5.rows.append(row5)
            t1.rows.append(row1)
        t1.rows.append([f"{temp:g}", "Average", *[f"{_mean(speedups[s]):.2f}x" if speedups[s] else "" for s in systems]])
    t1.data = [{k: d[k] for k in ("temperature", "benchmark", "system", "prompts", "speedup", "speedup_lo", "speedup_hi")}
               for d in t5.data]
    return t1, t5


def table3(records: list[dict]) -> Table:
    timed = [r for r in records if any(k.startswith("stage_ms.") for k in r["metrics"])
             and r["temperature"] == 0 and r["concurrency"] == 1]
    systems = _order(r["system"] for r in timed)
    t = Table("table3", "Table 3: per-block stage split, ms (T = 0, c = 1, mean over benchmarks)",
              ["Stage (ms / block)", *systems])
    for stage in (*STAGES, "per_block"):
        vals = {s: _mean([r["metrics"].get(f"stage_ms.{stage}", float("nan")) for r in timed if r["system"] == s])
                for s in systems}
        t.rows.append([stage.replace("_", " "), *[f"{vals[s]:.2f}" for s in systems]])
        t.data.append({"stage": stage, **vals})
    return t


def table13(records: list[dict]) -> Table:
    agg = aggregate([r for r in records if r["temperature"] == 0], concurrency=None)
    systems = _order(k[2] for k in agg)
    t = Table("table13", f"Tables 2/13: τ / TPS / speedup against concurrency (T = 0; {_sizes(agg)})",
              ["Benchmark", "c", *systems])
    for b, c in sorted({(k[1], k[3]) for k in agg}):
        ar = agg.get((0.0, b, "ar", c), {}).get("tokens_per_s", 0.0)
        row = [b, str(c)]
        for s in systems:
            a = agg.get((0.0, b, s, c))
            row.append(cell_text(s, a["tau"], a["tokens_per_s"], ar) if a else "")
            if a:
                t.data.append({"benchmark": b, "concurrency": c, "system": s, **{k: a[k] for k in T13_COLUMNS}})
        t.rows.append(row)
    return t


def table11(records: list[dict]) -> Table:
    rs = [r for r in records if r["system"] in ("lilicorr", "lilicorr-margin") and r["temperature"] == 0
          and r["concurrency"] == 1]
    benches = sorted({r["benchmark"] for r in rs})
    t = Table("table11", "Table 11: loss-term ablation, τ (T = 0, c = 1)", ["Objective (γ, λ, μ)", *benches])
    for obj in sorted({r.get("objective", "?") for r in rs}):
        vals = {b: _mean([r["metrics"].get("tau", float("nan")) for r in rs
                          if r.get("objective", "?") == obj and r["benchmark"] == b]) for b in benches}
        t.rows.append([obj, *[f"{vals[b]:.3f}" for b in benches]])
        t.data.append({"objective": obj, **vals})
    return t


def table12(records: list[dict]) -> Table:
    agg = aggregate([r for r in records if r["temperature"] == 0])
    t = Table("table12", "Table 12: decode rule, τ (greedy walk vs exact Viterbi, T = 0, c = 1)",
              ["Benchmark", "Greedy", "Exact", "Δ"])
    for b in sorted({k[1] for k in agg}):
        g, e = agg.get((0.0, b, "lilicorr")), agg.get((0.0, b, "lilicorr-viterbi"))
        if g and e:
            delta = (e["tau"] - g["tau"]) / g["tau"] * 100 if g["tau"] else float("nan")
            t.rows.append([b, f"{g['tau']:.3f}", f"{e['tau']:.3f}", f"{delta:+.2f}%"])
            t.data.append({"benchmark": b, "greedy": g["tau"], "exact": e["tau"], "delta_pct": delta})
    return t


def build_tables(records: list[dict]) -> list[Table]:
    """Every table that has data among the records (a table with no rows is left out)."""
    t1, t5 = table5(records)
    timed = any(r["metrics"].get("stage_ms.per_block") for r in records)
    concurrencies = len({r["concurrency"] for r in records})
    return [t for t in (t1, t5, table3(records), table13(records), table11(records), table12(records))
            if t.rows and (t.name != "table3" or timed) and (t.name != "table13" or concurrencies > 1)]
