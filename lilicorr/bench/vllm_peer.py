"""vLLM as a peer (not a test): `python jobs/bench.py vllm [--prompts 12 --max-new-tokens 64 ...]`.

The same held-out prompts (MT-Bench first turns: the shipped drafters trained on ShareGPT), the same target
(the embedded SmolLM2-135M, fp32) and the same drafter (the shipped DFlash export, written in the z-lab layout
by models/export.py; num_speculative_tokens = block - 1), greedy, through our engine and through vLLM's CPU
build. vLLM runs in .venv-vllm (`make vllm-env`) as a subprocess (vllm_side.py), so this venv never imports it,
and after ours, so the two never share the 2 cores. The reference is transformers' greedy `generate`.

Last stdout line, one JSON object: per engine, per-prompt τ, τ overall (1 + accepted / blocks), tok/s of AR
and DFlash at batch 1 and with every prompt batched, and how many outputs equal the target's greedy output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from lilicorr.bench.harness import (bench_prompts, cut_at_stop, json_line, load_bench_target, logger, size_engine,
                                    warm_up)

REPO = Path(__file__).resolve().parents[2]
SIDE = Path(__file__).with_name("vllm_side.py")
_log = logger("vllm")


def ours(cfg, model, system: str, checkpoint, prompts, max_new: int, stops, batch: int) -> dict:
    """Our engine: batch 1 (one request at a time, per-prompt τ) and all prompts batched, after a warm-up."""
    from lilicorr.engine.requests import Request
    from lilicorr.engine.systems import build_decoder

    size_engine(cfg, prompts, max_new, slack=16)
    cfg.engine.temperature = 0.0
    out: dict = {}
    for label, rows in (("batch1", 1), ("batched", batch)):
        dec = build_decoder(cfg, model, system, checkpoint=checkpoint, stop_ids=stops, max_batch=rows)
        warm_up(dec, prompts[0])
        t0 = time.perf_counter()
        if rows == 1:
            res = [dec.generate([Request(i, p, max_new_tokens=max_new)])[0] for i, p in enumerate(prompts)]
        else:
            res = dec.generate([Request(i, p, max_new_tokens=max_new) for i, p in enumerate(prompts)])
        wall = time.perf_counter() - t0
        outs = [cut_at_stop(list(r.output_ids), set(stops)) for r in res]
        blocks, acc = sum(r.blocks for r in res), sum(r.accepted_tokens for r in res)
        got = {"tok_s": sum(map(len, outs)) / wall, "outputs": outs, "wall_s": wall}
        if system != "ar":
            got.update({"tau": 1 + acc / blocks if blocks else None, "blocks": blocks, "accepted": acc,
                        "per_prompt_tau": [1 + r.accepted_tokens / r.blocks if r.blocks else None for r in res],
                        "per_prompt_blocks": [r.blocks for r in res]})
        out[label] = got
    return out


def _ours_systems(cfg, model, checkpoint, prompts, max_new: int, stops) -> dict:
    """Our AR and DFlash, each at batch 1 and with every prompt batched: {ar_batch1: {...}, ...}."""
    mine = {}
    for system in ("ar", "dflash"):
        got = ours(cfg, model, system, checkpoint if system != "ar" else None, prompts, max_new, stops, len(prompts))
        mine.update({f"{system}_{k}": v for k, v in got.items()})
        _log(f"ours {system}: {_rates(got)}")
    return mine


def theirs(vllm_python: str, spec: dict, timeout_s: int, script: Path = SIDE) -> dict:
    """Run a vLLM-side `script` (vllm_side.py, regen_vllm_side.py) on `spec` in .venv-vllm: its last JSON line."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    proc = subprocess.run([vllm_python, str(script), f.name], capture_output=True, text=True, timeout=timeout_s,
                          env=env, cwd=tempfile.gettempdir())
    os.unlink(f.name)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        # vLLM's engine process prints the root cause first and the parent's tracebacks after it: keep it all
        log = Path(tempfile.gettempdir()) / f"lilicorr-vllm-side-{os.getpid()}.log"
        log.write_text(f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        raise RuntimeError(f"vLLM side failed (exit {proc.returncode}); its whole output: {log}. "
                           f"Last lines: {proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def _rates(runs: dict) -> str:
    return ", ".join(f"{name} {r['tok_s']:.1f} tok/s" for name, r in runs.items())


def _per_run(runs: dict, ref: list[list[int]], stops) -> dict:
    """{<run>_tok_s, <run>_equal_greedy (outputs equal to the reference)} for every run."""
    s: dict = {}
    for name, r in runs.items():
        s[f"{name}_tok_s"] = round(r["tok_s"], 2)
        s[f"{name}_equal_greedy"] = sum(cut_at_stop(o, set(stops)) == g for o, g in zip(r["outputs"], ref))
    return s


def _summary(runs: dict, ref: list[list[int]], stops) -> dict:
    """{ar_batch1_tok_s, ..., dflash_tau, dflash_per_prompt_tau, outputs equal to the reference per run}."""
    s = _per_run(runs, ref, stops)
    d = runs["dflash_batch1"]
    s.update({"dflash_tau": d.get("tau"), "dflash_blocks": d.get("blocks"), "dflash_accepted": d.get("accepted"),
              "dflash_per_prompt_tau": [None if t is None else round(t, 3) for t in d.get("per_prompt_tau", [])],
              "dflash_per_prompt_blocks": d.get("per_prompt_blocks"), "dflash_batched_tau": runs["dflash_batched"].get("tau")})
    return s


def main(argv: list[str] | None = None) -> dict:
    from lilicorr.config import load_config
    from lilicorr.models.export import read_export, write_zlab
    from lilicorr.platform.assets import smollm2_dir
    from lilicorr.bench.measure import hf_generate_tps
    from lilicorr.platform.shipped import shipped_checkpoint

    ap = argparse.ArgumentParser(prog="bench.py vllm", description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--checkpoint", default=None, help="our DFlash export (default: the shipped one)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of our engine")
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--timeout", type=int, default=1800, help="seconds for the vLLM side")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for our engine, e.g. engine.cpu_prepack=false (repeatable)")
    ap.add_argument("--baseline", default="", metavar="KEY=VALUE[,KEY=VALUE]",
                    help="also run our engine with these overrides in the same run (e.g. engine.cpu_prepack=false: "
                         "the MKL path), reported as ours_baseline")
    ap.add_argument("--draft-tokens", default="", metavar="K[,K]",
                    help="also run our DFlash (with --lilicorr our LiLiCorr too) verifying only the first K drafts "
                         "of each block (engine.draft_tokens)")
    ap.add_argument("--skip-vllm", action="store_true", help="our engine only (no .venv-vllm needed)")
    ap.add_argument("--lilicorr", action="store_true",
                    help="also our engine with the shipped LiLiCorr drafter (vLLM has no LiLiCorr head)")
    ap.add_argument("--ddtree", action="store_true",
                    help="also our engine's DDTree over the same DFlash drafter (engine.ddtree_*; vLLM has no DDTree)")
    args = ap.parse_args(argv)
    if not args.skip_vllm and not Path(args.vllm_python).exists():
        raise SystemExit(f"no {args.vllm_python}: build the vLLM environment first (make vllm-env)")
    cfg, model, tok, stops = load_bench_target("smollm2-135m", args.set, args.threads)
    baseline_cfg = load_config("smollm2-135m", args.set + [o for o in args.baseline.split(",") if o])
    draft_ks = [int(k) for k in args.draft_tokens.split(",") if k]
    checkpoint = args.checkpoint or shipped_checkpoint("smollm2-135m", "dflash")
    prompts = bench_prompts(tok, args.prompts, model.config.vocab_size)
    zdir = Path(tempfile.mkdtemp(prefix="lilicorr-zlab-"))
    ex = read_export(checkpoint)
    warnings = write_zlab(ex, zdir, model.config, stops, model.get_output_embeddings().weight)
    _log(f"{len(prompts)} prompts x {args.max_new_tokens}; drafter {checkpoint} -> z-lab layout {zdir}")

    _, ref = hf_generate_tps(model, prompts, args.max_new_tokens, stops)  # the target's greedy output
    extra: dict = {}
    for system, wanted, ckpt in [("lilicorr", args.lilicorr, shipped_checkpoint("smollm2-135m", "lilicorr")),
                                 ("ddtree", args.ddtree, checkpoint)]:
        if wanted:
            got = ours(cfg, model, system, ckpt, prompts, args.max_new_tokens, stops, len(prompts))
            extra[f"ours_{system}"] = {"tau": got["batch1"]["tau"], "batched_tau": got["batched"]["tau"],
                                       **_per_run(got, ref, stops)}
            _log(f"ours {system}: {_rates(got)}")
    mine = _ours_systems(cfg, model, checkpoint, prompts, args.max_new_tokens, stops)
    if args.baseline:
        _log(f"ours with {args.baseline}")
        extra["ours_baseline"] = {"overrides": args.baseline, **_summary(
            _ours_systems(baseline_cfg, model, checkpoint, prompts, args.max_new_tokens, stops), ref, stops)}
    cut = [("dflash", checkpoint, "ours_draft_tokens")]  # with --lilicorr its drafter at each K too, side by side
    if args.lilicorr:
        cut.append(("lilicorr", shipped_checkpoint("smollm2-135m", "lilicorr"), "ours_lilicorr_draft_tokens"))
    for k in draft_ks:
        cfg.engine.draft_tokens = k
        for system, ckpt, key in cut:
            got = ours(cfg, model, system, ckpt, prompts, args.max_new_tokens, stops, len(prompts))
            extra.setdefault(key, {})[str(k)] = {"tau": got["batch1"]["tau"], **_per_run(got, ref, stops)}
            _log(f"ours {system}, draft_tokens {k}: {_rates(got)}")
    cfg.engine.draft_tokens = 0
    res = {"bench": "vllm", "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "target": cfg.target.source,
           "dtype": "float32", "drafter": str(checkpoint), "block_size": ex.cfg.drafter.block_size,
           "threads": args.threads, "overrides": args.set, "export_warnings": len(warnings),
           "ours": _summary(mine, ref, stops), **extra, "load_average": list(os.getloadavg())}
    if args.skip_vllm:
        return json_line(res, load_average=False)  # already in res
    spec = {"target": str(smollm2_dir()), "drafter": str(zdir), "num_speculative_tokens": ex.cfg.drafter.block_size - 1,
            "prompts": prompts, "max_new_tokens": args.max_new_tokens, "dtype": "float32",
            "max_model_len": max(map(len, prompts)) + args.max_new_tokens + 16,
            "architectures": list(getattr(model.config, "architectures", None) or ["LlamaForCausalLM"])}
    vl = theirs(args.vllm_python, spec, args.timeout)
    vruns = {k: v for k, v in vl.items() if isinstance(v, dict)}
    res.update({"vllm_version": vl.get("vllm_version"), "vllm": _summary(vruns, ref, stops),
                "vllm_startup_s": {k: round(v, 1) for k, v in vl.items() if k.endswith("startup_s")},
                "load_average": list(os.getloadavg())})
    a, b = res["ours"]["dflash_per_prompt_tau"], res["vllm"]["dflash_per_prompt_tau"]
    res["per_prompt_tau_equal"] = sum(x == y for x, y in zip(a, b))
    # τ counts a length-capped request's last block differently: we never draft past max_new_tokens (that block
    # commits its bonus token), vLLM drafts anyway and counts the accepted draft instead; the target passes
    # (blocks) per prompt are the engine-neutral figure.
    a, b = res["ours"]["dflash_per_prompt_blocks"], res["vllm"]["dflash_per_prompt_blocks"]
    res["per_prompt_blocks_equal"] = sum(x == y for x, y in zip(a, b))
    return json_line(res, load_average=False)  # already in res
