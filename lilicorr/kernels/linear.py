"""One linear projection of the engine's forward and the CPU kernel each call takes.

  2+ rows, a packed weight   -> oneDNN on the prepacked weight (kernels/packed_linear.py): verification, batched
                                decoding, prefill, the drafter's block
  one row, a packed weight   -> the packed weight if `one_row_packed` (engine.cpu_one_row: which of the two is
                                faster at one row depends on the host's MKL, so the engine measures it when a
                                decoder is built: `time_one_row`), else F.linear (MKL's GEMV)
  anything else              -> F.linear: no packed copy, CUDA, bf16, grad
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .packed_linear import PackedWeight, packed_linear, usable, worth_packing


@dataclass
class Projection:
    weight: Tensor  # (out, in), the plain tensor (a view of the Hugging Face parameter for the target)
    bias: Optional[Tensor] = None  # (out,)
    packed: Optional[PackedWeight] = None  # oneDNN's copy (engine.cpu_prepack), None = MKL for 2+ rows
    one_row_packed: bool = False  # one-row calls multiply by `packed` too (engine.cpu_one_row), not F.linear

    @classmethod
    def of(cls, weight: Tensor, bias: Optional[Tensor] = None, prepack: bool = False,
           one_row_packed: bool = False) -> "Projection":
        packed = PackedWeight.shared(weight) if prepack and worth_packing(weight) else None
        return cls(weight, bias, packed, one_row_packed and packed is not None)

    def packed_for(self, rows: int) -> Optional[Tensor]:
        """The packed copy a call on `rows` rows multiplies by (the scripted stack passes it to linear_on), or None
        for F.linear: no packed copy, or one row without `one_row_packed`."""
        return None if self.packed is None or (rows < 2 and not self.one_row_packed) else self.packed.packed()

    def __call__(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out)."""
        if (self.one_row_packed or x.numel() > x.shape[-1]) and usable(x, self.packed):
            return packed_linear(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)


@torch.no_grad()
def time_one_row(weights: Sequence[Tensor], repeats: int = 7) -> tuple[float, float, int]:
    """Seconds one row takes through every weight (out, in) of `weights`, on F.linear (the plain weights) and on
    their packed copies: (plain, packed, weights timed), each time the median of `repeats` passes, the two
    interleaved so that both meet the same machine. Weights that would not be packed (worth_packing) are left out."""
    weights = [w for w in weights if worth_packing(w)]
    if not weights:
        return 0.0, 0.0, 0
    packed = [PackedWeight.shared(w) for w in weights]
    xs = [torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights]

    def plain_pass():
        for w, x in zip(weights, xs):
            F.linear(x, w)

    def packed_pass():
        for p, x in zip(packed, xs):
            packed_linear(x, p)

    times: dict = {plain_pass: [], packed_pass: []}
    for i in range(repeats + 1):  # the first pass of each warms caches and oneDNN's kernels: not counted
        for fn in (plain_pass, packed_pass) if i % 2 == 0 else (packed_pass, plain_pass):
            start = time.perf_counter()
            fn()
            if i:
                times[fn].append(time.perf_counter() - start)
    return statistics.median(times[plain_pass]), statistics.median(times[packed_pass]), len(weights)
