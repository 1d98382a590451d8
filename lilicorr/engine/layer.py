"""One decoder layer of the target (Llama family, Qwen3) over a static KV cache: its records and its step.

A layer is two records: `LayerWeights` (the four projections, the norms; built once from a Hugging Face
layer without copying its weights) and `LayerShape` (head counts, eps, scale: frozen, one per model).
`layer_step` runs one layer eagerly on any (C rows, T tokens) step; scripted_stack.py runs the same lines for every
layer in one TorchScript call, so a new weight is one field here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lilicorr.kernels.linear import Projection
from lilicorr.models.norm_rope import rms_norm as hf_rms_norm

from .attention import attend


@dataclass(frozen=True)
class LayerShape:
    nq: int  # query heads
    nkv: int  # key/value heads
    hd: int  # head dim
    eps: float  # RMSNorm eps
    scale: float  # attention scale (hd ** -0.5)


@dataclass
class LayerWeights:
    qkv: Projection  # (nq + 2 nkv) hd <- H, one matrix (q, k, v rows)
    o: Projection  # H <- nq hd
    gate_up: Projection  # 2 I <- H, one matrix (gate rows, then up rows)
    down: Projection  # H <- I
    ln1: torch.Tensor  # (H,) input_layernorm
    ln2: torch.Tensor  # (H,) post_attention_layernorm
    qk_norm: Optional[torch.Tensor]  # (nq + nkv, hd): Qwen3's q_norm / k_norm rows, one table (None: Llama)


def layer_weights(hf_layer, qk_norm: bool, num_heads: int, num_kv_heads: int, prepack: bool = False,
                  one_row_packed: bool = False) -> LayerWeights:
    """The records of one HF decoder layer. q/k/v and gate/up are re-packed into one matrix each (fewer,
    larger matmuls) whose row views become the HF module's own weights; the others are detached views.
    prepack: also a oneDNN copy of each projection for multi-row steps (kernels/packed_linear.py), and with
    one_row_packed for one-row steps too (engine.cpu_one_row)."""
    a, m = hf_layer.self_attn, hf_layer.mlp
    # Detached views (no copy) of the HF parameters: the target is frozen here
    wqkv, bqkv = fused_weight([a.q_proj, a.k_proj, a.v_proj])
    w_gate_up, _ = fused_weight([m.gate_proj, m.up_proj])
    norm = None
    if qk_norm:  # one (nq + nkv, hd) table: q and k heads normed in one op (a few KB)
        norm = torch.cat([a.q_norm.weight.detach()[None].expand(num_heads, -1),
                          a.k_norm.weight.detach()[None].expand(num_kv_heads, -1)])
    return LayerWeights(
        qkv=Projection.of(wqkv, bqkv, prepack, one_row_packed),
        o=Projection.of(a.o_proj.weight.detach(), _detached(a.o_proj.bias), prepack, one_row_packed),
        gate_up=Projection.of(w_gate_up, None, prepack, one_row_packed),
        down=Projection.of(m.down_proj.weight.detach(), None, prepack, one_row_packed),
        ln1=hf_layer.input_layernorm.weight.detach(), ln2=hf_layer.post_attention_layernorm.weight.detach(),
        qk_norm=norm)


def _detached(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach()


def fused_weight(linears: list) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One (sum of out, in) weight (and bias) for `linears`, whose own parameters become row views of it.

    Re-packing once and handing the views back to the HF modules keeps a single copy of the weights
    (no duplicate for the fused projection). Where the modules already are consecutive rows of one buffer (a
    second TargetForward on the same model) that buffer is returned as it is: nothing is cached on the model.
    """
    w = _rows_of_one_buffer([lin.weight for lin in linears])
    has_bias = linears[0].bias is not None
    b = _rows_of_one_buffer([lin.bias for lin in linears]) if has_bias else None
    if w is not None and (b is not None or not has_bias):
        return w, b
    ws = [lin.weight for lin in linears]
    w = torch.cat([x.detach() for x in ws])
    b = torch.cat([lin.bias.detach() for lin in linears]) if has_bias else None
    off = 0
    for lin, x in zip(linears, ws):
        n = x.shape[0]
        lin.weight = nn.Parameter(w[off:off + n], requires_grad=x.requires_grad)
        if b is not None:
            lin.bias = nn.Parameter(b[off:off + n], requires_grad=lin.bias.requires_grad)
        off += n
    return w, b


def _rows_of_one_buffer(ts: list) -> Optional[torch.Tensor]:
    """torch.cat(ts) as a view, where the contiguous tensors `ts` lie one after another in one storage; else None."""
    first = ts[0]
    if any(t is None or not t.is_contiguous() or t.shape[1:] != first.shape[1:] for t in ts):
        return None
    storage, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    for t in ts:
        if t.untyped_storage().data_ptr() != storage or t.storage_offset() != offset:
            return None
        offset += t.numel()
    rows = sum(t.shape[0] for t in ts)
    return first.detach().as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: statistics in fp32, cast back before the weight. fp32: one fused op (same math,
    its own summation order); other dtypes: HF's ops exactly, since bf16 rounding amplifies any change.
    TorchScript-compatible, like attention_heads (engine/scripted_stack.py)."""
    if x.dtype == torch.float32 and weight.shape == x.shape[-1:]:
        return F.rms_norm(x, [x.shape[-1]], weight, eps)
    if x.dtype == torch.float32:
        return weight * F.rms_norm(x, [x.shape[-1]], None, eps)
    return hf_rms_norm(x, weight, eps)


def attention_block(qkv, cos, sin, mask, k_buf, v_buf, write_idx, kv_len: int, qk_norm, s: LayerShape,
                    eager: bool):
    """qkv (C, T, (nq + 2 nkv) hd) -> attention output (C, T, nq hd); writes the new K/V into the cache."""
    return attention_heads(qkv, cos, sin, mask, k_buf, v_buf, write_idx, kv_len, qk_norm, s.nq, s.nkv, s.hd, s.eps,
                           s.scale, eager)


def attention_heads(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, k_buf: torch.Tensor,
                    v_buf: torch.Tensor, write_idx: torch.Tensor, kv_len: int, qk_norm: Optional[torch.Tensor],
                    nq: int, nkv: int, hd: int, eps: float, scale: float, eager: bool) -> torch.Tensor:
    """attention_block with the shape as plain numbers: TorchScript takes no dataclass (scripted_stack.py)."""
    c, t = qkv.shape[0], qkv.shape[1]
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


def layer_step(x, cos, sin, mask, k_buf, v_buf, write_idx, kv_len: int, w: LayerWeights, s: LayerShape,
               eager: bool = False):
    """One decoder layer on x (C, T, H); writes the new K/V into k_buf/v_buf (C, nkv, cap, hd) at
    write_idx (C, nkv, T, hd) and attends over the first kv_len positions (mask (C, 1, T, kv_len) additive).
    eager: transformers' attention op order (bf16 checks).
    scripted_stack.py runs these same lines for every layer in one TorchScript call (fp32 CPU)."""
    h = rms_norm(x, w.ln1, s.eps)
    a = attention_block(w.qkv(h), cos, sin, mask, k_buf, v_buf, write_idx, kv_len, w.qk_norm, s, eager)
    x = x + w.o(a)
    gu = w.gate_up(rms_norm(x, w.ln2, s.eps))
    inter = gu.shape[-1] // 2
    return x + w.down(F.silu(gu[..., :inter]) * gu[..., inter:])
