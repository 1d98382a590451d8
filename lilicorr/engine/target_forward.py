"""Our own forward of a Llama-family or Qwen3 target over a static KV cache (gpt-fast style).

Built from a Hugging Face model's weights (shared, except q/k/v and gate/up, which are fused into one
matrix each for fewer, larger matmuls). One call processes T new tokens per row at per-row offsets,
writes their keys/values into the cache, and returns their logits and the outputs of the captured
layers (the drafter's context). The attention mask is causal for a chain of new tokens, or any
(C, T, T) ancestor mask for a tree of candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import KVCache


@dataclass
class ForwardOut:
    logits: Optional[torch.Tensor]  # (C, T', V), T' = T or the selected positions
    captured: Optional[torch.Tensor]  # (C, T, n*H) outputs of the captured layers, concatenated


class _Layer(nn.Module):
    def __init__(self, hf_layer, qk_norm: bool):
        super().__init__()
        a, m = hf_layer.self_attn, hf_layer.mlp
        self.wqkv = nn.Parameter(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), requires_grad=False)
        biases = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
        self.bqkv = (nn.Parameter(torch.cat(biases), requires_grad=False) if biases[0] is not None else None)
        self.wo = a.o_proj.weight
        self.bo = a.o_proj.bias
        self.w_gate_up = nn.Parameter(torch.cat([m.gate_proj.weight, m.up_proj.weight]), requires_grad=False)
        self.w_down = m.down_proj.weight
        self.ln1, self.ln2 = hf_layer.input_layernorm.weight, hf_layer.post_attention_layernorm.weight
        self.q_norm = a.q_norm.weight if qk_norm else None
        self.k_norm = a.k_norm.weight if qk_norm else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm exactly: statistics in fp32, cast back before the weight."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def step_mask(lens: torch.Tensor, kv_len: int, t: int, tree_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """(C, 1, T, kv_len) bool: the cache before lens[row], plus the new nodes the mask allows.

    New node i sits at cache index lens + i; `tree_mask` (C, T, T) is None for a causal chain.
    """
    j = torch.arange(kv_len, device=lens.device)
    rel = j[None, None, :] - lens[:, None, None]  # (C, 1, kv_len) index relative to the first new node
    past = rel < 0
    if tree_mask is None:
        new = (rel >= 0) & (rel <= torch.arange(t, device=lens.device)[None, :, None])  # (C, T, kv_len)
    else:
        inside = (rel >= 0) & (rel < t)
        idx = rel.clamp(0, t - 1).expand(-1, t, -1)
        new = inside & tree_mask.gather(2, idx)
    return (past | new)[:, None]


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """q (C, nq, T, hd), k/v (C, nkv, S, hd) (views into the cache are fine), mask (C, 1, T, S) bool.

    GQA without repeating K/V: the g = nq / nkv query heads sharing a KV head are stacked along the
    query axis, so each KV head is read once. (On CPU, SDPA with enable_gqa on strided cache views
    was 10-70x slower than this for decode shapes.) Softmax in fp32, as HF's eager path does.
    """
    c, nq, t, hd = q.shape
    nkv, s = k.shape[1], k.shape[2]
    g = nq // nkv
    qg = q.reshape(c, nkv, g * t, hd)
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale  # (C, nkv, g*T, S)
    m = mask[:, :, None].expand(c, 1, g, t, s).reshape(c, 1, g * t, s)
    scores = scores.masked_fill(~m, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v).reshape(c, nq, t, hd)


class TargetForward(nn.Module):
    """The target's decoder stack with a static KV cache. Weights come from `hf_model` (not copied
    where avoidable); the HF module stays the owner of the embedding and LM head."""

    def __init__(self, hf_model, capture_ids: Optional[list[int]] = None):
        super().__init__()
        cfg = hf_model.config
        self.config = cfg
        arch = getattr(cfg, "model_type", "llama")
        if arch not in ("llama", "qwen3"):
            raise ValueError(f"target model_type {arch!r} not supported (llama-family or qwen3)")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise ValueError(f"target hidden_act {cfg.hidden_act!r} not supported (silu)")
        if arch == "qwen3" and getattr(cfg, "use_sliding_window", False):
            raise ValueError("qwen3 targets with use_sliding_window=True are not supported")
        self.qk_norm = arch == "qwen3"
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.hidden_size = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.eps = cfg.rms_norm_eps
        self.capture_ids = list(capture_ids or [])
        body = hf_model.model
        self.embed_weight = body.embed_tokens.weight  # (V, H)
        self.lm_head_weight = hf_model.get_output_embeddings().weight  # (V, H), tied or not
        self.norm_weight = body.norm.weight
        self.layers = nn.ModuleList(_Layer(layer, self.qk_norm) for layer in body.layers)
        self.num_layers = len(self.layers)
        # RoPE exactly as the HF model computes it (handles rope_type variants via its own init fn).
        rotary = body.rotary_emb
        self.register_buffer("inv_freq", rotary.inv_freq.detach().float().clone(), persistent=False)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.scaling = self.head_dim ** -0.5

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    def new_cache(self, max_batch: int, max_len: int, slack: int = 64) -> KVCache:
        return KVCache(self.num_layers, max_batch, self.num_kv_heads, max_len, self.head_dim, self.dtype,
                       self.device, slack=slack)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_weight)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head of the target on its last hidden states."""
        return F.linear(rms_norm(hidden, self.norm_weight, self.eps), self.lm_head_weight)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq  # (C, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale).to(dtype)[:, None]  # (C, 1, T, hd)
        sin = (emb.sin() * self.rope_scale).to(dtype)[:, None]
        return cos, sin

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, cache: KVCache, rows: slice, kv_len: int,
                node_depth: Optional[torch.Tensor] = None, tree_mask: Optional[torch.Tensor] = None,
                logits_at: Optional[torch.Tensor] = None, want_captured: bool = True,
                want_logits: bool = True) -> ForwardOut:
        """Process tokens (C, T) for cache rows `rows`, the new ones starting at cache.lens[rows].

        node_depth (C, T): RoPE offset of each node from lens (None = 0..T-1, a chain).
        kv_len: positions of the cache to attend over (>= max lens + T; the whole capacity under CUDA
        graphs, the live maximum on CPU so short sequences do not pay for the buffer's length).
        logits_at (C, J): which of the T positions need logits (None = all); the LM head is the most
        expensive matmul for a short step, prefill needs only the last position.
        Does not change cache.lens: the caller commits what it accepts.
        """
        c, t = tokens.shape
        lens = cache.lens[rows]  # (C,)
        offs = torch.arange(t, device=tokens.device)[None, :]
        positions = lens[:, None] + (offs if node_depth is None else node_depth)  # (C, T)
        write_pos = lens[:, None] + offs  # node i lives at cache index lens + i
        mask = step_mask(lens, kv_len, t, tree_mask)  # (C, 1, T, kv_len)
        cos, sin = self._rope(positions, self.dtype)
        nq, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        x = self.embed(tokens)  # (C, T, H)
        layer_out: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.ln1, self.eps)
            qkv = F.linear(h, layer.wqkv, layer.bqkv)  # (C, T, (nq + 2 nkv) hd)
            q, k, v = qkv.split([nq * hd, nkv * hd, nkv * hd], dim=-1)
            q = q.view(c, t, nq, hd)
            k = k.view(c, t, nkv, hd)
            if self.qk_norm:
                q = rms_norm(q, layer.q_norm, self.eps)
                k = rms_norm(k, layer.k_norm, self.eps)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # (C, n, T, hd)
            v = v.view(c, t, nkv, hd).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache.write(i, rows, write_pos, k, v)
            keys, values = cache.read(i, rows, kv_len)  # (C, nkv, kv_len, hd)
            a = grouped_attention(q, keys, values, mask, self.scaling)  # (C, nq, T, hd)
            x = x + F.linear(a.transpose(1, 2).reshape(c, t, nq * hd), layer.wo, layer.bo)
            h = rms_norm(x, layer.ln2, self.eps)
            gate, up = F.linear(h, layer.w_gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.w_down)
            if want_captured and i in self.capture_ids:
                layer_out[i] = x
        cap = None
        if want_captured and self.capture_ids:  # an id listed twice (tiny targets) repeats its output
            cap = torch.cat([layer_out[i] for i in self.capture_ids], dim=-1)  # (C, T, n*H)
        logits = None
        if want_logits:
            if logits_at is not None:
                x = x.gather(1, logits_at[:, :, None].expand(-1, -1, x.shape[-1]))  # (C, J, H)
            logits = self.lm_head(x)
        return ForwardOut(logits=logits, captured=cap)
