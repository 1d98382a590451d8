"""The drafter's inference forms (a block over cached context; the context's K/V) as ONE TorchScript call each.

Why: at batch 1 a block is ~140 small eager ops over the drafter's 2 layers (norms, RoPE tables and rotations,
concatenations, the GQA repeat, attention, residuals) besides its GEMMs, and on a 2-core CPU each pays Python's
dispatch. The TorchScript interpreter runs the same aten ops without it.

The readable reference is the module code (DFlashDrafter.forward_block / fuse_context / project_context,
drafter_layers.DrafterLayer); these bodies are theirs op for op over plain tensors, so the outputs are
bit-identical (tests/parity/test_parity_drafter.py) where the projections run F.linear, equal up to oneDNN's
summation order where the engine packed them (DrafterInference). Inference only (no grad): training runs the modules.
If TorchScript cannot script here, `available()` is False and the modules run. The engine chooses the form per decoder
(engine/backend.py) and passes its DrafterInference in (`fast=`); training and direct calls run the modules.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lilicorr.kernels.packed_linear import PackedWeight, linear_on, packs_for_drafter
from lilicorr.kernels.scripted import Scripted
from lilicorr.models.norm_rope import apply_rope as _rotate
from lilicorr.models.norm_rope import rms_norm as rms
from lilicorr.models.norm_rope import rope_cos_sin as _rope

def _kv(x: Tensor, cos: Tensor, sin: Tensor, kw: Tensor, kp: Optional[Tensor], vw: Tensor, vp: Optional[Tensor],
        k_norm: Optional[Tensor], nkv: int, hd: int, eps: float) -> Tuple[Tensor, Tensor]:
    # DrafterAttention.project_kv (RoPE tables computed once per call by the caller: same values)
    C, T = x.shape[0], x.shape[1]
    k = linear_on(x, kw, kp, None).view(C, T, nkv, hd)
    if k_norm is not None:
        k = rms(k, k_norm, eps)
    k = k.transpose(1, 2)
    v = linear_on(x, vw, vp, None).view(C, T, nkv, hd).transpose(1, 2)
    return _rotate(k, cos, sin), v


def _block(x: Tensor, positions: Tensor, ctx_k: List[Tensor], ctx_v: List[Tensor], ctx_valid: Tensor,
           w: List[Tensor], packed: List[Optional[Tensor]], norms: List[Tensor], qk: List[Optional[Tensor]],
           nq: int, nkv: int, hd: int, eps: float, theta: float) -> Tensor:
    """DFlashDrafter.forward_block. Per layer i: w / packed [7i:7i+7] = q, k, v, o, gate, up, down; norms [2i:2i+2]
    = input, post-attention (norms[-1] the final norm); qk [2i:2i+2] = q_norm, k_norm (None without)."""
    C, B = x.shape[0], x.shape[1]
    mask = torch.cat([ctx_valid[:, None, :].expand(C, B, -1),
                      torch.ones(C, B, B, dtype=torch.bool, device=x.device)], dim=2)
    groups = nq // nkv
    for i in range(len(ctx_k)):
        j = 7 * i
        h = rms(x, norms[2 * i], eps)
        q = linear_on(h, w[j], packed[j], None).view(C, B, nq, hd)
        qn = qk[2 * i]
        if qn is not None:
            q = rms(q, qn, eps)
        q = q.transpose(1, 2)
        cos, sin = _rope(positions, hd, theta, q.dtype)
        q = _rotate(q, cos, sin)
        k_blk, v_blk = _kv(h, cos, sin, w[j + 1], packed[j + 1], w[j + 2], packed[j + 2], qk[2 * i + 1], nkv, hd, eps)
        k = torch.cat([ctx_k[i], k_blk], dim=2)
        v = torch.cat([ctx_v[i], v_blk], dim=2)
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        x = x + linear_on(out.transpose(1, 2).reshape(C, B, -1), w[j + 3], packed[j + 3], None)
        h = rms(x, norms[2 * i + 1], eps)
        gated = F.silu(linear_on(h, w[j + 4], packed[j + 4], None)) * linear_on(h, w[j + 5], packed[j + 5], None)
        x = x + linear_on(gated, w[j + 6], packed[j + 6], None)
    return rms(x, norms[-1], eps)


def _context(captured: Tensor, scale: Tensor, fc: Tensor, fc_packed: Optional[Tensor], hidden_norm: Tensor,
             positions: Tensor, w: List[Tensor], packed: List[Optional[Tensor]], k_norms: List[Optional[Tensor]],
             nkv: int, hd: int, eps: float, theta: float) -> Tuple[Tensor, List[Tuple[Tensor, Tensor]]]:
    """fuse_context then project_context: captured (C, T, n*H) -> ctx (C, T, H), per layer (k, v). Per layer i:
    w / packed [2i:2i+2] = k_proj, v_proj."""
    ctx = rms(linear_on(captured * scale.to(captured.dtype), fc, fc_packed, None), hidden_norm, eps)
    cos, sin = _rope(positions, hd, theta, ctx.dtype)
    kvs: List[Tuple[Tensor, Tensor]] = []
    for i in range(len(k_norms)):
        kvs.append(_kv(ctx, cos, sin, w[2 * i], packed[2 * i], w[2 * i + 1], packed[2 * i + 1], k_norms[i], nkv, hd,
                       eps))
    return ctx, kvs


_SCRIPT = Scripted("scripted drafter", "its modules", block=_block, context=_context)


def available() -> bool:
    """Whether the scripted forms can run in this process (scripts them on the first call)."""
    return _SCRIPT.get() is not None


def _norm(m: nn.Module) -> Optional[Tensor]:
    return m.weight if hasattr(m, "weight") else None  # nn.Identity (no q/k norms): None


def _projections(layer) -> List[nn.Module]:
    """One layer's projections in _block's order: q, k, v, o, gate, up, down."""
    a, m = layer.self_attn, layer.mlp
    return [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]


def _linears(drafter) -> List[nn.Module]:
    """The projections the scripted forms read: fc, then every layer's."""
    return [drafter.fc] + [lin for L in drafter.layers for lin in _projections(L)]


