"""One-row matrix-vector product on CPU as a compiled reduction (beside its reference, `F.linear`).

Why: batch-1 decoding is a chain of GEMVs (one row times every weight), so its speed is the memory
bandwidth the GEMV reaches. MKL's fp32 GEMV behind `F.linear` runs single-threaded at ~11 GB/s on the
2-core development machine (measured; the same with 1 or 2 threads), while `(x * W).sum(-1)` compiled by
TorchInductor becomes one fused, vectorised, OpenMP-parallel reduction over the weight's rows that reads
it at 2-4x that (`python jobs/bench.py gemv`). Only the one-row case gains: at 2+ rows the generated loop
reads the weight once per row, and MKL's GEMM is as fast or faster, so `linear` keeps F.linear there.

The sum runs in another order than MKL's (fp32, ~1e-5 relative), like every fused op of our forward;
greedy output is checked against transformers' by the engine tests. One compilation with dynamic shapes
serves every weight shape (~5 s the first time in a process, less from Inductor's on-disk cache).
If Inductor cannot compile here (no C++ compiler), `linear` warns once and uses F.linear; `gemv(strict=
True)` (the benchmarks) raises instead.
"""

from __future__ import annotations

import threading
import warnings
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def gemv_reference(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x (1, in), weight (out, in) -> (1, out): what the compiled GEMV must equal."""
    return F.linear(x, weight, bias)


def _gemv_sum(x: Tensor, weight: Tensor) -> Tensor:
    # (1, 1, in) * (1, out, in) -> sum over in: Inductor fuses the product into the reduction (no (out, in)
    # temporary) and splits the out rows over the threads.
    return (x[:, None, :] * weight[None]).sum(-1)


def _norm_gemv_sum(x: Tensor, norm_weight: Tensor, eps: Tensor, weight: Tensor) -> Tensor:
    # RMSNorm (statistics in fp32, as HF's) fused in front of the GEMV: one call instead of two in a decode step
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
    return (h[:, None, :] * weight[None]).sum(-1)


def _glu_gemv_sum(gate_up: Tensor, weight: Tensor) -> Tensor:
    # SwiGLU's silu(gate) * up fused in front of the down projection's GEMV
    gate, up = gate_up.chunk(2, dim=-1)
    return ((F.silu(gate) * up)[:, None, :] * weight[None]).sum(-1)


_compiled: dict[str, Callable] = {}
_failed: Optional[str] = None  # why compiling failed (then F.linear is used)
_lock = threading.Lock()  # the engine may run in a server thread; compile once
_FUNCTIONS = {"gemv": _gemv_sum, "norm_gemv": _norm_gemv_sum, "glu_gemv": _glu_gemv_sum}


def _compiled_fn(name: str = "gemv") -> Callable:
    with _lock:
        if name not in _compiled:
            # A process that decodes several models (tests, an evaluation grid) meets shape relations that
            # force a few recompiles (e.g. a square weight duck-sizes out == in); past Dynamo's limit a
            # fullgraph function fails and `gemv` falls back to F.linear, so leave room for them.
            cfg = torch._dynamo.config
            cfg.recompile_limit = max(cfg.recompile_limit, 64)
            cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4096)  # all regions together
            _compiled[name] = torch.compile(_FUNCTIONS[name], dynamic=True, fullgraph=True)
        return _compiled[name]


def _compiled_gemv() -> Callable:
    return _compiled_fn("gemv")


def compiled_gemv_works() -> bool:
    """Whether Inductor compiles the GEMVs here (tried once per process on a tiny shape; warns if not)."""
    if _failed is None:
        with torch.no_grad():
            x, w = torch.ones(1, 4), torch.ones(3, 4)
            gemv(x, w)
            if _failed is None:
                try:
                    norm_gemv(x, torch.ones(4), 1e-6, w)
                    glu_gemv(torch.ones(1, 8), w)
                except Exception as e:  # noqa: BLE001 - as in gemv
                    _fail(e)
    return _failed is None


def _fail(e: Exception) -> None:
    global _failed
    _failed = f"{type(e).__name__}: {e}"[:300]
    warnings.warn(f"compiled CPU GEMV unavailable ({_failed}); using F.linear", RuntimeWarning)


def gemv(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, strict: bool = False) -> Tensor:
    """x (1, in) fp32 CPU, weight (out, in) -> (1, out) through the compiled reduction."""
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"gemv takes one row (1, in), got {tuple(x.shape)}")
    if _failed is not None and not strict:
        return F.linear(x, weight, bias)
    try:
        y = _compiled_gemv()(x, weight)
    except Exception as e:  # noqa: BLE001 - Inductor's failures have many types (no compiler, codegen)
        if strict:
            raise
        _fail(e)
        return F.linear(x, weight, bias)
    return y if bias is None else y + bias


_EPS: dict[float, Tensor] = {}


def norm_gemv(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor) -> Tensor:
    """rms_norm(x) * norm_weight, then the GEMV: x (1, in) -> (1, out) in one compiled call."""
    # eps as a 0-d tensor: a Python float would be a constant of the graph, one recompile per model's eps
    eps_t = _EPS.setdefault(float(eps), torch.tensor(float(eps)))
    return _compiled_fn("norm_gemv")(x, norm_weight, eps_t, weight)


def glu_gemv(gate_up: Tensor, weight: Tensor) -> Tensor:
    """silu(gate) * up (gate_up = [gate | up], (1, 2 I)), then the GEMV with weight (out, I): one compiled call."""
    return _compiled_fn("glu_gemv")(gate_up, weight)


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, fast_gemv: bool = False) -> Tensor:
    """F.linear, except a single fp32 CPU row with `fast_gemv` goes through the compiled GEMV.

    x (..., in) -> (..., out); the leading dims are flattened to count the rows.
    """
    if (fast_gemv and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.numel() == x.shape[-1] and not torch.is_grad_enabled()):
        return gemv(x.reshape(1, -1), weight, bias).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)
