"""Measurements that take a model and prompts (no asset loading, no CLI: see bench/engine.py).

  engine_tps(cfg, model, prompts, max_new, stop_ids, system)  our decoder's tokens/s and outputs
  forward_costs(model, prompt, block)                          ms of a 1-token and a block-token target forward
  copy_bandwidth()                                             device copy bandwidth, bytes/s (CUDA)
  bandwidth_fraction(cfg, model, prompt, max_new)              AR tok/s at batch 1 vs weights bytes / bandwidth
"""

from __future__ import annotations

import statistics
import time

import torch

from lilicorr.bench.harness import size_engine, sync, warm_up
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder
from lilicorr.engine.target_forward import TargetForward


def engine_tps(cfg, model, prompts, max_new: int, stop_ids, system: str = "ar") -> tuple[float, list[list[int]], dict]:
    """(tokens/s, outputs, stats dict) of `system` at batch 1 after one warm-up request. Sets cfg.engine lengths."""
    size_engine(cfg, prompts, max_new, slack=8)
    dec = build_decoder(cfg, model, system, stop_ids=stop_ids, max_batch=1)
    warm_up(dec, prompts[0])
    dec.stats.__init__(block_size=dec.block)
    res = dec.generate([Request(i, p) for i, p in enumerate(prompts)])
    return dec.stats.tokens_per_s, [r.output_ids for r in res], dec.stats.as_dict()


def forward_costs(model, prompt: list[int], block: int = 16, reps: int = 10, prepack=None,
                  script_layers: bool = True) -> dict:
    """Median ms of our target forward for 1 token and for a `block`-token chain over a short cache.
    prepack: TargetForward's (None = packed oneDNN weights wherever they apply, False = MKL);
    script_layers=False: the eager layers for the block (engine.cpu_script_layers=false)."""
    tf = TargetForward(model, prepack=prepack)
    tf.script_layers = tf.script_layers and script_layers
    dev = tf.device
    cache = tf.new_cache(1, len(prompt) + block + 8)
    ids = torch.tensor([prompt], device=dev)
    tf(ids, cache, slice(0, 1), kv_len=len(prompt))
    cache.set_length(0, len(prompt))
    out = {}
    for t in (1, block):
        toks = torch.randint(0, tf.vocab_size, (1, t), device=dev)
        times = []
        for _ in range(reps + 2):
            sync(dev)
            t0 = time.perf_counter()
            tf(toks, cache, slice(0, 1), kv_len=len(prompt) + t)  # lens unchanged: the same step again
            sync(dev)
            times.append((time.perf_counter() - t0) * 1e3)
        out[f"forward_{t}_ms"] = statistics.median(times[2:])
    out[f"verify{block}_over_ar_step"] = out[f"forward_{block}_ms"] / out["forward_1_ms"]
    return out


def copy_bandwidth(gib: int = 2, reps: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write), CUDA only."""
    x = torch.empty(gib * 1024 ** 3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    torch.cuda.synchronize()
    bw = 2 * x.numel() * reps / (time.perf_counter() - t0)
    del x, y
    return bw


def bandwidth_fraction(cfg, model, prompt: list[int], max_new: int = 128) -> dict:
    """AR tok/s at batch 1 on `model` (on CUDA) vs the limit weights bytes / copy bandwidth."""
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = copy_bandwidth()
    tps, _, _ = engine_tps(cfg, model, [prompt], max_new, stop_ids=[])
    limit = bw / weight_bytes
    return {"gpu_weights_gb": weight_bytes / 1e9, "gpu_copy_bandwidth_tb_s": bw / 1e12,
            "gpu_ar_limit_tok_s": limit, "gpu_ar_tok_s": tps, "gpu_ar_fraction_of_limit": tps / limit}
