"""fp32 CPU linear layers through oneDNN with the weight packed once (beside its reference, `F.linear`).

Why: a multi-token pass (speculative verification of a block, batched decoding, the drafter's block) is a
chain of GEMMs with M = 2-200 rows, and on this machine's CPU (AMD EPYC, AVX-512) MKL's fp32 GEMM behind
`F.linear` runs those well below what the memory allows, while oneDNN with the weight already in its blocked layout
reads the weight much faster (MKL's time also jumps from M = 1 to 2, so one row keeps MKL's GEMV: kernels/linear.py;
`python jobs/bench.py gemv` times MKL and the packed weight side by side at one row, and bf16 F.linear vs packed;
the figures: docs/results.md, "CPU fast paths").
oneDNN's own JIT picks the AVX-512 kernel on any x86 vendor; reordering the weight once (here) instead of
on every call is what makes it pay at small M. The same prepacking is what Inductor's CPU freezing pass and
vLLM's CPU backend do.

Memory: the packed copy is as large as the weight (the plain tensor stays: the Hugging Face module, one-row
steps and training read it). `engine.cpu_prepack=false` keeps MKL and the memory.

The sums run in another order than MKL's (fp32, ~1e-6 relative), like every fused op of the forward;
greedy output is checked against transformers' by the engine tests.
"""

from __future__ import annotations

import functools
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

# Rows oneDNN tunes the packed layout for: among 1, 8, 16 and none, 8 measured as fast as any from 1 to 16 rows
# and at prefill sizes (docs/results.md).
ROWS_HINT = 8
# Below ~1 MB a weight is cache-resident and oneDNN's per-call cost outweighs what packing saves (the LiLiCorr
# head's layers ran faster on MKL; the target's and the drafter's from 576 x 576 on faster packed: docs/results.md).
MIN_ELEMENTS = 1 << 18


def worth_packing(weight: Tensor) -> bool:
    """Whether packing `weight` pays: packable and at least MIN_ELEMENTS (1 MB of fp32)."""
    return can_pack(weight) and weight.numel() >= MIN_ELEMENTS


def packs_for_drafter(weight: Tensor) -> bool:
    """The engine's rule for the drafter's projections: an fp32 weight worth packing (the target's rule), a bf16 one
    (engine.cpu_drafter_bf16) of any size where the CPU has bf16 instructions: unpacked bf16 F.linear lost to the
    packed weight at every SmolLM2 shape, the drafter's k/v projections (192 x 576) included (`python jobs/bench.py
    gemv`; the figures: docs/results.md, "CPU fast paths")."""
    return worth_packing(weight) or (weight.dtype == torch.bfloat16 and can_pack(weight, bf16=True))


def can_pack(weight: Tensor, bf16: bool = False) -> bool:
    """Whether `weight` (out, in) can be packed: an fp32 CPU matrix and a PyTorch built with oneDNN; with
    bf16=True also a bf16 one where this CPU has bf16 instructions (the engine's bf16 drafter,
    engine.cpu_drafter_bf16: at 1-16 rows oneDNN's bf16 GEMM reads half the bytes, faster than fp32 here:
    docs/results.md, "CPU fast paths")."""
    if weight.dim() != 2 or weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return weight.dtype == torch.float32 or (bf16 and weight.dtype == torch.bfloat16 and bf16_supported())


@functools.lru_cache(maxsize=None)
def bf16_supported() -> bool:
    """Whether oneDNN runs bf16 GEMMs natively on this CPU (AVX512-BF16 or AMX), not by emulation; asked once
    (usable() checks it on every packed call)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedWeight:
    """The oneDNN-packed copy of a plain (out, in) weight, re-packed if the weight changed since: in place
    (a load_state_dict or an optimizer step bump its version counter) or its storage was swapped (module.to
    sets `.data`): never stale, never silently wrong."""

    def __init__(self, weight: Tensor):
        if not can_pack(weight, bf16=True):
            raise ValueError(f"cannot pack a {weight.dtype} {tuple(weight.shape)} weight on {weight.device} "
                             f"(fp32 or, with CPU support, bf16 CPU matrices only, with oneDNN)")
        self.weight = weight
        self._key: tuple = ()
        self._packed: Optional[Tensor] = None

    def packed(self) -> Tensor:
        w = self.weight
        key = (w._version, w.data_ptr(), w.dtype)
        if key != self._key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), ROWS_HINT)
            self._key = key
        return self._packed

    @classmethod
    def shared(cls, weight: Tensor) -> "PackedWeight":
        """The packed copy of `weight`'s memory, one per process: the systems a server runs side by side on
        one target (lilicorr, dflash, ar) share it instead of packing it once each. Keyed by where the
        tensor's data lives (the PackedWeight holds the tensor, so that memory is not reused while it lives)."""
        key = (weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype)
        found = _SHARED.get(key)
        if found is None:
            found = _SHARED[key] = cls(weight)
        return found


_SHARED: "weakref.WeakValueDictionary[tuple, PackedWeight]" = weakref.WeakValueDictionary()


def packed_linear(x: Tensor, weight: PackedWeight, bias: Optional[Tensor] = None) -> Tensor:
    """x (..., in) CPU, the weight's dtype -> (..., out), = F.linear(x, weight.weight, bias) up to summation order."""
    return linear_on(x, weight.weight, weight.packed(), bias)


def linear_on(x: Tensor, weight: Tensor, packed: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
    """x @ weight.T + bias through oneDNN on `packed` (PackedWeight.packed() of weight) if given, else F.linear.
    TorchScript-compatible: the scripted layer stack (engine/scripted_stack.py) calls it."""
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


def usable(x: Tensor, weight: Optional[PackedWeight]) -> bool:
    """Whether a call on x may take the packed path: inference on CPU rows of the weight's dtype (fp32, or bf16
    for a weight packed as bf16; autograd needs F.linear)."""
    return (weight is not None and x.dtype == weight.weight.dtype and x.device.type == "cpu" and x.numel() > 0
            and can_pack(weight.weight, bf16=True)
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.weight.requires_grad)))
