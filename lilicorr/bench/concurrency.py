"""Throughput against serving concurrency, input and output entropy, through the Serve app over HTTP (the
paper's Tables 2, 13 and 14; not a test):

    python jobs/bench.py concurrency --systems ar,dflash,lilicorr --concurrency 1,2,4,8,16,32 \\
        --inputs chat --requests 2 --max-tokens 64

Prompts. Each `--inputs` source — `chat` (MT-Bench first turns, HumanEval, MMATH's MATH-500 problems, the first
`--pool` of each, interleaved) or any packaged benchmark name (`jobs/evaluate.py`'s, e.g. a long-input set) — is
split into output-entropy tiers by the target itself, as the paper's SPEED throughput split is: each prompt's
greedy answer (`--entropy-tokens` tokens, transformers `generate`) is decoded once and the mean entropy of the
target's next-token distribution along it measured (nats); its terciles make the tiers `low`, `mid`, `high`.
The measurement is cached under outputs/bench/ per target and prompt set.

Load. One Serve app on 127.0.0.1 serves every system over the shared target (engine.max_batch_size = the
largest c unless an override sets it; engine.max_seq_len fits the longest prompt). Per (input, tier, c), every
system in turn — the order rotating from cell to cell — gets c closed-loop streaming clients, each sending
`--requests` greedy requests back to back (client i takes the tier's prompts i, i + c, ...): a cell is a fixed
amount of work, never a time window. Per cell: output tok/s (completion tokens / wall), τ pooled from the
responses' usage (accepted drafts + blocks over blocks), TTFT and latency p50, errors; the speedup over AR at
the same (input, tier, c).

Output. Progress with an ETA on stderr; one MLflow parent run (job `bench-concurrency`) with a child run per
cell, the table (markdown + CSV) and the plot of speedup against c as its artifacts, copies under `--out`;
last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from lilicorr.bench.harness import json_line, logger

TIERS = ("low", "mid", "high")
_log = logger("concurrency")


def source_prompts(name: str, pool: int) -> list[dict]:
    """Rows {"id", "messages"} of one --inputs source (module docstring)."""
    from lilicorr.platform.benchmark_prompts import benchmark_prompts

    if name != "chat":
        return benchmark_prompts(name)[:pool]
    parts = [benchmark_prompts(b)[:pool] for b in ("mt-bench", "humaneval", "math-500-mmath")]
    return [r for group in zip(*parts) for r in group]  # interleaved: every domain in every slice


def output_entropy(model, prompts: list[list[int]], tokens: int, stop_ids, batch: int = 16) -> list[float]:
    """Mean entropy (nats) of the target's next-token distribution along each prompt's greedy answer of up to
    `tokens` tokens (to its first stop token), from transformers `generate`'s scores, `batch` prompts at a time."""
    import torch

    from lilicorr.platform.evaluate.cells import left_pad

    out: list[float] = []
    stops = set(stop_ids)
    dev = next(model.parameters()).device
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        ids, mask = left_pad(chunk)
        width = ids.shape[1]
        with torch.inference_mode():
            gen = model.generate(ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=tokens, do_sample=False,
                                 temperature=None, top_p=None, top_k=None, output_scores=True,
                                 return_dict_in_generate=True, eos_token_id=list(stops) or None, pad_token_id=0)
        logp = torch.stack(gen.scores, 1).float().log_softmax(-1)  # (rows, steps, vocab)
        ent = -(logp.exp() * logp).sum(-1)  # (rows, steps)
        new = gen.sequences[:, width:]
        for r in range(len(chunk)):
            row = new[r].tolist()
            n = next((j + 1 for j, t in enumerate(row) if t in stops), len(row))
            out.append(float(ent[r, :n].mean()))
    return out


