"""Engine benchmark (not a test): `python jobs/bench.py engine [--prompts 6 --max-new-tokens 128 ...]`.

One run, the same prompts for every measurement:
  1. our AR decoder tok/s vs transformers greedy `generate` (batch 1), and whether outputs agree;
  2. the cost of verifying a 16-token block relative to one AR step (target forward over a short cache);
  3. on a GPU: AR tok/s at batch 1 on the Qwen3-8B shape (random bf16 weights) as a fraction of the
     bandwidth limit, weights bytes / device copy bandwidth.
CPU default: the embedded SmolLM2-135M when `lilicorr.platform.assets.load_target` can load it, else a
random model of its shape (30 layers, hidden 576, 9/3 heads, intermediate 1536, vocab 49152).
The last stdout line is one JSON object with every figure. The measurements live in lilicorr.bench.measure.
"""

from __future__ import annotations

import argparse

import torch

from lilicorr.bench.gpu_decode import QWEN3_8B
from lilicorr.bench.harness import bench_prompts, json_line, logger
from lilicorr.bench.measure import (copy_bandwidth, engine_batch_tps, engine_tps, forward_costs, hf_batch_tps,
                                     hf_generate_tps)
from lilicorr.config import load_config

SMOLLM2_SHAPE = ["target.source=random", "target.num_layers=30", "target.hidden_size=576", "target.num_heads=9",
                 "target.num_kv_heads=3", "target.head_dim=64", "target.intermediate_size=1536",
                 "target.vocab_size=49152", "target.rope_theta=100000"]
_log = logger("engine")


def load_cpu_target(preset: str, random_shape: bool):
    """(cfg, model, tokenizer or None, label)."""
    if not random_shape:
        try:
            from lilicorr.platform.assets import load_target

            cfg = load_config(preset)
            model, tok = load_target(cfg.target)
            return cfg, model, tok, cfg.target.source
        except Exception as e:  # asset not installed: fall back to the shape
            _log(f"load_target failed ({e}); using a random model of SmolLM2's shape")
    cfg = load_config(preset, SMOLLM2_SHAPE)
    from lilicorr.models.target import build_random_target

    return cfg, build_random_target(cfg.target), None, "random SmolLM2-135M shape"


