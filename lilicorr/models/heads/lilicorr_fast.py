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

from lilicorr.kernels.compiled import Compiled
from lilicorr.kernels.scripted import Scripted
from lilicorr.kernels.topk_logsoftmax import NUM_FEATURES, _topk_ids_chunked, candidate_features
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


def attention_biases(head, S: int, K: int) -> List[Tensor]:
    """Each lattice layer's LatticeAttentionBias(S, K) (its own forward), kept until its parameters change:
    an index over a (heads, 2S-1) table that was two of the pass's costliest small ops when redone per block."""
    params = [t for b in head.lattice.layer_biases() for t in (b.slot_distance, b.same_slot)]
    return _derived(head, "_bias_cache", (S, K), params,
                    lambda: [b(S, K).detach() for b in head.lattice.layer_biases()])


def _options(head, S: int, K: int) -> Tuple[List[Tensor], List[List[Tensor]], bool, bool, float, int, float, float]:
    """_infer's arguments that come from the head: (w, layers, rms_embed, layernorm, ln_eps, num_heads, eps, sigma)."""
    w, layers = head_weights(head)
    for p, b in zip(layers, attention_biases(head, S, K)):
        p[5] = b
    fn = head.feature_norm
    layernorm = isinstance(fn, torch.nn.LayerNorm)
    first = head.lattice.layers[0] if head.lattice.layers else None
    return (w, layers, head.choices["embed"] == "rms", layernorm, float(fn.eps) if layernorm else 1e-5,
            first.num_heads if first is not None else 1, float(head.lattice.norm.eps),  # every lattice RMSNorm's
            float(head.cfg.sigma))


def infer(head, emb: Tensor, features: Tensor, slot_hidden: Tensor, t: Tensor, greedy: bool):
    """LiLiCorrHead.vectors (+ the greedy walk when `greedy`) in one scripted call; see _infer."""
    w, layers, rms_embed, layernorm, ln_eps, num_heads, eps, sigma = _options(head, emb.shape[1], emb.shape[2])
    return _SCRIPT.get()["infer"](emb, features, slot_hidden, t, w, layers, rms_embed, layernorm, ln_eps, num_heads,
                                  head.S, eps, sigma, greedy)


# ----------------------------------------------------------------------------- batch 1, compiled


def _propose_one_row(logits: Tensor, vocab_ids: Optional[Tensor], embed_nodes: Tensor, out_in: List[Tensor],
                     slot_hidden: Tensor, t: Tensor, proj: List[Tensor], proj_eps: float, k: int, w: List[Tensor],
                     layers: List[List[Tensor]], layernorm: bool, ln_eps: float, num_heads: int, eps: float,
                     sigma: float) -> Tuple[Tensor, Tensor]:
    """The whole greedy proposal of one row: logits (1, S, V') over the draft vocabulary (vocab_ids (V',) their
    token ids; None: V' is the target's vocabulary), embed_nodes (V', W) = embed_proj of each column's target
    embedding (one_row_tables), out_in = [out_head and in_head weights stacked (2d, W), biases (2d,)], slot_hidden
    (1, S, H), t the target state: (1, W) projected already when `proj` is empty, else the drafter's fused context
    (1, H_d) that proj = [target_proj w, b, target_norm w] projects -> committed tokens (1, S), candidates (1, S, K).
    LiLiCorrHead.propose's eager prelude (topk_logsoftmax_fast: exact top-K ids, then the log-softmax and
    features, target_projection) and _infer, with three of _infer's GEMMs precomputed or folded (see the notes)."""
    C, S, V = logits.shape
    dtype = w[0].dtype
    if len(proj) == 3:  # LiLiCorrHead.target_projection, "fused" with the engine's context state
        t = rms(F.linear(t.to(proj[0].dtype), proj[0], proj[1]), proj[2], proj_eps)
    x = logits.reshape(C * S, V).float()
    cols = _topk_ids_chunked(x, k)  # (S, K) exact ids, ties -> lower id: integer keys, so compiled they stay exact
    logprobs = torch.log_softmax(x, dim=-1).gather(1, cols)
    f = candidate_features(logprobs).view(C, S, k, NUM_FEATURES).to(dtype)
    cand = cols.view(C, S, k) if vocab_ids is None else vocab_ids[cols.view(C, S, k)]
    if layernorm:
        f = F.layer_norm(f, [f.shape[-1]], w[4], w[5], ln_eps)
    Wd = w[0].shape[0]
    nodes = (embed_nodes[cols].view(C, S, k, Wd)  # = F.linear(embedding, embed_proj): a row per column, made once
             + F.linear(slot_hidden.to(dtype), w[2], w[3])[:, :, None]
             + F.linear(F.silu(F.linear(f, w[6], w[7])), w[8], w[9])
             + w[10][:S, None]
             + w[11][None, :k])  # (1, S, K, W)
    h = _lattice(nodes, layers, num_heads, eps, w[12])
    # fuse(cat[h, t, h*t]) with one row's t folded into the weights: h Wa' + (t Wb' + b) + h (Wc * t)'; a (W, W)
    # GEMM where the concatenation made a (W, 3W) one
    fw = w[13]
    fused = F.silu(F.linear(h, fw[:, :Wd] + fw[:, 2 * Wd:] * t, w[14] + F.linear(t, fw[:, Wd:2 * Wd])[0]))
    oi = F.linear(fused, out_in[0], out_in[1])  # out_head and in_head in one GEMM
    d = oi.shape[-1] // 2
    out_v, in_v = F.normalize(oi[..., :d], 2.0, -1), F.normalize(oi[..., d:], 2.0, -1)
    anchor_out = F.normalize(F.linear(t, w[19], w[20]), 2.0, -1)
    path = _walk(out_v, in_v, anchor_out, sigma)
    return cand.gather(-1, path[..., None])[..., 0], cand