def plain_layers(drafter) -> bool:
    """Whether every projection the scripted forms read is an nn.Linear without bias (the engine asks once, when it
    builds a decoder: engine/drafting.py)."""
    return all(type(m) is nn.Linear and m.bias is None for m in _linears(drafter))


class DrafterInference:
    """What a decoder keeps for its drafter's scripted forms: the oneDNN-packed copies of the projections that pack
    (packs_for_drafter), made when the engine packs the target's (engine.cpu_prepack), keyed by module and never stored
    on the drafter. Empty: every projection through F.linear."""

    def __init__(self, drafter, prepack: bool):
        self.packed = {m: PackedWeight.shared(m.weight) for m in _linears(drafter)
                       if prepack and packs_for_drafter(m.weight)}

    def weight(self, m: nn.Module) -> Tuple[Tensor, Optional[Tensor]]:
        """(weight, its current packed copy or None): what the scripted forms multiply by."""
        p = self.packed.get(m)
        return m.weight, (p.packed() if p is not None and p.weight is m.weight else None)

    def weights(self, mods: List[nn.Module]) -> Tuple[List[Tensor], List[Optional[Tensor]]]:
        """([weight], [packed copy or None]) of `mods`, in order."""
        pairs = [self.weight(m) for m in mods]
        return [w for w, _ in pairs], [p for _, p in pairs]


def usable(drafter, x: Tensor, fast: Optional[DrafterInference]) -> bool:
    """Whether the scripted forms replace the modules for input x: asked for (fast: the engine's DrafterInference,
    made where plain_layers holds), CPU inference, x in the drafter's dtype (fp32, or bf16: engine.cpu_drafter_bf16)."""
    if fast is None or torch.is_grad_enabled() or x.device.type != "cpu":
        return False
    return x.dtype in (torch.float32, torch.bfloat16) and x.dtype == drafter.fc.weight.dtype and available()


def block(drafter, fast: DrafterInference, x: Tensor, positions: Tensor, ctx_kv, ctx_valid: Tensor) -> Tensor:
    """DFlashDrafter.forward_block in one scripted call."""
    s = drafter.shape
    w, packed = fast.weights([lin for L in drafter.layers for lin in _projections(L)])
    norms: List[Tensor] = []
    qk: List[Optional[Tensor]] = []
    for L in drafter.layers:
        norms += [L.input_layernorm.weight, L.post_attention_layernorm.weight]
        qk += [_norm(L.self_attn.q_norm), _norm(L.self_attn.k_norm)]
    norms.append(drafter.norm.weight)
    return _SCRIPT.get()["block"](x, positions, [k for k, _ in ctx_kv], [v for _, v in ctx_kv], ctx_valid, w, packed,
                              norms, qk, s.num_heads, s.num_kv_heads, s.head_dim, float(s.rms_norm_eps),
                              float(s.rope_theta))


def context(drafter, fast: DrafterInference, captured: Tensor, positions: Tensor
            ) -> Tuple[Tensor, List[Tuple[Tensor, Tensor]]]:
    """fuse_context + project_context in one scripted call: ctx (C, T, H) and per layer (k, v)."""
    s = drafter.shape
    fc, fc_p = fast.weight(drafter.fc)
    w, packed = fast.weights([lin for L in drafter.layers for lin in (L.self_attn.k_proj, L.self_attn.v_proj)])
    return _SCRIPT.get()["context"](captured, drafter.feature_scale, fc, fc_p, drafter.hidden_norm.weight, positions, w,
                                packed, [_norm(L.self_attn.k_norm) for L in drafter.layers], s.num_kv_heads,
                                s.head_dim, float(s.rms_norm_eps), float(s.rope_theta))
