"""Qwen3-style decoder layers for the DFlash drafter: RMSNorm, attention with q_norm/k_norm and RoPE, SwiGLU.
With `qk_norm=False` the layer is Llama's (no q/k norms), so a Llama target's layers copy in exactly.

Module names follow the public DFlash release (`self_attn.q_proj`, `mlp.gate_proj`, `input_layernorm`, ...)
so its safetensors load by name, and so do a Llama/Qwen3 target's own layers (`init="target_top"`).
The fused target context enters every layer as extra keys/values in front of the block's own; queries
come only from block tokens. One `forward` serves training (many blocks, dense boolean mask) and
inference (one block per sequence, cached context K/V), which is what keeps the two forms identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lilicorr.models.norm_rope import apply_rope, rms_norm, rope_cos_sin

__all__ = ["DrafterShape", "RMSNorm", "DrafterAttention", "DrafterMLP", "DrafterLayer", "apply_rope", "rope_cos_sin"]


@dataclass
class DrafterShape:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    num_layers: int
    num_captured: int
    qk_norm: bool = True  # Qwen3 (and the public DFlash drafters) have q/k norms, Llama does not


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class DrafterAttention(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden_size, s.num_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=False)
        # Identity keeps the module names (and no parameters) when the layout has no q/k norms.
        self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps) if s.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps) if s.qk_norm else nn.Identity()

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor):
        """x (C, T, H) at `positions` (C, T) -> k, v (C, n_kv, T, hd); k normed and rotated."""
        C, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(C, T, self.s.num_kv_heads, self.s.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(C, T, self.s.num_kv_heads, self.s.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.s.head_dim, self.s.rope_theta, k.dtype)
        return apply_rope(k, cos, sin), v

    def forward(self, x, positions, ctx_k, ctx_v, mask):
        """x (C, Q, H) block tokens; ctx_k/v (C, n_kv, Tc, hd); mask (C, Q, Tc + Q) bool, True = attend."""
        C, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(C, Q, self.s.num_heads, self.s.head_dim)).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.s.head_dim, self.s.rope_theta, q.dtype)
        q = apply_rope(q, cos, sin)
        k_blk, v_blk = self.project_kv(x, positions)
        k = torch.cat([ctx_k, k_blk], dim=2)  # (C, n_kv, Tc + Q, hd)
        v = torch.cat([ctx_v, v_blk], dim=2)
        groups = self.s.num_heads // self.s.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])  # (C, heads, Q, hd)
        return self.o_proj(out.transpose(1, 2).reshape(C, Q, -1))


class DrafterMLP(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.self_attn = DrafterAttention(s)
        self.mlp = DrafterMLP(s)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, x, positions, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
