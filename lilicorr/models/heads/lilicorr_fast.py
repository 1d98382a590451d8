"""The LiLiCorr head's inference pass (vectors -> scores -> greedy walk) as ONE TorchScript call.

Why: at batch 1 the pass is ~150 small ops (28 nodes of width 128: two lattice layers, the fusion, three
unit-norm heads, the scores, a 7-step walk); on a 2-core CPU each pays Python's dispatch, which was most
of the head's ~2.5 ms. The TorchScript interpreter runs the same aten ops without it.

The readable reference is the module code (LiLiCorrHead.vectors, LatticeTransformer, lattice_scores_reference,
greedy_walk_reference); this body is theirs op for op, in the same order, over plain tensors, so the outputs
are bit-identical (tests/models/test_models_lilicorr_fast.py). Inference only (no_grad, fp32 or any one
dtype): training keeps the modules. If TorchScript cannot script here, `available()` is False and the head
runs its modules.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from lilicorr.kernels.scripted import Scripted
from lilicorr.models.drafter_fast import rms  # drafter_layers.RMSNorm.forward

COS_EPS = 1e-8  # = lilicorr.kernels.lattice.COS_EPS
SCRIPTED = True  # False: LiLiCorrHead.propose runs its modules (the reference; tests flip it)


def _unit(x: Tensor) -> Tensor:
    # kernels/lattice._unit
    x = x.float()
    return x / torch.linalg.vector_norm(x, 2.0, [-1], True).clamp_min(1e-8)  # COS_EPS; = x.norm(dim=-1, keepdim=True)


def _infer(emb: Tensor, features: Tensor, slot_hidden: Tensor, t: Tensor, w: List[Tensor],
           layers: List[List[Tensor]], rms_embed: bool, layernorm: bool, ln_eps: float, num_heads: int,
           num_slots: int, eps: float, sigma: float, greedy: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """emb (C, S, K, H_t) target embeddings of the candidates, features (C, S, K, 5), slot_hidden (C, S, H),
    t (C, W) the projected target state -> out, in (C, S, K, d), anchor_out (C, d), path (C, S) (greedy; else
    empty). w: embed_proj w/b, hidden_proj w/b, feature_norm w/b (or empty), conf_mlp 0 w/b, 2 w/b, slot_table,
    rank_table, final norm, fuse w/b, out_head w/b, in_head w/b, anchor_head w/b. layers[i]: attn_norm, qkv w/b,
    proj w/b, the attention bias (heads, S*K, S*K), (unused), ffn_norm, ffn_in w/b, ffn_out w/b."""
    C, S, K = emb.shape[0], emb.shape[1], emb.shape[2]
    dtype = w[0].dtype
    # LiLiCorrHead.vectors
    emb = emb.float()
    if rms_embed:
        emb = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + 1e-6)
    f = features.to(dtype)
    if layernorm:
        f = F.layer_norm(f, [f.shape[-1]], w[4], w[5], ln_eps)
    nodes = (F.linear(emb.to(dtype), w[0], w[1])
             + F.linear(slot_hidden.to(dtype), w[2], w[3])[:, :, None]
             + F.linear(F.silu(F.linear(f, w[6], w[7])), w[8], w[9])
             + w[10][:S, None]
             + w[11][None, :K])  # (C, S, K, W)
    # LatticeTransformer.forward
    Wd = nodes.shape[-1]
    x = nodes.reshape(C, S * K, Wd)
    N = S * K
    for p in layers:
        # LatticeLayer.forward, LatticeAttentionBias.forward
        qkv = F.linear(rms(x, p[0], eps), p[1], p[2]).view(C, N, 3, num_heads, Wd // num_heads).permute(2, 0, 3, 1, 4)
        q, kk, v = qkv[0], qkv[1], qkv[2]
        bias = p[5].to(q.dtype)[None]  # LatticeAttentionBias(S, K), (heads, N, N): computed once, see attention_biases
        att = F.scaled_dot_product_attention(q, kk, v, attn_mask=bias)
        x = x + F.linear(att.transpose(1, 2).reshape(C, N, Wd), p[3], p[4])
        x = x + F.linear(F.silu(F.linear(rms(x, p[7], eps), p[8], p[9])), p[10], p[11])
    h = rms(x, w[12], 1e-6).view(C, S, K, Wd)
    t_b = t[:, None, None].expand_as(h)
    fused = F.silu(F.linear(torch.cat([h, t_b, h * t_b], dim=-1), w[13], w[14]))
    out_v = F.normalize(F.linear(fused, w[15], w[16]), 2.0, -1)
    in_v = F.normalize(F.linear(fused, w[17], w[18]), 2.0, -1)
    anchor_out = F.normalize(F.linear(t, w[19], w[20]), 2.0, -1)
    path = torch.empty(0, dtype=torch.long, device=x.device)
    if greedy:
        # lattice_scores_reference, greedy_walk_reference
        o, i, a = _unit(out_v), _unit(in_v), _unit(anchor_out)
        anchor_scores = sigma * torch.einsum("cd,ckd->ck", a, i[:, 0])
        pair_scores = sigma * torch.einsum("cskd,csjd->cskj", o[:, :-1], i[:, 1:])
        c = anchor_scores.argmax(dim=-1)
        steps = [c]
        rows = torch.arange(C, device=x.device)
        for s in range(pair_scores.shape[1]):
            c = pair_scores[rows, s, c].argmax(dim=-1)
            steps.append(c)
        path = torch.stack(steps, dim=1)
    return out_v, in_v, anchor_out, path


_SCRIPT = Scripted("scripted LiLiCorr head", "its modules", infer=_infer)


def available() -> bool:
    return _SCRIPT.get() is not None


def _wb(m) -> List[Tensor]:
    return [m.weight, m.bias]


def head_weights(head) -> Tuple[List[Tensor], List[List[Tensor]]]:
    """The head's tensors in _infer's order (read per call: an optimizer step or a load is picked up)."""
    fn = head.feature_norm
    ln = _wb(fn) if isinstance(fn, torch.nn.LayerNorm) else [head.embed_proj.weight, head.embed_proj.weight]
    w = (_wb(head.embed_proj) + _wb(head.hidden_proj) + ln + _wb(head.conf_mlp[0]) + _wb(head.conf_mlp[2])
         + [head.slot_table.weight, head.rank_table.weight, head.lattice.norm.weight] + _wb(head.fuse)
         + _wb(head.out_head) + _wb(head.in_head) + _wb(head.anchor_head))
    layers = [[L.attn_norm.weight, *_wb(L.qkv), *_wb(L.proj), L.bias.slot_distance, L.bias.same_slot,
               L.ffn_norm.weight, *_wb(L.ffn_in), *_wb(L.ffn_out)] for L in head.lattice.layers]
    return w, layers


def attention_biases(head, S: int, K: int) -> List[Tensor]:
    """Each lattice layer's LatticeAttentionBias(S, K) (its own forward), kept until its parameters change:
    an index over a (heads, 2S-1) table that was two of the pass's costliest small ops when redone per block."""
    params = [t for L in head.lattice.layers for t in (L.bias.slot_distance, L.bias.same_slot)]
    key = (S, K, tuple((t.data_ptr(), t._version) for t in params))
    found = head.__dict__.get("_bias_cache")
    if found is None or found[0] != key:
        found = (key, [L.bias(S, K).detach() for L in head.lattice.layers])
        head.__dict__["_bias_cache"] = found
    return found[1]


def infer(head, emb: Tensor, features: Tensor, slot_hidden: Tensor, t: Tensor, greedy: bool):
    """LiLiCorrHead.vectors (+ the greedy walk when `greedy`) in one scripted call; see _infer."""
    w, layers = head_weights(head)
    for p, b in zip(layers, attention_biases(head, emb.shape[1], emb.shape[2])):
        p[5] = b
    fn = head.feature_norm
    layernorm = isinstance(fn, torch.nn.LayerNorm)
    eps = head.lattice.layers[0].attn_norm.eps if head.lattice.layers else 1e-6
    return _SCRIPT.get()["infer"](emb, features, slot_hidden, t, w, layers, head.choices["embed"] == "rms", layernorm,
                     float(fn.eps) if layernorm else 1e-5, head.lattice.layers[0].num_heads if head.lattice.layers else 1,
                     head.S, float(eps), float(head.cfg.sigma), greedy)
