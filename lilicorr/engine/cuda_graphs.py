"""CUDA graphs for the two fixed-shape parts of a step: the target's verify pass and the drafter's
backbone + LM head. UNTESTED ON A GPU (written without one); the CPU path never imports this module.

Shapes are static: every slot of the batch, a block of `decoder.block` nodes, attention over the whole
cache capacity (masked by per-row lengths, which the graphs read from the cache's own `lens` tensor,
updated in place between replays). Inputs are copied into static buffers before each replay; nothing
inside a replay synchronizes with the host. Capture happens lazily at first use; if it fails the
decoder falls back to eager execution for that part, with a warning. `graphed_target_step` is the same
wrapper around one target pass, for the GPU bench (lilicorr/bench/gpu_decode.py), where a failed capture raises.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch


class _Graph:
    def __init__(self, fn: Callable[[], object], capture: bool = True):
        self.fn = fn
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.out = None
        self.failed = not capture  # capture=False: same static shapes, run eagerly (CPU tests)

    def __call__(self):
        if self.failed:
            return self.fn()
        if self.graph is None:
            try:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm up kernels and allocator outside the graph
                        self.fn()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.out = self.fn()
                self.graph = graph
            except Exception as e:  # noqa: BLE001 - any capture problem: run eagerly instead
                warnings.warn(f"CUDA graph capture failed, running eagerly: {e}")
                self.failed = True
                return self.fn()
        self.graph.replay()
        return self.out


def graphed_target_step(target, cache, tokens: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """step(x (1, T)) -> logits (1, T, V): our target's pass of T = `tokens` new tokens for cache row 0 over the
    whole cache capacity, captured now (static shapes, as the engine's verify graph). Raises if the capture fails:
    a benchmark that asks for a graph must not time the eager forward. The pass leaves cache.lens as it was."""
    static = torch.zeros(1, tokens, dtype=torch.long, device=target.device)
    target.rope.ensure(cache.capacity)
    graph = _Graph(lambda: target(static, cache, slice(0, 1), cache.capacity, want_captured=False).logits)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph()
    if graph.failed or graph.graph is None:
        raise RuntimeError(f"CUDA graph capture of a {tokens}-token target step failed: "
                           + "; ".join(str(w.message) for w in caught)[:500])

    def step(x: torch.Tensor) -> torch.Tensor:
        static.copy_(x)
        return graph()

    return step


class GraphedSteps:
    """Replays the runner's public `target_pass` and `draft_backbone` + `draft_logits` with static shapes.

    capture=False runs the same static-shape functions eagerly: the CPU tests use it to check the
    static path (all slots, full-capacity attention, static buffers) gives the same tokens."""

    def __init__(self, runner, capture: bool = True):
        self.runner = runner
        c, n = runner.max_batch, runner.block
        dev = runner.device
        self.rows = slice(0, c)
        self.tokens = torch.zeros(c, n, dtype=torch.long, device=dev)  # (C, N) static verify input
        self.anchor = torch.zeros(c, dtype=torch.long, device=dev)  # (C,) static draft input
        self._verify = _Graph(self._verify_fn, capture)
        self._draft = _Graph(self._draft_fn, capture) if runner.drafting is not None else None

    def _verify_fn(self):
        r = self.runner
        return r.target_pass(self.tokens, self.rows, r.cache.capacity)

    def verify(self, tokens: torch.Tensor):
        self.tokens.copy_(tokens)
        return self._verify()

    def _draft_fn(self):
        r = self.runner
        lens = r.cache.lens[self.rows]  # read in place: the cache's own tensor, updated between replays
        slot_hidden = r.draft_backbone(self.rows, self.anchor, lens, r.cache.capacity)
        return slot_hidden, r.draft_logits(slot_hidden)

    def draft_backbone(self, anchor: torch.Tensor):
        """(slot_hidden (C, S, H), slot_logits (C, S, V)) for every slot, replayed from the graph."""
        self.anchor.copy_(anchor)
        return self._draft()