def entropy_tiers(entropy: list[float]) -> list[str]:
    """Each prompt's tier by rank: the lowest third of `entropy` `low`, the highest third `high` (ties broken by
    position), so the tiers hold equal shares whatever the values."""
    order = sorted(range(len(entropy)), key=lambda i: (entropy[i], i))
    n, tiers = len(entropy), [""] * len(entropy)
    for rank, i in enumerate(order):
        tiers[i] = TIERS[min(2, rank * 3 // n)]
    return tiers


def tiered_prompts(cfg, source: str, pool: int, tokens: int, cache_dir: Path) -> dict[str, list[dict]]:
    """{tier: rows} of one source, its entropies measured once and cached (per target, source and prompts)."""
    from lilicorr.platform.assets import eos_token_ids, load_target
    from lilicorr.platform.chat import prompt_ids

    rows = source_prompts(source, pool)
    key = hashlib.sha1(json.dumps([cfg.target.source, source, tokens, [r["id"] for r in rows]]).encode()).hexdigest()[:12]
    cache = cache_dir / f"entropy-{source}-{key}.json"
    if cache.exists():
        entropy = json.loads(cache.read_text())["entropy"]
        _log(f"{source}: entropies of {len(rows)} prompts from {cache}")
    else:
        t0 = time.perf_counter()
        model, tok = load_target(cfg.target)
        ids = [prompt_ids(tok, r["messages"], cfg.target.enable_thinking) for r in rows]
        entropy = output_entropy(model, ids, tokens, eos_token_ids(cfg.target, tok))
        cache_dir.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"source": source, "tokens": tokens, "ids": [r["id"] for r in rows],
                                     "entropy": entropy}))
        _log(f"{source}: measured the output entropy of {len(rows)} prompts in {time.perf_counter() - t0:.0f}s")
    tiers = entropy_tiers(entropy)
    out = {t: [dict(r, entropy=e) for r, e, tt in zip(rows, entropy, tiers) if tt == t] for t in TIERS}
    for t in TIERS:
        es = [r["entropy"] for r in out[t]]
        _log(f"{source} tier {t}: {len(es)} prompts, entropy {min(es):.2f}-{max(es):.2f} nats")
    return out


@dataclass(frozen=True)
class Cell:
    system: str
    inputs: str
    tier: str
    concurrency: int

    @property
    def setting(self) -> tuple:
        return (self.inputs, self.tier, self.concurrency)

    def run_name(self) -> str:
        return f"conc-{self.system}-{self.inputs}-{self.tier}-c{self.concurrency}"


async def run_cell(url: str, model: str, prompts: list[dict], clients: int, requests: int, max_tokens: int,
                   api_key: str) -> dict:
    """c closed-loop clients x `requests` requests each (client i takes prompts i, i + c, ...); the cell's figures."""
    from lilicorr.bench.serve_load import figures, new_record, openai_client, stream_request

    async def client(first: int) -> None:
        for k in range(requests):
            row = prompts[(first + k * clients) % len(prompts)]
            await stream_request(aclient, model, row["messages"], max_tokens, rec)

    rec = new_record()
    async with openai_client(url, api_key, clients, 900) as aclient:
        t0 = time.perf_counter()
        await asyncio.gather(*[client(i) for i in range(clients)])
        wall = time.perf_counter() - t0
    return {**figures(rec, wall), "tau": (rec["accepted"] + rec["blocks"]) / rec["blocks"] if rec["blocks"] else None}


def add_speedups(results: list[dict]) -> None:
    """speedup = tok/s over AR's at the same (inputs, tier, c), in place."""
    ar = {Cell(**r["cell"]).setting: r["tokens_per_s"] for r in results if r["cell"]["system"] == "ar"}
    for r in results:
        base = ar.get(Cell(**r["cell"]).setting)
        r["speedup"] = r["tokens_per_s"] / base if base else None


def table(results: list[dict], systems: list[str]) -> tuple[str, str]:
    """(markdown, csv): per (inputs, tier, c) a row, per system `τ / tok/s / speedup` (Table 2/13 layout)."""
    by = {(r["cell"]["inputs"], r["cell"]["tier"], r["cell"]["concurrency"], r["cell"]["system"]): r for r in results}
    settings = sorted({k[:3] for k in by}, key=lambda k: (k[0], TIERS.index(k[1]) if k[1] in TIERS else 9, k[2]))
    md = ["| input | tier | c | " + " | ".join(systems) + " |", "|---|---|---|" + "---|" * len(systems)]
    rows = ["inputs,tier,concurrency,system,requests,errors,tau,tokens_per_s,speedup,ttft_p50_s"]
    for s in settings:
        cells = []
        for name in systems:
            r = by.get((*s, name))
            if r is None:
                cells.append("")
                continue
            tau = "–" if r["tau"] is None or name == "ar" else f"{r['tau']:.2f}"
            speed = f"{r['speedup']:.2f}x" if r.get("speedup") else "–"
            cells.append(f"{tau} / {r['tokens_per_s']:.1f} / {speed}" + (f" ({r['errors']} err)" if r["errors"] else ""))
            rows.append(f"{s[0]},{s[1]},{s[2]},{name},{r['requests']},{r['errors']},{r['tau'] or ''},"
                        f"{r['tokens_per_s']:.3f},{r.get('speedup') or ''},{r['ttft_p50_s'] or ''}")
        md.append(f"| {s[0]} | {s[1]} | {s[2]} | " + " | ".join(cells) + " |")
    return "\n".join(md), "\n".join(rows) + "\n"


