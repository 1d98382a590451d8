"""CUDA graphs of our target forward, one per batch-size bucket (1/2/4/8/16/32) and step length.

A graph is captured once per (bucket, T) at start-up over the whole cache capacity (static shapes:
kv_len = capacity, masks from the cache's per-row lengths, RoPE from a pre-built table), so a light
load replays the smallest bucket that holds its rows instead of paying for full capacity. Replays
take the tokens of rows 0..n-1 and return their logits. Capture failures raise: a benchmark that asks
for graphs must not silently time the eager forward. Optionally the per-layer function is compiled
first (torch.compile, static shapes), then captured.
"""

from __future__ import annotations

import torch

from .kv_cache import KVCache
from .target_forward import TargetForward

BUCKETS = (1, 2, 4, 8, 16, 32)


def bucket_for(n: int, buckets=BUCKETS) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} rows exceed the largest CUDA-graph bucket ({buckets[-1]})")


class ForwardGraphs:
    def __init__(self, target: TargetForward, cache: KVCache, steps=(1,), buckets=BUCKETS, warmup: int = 2):
        if target.device.type != "cuda":
            raise RuntimeError("ForwardGraphs needs a CUDA target (CUDA graphs)")
        self.target, self.cache = target, cache
        self.buckets = tuple(b for b in buckets if b <= cache.max_batch)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        target.rope.ensure(cache.capacity)
        saved = cache.lens.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for t in steps:
                for b in self.buckets:
                    tokens = torch.zeros(b, t, dtype=torch.long, device=target.device)
                    for _ in range(warmup):  # compile / allocate outside the capture
                        target(tokens, cache, slice(0, b), cache.capacity, want_captured=False)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                        logits = target(tokens, cache, slice(0, b), cache.capacity, want_captured=False).logits
                    self.graphs[(b, t)] = (graph, tokens, logits)
        torch.cuda.current_stream().wait_stream(stream)
        cache.lens.copy_(saved)  # the warm-up writes lie beyond every row's length: nothing committed

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (n, T) for cache rows 0..n-1 -> logits (n, T, V) (a view into the graph's output)."""
        n, t = tokens.shape
        graph, static_tokens, logits = self.graphs[(bucket_for(n, self.buckets), t)]
        static_tokens[:n].copy_(tokens)
        graph.replay()
        return logits[:n]
