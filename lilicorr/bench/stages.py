"""Per-stage cost of a block at batch 1 (or --batch N), systems x config variants interleaved (not a test):

    python jobs/bench.py stages [--systems ar,dflash,lilicorr] [--variants ";engine.cpu_script_layers=false"]
        [--prompts 6 --max-new-tokens 64 --threads 2]
    python jobs/bench.py stages --batch 12 --prompts 36   # three groups of 12 prompts, each decoded together
    python jobs/bench.py stages --systems ar,dflash,ddtree --variants ";ddtree: engine.ddtree_budget=3;ddtree: engine.ddtree_budget=6"
    python jobs/bench.py stages --systems ar,dflash,lilicorr,lilicorr@outputs/ship/lilicorr/export   # another export
    python jobs/bench.py stages --benchmark long-16k --prompts 4 target.yarn_factor=2   # long inputs, YaRN target

Every (system, variant) decoder is built once and warmed up; then each prompt goes through all of them in turn,
so a machine whose speed drifts (a shared 2-core box) slows them alike. With `--batch N` the prompts go in groups of N
decoded together (one group is the unit that is interleaved and resampled; per-block figures are per row's block). A system `SYSTEM@DIR` decodes as SYSTEM with
the export in DIR (a candidate beside the shipped one); plain systems take the shipped export. Variants are override sets separated by
';' (an empty one is the default config); one that starts with `SYSTEM:` applies to that system only. Per row: tok/s, wall ms per block, τ, the stage timers of
`build_decoder(..., timing=True)` in ms per block (target_verify, draft_backbone, lm_head, spec_head,
accept_residual), which implementation ran each computation (`backend`: engine/backend.py's record), the
block's cost in AR steps (its timed stages over the default AR decoder's), and how many outputs equal the first
row's (AR's: greedy decoding is lossless). `decode_tok_s` leaves the prefill out: the tokens after a request's first
step that returned any, over the time from then on (what a long prompt's prefill would otherwise swamp), and
`speedup` is decode_tok_s over the first AR row's, with a 95% paired bootstrap interval over prompts.
`--benchmark NAME` takes a packaged benchmark's first --prompts prompts (default: MT-Bench's first turns); trailing
`section.field=value` overrides apply to every decoder and to the target (target.yarn_factor=2).
Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import time

from lilicorr.bench.harness import bench_prompts, json_line, load_bench_target, logger, size_engine, warm_up

_log = logger("stages")


def _variant(text: str) -> tuple[str | None, list[str]]:
    """'SYSTEM: a=1 b=2' -> (SYSTEM, [a=1, b=2]); 'a=1' -> (None, [a=1]) for every system."""
    head, sep, rest = text.partition(":")
    if sep and "=" not in head:
        return head.strip(), rest.split()
    return None, text.split()


def warm_decoder(cfg, model, system: str, checkpoint, stops, prompts, max_new: int, batch: int = 1):
    """A decoder of `batch` rows with its stage timers on, sized for `prompts` x `max_new` tokens and warmed up (the
    C head builds on the first call), its timers cleared: what every per-block figure here is read from."""
    from lilicorr.engine.systems import build_decoder

    size_engine(cfg, prompts, max_new, slack=16)
    dec = build_decoder(cfg, model, system, checkpoint=checkpoint, stop_ids=stops, timing=True, max_batch=batch)
    warm_up(dec, prompts[0][:256], tokens=8)  # first-call builds; a long prefill adds nothing
    dec.timers.totals_ms.clear()
    return dec


def timed_generate(dec, reqs: list) -> tuple[list, float, float, int]:
    """([result per request], wall s, decode s, decode tokens) of `reqs` decoded together: decode = the steps after the
    first step that returned tokens (that one holds the prefill), and the tokens they returned."""
    for req in reqs:
        dec.add_request(req)
    t0 = time.perf_counter()
    first_t, after, results = None, 0, {}
    while dec.has_work():
        deltas = dec.step_deltas()
        got = sum(len(d.new_ids) for d in deltas)
        if first_t is not None:
            after += got
        elif got:
            first_t = time.perf_counter()
        results.update((d.id, d.result) for d in deltas if d.finished)
    end = time.perf_counter()
    return [results[r.id] for r in reqs], end - t0, end - first_t if first_t is not None else 0.0, after


def main(argv: list[str] | None = None) -> dict:
    import numpy as np

    from lilicorr.config import load_config
    from lilicorr.engine.requests import Request
    from lilicorr.platform.intervals import interval, speed_ratio
    from lilicorr.platform.shipped import shipped_checkpoint

    ap = argparse.ArgumentParser(prog="bench.py stages", description=__doc__.split("\n")[0])
    ap.add_argument("--systems", default="ar,dflash,lilicorr")
    ap.add_argument("--variants", default="", help="override sets separated by ';' ('' = the default config only)")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="prompts decoded together (groups of N; --prompts rounds down)")
    ap.add_argument("--benchmark", default=None, help="a packaged benchmark (benchmark_prompts.py), e.g. long-8k; "
                                                      "default: MT-Bench's first turns")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("overrides", nargs="*", metavar="section.field=value",
                    help="config overrides for every decoder and the target (e.g. target.yarn_factor=2)")
    args = ap.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    variants = [_variant(v) for v in args.variants.split(";")] if args.variants else [(None, [])]
    cfg, model, tok, stops = load_bench_target("smollm2-135m", args.overrides, args.threads)
    if args.benchmark:
        from lilicorr.bench.acceptance import benchmark_prompt_ids
        from lilicorr.platform.benchmark_prompts import target_answerer

        prompts = benchmark_prompt_ids(args.benchmark, tok, None, args.prompts,
                                       target_answerer(cfg, model, tok, stops), cfg.target.enable_thinking)
    else:
        prompts = bench_prompts(tok, args.prompts, model.config.vocab_size)
    runs = []
    for name in systems:
        system, _, export = name.partition("@")
        for only, overrides in variants:
            if only is not None and only not in (system, name):
                continue
            ckpt = export or (None if system == "ar" else shipped_checkpoint("smollm2-135m", system))
            dec = warm_decoder(load_config("smollm2-135m", [*args.overrides, *overrides]), model, system, ckpt, stops,
                               prompts, args.max_new_tokens, args.batch)
            runs.append({"system": name, "overrides": " ".join(overrides), "dec": dec, "wall": 0.0, "tokens": 0,
                         "blocks": 0, "accepted": 0, "outputs": [], "decode": []})
    groups = [prompts[i:i + args.batch] for i in range(0, len(prompts) - args.batch + 1, args.batch)]
    if not groups:
        raise SystemExit(f"--batch {args.batch} needs at least that many prompts (--prompts {len(prompts)})")
    _log(f"{len(runs)} decoders; {len(groups)} groups of {args.batch} prompts x {args.max_new_tokens} tokens, "
         f"interleaved")
    for g, group in enumerate(groups):
        reqs = [Request(g * args.batch + i, p, max_new_tokens=args.max_new_tokens) for i, p in enumerate(group)]
        for r in runs:
            results, wall, decode_s, decode_tokens = timed_generate(r["dec"], reqs)
            for res in results:
                if res.error:
                    raise SystemExit(f"{r['system']}: {res.error}")
                r["tokens"] += len(res.output_ids)
                r["blocks"] += res.blocks
                r["accepted"] += res.accepted_tokens
                r["outputs"].append(list(res.output_ids))
            r["wall"] += wall
            r["decode"].append((decode_tokens, decode_s))
    rows, ar_ms = [], None
    ar_run = next((r for r in runs if r["system"] == "ar"), None)
    rng = np.random.default_rng(args.seed)

    def rate(d: np.ndarray) -> float:  # d (n, 2): per prompt (tokens, seconds) -> pooled tokens/s
        return float(d[:, 0].sum() / max(d[:, 1].sum(), 1e-9))

    for r in runs:
        stages = {k.removesuffix("_ms"): round(v, 2) for k, v in r["dec"].timers.summary(r["blocks"]).items()}
        if r["system"] == "ar" and ar_ms is None:
            ar_ms = stages["per_block"]
        row = {"system": r["system"], "overrides": r["overrides"], "tok_s": round(r["tokens"] / r["wall"], 2),
               "wall_ms_per_block": round(1e3 * r["wall"] / r["blocks"], 2), "tau": round(1 + r["accepted"] / r["blocks"], 3),
               "stage_ms_per_block": stages, "backend": r["dec"].backend_plan.record(),
               "equal_to_first": sum(a == b for a, b in zip(r["outputs"], runs[0]["outputs"]))}
        if ar_ms:
            row["block_over_ar_step"] = round(stages["per_block"] / ar_ms, 3)
        mine = np.array(r["decode"], dtype=np.float64)
        row["decode_tok_s"] = round(rate(mine), 2)
        if ar_run is not None:
            both = np.concatenate([mine, np.array(ar_run["decode"], dtype=np.float64)], 1)
            lo, hi = interval(both, speed_ratio, rng)
            row["speedup"] = round(speed_ratio(both), 3)
            row["speedup_ci95"] = [round(lo, 3), round(hi, 3)]
        rows.append(row)
        _log(f"{row['system']:9s} {row['overrides'] or 'default':36s} {row['tok_s']:5.1f} tok/s, decode "
             f"{row['decode_tok_s']:5.1f} tok/s" + (f" ({row['speedup']:.3f}x AR {row['speedup_ci95']})" if "speedup" in row
                                                    else "") + f", τ {row['tau']:.3f}, "
             f"block {stages['per_block']:.1f} ms" + (f" = {row['block_over_ar_step']:.2f} AR steps" if ar_ms else "")
             + f", {stages}")
    res = {"bench": "stages", "benchmark": args.benchmark or "mt-bench", "overrides": args.overrides,
           "prompts": len(groups) * args.batch, "batch": args.batch, "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
           "max_new_tokens": args.max_new_tokens, "threads": args.threads,
           "rows": rows}
    return json_line(res)