def stamp(sources: List[Tensor]) -> tuple:
    """What says a tensor changed: its storage, its in-place version and its shape."""
    return tuple((x.data_ptr(), x._version, x.shape) for x in sources)


def _derived(head, name: str, key: tuple, sources: List[Tensor], build):
    """build()'s tensors kept on the head until `key` or one of `sources` changes (its storage or in-place
    version: an optimizer step, load_state_dict, module.to): weights derived from parameters, made once, not per
    block."""
    full = (key, stamp(sources))
    found = head.__dict__.get(name)
    if found is None or found[0] != full:
        with torch.no_grad():
            found = (full, build())
        head.__dict__[name] = found
    return found[1]


def one_row_tables(head, S: int, vocab_ids: Optional[Tensor], sources: List[Tensor]):
    """What _propose_one_row reads that derives from parameters, kept per parameter version (_derived):
    (embed_nodes (V', W), [out_in weight (2d, W), bias (2d,)], each lattice layer's attention bias (heads, S*K, S*K)).
    embed_nodes: embed_proj of the (normalised, "rms") target embedding of every logit column (the draft
    vocabulary's tokens, or all), so a block gathers its K*S rows instead of projecting them. sources: from
    _one_row_args, the target's embedding table last."""
    table = sources[-1]
    ep, oh, ih = head.embed_proj, head.out_head, head.in_head

    def build():
        emb = (table if vocab_ids is None else table[vocab_ids]).float()  # LiLiCorrHead.vectors' embedding
        if head.choices["embed"] == "rms":
            emb = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + 1e-6)
        nodes = F.linear(emb.to(ep.weight.dtype), ep.weight, ep.bias)
        out_in = [torch.cat([oh.weight, ih.weight]), torch.cat([oh.bias, ih.bias])]
        return nodes, out_in, attention_biases(head, S, head.K)

    return _derived(head, "_one_row_tables", (S,), sources if vocab_ids is None else [*sources, vocab_ids], build)


# Why compiled, and only for one row: at batch 1 the scripted pass still runs ~170 aten ops one by one, plus the
# eager top-K, features and target projection (~40 more), each paying PyTorch's dispatch, and inside the engine
# with caches the target's pass has just flushed. Inductor fuses the pointwise and reduction chains into a few C++
# kernels around the GEMMs (the session-11 closing note has the figures; `jobs/bench.py stages` runs
# `engine.cpu_compile_head=false` beside it). Static shapes: a decoder compiles it once (its warm-up), where a
# dynamic row count would cost the small GEMMs their specialisation; rows > 1 keep the scripted pass. The sums
# run in Inductor's order (fp32, ~1e-6 relative), so a score within that of another could pick the other
# candidate: a different draft, never a different output (the target verifies it).
# One thread: its GEMMs are (S*K = 12..28, 128) x (128, 128..384), too small to split over cores, and one thread
# measured faster than two inside the engine (docs/results.md). Inductor sees the same count when it compiles
# (its kernels' OpenMP width). cpp_wrapper: the graph's ~60 kernel and GEMM calls from generated C++, not a Python
# wrapper, which measured cheaper a call.
_COMPILED = Compiled("compiled batch-1 LiLiCorr head", "the scripted head", _propose_one_row, threads=1,
                     dynamic=False, options={"cpp_wrapper": True})


def _one_row_args(head, S: int) -> tuple:
    """(_propose_one_row's head-side arguments after the state, the sources of one_row_tables), gathered once per
    head (reading ~60 attributes per block cost ~0.1 ms): the head's and the target's Parameter objects, so in-place
    updates (an optimizer step, load_state_dict, module.to) are seen, and one_row_tables remakes what derives
    from them."""
    found = head.__dict__.get("_one_row_args")
    if found is None or found[0] != S:
        w, layers, _rms_embed, *options = _options(head, S, head.K)  # rms_embed: in one_row_tables
        fused = head.choices["target"] == "fused"
        proj = [head.target_proj.weight, head.target_proj.bias, head.target_norm.weight] if fused else []
        eps = float(head.target_norm.eps) if fused else 1e-6
        sources = [t for b in head.lattice.layer_biases() for t in (b.slot_distance, b.same_slot)]
        sources += [t for m in (head.embed_proj, head.out_head, head.in_head) for t in (m.weight, m.bias)]
        found = (S, (proj, eps, head.K, w, layers, *options), [*sources, head._target.embed_weight])
        head.__dict__["_one_row_args"] = found
    return found[1], found[2]


def propose_one_row(head, logits: Tensor, vocab_ids: Optional[Tensor], slot_hidden: Tensor, target_state: Tensor,
                    context_state: Optional[Tensor], strict: bool = False) -> Optional[Tuple[Tensor, Tensor]]:
    """(tokens (1, S), candidates (1, S, K)) of a greedy LiLiCorrHead for one row, or None where Inductor cannot
    compile here (then the caller runs the scripted pass). target_state, context_state: as in
    LiLiCorrHead.target_projection (the projection runs in the graph when the head reads the context state)."""
    S = logits.shape[1]
    (proj, *args), sources = _one_row_args(head, S)
    embed_nodes, out_in, biases = one_row_tables(head, S, vocab_ids, sources)
    for p, b in zip(args[3], biases):  # the layers' attention bias slot
        p[5] = b
    if proj and context_state is not None:
        t = context_state
    else:
        t, proj = head.target_projection(target_state, context_state), []
    return _COMPILED(logits, vocab_ids, embed_nodes, out_in, slot_hidden, t, proj, *args, strict=strict)
