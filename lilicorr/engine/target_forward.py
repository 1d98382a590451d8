"""Our own forward of a Llama-family or Qwen3 target over a static KV cache (gpt-fast style).

Built from a Hugging Face model's weights without copying them (engine/layer.py: q/k/v and gate/up
re-packed once into one matrix each whose views become the HF model's own Linear weights); on an fp32 CPU
target each projection also gets a oneDNN-packed copy for multi-row steps (kernels/packed_linear.py). One call
processes T new tokens per row at per-row offsets, writes their keys/values into the cache, and returns
their logits and the outputs of the captured layers (the drafter's context). The attention mask is
causal for a chain of new tokens, or any (C, T, T) ancestor mask for a tree of candidates; attention
is length-aware (lilicorr.engine.attention), RoPE (YaRN included) comes from lilicorr.engine.rope.
On an fp32 CPU a step runs every layer in one TorchScript call (scripted_stack.py), layer.layer_step's math; a step
of one row's one token multiplies by the plain weights (MKL's GEMV) or the packed ones, whichever engine.cpu_one_row
chose (engine/backend.py), others by the packed ones (kernels/linear.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lilicorr.kernels.linear import Projection

from .attention import additive, step_mask
from .kv_cache import KVCache
from . import scripted_stack
from .layer import LayerShape, fused_weight, layer_step, layer_weights, rms_norm
from .rope import RopeTable, rope_parameters

__all__ = ["ForwardOut", "TargetForward", "rms_norm", "step_mask", "fused_weight"]


@dataclass
class ForwardOut:
    logits: Optional[torch.Tensor]  # (C, T', V), T' = T or the selected positions
    captured: Optional[torch.Tensor]  # (C, T, n*H) outputs of the captured layers, concatenated


class TargetForward(nn.Module):
    """The target's decoder stack with a static KV cache. Weights come from `hf_model` (not copied
    where avoidable); the HF module stays the owner of the embedding and LM head."""

    def __init__(self, hf_model, capture_ids: Optional[list[int]] = None, prepack: Optional[bool] = None,
                 script_layers: Optional[bool] = None, one_row_packed: bool = False):
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
        # positions the target serves (after any target.yarn_factor extension); None = unbounded (no such field)
        self.max_positions = getattr(cfg, "max_position_embeddings", None)
        self.eps = cfg.rms_norm_eps
        self.capture_ids = list(capture_ids or [])
        body = hf_model.model
        self.embed_weight = body.embed_tokens.weight  # (V, H)
        self.lm_head_weight = hf_model.get_output_embeddings().weight  # (V, H), tied or not
        self.norm_weight = body.norm.weight
        # fp32 CPU: a oneDNN-packed copy of every projection and of the LM head for steps of 2+ rows
        # (kernels/packed_linear.py: MKL's small-M GEMMs run far slower here, docs/results.md); +1x the weights' memory.
        # None = on wherever it applies (engine.cpu_prepack).
        self.prepack = self.device.type == "cpu" and self.dtype == torch.float32 if prepack is None else prepack
        # one_row_packed: one row's one token multiplies by the packed copies too (engine.cpu_one_row), not F.linear
        self.layers = [layer_weights(layer, self.qk_norm, self.num_heads, self.num_kv_heads, self.prepack,
                                     one_row_packed) for layer in body.layers]
        self.num_layers = len(self.layers)
        inv_freq, self.rope_scale = rope_parameters(cfg)  # YaRN / llama3 / linear scaling included
        hf_inv = getattr(getattr(body, "rotary_emb", None), "inv_freq", None)
        if hf_inv is not None and hf_inv.dtype != torch.float32:
            # model.to(bf16) casts HF's inv_freq buffer too, and HF rotates with the rounded values
            inv_freq = inv_freq.to(hf_inv.dtype).float()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope = RopeTable(inv_freq, self.rope_scale, self.embed_weight.dtype, self.embed_weight.device)
        self.scaling = self.head_dim ** -0.5
        self.shape = LayerShape(self.num_heads, self.num_kv_heads, self.head_dim, self.eps, self.scaling)
        self.lm_head_proj = Projection.of(self.lm_head_weight.detach(), None, self.prepack, one_row_packed)
        # Attention: SDPA, except bf16/fp16 on CPU, where transformers' eager op order keeps greedy output
        # identical to the reference (CPU decodes in fp32; bf16 there is for checks). Settable.
        self.eager_attention = self.device.type == "cpu" and self.dtype != torch.float32
        # fp32 CPU steps: every layer in one TorchScript call, the same ops without Python's per-op cost
        # (scripted_stack.py). None = on wherever it applies; False = the eager layers, the reference
        # (engine.cpu_script_layers). Settable.
        fp32_cpu = self.device.type == "cpu" and self.dtype == torch.float32
        self.script_layers = fp32_cpu if script_layers is None else script_layers

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    def new_cache(self, max_batch: int, max_len: int, slack: int = 64) -> KVCache:
        cache = KVCache(self.num_layers, max_batch, self.num_kv_heads, max_len, self.head_dim, self.dtype,
                        self.device, slack=slack)
        self.rope.ensure(cache.capacity)  # every position a step can reach is < capacity
        return cache

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_weight)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head of the target on its last hidden states."""
        return self.lm_head_proj(rms_norm(hidden, self.norm_weight, self.eps))

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
        write_idx = write_pos[:, None, :, None].expand(c, self.num_kv_heads, t, self.head_dim)
        mask = additive(step_mask(lens, kv_len, t, tree_mask), self.dtype)  # (C, 1, T, kv_len)
        self.rope.ensure(int(cache.capacity))
        cos, sin = self.rope.lookup(positions)  # (C, T, hd)
        cos, sin = cos[:, :, None], sin[:, :, None]  # (C, T, 1, hd): broadcast over heads
        x = self.embed(tokens)  # (C, T, H)
        layer_out: dict[int, torch.Tensor] = {}
        fn = layer_step
        fp32_cpu = x.dtype == torch.float32 and x.device.type == "cpu"
        if self.script_layers and fp32_cpu and not self.eager_attention and scripted_stack.available():
            # every layer in one TorchScript call: the same ops without Python's per-op cost (scripted_stack.py)
            x, layer_out = scripted_stack.scripted_layers(
                x, cos, sin, mask, [k[rows] for k in cache.k], [v[rows] for v in cache.v], write_idx, kv_len,
                self.layers, self.shape, self.capture_ids if want_captured else [])
            fn = None
        for i, layer in enumerate(self.layers if fn is not None else []):
            x = fn(x, cos, sin, mask, cache.k[i][rows], cache.v[i][rows], write_idx, kv_len, layer, self.shape,
                   self.eager_attention)
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
