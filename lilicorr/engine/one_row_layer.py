"""One decoder layer for one token of one row as ONE compiled call (fp32 CPU batch-1 decode).

Why: batch-1 decoding is bound by reading the weights, and on a 2-core CPU the rest of a layer — the
norms, RoPE, the cache write, attention over one query, the residuals — is ~15 small eager ops of
5-10 µs each, plus one Dynamo guard check (~30 µs) per compiled GEMV. Writing the whole layer as one
function of tensors lets TorchInductor fuse it into a handful of kernels behind one guard check: the
layer's matmuls are the GEMV reductions of kernels/gemv.py (`(x[:, None] * W[None]).sum(-1)`, fused,
vectorised and split over the cores), and the norm and the SwiGLU gate fold into them. Measured on the
2-core machine (SmolLM2 shapes, 30 layers, one run side by side): 24.5 ms per step vs 29.5 ms with four
compiled GEMVs per layer around eager attention (`python jobs/bench.py engine` has the full-model figures).

One compilation with dynamic shapes serves every position (the cache length is a symbolic size) and
every layer of a model; another model's head layout compiles once more (the head counts are constants).
The sums run in another order than MKL's and SDPA's (fp32, ~1e-6 relative), like kernels/gemv.py;
greedy output is checked against transformers' by the engine tests. If Inductor cannot compile here, the
call warns once and the eager `layer_step` runs instead (the same arguments, the same result).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from lilicorr.kernels.compiled import Compiled
from lilicorr.kernels.gemv import gemv_sum as _gemv  # x (1, in), w (out, in) -> (1, out), fused reduction
from lilicorr.models.norm_rope import rms_norm as _rms  # fp32 here: its casts are no-ops


def _layer_body(x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, k_buf: Tensor, v_buf: Tensor,
                write_idx: Tensor, wqkv: Tensor, bqkv: Optional[Tensor], wo: Tensor, bo: Optional[Tensor],
                w_gate_up: Tensor, w_down: Tensor, ln1: Tensor, ln2: Tensor, qk_norm: Optional[Tensor],
                eps: Tensor, nq: int, nkv: int, hd: int, scale: float) -> Tensor:
    """x (1, 1, H); cos/sin (1, 1, 1, hd); mask (1, 1, 1, S) additive; k_buf/v_buf (1, nkv, cap, hd) cache
    views, written at write_idx (1, nkv, 1, hd); returns the layer's output (1, 1, H)."""
    h = x.view(1, -1)  # (1, H)
    qkv = _gemv(_rms(h, ln1, eps), wqkv)  # (1, (nq + 2 nkv) hd)
    if bqkv is not None:
        qkv = qkv + bqkv
    qkv = qkv.view(1, 1, nq + 2 * nkv, hd)
    qk, v = qkv[:, :, :nq + nkv], qkv[:, :, nq + nkv:]
    if qk_norm is not None:  # Qwen3's q_norm / k_norm, one (nq + nkv, hd) table
        qk = _rms(qk, qk_norm, eps)
    qk = qk * cos + qk.roll(hd // 2, dims=-1) * sin  # RoPE on q and k heads at once (rope.RopeTable's layout)
    q, k = qk[:, :, :nq], qk[:, :, nq:]
    k_buf.scatter_(2, write_idx, k.transpose(1, 2))
    v_buf.scatter_(2, write_idx, v.transpose(1, 2))
    s = mask.shape[-1]  # the positions this step attends over (the row's length + 1)
    keys, values = k_buf[0, :, :s], v_buf[0, :, :s]  # (nkv, S, hd)
    qg = q.reshape(nkv, nq // nkv, hd)  # the query heads of each KV head (GQA without copies)
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * scale + mask.view(1, 1, s)  # (nkv, g, S)
    a = torch.matmul(torch.softmax(scores, dim=-1), values).reshape(1, nq * hd)
    o = _gemv(a, wo)
    h = h + (o if bo is None else o + bo)
    gate, up = _gemv(_rms(h, ln2, eps), w_gate_up).chunk(2, dim=-1)
    h = h + _gemv(F.silu(gate) * up, w_down)
    return h.view(x.shape)


# One model compiles this up to four times: Dynamo specialises a cache of one row and a view at storage offset 0
# or 1 (its "0/1 specialisation"); another head layout, bias or q/k norm compiles again (Compiled leaves room).
_COMPILED = Compiled("compiled one-row layer", "the eager layer", _layer_body, dynamic=True)
_eps: dict[float, Tensor] = {}


def one_row_layer_step(x, cos, sin, mask, k_buf, v_buf, write_idx, kv_len: int, w, s, eager: bool = False,
                       fast_gemv: bool = True):
    """layer.layer_step for one token of one row (fp32 CPU), as one compiled call; the same arguments
    (w: LayerWeights, s: LayerShape). The weights must not require grad (layer_weights holds detached
    views): Dynamo guards on it."""
    from .layer import layer_step  # the eager reference and fallback

    if _COMPILED.failed is None and kv_len >= 2:  # a first token at position 0 (kv_len 1) would specialise a graph
        # eps as a 0-d tensor: a float would be a constant of the graph (one compile per model's eps)
        eps_t = _eps.get(s.eps)
        if eps_t is None:
            eps_t = _eps.setdefault(float(s.eps), torch.tensor(float(s.eps)))
        y = _COMPILED(x, cos, sin, mask, k_buf, v_buf, write_idx, w.qkv.weight, w.qkv.bias, w.o.weight, w.o.bias,
                      w.gate_up.weight, w.down.weight, w.ln1, w.ln2, w.qk_norm, eps_t, s.nq, s.nkv, s.hd, s.scale)
        if y is not None:
            return y
    return layer_step(x, cos, sin, mask, k_buf, v_buf, write_idx, kv_len, w, s, eager, fast_gemv=False)
