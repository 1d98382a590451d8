"""The bidirectional Transformer over LiLiCorr's (S x K) candidate lattice (Appendix A).

Pre-norm layers (RMSNorm), multi-head attention over every node of the lattice at once, a SiLU
feed-forward. Position enters attention through two biases learned per head and added to the logits:
one indexed by the signed slot distance of a pair (2S - 1 values), one for pairs sharing a slot.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lilicorr.models.drafter_layers import RMSNorm


class LatticeAttentionBias(nn.Module):
    def __init__(self, num_slots: int, num_heads: int):
        super().__init__()
        self.num_slots = num_slots
        self.slot_distance = nn.Parameter(torch.zeros(num_heads, 2 * num_slots - 1))
        self.same_slot = nn.Parameter(torch.zeros(num_heads))

    def forward(self, num_slots: int, k: int) -> Tensor:
        """-> (heads, S*K, S*K) additive bias; nodes are ordered slot-major (node = s*K + k)."""
        slot = torch.arange(num_slots, device=self.same_slot.device).repeat_interleave(k)  # (S*K,)
        dist = slot[None, :] - slot[:, None] + (self.num_slots - 1)  # signed j - i, shifted to >= 0
        same = (slot[None, :] == slot[:, None]).float()
        return self.slot_distance[:, dist] + self.same_slot[:, None, None] * same


class LatticeLayer(nn.Module):
    def __init__(self, width: int, num_heads: int, ffn_width: int, num_slots: int, eps: float = 1e-6):
        super().__init__()
        self.num_heads = num_heads
        self.attn_norm = RMSNorm(width, eps)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.bias = LatticeAttentionBias(num_slots, num_heads)
        self.ffn_norm = RMSNorm(width, eps)
        self.ffn_in = nn.Linear(width, ffn_width)
        self.ffn_out = nn.Linear(ffn_width, width)

    def forward(self, x: Tensor, num_slots: int, k: int) -> Tensor:
        """x (C, S*K, W) -> (C, S*K, W)."""
        C, N, W = x.shape
        q, kk, v = self.qkv(self.attn_norm(x)).view(C, N, 3, self.num_heads, W // self.num_heads).permute(2, 0, 3, 1, 4)
        bias = self.bias(num_slots, k).to(q.dtype)[None]  # (1, heads, N, N)
        att = F.scaled_dot_product_attention(q, kk, v, attn_mask=bias)  # (C, heads, N, hd)
        x = x + self.proj(att.transpose(1, 2).reshape(C, N, W))
        return x + self.ffn_out(F.silu(self.ffn_in(self.ffn_norm(x))))


class LatticeTransformer(nn.Module):
    def __init__(self, width: int, num_heads: int, ffn_width: int, num_layers: int, num_slots: int):
        super().__init__()
        if width % num_heads:
            raise ValueError(f"head width {width} is not divisible by {num_heads} heads")
        self.layers = nn.ModuleList([LatticeLayer(width, num_heads, ffn_width, num_slots) for _ in range(num_layers)])
        self.norm = RMSNorm(width)

    def forward(self, nodes: Tensor) -> Tensor:
        """nodes (C, S, K, W) -> (C, S, K, W)."""
        C, S, K, W = nodes.shape
        x = nodes.reshape(C, S * K, W)
        for layer in self.layers:
            x = layer(x, S, K)
        return self.norm(x).view(C, S, K, W)
