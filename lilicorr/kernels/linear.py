"""One linear projection of the engine's forward and the CPU kernel each call takes.

  2+ rows, a packed weight   -> oneDNN on the prepacked weight (kernels/packed_linear.py): verification, batched
                                decoding, prefill, the drafter's block
  anything else              -> F.linear: one row (batch-1 decoding: MKL's GEMV measured faster there than the
                                packed weight, docs/results.md), CUDA, bf16, grad
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from .packed_linear import PackedWeight, packed_linear, usable, worth_packing


@dataclass
class Projection:
    weight: Tensor  # (out, in), the plain tensor (a view of the Hugging Face parameter for the target)
    bias: Optional[Tensor] = None  # (out,)
    packed: Optional[PackedWeight] = None  # oneDNN's copy (engine.cpu_prepack), None = MKL for 2+ rows

    @classmethod
    def of(cls, weight: Tensor, bias: Optional[Tensor] = None, prepack: bool = False) -> "Projection":
        return cls(weight, bias, PackedWeight.shared(weight) if prepack and worth_packing(weight) else None)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def packed_for(self, rows: int) -> Optional[Tensor]:
        """The packed copy a call on `rows` rows multiplies by (the scripted stack passes it to linear_on), or None
        for F.linear: no packed copy, or one row."""
        return None if self.packed is None or rows < 2 else self.packed.packed()

    def __call__(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out)."""
        if x.numel() > x.shape[-1] and usable(x, self.packed):
            return packed_linear(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)
