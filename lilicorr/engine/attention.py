"""Length-aware attention over a static KV cache: per-row lengths, chain or tree masks, GQA without copies.

`step_mask` builds the (C, 1, T, S) visibility of one step from each row's committed length (and a
tree's ancestor mask); `attend` runs scaled-dot-product attention with it:
  - CPU: SDPA with `enable_gqa` — its flash kernel reads each KV head once (no repeat_interleave) and
    works in blocks, so a long prompt never holds a (T, S) fp32 score matrix per head; batched one-token
    fp32 steps take two batched matmuls instead (faster there, the scores are one row per head);
  - CUDA: the g = nq / nkv query heads of a KV head are stacked along the query axis, which every SDPA
    backend accepts (the fused kernels take `enable_gqa` only without a mask and would fall back to the
    math path, with full score tensors, for ours).
Long query spans are processed in slices of at most `SCORE_BUDGET` (rows x heads x queries x keys)
elements, so whatever backend runs, the memory of the mask (and of scores on a math fallback) is bounded.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

SCORE_BUDGET = 1 << 25  # elements of (C, nq, T_slice, S) per SDPA call: 128 MB in fp32


def step_mask(lens: torch.Tensor, kv_len: int, t: int, tree_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """(C, 1, T, kv_len) bool: the cache before lens[row], plus the new nodes the mask allows.

    New node i sits at cache index lens + i; `tree_mask` (C, T, T) is None for a causal chain.
    """
    j = torch.arange(kv_len, device=lens.device)
    rel = j[None, None, :] - lens[:, None, None]  # (C, 1, kv_len) index relative to the first new node
    if tree_mask is None:
        return (rel <= torch.arange(t, device=lens.device)[None, :, None])[:, None]  # past, or an earlier node
    inside = (rel >= 0) & (rel < t)
    idx = rel.clamp(0, t - 1).expand(-1, t, -1)
    return ((rel < 0) | (inside & tree_mask.gather(2, idx)))[:, None]


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as the additive bias SDPA adds to scores (0 visible, -inf hidden), built once per step."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
           eager: bool = False, budget: int = SCORE_BUDGET) -> torch.Tensor:
    """q (C, nq, T, hd); k, v (C, nkv, S, hd) (cache views are fine); mask (C, 1, T, S) additive.

    Returns (C, nq, T, hd). Every query row sees exactly the keys its mask row allows.
    eager=True follows transformers' eager attention op for op (scores in the input dtype, softmax in
    fp32): the reference the bf16 paths are compared with; SDPA otherwise.
    TorchScript-compatible (engine/scripted_stack.py runs it inside the scripted layer stack).
    """
    c, nq, t, hd = q.shape
    s = k.shape[2]
    step = max(1, budget // max(1, c * nq * s))
    if t <= step:
        return _eager(q, k, v, mask, scale) if eager else _sdpa(q, k, v, mask, scale)
    parts: List[torch.Tensor] = []
    for a in range(0, t, step):
        qa, ma = q[:, :, a:a + step], mask[:, :, a:a + step]
        parts.append(_eager(qa, k, v, ma, scale) if eager else _sdpa(qa, k, v, ma, scale))
    return torch.cat(parts, dim=2)


def _stack(q: torch.Tensor, mask: torch.Tensor, nkv: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Query heads of one KV head stacked on the query axis: (C, nkv, g*T, hd) and (C, 1, g*T, S)."""
    c, nq, t, hd = q.shape
    g = nq // nkv
    qs = q.reshape(c, nkv, g * t, hd)  # head h = kv * g + j: rows of a KV head ordered (j, t)
    ms = mask if g == 1 else mask[:, :, None].expand(c, 1, g, t, mask.shape[-1]).reshape(c, 1, g * t, -1)
    return qs, ms


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    qs, ms = _stack(q, mask, k.shape[1])
    scores = torch.matmul(qs, k.transpose(-1, -2)) * scale + ms
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v).reshape(q.shape)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    nq, nkv = q.shape[1], k.shape[1]
    if q.device.type == "cpu" and q.shape[2] == 1 and q.shape[0] > 1 and q.dtype == torch.float32:
        # Batched one-token decoding on CPU: two batched matmuls beat the flash kernel's per-(row, head) tasks
        # (docs/results.md), the same math in another summation order.
        return _eager(q, k, v, mask, scale)
    if nq == nkv:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if q.device.type == "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    qs, ms = _stack(q, mask, nkv)
    return F.scaled_dot_product_attention(qs, k, v, attn_mask=ms, scale=scale).reshape(q.shape)
