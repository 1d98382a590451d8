"""Acceptance length τ per system and benchmark, with per-prompt intervals and paired ratios (not a test):

    python jobs/bench.py acceptance --systems dflash,lilicorr --benchmarks mt-bench,humaneval,heldout
    python jobs/bench.py acceptance --systems dflash,lilicorr,dflash@outputs/v6/dflash/export,lilicorr@outputs/v6/lilicorr/export \\
        --pairs lilicorr:dflash,lilicorr@outputs/v6/lilicorr/export:dflash@outputs/v6/dflash/export

    python jobs/bench.py acceptance --systems dflash,lilicorr --benchmarks long-16k --prompts 8 target.yarn_factor=2

Greedy, every prompt of each benchmark (MT-Bench's 80 first turns, HumanEval's 164, any other packaged benchmark of
benchmark_prompts.py, and `heldout`: 80 ShareGPT first turns past every row a shipped corpus read), `--max-new-tokens` each, decoded in batches of `--batch` (τ does not depend on the
batch: greedy verification accepts what the target would have produced). A system `SYSTEM@DIR` decodes with the
export in DIR; a plain one with the shipped export; `SYSTEM[@DIR]|section.field=value|...` with overrides of its own
(e.g. `lilicorr|engine.draft_vocab=4096`, the name as given labels it). Per (system, benchmark): τ pooled over prompts (accepted
tokens / blocks + 1), a 95% bootstrap interval over prompts, and each slot's acceptance rate; per pair A:B:
τ_A ÷ τ_B with a paired bootstrap interval (the same prompts resampled for both), so a 5% difference can be
told from prompt-to-prompt noise. Speed is not measured here (batch-1 speed: `jobs/bench.py stages`). Every
output is checked against the first system's: greedy decoding is lossless, so they must be equal. Trailing
`section.field=value` overrides apply to every system and to the target (e.g. target.yarn_factor=2).
Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from lilicorr.bench.harness import json_line, load_bench_target, logger
from lilicorr.platform.intervals import interval, paired_ratio, pooled_tau

HELDOUT_PROMPTS = 80  # the held-out benchmark's size when --prompts is not given (MT-Bench's)
_log = logger("acceptance")


def benchmark_prompt_ids(name: str, tokenizer, corpus: str | None, limit: int | None, answer=None,
                         enable_thinking: bool = False) -> list[list[int]]:
    """Prompt token ids of one benchmark: a packaged one (benchmark_prompts.PACKAGED_BENCHMARKS; `answer` fills
    mt-bench-turn2's turn-1 answers, benchmark_prompts.target_answerer), or heldout (ShareGPT first turns past the
    corpora)."""
    if name == "heldout":
        if not corpus:
            raise SystemExit("--benchmarks heldout needs a packaged corpus: --corpus DIR (e.g. corpora/smollm2-135m/"
                             "sharegpt-v1), or a --preset whose data.output_dir is one")
        return heldout_prompt_ids(tokenizer, corpus, limit or HELDOUT_PROMPTS)
    from lilicorr.platform.benchmark_prompts import (benchmark_prompts, fill_target_turns, needs_target_turns,
                                                     rows_prompt_ids)

    rows = benchmark_prompts(name)
    rows = rows[:limit] if limit else rows
    if needs_target_turns(rows):
        if answer is None:
            raise SystemExit(f"benchmark {name!r} needs the target's own answers (benchmark_prompts.target_answerer)")
        rows = fill_target_turns(rows, answer)
    return rows_prompt_ids(tokenizer, rows, enable_thinking)


def heldout_prompt_ids(tokenizer, corpus: str, n: int, max_prompt_tokens: int = 256) -> list[list[int]]:
    """n chat prompts no shipped drafter trained on: the first user turns of ShareGPT conversations past every row a
    shipped corpus read (the packaged corpus's last source row, and row 4,800, past the as-is corpus of v1-v5), at
    most `max_prompt_tokens` long as in training. (The corpus's own held-out split is hash-chosen among rows the
    as-is corpus trained v1-v5 on, so it would favour them; it serves validation.)"""
    import pyarrow.parquet as pq

    from lilicorr.platform.assets import normalize_messages, sharegpt_parquet
    from lilicorr.platform.chat import prompt_ids
    from lilicorr.platform.corpus import read_manifest
    from lilicorr.platform.regenerate.conversations import SkipConversation, conversation_skeleton

    out: list[list[int]] = []
    start = max([4800] + [stop for _, stop in read_manifest(corpus)["source_rows"]])
    table = pq.read_table(sharegpt_parquet(), columns=["messages"])
    for rec in table.slice(start).to_pylist():
        if len(out) >= n:
            break
        try:
            msgs = conversation_skeleton(normalize_messages(rec["messages"]))
        except (SkipConversation, ValueError, TypeError):
            continue
        head = 2 if msgs[0]["role"] == "system" else 1
        ids = prompt_ids(tokenizer, msgs[:head], False)
        if len(ids) <= max_prompt_tokens:
            out.append(ids)
    return out


def main(argv: list[str] | None = None) -> dict:
    from lilicorr.config import load_config
    from lilicorr.engine.requests import Request
    from lilicorr.engine.kv_cache import KVCacheTooLarge
    from lilicorr.engine.systems import build_decoder
    from lilicorr.platform.benchmark_prompts import target_answerer
    from lilicorr.platform.corpus import is_corpus
    from lilicorr.platform.shipped import shipped_checkpoint

    ap = argparse.ArgumentParser(prog="bench.py acceptance", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--systems", default="dflash,lilicorr",
                    help="SYSTEM, SYSTEM@EXPORT_DIR, either with |section.field=value overrides of its own "
                         "(e.g. 'lilicorr|engine.draft_vocab=4096'), comma-separated")
    ap.add_argument("--benchmarks", default="mt-bench,humaneval,heldout")
    ap.add_argument("--pairs", default="", help="A:B,... for τ_A / τ_B (system names as given); default: each later "
                                                "system against the first")
    ap.add_argument("--corpus", default=None, help="packaged corpus whose source rows 'heldout' skips (default: the preset's data.output_dir when it is one)")
    ap.add_argument("--prompts", type=int, default=None, help="at most N prompts per benchmark (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("overrides", nargs="*", metavar="section.field=value",
                    help="config overrides for every system (e.g. target.yarn_factor=2 for long-16k)")
    args = ap.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    benches = [b for b in args.benchmarks.split(",") if b]
    pairs = [tuple(p.split(":", 1)) for p in args.pairs.split(",") if p] if args.pairs else \
        [(s, systems[0]) for s in systems[1:]]
    for a, b in pairs:
        if a not in systems or b not in systems:
            raise SystemExit(f"--pairs {a}:{b}: both must be among --systems ({', '.join(systems)})")
    cfg, model, tok, stops = load_bench_target(args.preset, args.overrides, args.threads)
    corpus = args.corpus or (cfg.data.output_dir if is_corpus(cfg.data.output_dir) else None)
    answer = target_answerer(cfg, model, tok, stops)
    prompts = {b: benchmark_prompt_ids(b, tok, corpus, args.prompts, answer, cfg.target.enable_thinking)
               for b in benches}
    longest = max(len(p) for ps in prompts.values() for p in ps)
    _log(f"{len(systems)} systems x {', '.join(f'{b} ({len(p)})' for b, p in prompts.items())} prompts, "
         f"{args.max_new_tokens} tokens each, batch {args.batch}")
    per: dict[tuple[str, str], np.ndarray] = {}  # (system, bench) -> (n, 2) accepted, blocks
    slots: dict[tuple[str, str], list[float]] = {}
    outputs: dict[tuple[str, str], list[list[int]]] = {}
    t_start = time.perf_counter()
    for k, name in enumerate(systems):
        spec, *own = name.split("|")  # SYSTEM[@EXPORT_DIR][|section.field=value...]: this system's own overrides
        system, _, export = spec.partition("@")
        ckpt = export or shipped_checkpoint(args.preset, system)
        run_cfg = load_config(args.preset, [*args.overrides, *own])
        run_cfg.engine.max_new_tokens = args.max_new_tokens
        run_cfg.engine.max_seq_len = longest + args.max_new_tokens + 32
        try:
            dec = build_decoder(run_cfg, model, system, checkpoint=ckpt, stop_ids=stops, max_batch=args.batch)
        except KVCacheTooLarge as e:
            raise SystemExit(f"{name}: {e}") from None
        for b, ps in prompts.items():
            before = list(dec.stats.slot_accepted), dec.stats.blocks
            res = dec.generate([Request(i, p, max_new_tokens=args.max_new_tokens) for i, p in enumerate(ps)])
            bad = next((r for r in res if r.error), None)
            if bad is not None:
                raise SystemExit(f"{name} on {b}: {bad.error}")
            per[name, b] = np.array([[r.accepted_tokens, r.blocks] for r in res], dtype=np.float64)
            blocks = dec.stats.blocks - before[1]
            slots[name, b] = [round((a - a0) / max(blocks, 1), 4) for a, a0 in zip(dec.stats.slot_accepted, before[0])]
            outputs[name, b] = [list(r.output_ids) for r in res]
            _log(f"[{k + 1}/{len(systems)}] {name} {b}: τ {pooled_tau(per[name, b]):.3f} "
                 f"({time.perf_counter() - t_start:.0f}s so far)")
    rng = np.random.default_rng(args.seed)
    rows = []
    for name in systems:
        for b in benches:
            v = per[name, b]
            lo, hi = interval(v, pooled_tau, rng)
            same = sum(x == y for x, y in zip(outputs[name, b], outputs[systems[0], b]))
            rows.append({"system": name, "benchmark": b, "prompts": len(v), "tau": round(pooled_tau(v), 4),
                         "tau_ci95": [round(lo, 4), round(hi, 4)], "slot_acceptance": slots[name, b],
                         "equal_to_first": same})
            _log(f"{name:40s} {b:10s} n={len(v):3d} τ {pooled_tau(v):.3f} [{lo:.3f}, {hi:.3f}] "
                 f"slots {slots[name, b][:4]} equal {same}/{len(v)}")
    ratios = []
    for a, b_ in pairs:
        for b in benches + ["all"]:
            both = np.concatenate([per[a, x] for x in benches], 0) if b == "all" else per[a, b]
            other = np.concatenate([per[b_, x] for x in benches], 0) if b == "all" else per[b_, b]
            joint = np.concatenate([both, other], 1)
            lo, hi = interval(joint, paired_ratio, rng)
            ratios.append({"a": a, "b": b_, "benchmark": b, "prompts": len(joint),
                           "ratio": round(paired_ratio(joint), 4), "ci95": [round(lo, 4), round(hi, 4)]})
            _log(f"{a} / {b_} on {b}: {paired_ratio(joint):.4f} [{lo:.4f}, {hi:.4f}] (n={len(joint)})")
    res = {"bench": "acceptance", "preset": args.preset, "max_new_tokens": args.max_new_tokens,
           "corpus": corpus, "rows": rows, "ratios": ratios, "wall_s": round(time.perf_counter() - t_start, 1)}
    return json_line(res, load_average=False)
