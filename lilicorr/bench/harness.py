"""What the benchmarks share, written once: their stderr log, device syncs and a median timing, the prompts they
decode, an engine sized and warmed up for them, outputs cut at a stop token, and the JSON line each prints last.

A benchmark's figures are its own; these only make the steps around them the same everywhere.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Callable

import torch


def logger(name: str) -> Callable[[str], None]:
    """A benchmark's progress line on stderr, `[bench NAME] ...`: stdout keeps only its result."""

    def log(msg: str) -> None:
        print(f"[bench {name}] {msg}", file=sys.stderr, flush=True)

    return log


def sync(device) -> None:
    """Wait for the device's queued work (CUDA); nothing to wait for on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def median_s(fn: Callable[[], object], reps: int, device="cpu", warmup: int = 1) -> float:
    """Median seconds of `reps` calls of fn after `warmup` untimed ones (compiles, allocations, caches), each call
    synced so that the device's time is counted, not only the launch."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def mt_bench_prompt_ids(tokenizer, n: int) -> list[list[int]]:
    """The first n MT-Bench first turns as chat prompt ids (fewer where the set has fewer)."""
    from lilicorr.platform.benchmark_prompts import benchmark_prompts
    from lilicorr.platform.chat import prompt_ids

    rows = benchmark_prompts("mt-bench")[:n]
    return [prompt_ids(tokenizer, (r.get("messages") or [{"role": "user", "content": r.get("prompt", "")}])[:1], False)
            for r in rows]


def bench_prompts(tokenizer, n: int, vocab: int) -> list[list[int]]:
    """The CPU benchmarks' prompts: MT-Bench first turns, or, without a tokenizer or the prompt set, n random token
    prompts of 40, 47, 54, ... tokens (seeded: every run times the same ones)."""
    if tokenizer is not None:
        try:
            out = mt_bench_prompt_ids(tokenizer, n)
            if out:
                return out
        except Exception as e:
            logger("prompts")(f"MT-Bench prompts unavailable ({e}); using random token prompts")
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (40 + 7 * i,), generator=g).tolist() for i in range(n)]


def load_bench_target(preset: str, overrides: list[str], threads: int):
    """(cfg, model, tokenizer, stop ids) of the preset's real target, torch set to `threads` intra-op threads: how
    every benchmark that decodes it starts."""
    from lilicorr.config import load_config
    from lilicorr.platform.assets import eos_token_ids, load_target

    torch.set_num_threads(threads)
    cfg = load_config(preset, overrides)
    model, tok = load_target(cfg.target)
    return cfg, model, tok, eos_token_ids(cfg.target, tok)


def size_engine(cfg, prompts, max_new: int, slack: int) -> None:
    """cfg.engine sized for `prompts` x `max_new` new tokens: the static caches hold the longest prompt, its tokens
    and `slack` more positions."""
    cfg.engine.max_new_tokens = max_new
    cfg.engine.max_seq_len = max(len(p) for p in prompts) + max_new + slack


def warm_up(dec, prompt: list[int], tokens: int = 4) -> None:
    """One short request before the timed ones: first calls build, compile and allocate."""
    from lilicorr.engine.requests import Request

    dec.generate([Request("warmup", prompt, max_new_tokens=tokens)])


def cut_at_stop(ids: list[int], stops: set) -> list[int]:
    """ids up to and including the first stop token: how outputs that run on past a stop are compared."""
    for i, t in enumerate(ids):
        if t in stops:
            return ids[:i + 1]
    return ids


def json_line(res: dict, load_average: bool = True) -> dict:
    """Prints the result as the benchmark's last stdout line, one JSON object, and returns it. load_average: the
    machine's 1/5/15-minute load added last, since on a shared machine wall-clock figures depend on the others."""
    if load_average:
        res["load_average"] = list(os.getloadavg())
    print(json.dumps(res))
    return res
