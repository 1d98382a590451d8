"""Our own forward of a Llama-family or Qwen3 target over a static KV cache (gpt-fast style).

Built from a Hugging Face model's weights without copying them: q/k/v and gate/up are re-packed once
into one matrix each (fewer, larger matmuls) and the HF model's own Linear weights become views into
those matrices, so the target's memory does not grow (the HF model keeps working unchanged). One call
processes T new tokens per row at per-row offsets, writes their keys/values into the cache, and returns
their logits and the outputs of the captured layers (the drafter's context). The attention mask is
causal for a chain of new tokens, or any (C, T, T) ancestor mask for a tree of candidates; attention
is length-aware (lilicorr.engine.attention), RoPE (YaRN included) comes from lilicorr.engine.rope.
`compile_layers()` wraps the per-layer function in torch.compile (optional; see its docstring).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lilicorr.kernels.gemv import linear

from .attention import additive, attend, step_mask
from .kv_cache import KVCache
from .one_row_layer import one_row_layer_step
from .rope import RopeTable, rope_parameters

__all__ = ["ForwardOut", "TargetForward", "rms_norm", "step_mask", "fused_weight"]


@dataclass
class ForwardOut:
    logits: Optional[torch.Tensor]  # (C, T', V), T' = T or the selected positions
    captured: Optional[torch.Tensor]  # (C, T, n*H) outputs of the captured layers, concatenated


def fused_weight(linears: list, name: str) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One (sum of out, in) weight (and bias) for `linears`, whose own parameters become row views of it.

    Re-packing once and handing the views back to the HF modules keeps a single copy of the weights
    (no duplicate for the fused projection). Reused while the modules still point into the same buffer
    (a second TargetForward on the same model); re-packed if the model was moved or cast since.
    """
    owner = linears[0]
    cached = owner.__dict__.get(f"_lilicorr_fused_{name}")
    if cached is not None and _views_of(linears, cached):
        return cached
    ws = [lin.weight for lin in linears]
    w = torch.cat([x.detach() for x in ws])
    b = None
    if linears[0].bias is not None:
        b = torch.cat([lin.bias.detach() for lin in linears])
    off = 0
    for lin, x in zip(linears, ws):
        n = x.shape[0]
        lin.weight = nn.Parameter(w[off:off + n], requires_grad=x.requires_grad)
        if b is not None:
            lin.bias = nn.Parameter(b[off:off + n], requires_grad=lin.bias.requires_grad)
        off += n
    owner.__dict__[f"_lilicorr_fused_{name}"] = (w, b)
    return w, b


def _views_of(linears, fused) -> bool:
    w, b = fused
    off = 0
    for lin in linears:
        n = lin.weight.shape[0]
        if lin.weight.data_ptr() != w[off:off + n].data_ptr() or lin.weight.shape != w[off:off + n].shape:
            return False
        if b is not None and (lin.bias is None or lin.bias.data_ptr() != b[off:off + n].data_ptr()):
            return False
        off += n
    return off == w.shape[0]


class _Layer(nn.Module):
    def __init__(self, hf_layer, qk_norm: bool, num_heads: int, num_kv_heads: int):
        super().__init__()
        a, m = hf_layer.self_attn, hf_layer.mlp
        self.wqkv, self.bqkv = fused_weight([a.q_proj, a.k_proj, a.v_proj], "qkv")
        # Detached views (no copy) of the HF parameters, like the fused qkv / gate-up views: the target is
        # frozen here, and the compiled one-row layer (one_row_layer.py) would otherwise be guarded on
        # requires_grad and compile twice for an inference model and a training one.
        self.wo, self.bo = _detached(a.o_proj.weight), _detached(a.o_proj.bias)
        self.w_gate_up, _ = fused_weight([m.gate_proj, m.up_proj], "gate_up")
        self.w_down = _detached(m.down_proj.weight)
        self.ln1 = _detached(hf_layer.input_layernorm.weight)
        self.ln2 = _detached(hf_layer.post_attention_layernorm.weight)
        self.qk_norm = None
        if qk_norm:  # one (nq + nkv, hd) table: q and k heads normed in one op (a few KB)
            self.qk_norm = torch.cat([a.q_norm.weight.detach()[None].expand(num_heads, -1),
                                      a.k_norm.weight.detach()[None].expand(num_kv_heads, -1)])


