"""Rotary position embeddings of Llama-family and Qwen3 models, scaled variants included (YaRN).

`rope_parameters(config)` reads a Hugging Face config (transformers 4.x `rope_theta` + `rope_scaling`,
or 5.x `rope_parameters`) and returns the inverse frequencies and the cos/sin scale exactly as
transformers computes them for rope types "default", "linear", "llama3" and "yarn" (Qwen3's long-context
setting). `inv_freq_for(...)` does the same from plain numbers, for modules (the drafter) that carry a
theta and a scaling dict rather than an HF config. `RopeTable` caches cos/sin for positions 0..n-1 so a
step looks its positions up instead of recomputing them (values identical to computing them per step).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from lilicorr.models.norm_rope import apply_rope, cos_sin  # the shared math (models/norm_rope.py)
from lilicorr.models.rope_config import rope_scaling_of

__all__ = ["RopeTable", "apply_rope", "cos_sin", "inv_freq_for", "rope_parameters"]

SUPPORTED = ("default", "linear", "llama3", "yarn")


def rope_parameters(config) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim/2,) fp32, attention scaling of cos/sin) for an HF model config."""
    theta, scaling = rope_scaling_of(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    partial = (scaling or {}).get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    if float(partial) != 1.0:
        raise ValueError(f"partial_rotary_factor={partial} is not supported (rotary over the whole head only)")
    return inv_freq_for(theta, head_dim, scaling, getattr(config, "max_position_embeddings", None))


def inv_freq_for(theta: float, head_dim: int, scaling: Optional[dict] = None,
                 max_position_embeddings: Optional[int] = None) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention scaling) for RoPE base `theta` over `head_dim`, with an HF-style scaling dict."""
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind not in SUPPORTED:
        raise ValueError(f"rope type {kind!r} is not supported; supported: {', '.join(SUPPORTED)}")
    dim = head_dim
    base = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    inv_freq = 1.0 / (theta ** base)
    if kind == "default":
        return inv_freq, 1.0
    s = scaling
    if kind == "linear":
        return inv_freq / s["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, s), 1.0
    return _yarn(theta, dim, s, max_position_embeddings)


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, out)


def _yarn(theta: float, dim: int, s: dict, max_position_embeddings: Optional[int]) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071) exactly as transformers' `_compute_yarn_parameters`."""
    original = s.get("original_max_position_embeddings")
    if original is None:
        raise ValueError("yarn rope scaling needs original_max_position_embeddings")
    factor = s.get("factor")
    if factor is None:
        if not max_position_embeddings:
            raise ValueError("yarn rope scaling needs factor (or max_position_embeddings)")
        factor = max_position_embeddings / original
    attention = s.get("attention_factor")
    mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention is None:
        attention = (float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all)) if mscale and mscale_all
                     else get_mscale(factor))
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extra_factor = 1 - ramp
    return interpolation * (1 - extra_factor) + extrapolation * extra_factor, float(attention)


class RopeTable:
    """cos and signed sin for positions 0..n-1 in one (n, 2, head_dim) table of the compute dtype.

    `lookup(positions)` -> cos, sin_signed (..., head_dim) where sin_signed = (-sin, sin) halves, so that
    rope(x) = x * cos + x.roll(head_dim/2) * sin_signed: the same products as `apply_rope` (a sign flip
    is exact) with fewer operations.
    """

    def __init__(self, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype, device):
        self.inv_freq, self.scale, self.dtype, self.device = inv_freq.float(), float(scale), dtype, device
        self.table = torch.empty(0, 2, 2 * inv_freq.numel(), dtype=dtype, device=device)

    def ensure(self, n: int) -> None:
        """Cover positions < n (call before CUDA-graph capture; lookups never grow the table)."""
        if n <= self.table.shape[0]:
            return
        n = max(n, 2 * self.table.shape[0], 256)
        cos, sin = cos_sin(torch.arange(n, device=self.device), self.inv_freq, self.scale)
        half = sin.shape[-1] // 2
        signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        self.table = torch.stack((cos.to(self.dtype), signed.to(self.dtype)), dim=1)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        both = self.table[positions]  # (..., 2, hd)
        return both[..., 0, :], both[..., 1, :]