def gpu_bandwidth_fraction(max_new: int = 128) -> dict:
    """AR tok/s at batch 1 on the Qwen3-8B shape (random bf16 weights) vs the bandwidth limit (CUDA only)."""
    from lilicorr.models.target import build_random_target

    cfg = load_config("qwen3-8b", QWEN3_8B)  # the GPU bench's shape
    with torch.device("cuda"):
        model = build_random_target(cfg.target)
    prompt = torch.randint(0, cfg.target.vocab_size, (512,)).tolist()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = copy_bandwidth()
    tps, _, _ = engine_tps(cfg, model, [prompt], max_new, stop_ids=[])
    limit = bw / weight_bytes
    return {"gpu_weights_gb": weight_bytes / 1e9, "gpu_copy_bandwidth_tb_s": bw / 1e12,
            "gpu_ar_limit_tok_s": limit, "gpu_ar_tok_s": tps, "gpu_ar_fraction_of_limit": tps / limit}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="bench.py engine", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--random-shape", action="store_true", help="skip load_target; random SmolLM2-shaped weights")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--systems", default="", help="also time these speculative systems with a random drafter, e.g. dflash,lilicorr")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    ap.add_argument("--skip-gpu", action="store_true")
    ap.add_argument("--batch", default="0", help="also compare batched AR (the regeneration path) with "
                    "transformers' batched generate on this many prompts decoded together; several: 16,32 (0 = skip)")
    ap.add_argument("--batch-only", action="store_true", help="only the batched comparison (--batch)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="weights and activations of both ours and transformers' (bf16: the regeneration option "
                         "target.dtype=bfloat16; CPUs with AVX512-BF16/AMX run its GEMMs 2-3x faster)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, model, tok, label = load_cpu_target(args.preset, args.random_shape)
    model = model.to(getattr(torch, args.dtype)).eval()
    cfg.target.dtype = args.dtype
    stop_ids = [] if tok is None else [tok.convert_tokens_to_ids(tok.eos_token)]
    prompts = bench_prompts(tok, args.prompts, model.config.vocab_size)
    _log(f"target: {label}; {len(prompts)} prompts x {args.max_new_tokens} new tokens; threads {torch.get_num_threads()}")
    res: dict = {"target": label, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                 "threads": torch.get_num_threads(), "dtype": args.dtype}
    if not args.batch_only:
        single_row(res, cfg, model, prompts, args.max_new_tokens, stop_ids)
    batches = [int(b) for b in str(args.batch).split(",") if int(b) > 0]
    for b in batches:  # one size: flat keys as before; several: one entry per size
        got = batch_comparison(cfg, model, tok, b, args.max_new_tokens, stop_ids)
        if len(batches) == 1:
            res.update(got)
        else:
            res[f"batch_{b}"] = got
    for system in [s for s in args.systems.split(",") if s]:
        tps, _, stats = engine_tps(cfg, model, prompts, args.max_new_tokens, stop_ids, system=system)
        res[f"{system}_random_drafter_tok_s"] = tps
        res[f"{system}_random_drafter_tau"] = stats["tau"]
        _log(f"{system} (random drafter): {tps:.1f} tok/s, tau {stats['tau']:.2f}")
    if torch.cuda.is_available() and not args.skip_gpu:
        res.update(gpu_bandwidth_fraction())
    else:
        res["gpu"] = "no CUDA device: the Qwen3-8B bandwidth figure was not measured"
    return json_line(res)


def single_row(res: dict, cfg, model, prompts, max_new: int, stop_ids) -> None:
    """Batch-1 figures into res: forward costs, our AR (and with MKL's GEMV), transformers' generate."""
    res.update(forward_costs(model, prompts[0]))
    _log(f"forward 1 token {res['forward_1_ms']:.1f} ms, 16 tokens {res['forward_16_ms']:.1f} ms "
         f"(verify16 / AR step = {res['verify16_over_ar_step']:.2f})")
    if not torch.cuda.is_available():  # the same forward with the eager layers, and with MKL for 2+ rows
        for suffix, kw, what in (("eager", {"script_layers": False}, "the eager layers (engine.cpu_script_layers=false)"),
                                 ("mkl", {"prepack": False}, "MKL for 2+ rows (engine.cpu_prepack=false)")):
            other = forward_costs(model, prompts[0], **kw)
            res.update({f"{k}_{suffix}": v for k, v in other.items()})
            _log(f"  with {what}: 16 tokens {other['forward_16_ms']:.1f} ms "
                 f"(verify16 / AR step = {other['verify16_over_ar_step']:.2f})")
    ours, our_out, _ = engine_tps(cfg, model, prompts, max_new, stop_ids)
    _log(f"engine AR: {ours:.1f} tok/s")
    theirs, hf_out = hf_generate_tps(model, prompts, max_new, stop_ids)
    _log(f"transformers generate: {theirs:.1f} tok/s")
    res.update({"engine_ar_tok_s": ours, "hf_generate_tok_s": theirs, "engine_over_hf": ours / theirs,
                "outputs_identical": sum(a == b for a, b in zip(our_out, hf_out))})


def batch_comparison(cfg, model, tok, batch: int, max_new: int, stop_ids) -> dict:
    """Batched greedy AR, ours vs transformers, on the same `batch` prompts (tok/s wall and per CPU-second)."""
    prompts = bench_prompts(tok, batch, model.config.vocab_size)
    ew, ec, ours = engine_batch_tps(cfg, model, prompts, max_new, stop_ids, batch)
    _log(f"engine batched AR (batch {batch}): {ew:.1f} tok/s ({ec:.1f} per CPU-second)")
    mkl = {}
    for key, name in (("cpu_script_layers", "eager"), ("cpu_prepack", "mkl")):  # side by side: each CPU lever off
        if getattr(cfg.engine, key) and not torch.cuda.is_available():
            setattr(cfg.engine, key, False)
            mw, _, mkl_out = engine_batch_tps(cfg, model, prompts, max_new, stop_ids, batch)
            setattr(cfg.engine, key, True)
            _log(f"engine batched AR with engine.{key}=false: {mw:.1f} tok/s")
            mkl.update({f"engine_batch_{name}_tok_s": mw,
                        f"{name}_outputs_identical": sum(a == b for a, b in zip(ours, mkl_out))})
    hw, hc, theirs = hf_batch_tps(model, prompts, max_new, stop_ids, batch)
    _log(f"transformers batched generate (batch {batch}): {hw:.1f} tok/s ({hc:.1f} per CPU-second)")
    return {"batch": batch, "engine_batch_tok_s": ew, "engine_batch_tok_per_cpu_s": ec, "hf_batch_tok_s": hw,
            "hf_batch_tok_per_cpu_s": hc, "engine_batch_over_hf": ew / hw,
            "batch_outputs_identical": sum(a == b for a, b in zip(ours, theirs)), **mkl}
