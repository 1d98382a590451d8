"""One-row matrix-vector product on CPU as a compiled reduction (beside its reference, `F.linear`).

Why: batch-1 decoding is a chain of GEMVs (one row times every weight), so its speed is the memory
bandwidth the GEMV reaches. MKL's fp32 GEMV behind `F.linear` runs single-threaded at ~11 GB/s on the
2-core development machine (measured; the same with 1 or 2 threads), while `(x * W).sum(-1)` compiled by
TorchInductor becomes one fused, vectorised, OpenMP-parallel reduction over the weight's rows that reads
it at 2-4x that (`python jobs/bench.py gemv`). Only the one-row case gains: at 2+ rows the generated loop
reads the weight once per row.
The engine's batch-1 step uses it for the LM head (through kernels/linear.Projection); each layer's GEMVs
are fused with the rest of the layer into one compiled call (lilicorr/engine/one_row_layer.py). At 2+ rows
the projection takes oneDNN on a prepacked weight instead (kernels/packed_linear.py).

The sum runs in another order than MKL's (fp32, ~1e-5 relative), like every fused op of our forward;
greedy output is checked against transformers' by the engine tests. One compilation with dynamic shapes
serves every weight shape (~5 s the first time in a process, less from Inductor's on-disk cache).
If Inductor cannot compile here (no C++ compiler), `gemv` warns once and uses F.linear; `gemv(strict=
True)` (the benchmarks) raises instead.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from lilicorr.kernels.compiled import Compiled


def gemv_reference(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x (1, in), weight (out, in) -> (1, out): what the compiled GEMV must equal."""
    return F.linear(x, weight, bias)


def gemv_sum(x: Tensor, weight: Tensor) -> Tensor:
    # (1, 1, in) * (1, out, in) -> sum over in: Inductor fuses the product into the reduction (no (out, in)
    # temporary) and splits the out rows over the threads.
    return (x[:, None, :] * weight[None]).sum(-1)


_COMPILED = Compiled("compiled CPU GEMV", "F.linear", gemv_sum, dynamic=True)


def gemv(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, strict: bool = False) -> Tensor:
    """x (1, in) fp32 CPU, weight (out, in) -> (1, out) through the compiled reduction."""
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"gemv takes one row (1, in), got {tuple(x.shape)}")
    y = _COMPILED(x, weight, strict=strict)
    if y is None:  # Inductor cannot compile here (warned once)
        return F.linear(x, weight, bias)
    return y if bias is None else y + bias


# Below ~1 MB a weight is cache-resident and F.linear beats the compiled call, whose guards and wrapper cost more
# than the GEMV saves (figures: docs/results.md; `jobs/bench.py gemv`).
# Tiny targets (tests) thus skip Dynamo, whose guard checks also grow with every shape it has compiled in a process.
MIN_ELEMENTS = 1 << 18


def gemv_eligible(x: Tensor, weight: Tensor) -> bool:
    """Whether x (..., in) is one fp32 CPU row for the compiled GEMV and `weight` large enough to pay for the call
    (inference only: training keeps autograd's F.linear). kernels/linear.Projection takes this path when its
    caller asks for `fast_gemv`."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.numel() == x.shape[-1] and weight.numel() >= MIN_ELEMENTS and not torch.is_grad_enabled())
