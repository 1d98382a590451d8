"""One linear projection of the engine's forward and the CPU kernel each call takes.

  one fp32 CPU row, `fast_gemv`     -> the compiled GEMV (kernels/gemv.py): batch-1 decoding is bandwidth-bound
  more rows, a packed weight        -> oneDNN on the prepacked weight (kernels/packed_linear.py): verification,
                                       batched decoding, prefill, the drafter's block
  anything else (CUDA, bf16, grad)  -> F.linear
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from .gemv import gemv_eligible, gemv
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

    def __call__(self, x: Tensor, fast_gemv: bool = False) -> Tensor:
        """x (..., in) -> (..., out)."""
        if fast_gemv and gemv_eligible(x, self.weight):
            return gemv(x.reshape(1, -1), self.weight, self.bias).view(*x.shape[:-1], self.out_features)
        if usable(x, self.packed):
            return packed_linear(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)
