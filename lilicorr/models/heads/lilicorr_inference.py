"""The LiLiCorr head's inference pass (vectors -> scores -> greedy walk) as ONE TorchScript call.

Why: at batch 1 the pass is ~150 small ops (28 nodes of width 128: two lattice layers, the fusion, three
unit-norm heads, the scores, a 7-step walk); on a 2-core CPU each pays Python's dispatch, which was most
of the head's cost a block (docs/results.md, "CPU fast paths"). The TorchScript interpreter runs the same aten ops
without it.

The readable reference is the module code (LiLiCorrHead.vectors, LatticeTransformer, lattice_scores_reference,
greedy_walk_reference); this body is theirs op for op, in the same order, over plain tensors, so the outputs
are bit-identical (tests/parity/test_parity_lilicorr_head.py). Inference only (no_grad, fp32 or any one
dtype): training keeps the modules. If TorchScript cannot script here, `available()` is False and the head
runs its modules. The engine asks for this pass through a HeadInference (below) passed to `propose`; a direct call
without one runs the modules.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from lilicorr.kernels.scripted import Scripted
from lilicorr.models.drafter_fast import rms  # drafter_layers.RMSNorm.forward

COS_EPS = 1e-8  # = lilicorr.kernels.lattice.COS_EPS


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
    h = _lattice(nodes, layers, num_heads, eps, w[12])
    t_b = t[:, None, None].expand_as(h)
    fused = F.silu(F.linear(torch.cat([h, t_b, h * t_b], dim=-1), w[13], w[14]))
    out_v = F.normalize(F.linear(fused, w[15], w[16]), 2.0, -1)
    in_v = F.normalize(F.linear(fused, w[17], w[18]), 2.0, -1)
    anchor_out = F.normalize(F.linear(t, w[19], w[20]), 2.0, -1)
    path = _walk(out_v, in_v, anchor_out, sigma) if greedy else torch.empty(0, dtype=torch.long, device=emb.device)
    return out_v, in_v, anchor_out, path


def _lattice(nodes: Tensor, layers: List[List[Tensor]], num_heads: int, eps: float, norm: Tensor) -> Tensor:
    """LatticeTransformer.forward: nodes (C, S, K, W) -> (C, S, K, W) after its final norm."""
    C, S, K, Wd = nodes.shape
    N = S * K
    x = nodes.reshape(C, N, Wd)
    for p in layers:
        # LatticeLayer.forward, LatticeAttentionBias.forward
        qkv = F.linear(rms(x, p[0], eps), p[1], p[2]).view(C, N, 3, num_heads, Wd // num_heads).permute(2, 0, 3, 1, 4)
        q, kk, v = qkv[0], qkv[1], qkv[2]
        bias = p[5].to(q.dtype)[None]  # LatticeAttentionBias(S, K), (heads, N, N): computed once, see attention_biases
        att = F.scaled_dot_product_attention(q, kk, v, attn_mask=bias)
        x = x + F.linear(att.transpose(1, 2).reshape(C, N, Wd), p[3], p[4])
        x = x + F.linear(F.silu(F.linear(rms(x, p[7], eps), p[8], p[9])), p[10], p[11])
    return rms(x, norm, eps).view(C, S, K, Wd)


def _walk(out_v: Tensor, in_v: Tensor, anchor_out: Tensor, sigma: float) -> Tensor:
    """lattice_scores_reference + greedy_walk_reference: out, in (C, S, K, d), anchor_out (C, d) -> path (C, S)."""
    C = out_v.shape[0]
    o, i, a = _unit(out_v), _unit(in_v), _unit(anchor_out)
    anchor_scores = sigma * torch.einsum("cd,ckd->ck", a, i[:, 0])
    pair_scores = sigma * torch.einsum("cskd,csjd->cskj", o[:, :-1], i[:, 1:])
    c = anchor_scores.argmax(dim=-1)
    steps = [c]
    rows = torch.arange(C, device=out_v.device)
    for s in range(pair_scores.shape[1]):
        c = pair_scores[rows, s, c].argmax(dim=-1)
        steps.append(c)
    return torch.stack(steps, dim=1)


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
    layers = [[L.attn_norm.weight, *_wb(L.qkv), *_wb(L.proj), b.slot_distance, b.same_slot,
               L.ffn_norm.weight, *_wb(L.ffn_in), *_wb(L.ffn_out)]
              for L, b in zip(head.lattice.layers, head.lattice.layer_biases())]
    return w, layers


def stamp(sources: List[Tensor]) -> tuple:
    """What says a tensor changed: its storage, its in-place version and its shape."""
    return tuple((x.data_ptr(), x._version, x.shape) for x in sources)


class HeadInference:
    """What a decoder keeps for one LiLiCorr head's inference: which fast paths its proposals take (engine/backend.py
    chose them; engine/drafting.py builds this and passes it to every `propose`) and the tables derived from the
    head's parameters, made once and remade when one of their parameters changes (its storage or in-place version:
    an optimizer step, load_state_dict, module.to). The head holds none of it: two decoders over one head, or a
    training loop beside a decoder, never see each other's choice or tables.
      scripted  2+ rows (and one row the C call does not take): the scripted pass (_infer), else the modules
      native    one greedy fp32 row: the C call (heads/lilicorr_native.py)"""

    def __init__(self, scripted: bool = True, native: bool = False):
        self.scripted, self.native = scripted, native
        self._tables: dict = {}
        self.native_plan = None  # heads/lilicorr_native.py's _Plan, made on the first one-row call
        self.native_sources = None  # (vocab_ids, the tensors the plan derives from)
        self.native_args = None  # (S, the kernel's head-side arguments, their sources)

    def derived(self, name: str, key: tuple, sources: List[Tensor], build):
        """build()'s tensors kept until `key` or one of `sources` changes: weights derived from parameters, made
        once, not per block."""
        full = (key, stamp(sources))
        found = self._tables.get(name)
        if found is None or found[0] != full:
            with torch.no_grad():
                found = (full, build())
            self._tables[name] = found
        return found[1]


def attention_biases(head, S: int, K: int, tables: Optional[HeadInference] = None) -> List[Tensor]:
    """Each lattice layer's LatticeAttentionBias(S, K) (its own forward), kept in `tables` until its parameters
    change: an index over a (heads, 2S-1) table that was two of the pass's costliest small ops when redone per block.
    tables None: made afresh."""
    def build():
        return [b(S, K).detach() for b in head.lattice.layer_biases()]

    if tables is None:
        with torch.no_grad():
            return build()
    params = [t for b in head.lattice.layer_biases() for t in (b.slot_distance, b.same_slot)]
    return tables.derived("biases", (S, K), params, build)


def options(head, S: int, K: int, tables: Optional[HeadInference] = None
            ) -> Tuple[List[Tensor], List[List[Tensor]], bool, bool, float, int, float, float]:
    """_infer's arguments that come from the head: (w, layers, rms_embed, layernorm, ln_eps, num_heads, eps, sigma)."""
    w, layers = head_weights(head)
    for p, b in zip(layers, attention_biases(head, S, K, tables)):
        p[5] = b
    fn = head.feature_norm
    layernorm = isinstance(fn, torch.nn.LayerNorm)
    first = head.lattice.layers[0] if head.lattice.layers else None
    return (w, layers, head.choices["embed"] == "rms", layernorm, float(fn.eps) if layernorm else 1e-5,
            first.num_heads if first is not None else 1, float(head.lattice.norm.eps),  # every lattice RMSNorm's
            float(head.cfg.sigma))


def infer(head, emb: Tensor, features: Tensor, slot_hidden: Tensor, t: Tensor, greedy: bool,
          tables: Optional[HeadInference] = None):
    """LiLiCorrHead.vectors (+ the greedy walk when `greedy`) in one scripted call; see _infer."""
    w, layers, rms_embed, layernorm, ln_eps, num_heads, eps, sigma = options(head, emb.shape[1], emb.shape[2], tables)
    return _SCRIPT.get()["infer"](emb, features, slot_hidden, t, w, layers, rms_embed, layernorm, ln_eps, num_heads,
                                  head.S, eps, sigma, greedy)