def _detached(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: statistics in fp32, cast back before the weight. fp32: one fused op (same math,
    its own summation order); other dtypes: HF's ops exactly, since bf16 rounding amplifies any change."""
    if x.dtype == torch.float32 and weight.shape == x.shape[-1:]:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    if x.dtype == torch.float32:
        return weight * F.rms_norm(x, (x.shape[-1],), None, eps)
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def attention_block(x, qkv, cos, sin, mask, k_buf, v_buf, write_idx, kv_len: int, qk_norm, nq: int, nkv: int,
                    hd: int, eps: float, scale: float, eager: bool):
    """qkv (C, T, (nq + 2 nkv) hd) -> attention output (C, T, nq hd); writes the new K/V into the cache."""
    c, t, _ = x.shape
    qkv = qkv.view(c, t, nq + 2 * nkv, hd)
    qk, v = qkv[:, :, :nq + nkv], qkv[:, :, nq + nkv:]
    if qk_norm is not None:
        qk = rms_norm(qk, qk_norm, eps)  # HF's q_norm / k_norm, per head from one (nq + nkv, hd) table
    qk = qk * cos + qk.roll(hd // 2, dims=-1) * sin  # RoPE on q and k heads at once (see rope.RopeTable)
    q, k = qk[:, :, :nq].transpose(1, 2), qk[:, :, nq:].transpose(1, 2)  # (C, n, T, hd)
    k_buf.scatter_(2, write_idx, k)
    v_buf.scatter_(2, write_idx, v.transpose(1, 2))
    a = attend(q, k_buf[:, :, :kv_len], v_buf[:, :, :kv_len], mask, scale, eager)  # (C, nq, T, hd)
    return a.transpose(1, 2).reshape(c, t, nq * hd)


def layer_step(x, cos, sin, mask, k_buf, v_buf, write_idx, kv_len: int, wqkv, bqkv, wo, bo, w_gate_up, w_down,
               ln1, ln2, qk_norm, nq: int, nkv: int, hd: int, eps: float, scale: float, eager: bool = False,
               fast_gemv: bool = False):
    """One decoder layer on x (C, T, H); writes the new K/V into k_buf/v_buf (C, nkv, cap, hd) at
    write_idx (C, nkv, T, hd) and attends over the first kv_len positions. A plain function of tensors
    so torch.compile can take it whole. fast_gemv: one-row steps use the compiled CPU GEMV (kernels.gemv)."""
    h = rms_norm(x, ln1, eps)
    a = attention_block(x, linear(h, wqkv, bqkv, fast_gemv), cos, sin, mask, k_buf, v_buf, write_idx, kv_len,
                        qk_norm, nq, nkv, hd, eps, scale, eager)
    x = x + linear(a, wo, bo, fast_gemv)
    h = rms_norm(x, ln2, eps)
    gu = linear(h, w_gate_up, None, fast_gemv)
    inter = gu.shape[-1] // 2
    return x + linear(F.silu(gu[..., :inter]) * gu[..., inter:], w_down, None, fast_gemv)


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
        self.layers = nn.ModuleList(_Layer(layer, self.qk_norm, self.num_heads, self.num_kv_heads)
                                    for layer in body.layers)
        self.num_layers = len(self.layers)
        inv_freq, self.rope_scale = rope_parameters(cfg)  # YaRN / llama3 / linear scaling included
        hf_inv = getattr(getattr(body, "rotary_emb", None), "inv_freq", None)
        if hf_inv is not None and hf_inv.dtype != torch.float32:
            # model.to(bf16) casts HF's inv_freq buffer too, and HF rotates with the rounded values
            inv_freq = inv_freq.to(hf_inv.dtype).float()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope = RopeTable(inv_freq, self.rope_scale, self.embed_weight.dtype, self.embed_weight.device)
        self.scaling = self.head_dim ** -0.5
        self._layer_fn = layer_step
        # Attention: SDPA, except bf16/fp16 on CPU, where transformers' eager op order keeps greedy output
        # identical to the reference (CPU decodes in fp32; bf16 there is for checks). Settable.
        self.eager_attention = self.device.type == "cpu" and self.dtype != torch.float32
        # fp32 CPU batch-1 decode: each layer as one compiled call (one_row_layer.py) and the LM head through
        # the compiled GEMV; MKL's GEMV is single-threaded and reaches ~40% of the memory bandwidth there
        # (kernels/gemv.py). Settable (engine.cpu_gemv).
        self.fast_gemv = self.device.type == "cpu" and self.dtype == torch.float32

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

    def compile_layers(self, **kwargs) -> None:
        """torch.compile the per-layer function (norms, RoPE, SiLU-gate fused; matmuls stay library calls).

        Optional: on CPU it saves a few percent per step at batch 1 (measured in jobs/bench.py engine
        --compile) and costs tens of seconds of compilation per new shape; on CUDA pass mode and
        dynamic=False for static shapes under CUDA graphs. Errors are not caught: a benchmark that asks
        for a compiled forward fails loudly rather than timing the eager one.
        """
        self._layer_fn = torch.compile(layer_step, **kwargs)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_weight)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head of the target on its last hidden states."""
        return linear(rms_norm(hidden, self.norm_weight, self.eps), self.lm_head_weight, None, self.fast_gemv)

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
        nq, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        write_idx = write_pos[:, None, :, None].expand(c, nkv, t, hd)
        mask = additive(step_mask(lens, kv_len, t, tree_mask), self.dtype)  # (C, 1, T, kv_len)
        self.rope.ensure(int(cache.capacity))
        cos, sin = self.rope.lookup(positions)  # (C, T, hd)
        cos, sin = cos[:, :, None], sin[:, :, None]  # (C, T, 1, hd): broadcast over heads
        x = self.embed(tokens)  # (C, T, H)
        layer_out: dict[int, torch.Tensor] = {}
        fn = self._layer_fn
        if self.fast_gemv and c * t == 1 and fn is layer_step and x.dtype == torch.float32 and x.device.type == "cpu":
            fn = one_row_layer_step  # the whole layer as one compiled call (batch-1 decode on CPU)
        for i, layer in enumerate(self.layers):
            x = fn(x, cos, sin, mask, cache.k[i][rows], cache.v[i][rows], write_idx, kv_len, layer.wqkv, layer.bqkv,
                   layer.wo, layer.bo, layer.w_gate_up, layer.w_down, layer.ln1, layer.ln2, layer.qk_norm,
                   nq, nkv, hd, self.eps, self.scaling, self.eager_attention, self.fast_gemv)
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
