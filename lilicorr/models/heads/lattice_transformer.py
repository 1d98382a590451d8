"""The bidirectional Transformer over LiLiCorr's (S x K) candidate lattice (Appendix A).

Pre-norm layers (RMSNorm), multi-head attention over every node of the lattice at once, a SiLU
feed-forward. Position enters attention through two biases learned per head and added to the logits:
one indexed by the signed slot distance of a pair (2S - 1 values), one for pairs sharing a slot.
The paper leaves open whether the biases are per layer or shared by all layers; `shared_bias` picks vLLM's
and SGLang's choice (one pair of tables read by every layer), False ours before (a pair per layer).
"""

from __future__ import annotations

import warnings

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
    def __init__(self, width: int, num_heads: int, ffn_width: int, num_slots: int, eps: float = 1e-6,
                 own_bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.attn_norm = RMSNorm(width, eps)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        if own_bias:  # else the LatticeTransformer's shared tables are passed in
            self.bias = LatticeAttentionBias(num_slots, num_heads)
        self.ffn_norm = RMSNorm(width, eps)
        self.ffn_in = nn.Linear(width, ffn_width)
        self.ffn_out = nn.Linear(ffn_width, width)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        """x (C, S*K, W), bias (heads, S*K, S*K) -> (C, S*K, W)."""
        C, N, W = x.shape
        q, kk, v = self.qkv(self.attn_norm(x)).view(C, N, 3, self.num_heads, W // self.num_heads).permute(2, 0, 3, 1, 4)
        bias = bias.to(q.dtype)[None]  # (1, heads, N, N)
        att = F.scaled_dot_product_attention(q, kk, v, attn_mask=bias)  # (C, heads, N, hd)
        x = x + self.proj(att.transpose(1, 2).reshape(C, N, W))
        return x + self.ffn_out(F.silu(self.ffn_in(self.ffn_norm(x))))


class LatticeTransformer(nn.Module):
    def __init__(self, width: int, num_heads: int, ffn_width: int, num_layers: int, num_slots: int,
                 shared_bias: bool = False, eps: float = 1e-6):
        super().__init__()
        if width % num_heads:
            raise ValueError(f"head width {width} is not divisible by {num_heads} heads")
        self.shared_bias = shared_bias
        if shared_bias:
            self.bias = LatticeAttentionBias(num_slots, num_heads)
        self.layers = nn.ModuleList([LatticeLayer(width, num_heads, ffn_width, num_slots, eps, own_bias=not shared_bias)
                                     for _ in range(num_layers)])
        self.norm = RMSNorm(width, eps)
        self.register_load_state_dict_pre_hook(_bias_tables_as_built)

    def layer_biases(self) -> list[LatticeAttentionBias]:
        """The attention-bias tables each layer reads, in layer order (the same module repeated when shared)."""
        return [self.bias if self.shared_bias else layer.bias for layer in self.layers]

    def forward(self, nodes: Tensor) -> Tensor:
        """nodes (C, S, K, W) -> (C, S, K, W)."""
        C, S, K, W = nodes.shape
        x = nodes.reshape(C, S * K, W)
        shared = self.bias(S, K) if self.shared_bias else None  # (heads, S*K, S*K), once for every layer
        for layer in self.layers:
            x = layer(x, shared if shared is not None else layer.bias(S, K))
        return self.norm(x).view(C, S, K, W)


_TABLES = ("slot_distance", "same_slot")


def _bias_tables_as_built(module: LatticeTransformer, state: dict, prefix: str, *_args) -> None:
    """Load-time hook: bias tables written the other way (per layer / shared) are turned into this lattice's.
    Shared -> per layer copies the one table to every layer (exact). Per layer -> shared takes the mean, exact when
    the tables are equal (vLLM's layout read back writes every layer the same) and otherwise a model not trained as
    such, said in a warning: that is how a per-layer head is continued as a shared one (train.init_from)."""
    per_layer = [f"{prefix}layers.{i}.bias." for i in range(len(module.layers))]
    shared = f"{prefix}bias."
    if module.shared_bias and all(p + _TABLES[0] in state for p in per_layer) and shared + _TABLES[0] not in state:
        tables = {n: [state.pop(p + n) for p in per_layer] for n in _TABLES}
        if any(not torch.equal(t[0], u) for t in tables.values() for u in t[1:]):
            warnings.warn(f"{prefix or 'the head'}: loading per-layer lattice attention biases into one shared table "
                          "(head.lilicorr_slot_bias=shared) by their mean: not the model as trained")
        for n, t in tables.items():
            state[shared + n] = torch.stack([u.float() for u in t]).mean(0).to(t[0].dtype)
    elif not module.shared_bias and shared + _TABLES[0] in state and not any(p + _TABLES[0] in state for p in per_layer):
        for n in _TABLES:
            table = state.pop(shared + n)
            for p in per_layer:
                state[p + n] = table.clone()
