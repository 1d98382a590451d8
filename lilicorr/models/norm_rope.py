"""RMSNorm and rotary position embeddings as plain tensor functions: the one copy every model here runs.

The target's forward (engine/layer.py, engine/rope.py), the drafter's modules (drafter_layers.py) and its scripted
form (drafter_fast.py) import these, so a change to the math is one edit and the scripted and eager forms cannot
drift apart. TorchScript compiles them where a scripted
function calls them (type annotations kept for it). Transformers' op order exactly: bf16 rounding amplifies
any reordering, and the engine's greedy output is checked against transformers' token for token.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Transformers' RMSNorm: statistics in fp32, cast back to x's dtype before the weight."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def cos_sin(positions: Tensor, inv_freq: Tensor, scale: float) -> Tuple[Tensor, Tensor]:
    """fp32 cos, sin (..., head_dim) at `positions`, as transformers' rotary embedding computes them."""
    freqs = positions[..., None].float() * inv_freq.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scale, emb.sin() * scale


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Default (unscaled) RoPE tables at absolute `positions` (C, T) -> cos, sin (C, 1, T, head_dim) in dtype."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
                                / head_dim))
    cos, sin = cos_sin(positions, inv_freq, 1.0)
    return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (..., head_dim) rotated with transformers' `rotate_half` convention (cos/sin broadcast to x)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
