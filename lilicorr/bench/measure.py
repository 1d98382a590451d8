"""Measurements that take a model and prompts (no asset loading, no CLI: see bench/engine.py): our decoder and
transformers' `generate` at batch 1 and batched (the regeneration path), the target forward's cost, the device's
copy bandwidth. The batched pair returns (tokens/s wall, tokens per process-CPU-second, outputs cut after the
first stop id): the CPU figure is the one to read on a shared machine, where wall time mostly measures the others.
"""

from __future__ import annotations

import time

import torch

from lilicorr.bench.harness import cut_at_stop, median_s, size_engine, sync, warm_up
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder
from lilicorr.engine.target_forward import TargetForward
from lilicorr.platform.evaluate.cells import hf_generate


def engine_tps(cfg, model, prompts, max_new: int, stop_ids, system: str = "ar") -> tuple[float, list[list[int]], dict]:
    """(tokens/s, outputs, stats dict) of `system` at batch 1 after one warm-up request. Sets cfg.engine lengths."""
    size_engine(cfg, prompts, max_new, slack=8)
    dec = build_decoder(cfg, model, system, stop_ids=stop_ids, max_batch=1)
    warm_up(dec, prompts[0])
    dec.stats.__init__(block_size=dec.block)
    res = dec.generate([Request(i, p) for i, p in enumerate(prompts)])
    return dec.stats.tokens_per_s, [r.output_ids for r in res], dec.stats.as_dict()


def hf_generate_tps(model, prompts, max_new: int, stop_ids) -> tuple[float, list[list[int]]]:
    """The transformers baseline: greedy `generate` at batch 1, (tokens/s, outputs)."""
    outs, wall = hf_generate(model, prompts, max_new, stop_ids)
    return sum(map(len, outs)) / wall, outs


def _timed(fn, dev):
    """(fn's result, wall seconds, process CPU seconds)."""
    sync(dev)
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    sync(dev)
    return out, time.perf_counter() - w, time.process_time() - c


def engine_batch_tps(cfg, model, prompts, max_new: int, stop_ids, batch: int) -> tuple[float, float, list[list[int]]]:
    """Our AR decoder, `batch` rows at once, after one warm-up request."""
    size_engine(cfg, prompts, max_new, slack=8)
    cfg.engine.temperature = 0.0
    dec = build_decoder(cfg, model, "ar", stop_ids=stop_ids, max_batch=batch)
    warm_up(dec, prompts[0])
    res, wall, cpu = _timed(lambda: dec.generate([Request(i, p, max_new_tokens=max_new)
                                                  for i, p in enumerate(prompts)]), dec.runner.device)
    outs = [cut_at_stop(list(r.output_ids), set(stop_ids)) for r in res]
    n = sum(len(o) for o in outs)
    return n / wall, n / max(cpu, 1e-9), outs


def hf_batch_tps(model, prompts, max_new: int, stop_ids, batch: int) -> tuple[float, float, list[list[int]]]:
    """transformers' `generate` on left-padded batches of `batch` prompts, after one short warm-up call."""
    dev = next(model.parameters()).device
    with torch.inference_mode():  # warm-up, as for ours
        model.generate(torch.tensor([prompts[0]], device=dev), max_new_tokens=4, do_sample=False,
                       pad_token_id=0, temperature=None, top_p=None, top_k=None)
    outs, wall, cpu = _timed(lambda: hf_generate(model, prompts, max_new, stop_ids, batch=batch)[0], dev)
    n = sum(len(o) for o in outs)
    return n / wall, n / max(cpu, 1e-9), outs


def forward_costs(model, prompt: list[int], block: int = 16, reps: int = 10, prepack=None,
                  script_layers: bool = True) -> dict:
    """Median ms of our target forward for 1 token and for a `block`-token chain over a short cache.
    prepack: TargetForward's (None = packed oneDNN weights wherever they apply, False = MKL);
    script_layers=False: the eager layers for the block (engine.cpu_script_layers=false)."""
    tf = TargetForward(model, prepack=prepack)
    tf.script_layers = tf.script_layers and script_layers
    dev = tf.device
    cache = tf.new_cache(1, len(prompt) + block + 8)
    tf(torch.tensor([prompt], device=dev), cache, slice(0, 1), kv_len=len(prompt))
    cache.set_length(0, len(prompt))
    out = {}
    for t in (1, block):
        toks = torch.randint(0, tf.vocab_size, (1, t), device=dev)
        # the same step again each call: the cache's lengths are left unchanged
        out[f"forward_{t}_ms"] = 1e3 * median_s(lambda: tf(toks, cache, slice(0, 1), kv_len=len(prompt) + t), reps,
                                                dev, warmup=2)
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