def plot(results: list[dict], path: Path) -> Optional[Path]:
    """Speedup over AR against c (log2 axis), one panel per (inputs, tier), one line per speculative system."""
    rs = [r for r in results if r["cell"]["system"] != "ar" and r.get("speedup")]
    if not rs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["cell"]["inputs"], r["cell"]["tier"]) for r in rs},
                    key=lambda k: (k[0], TIERS.index(k[1]) if k[1] in TIERS else 9))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2), squeeze=False, sharey=True)
    for ax, (inputs, tier) in zip(axes[0], panels):
        for system in dict.fromkeys(r["cell"]["system"] for r in rs):
            pts = sorted((r["cell"]["concurrency"], r["speedup"]) for r in rs if r["cell"]["system"] == system
                         and r["cell"]["inputs"] == inputs and r["cell"]["tier"] == tier)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency c")
        ax.set_title(f"{inputs}, {tier} entropy", fontsize=9)
    axes[0][0].set_ylabel("speedup over AR (tok/s)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def log_mlflow(cfg, args, results: list[dict], md: str, csv: str, png: Optional[Path]) -> Optional[str]:
    """One parent run with a child run per cell; the table and the plot as the parent's artifacts."""
    import mlflow
    from mlflow.entities import Metric, Param

    from lilicorr.platform.tracking import PARENT_TAG, start_run

    with start_run(cfg, "bench-concurrency", name_parts=[args.systems.replace(",", "+")]) as parent:
        client = mlflow.MlflowClient(mlflow.get_tracking_uri())
        pid, exp = parent.info.run_id, parent.info.experiment_id
        mlflow.log_dict(vars(args), "args.json")
        for r in results:
            cell = Cell(**r["cell"])
            run = client.create_run(exp, run_name=cell.run_name(),
                                    tags={PARENT_TAG: pid, "job": "bench-concurrency-cell", "system": cell.system})
            now = int(time.time() * 1000)
            metrics = [Metric(k, float(r[k]), now, 0) for k in ("tokens_per_s", "tau", "speedup", "requests", "errors",
                                                               "wall_s", "ttft_p50_s", "latency_p50_s")
                       if r.get(k) is not None]
            params = [Param(k, str(v)) for k, v in asdict(cell).items()] + \
                     [Param("max_tokens", str(args.max_tokens)), Param("requests_per_client", str(args.requests))]
            client.log_batch(run.info.run_id, metrics=metrics, params=params)
            client.set_terminated(run.info.run_id, "FINISHED")
        mlflow.log_text(md, "concurrency/table.md")
        mlflow.log_text(csv, "concurrency/table.csv")
        if png:
            mlflow.log_artifact(str(png), "concurrency")
        return pid


def main(argv: Optional[list[str]] = None) -> dict:
    from lilicorr.config import load_config

    p = argparse.ArgumentParser(prog="bench.py concurrency", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="smollm2-135m")
    p.add_argument("--systems", default="ar,dflash,lilicorr", help="served systems; ar is added when missing")
    p.add_argument("--concurrency", default="1,2,4,8,16,32")
    p.add_argument("--inputs", default="chat", help="prompt sources: chat or packaged benchmark names, comma-separated")
    p.add_argument("--tiers", default=",".join(TIERS), help="entropy tiers to load (of low,mid,high)")
    p.add_argument("--pool", type=int, default=80, help="prompts per benchmark in a source")
    p.add_argument("--entropy-tokens", type=int, default=32, help="greedy tokens whose entropy ranks a prompt")
    p.add_argument("--requests", type=int, default=2, help="requests per client in a cell")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--checkpoint", action="append", default=[], help="SYSTEM=DIR (default: the shipped exports)")
    p.add_argument("--drafter", default=None, choices=["random"], help="untrained drafters where no export is found")
    p.add_argument("--torch-threads", type=int, default=None, help="intra-op threads of the replica")
    p.add_argument("--out", default="outputs/bench/concurrency", help="table, CSV, plot and JSON copies")
    p.add_argument("--no-mlflow", action="store_true")
    p.add_argument("overrides", nargs="*", help="config overrides for the served engines")
    args = p.parse_args(argv)
    systems = list(dict.fromkeys(["ar", *[s for s in args.systems.split(",") if s]]))
    levels = [int(x) for x in args.concurrency.split(",") if x]
    tiers = [t for t in args.tiers.split(",") if t]
    bad = [t for t in tiers if t not in TIERS]
    if bad or not levels or min(levels) < 1:
        p.error(f"--tiers takes {', '.join(TIERS)} (got {bad}); --concurrency positive integers (got {levels})")
    sources = [s for s in args.inputs.split(",") if s]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(args.preset, list(args.overrides))
    prompts = {s: tiered_prompts(cfg, s, args.pool, args.entropy_tokens, Path("outputs/bench")) for s in sources}

    from lilicorr.platform.assets import load_tokenizer
    from lilicorr.platform.chat import prompt_ids

    tok = load_tokenizer(cfg.target)
    longest = max(len(prompt_ids(tok, r["messages"], cfg.target.enable_thinking))
                  for by_tier in prompts.values() for rows in by_tier.values() for r in rows)
    overrides = list(args.overrides)
    if not any(o.startswith("engine.max_batch_size=") for o in overrides):
        overrides.append(f"engine.max_batch_size={max(levels)}")
    if not any(o.startswith("engine.max_seq_len=") for o in overrides):
        overrides.append(f"engine.max_seq_len={max(cfg.engine.max_seq_len, longest + args.max_tokens + 16)}")
    cells = [Cell(system, s, t, c) for s in sources for t in tiers for c in levels for system in systems]
    # rotate the system order from setting to setting: no system always runs right after the server warmed up
    ordered = []
    for k in range(0, len(cells), len(systems)):
        group = cells[k:k + len(systems)]
        shift = (k // len(systems)) % len(systems)
        ordered += group[shift:] + group[:shift]
    work = sum(c.concurrency for c in ordered) * args.requests * args.max_tokens
    _log(f"{len(ordered)} cells: {len(systems)} systems x {len(sources)} inputs x {len(tiers)} tiers x c in {levels}; "
         f"{args.requests} requests per client, {args.max_tokens} tokens each (~{work} tokens); server overrides "
         f"{' '.join(overrides)}")

    from lilicorr.serve_apps.launch import free_port, start_serve, stop_serve
    from lilicorr.serve_apps.loading import ServeSpec

    api_key = os.environ.get("LILICORR_API_KEY") or "none"
    spec = ServeSpec(preset=args.preset, overrides=overrides, systems=systems, checkpoints=list(args.checkpoint),
                     drafter=args.drafter, torch_threads=args.torch_threads)
    t_start = time.perf_counter()
    url = start_serve(spec, "127.0.0.1", free_port())
    _log(f"server up at {url} in {time.perf_counter() - t_start:.0f}s")
    results: list[dict] = []
    try:
        from lilicorr.bench.serve_load import served_models

        served = set(served_models(url, api_key))
        model_of = {s: next(m for m in served if m.endswith(f"-{s}")) for s in systems}
        for system in systems:  # one short request each: the first request through a model pays its set-up
            asyncio.run(run_cell(url, model_of[system], prompts[sources[0]][tiers[0]], 1, 1, 4, api_key))
        done_tokens, t0 = 0, time.perf_counter()
        for i, cell in enumerate(ordered, 1):
            res = asyncio.run(run_cell(url, model_of[cell.system], prompts[cell.inputs][cell.tier], cell.concurrency,
                                       args.requests, args.max_tokens, api_key))
            res["cell"] = asdict(cell)
            results.append(res)
            done_tokens += cell.concurrency * args.requests * args.max_tokens
            elapsed = time.perf_counter() - t0
            eta = elapsed / done_tokens * (work - done_tokens)
            tau = f", τ {res['tau']:.2f}" if res["tau"] else ""
            _log(f"[{i}/{len(ordered)}] {cell.run_name()}: {res['tokens_per_s']:.1f} tok/s{tau}, "
                 f"{res['requests']} requests, {res['errors']} errors ({elapsed:.0f}s, ETA {eta:.0f}s)")
    finally:
        stop_serve()
    add_speedups(results)
    md, csv = table(results, systems)
    (out / "table.md").write_text(md + "\n")
    (out / "table.csv").write_text(csv)
    png = plot(results, out / "speedup_vs_concurrency.png")
    run_id = None if args.no_mlflow else log_mlflow(cfg, args, results, md, csv, png)
    print(md, file=sys.stderr, flush=True)
    summary = {"bench": "concurrency", "preset": args.preset, "systems": systems, "inputs": sources, "tiers": tiers,
               "concurrency": levels, "requests_per_client": args.requests, "max_tokens": args.max_tokens,
               "wall_s": round(time.perf_counter() - t_start, 1), "mlflow_run_id": run_id,
               "errors": sum(r["errors"] for r in results),
               "cells": [{**r["cell"], **{k: r[k] for k in ("requests", "errors", "tau", "tokens_per_s", "speedup",
                                                           "ttft_p50_s")}} for r in results]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return json_line(summary, load_average=False)
