"""LiLiCorr lattice scores and decode rules (paper Eq. 1, 8, 12; App. E).

Shapes: C sequences, S speculative slots (S = B - 1), K candidates per slot, d = d_e.
Slot index 0 below is speculative slot 1; the anchor (paper slot 0) carries a single out vector.

    anchor_scores[c, k]         = sigma * cos(anchor_out[c], in[c, 0, k])           (Eq. 1, s = 0)
    pair_scores[c, s, k, k']    = sigma * cos(out[c, s, k], in[c, s + 1, k'])      (Eq. 1, s >= 1)

Decode rules over these scores:
    greedy  (Eq. 8):  c_0 = argmax_k anchor[k];  c_s = argmax_k' pair[s-1, c_{s-1}, k']
    viterbi (Eq. 12): the path maximizing anchor[c_0] + sum_s pair[s-1, c_{s-1}, c_s]
Ties go to the lowest index: every argmax picks the first maximum; Viterbi keeps the lowest
predecessor among equal partial scores and the lowest final candidate among equal totals.

The references are plain torch and differentiable; `match_and_walk` runs one fused Triton launch on
CUDA (or with TRITON_INTERPRET=1) and the references otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lilicorr.kernels.dispatch import use_triton

COS_EPS = 1e-8  # like torch.nn.functional.cosine_similarity: each norm clamped at eps
RULES = ("greedy", "viterbi")


def _unit(x: Tensor) -> Tensor:
    """x / max(||x||, eps) along the last dim, in fp32."""
    x = x.float()
    return x / x.norm(dim=-1, keepdim=True).clamp_min(COS_EPS)


def lattice_scores_reference(
    out_vecs: Tensor, in_vecs: Tensor, anchor_out: Tensor, sigma: float
) -> tuple[Tensor, Tensor]:
    """out_vecs, in_vecs (C, S, K, d) raw; anchor_out (C, d) -> anchor (C, K), pair (C, S-1, K, K)."""
    o = _unit(out_vecs)  # (C, S, K, d)
    i = _unit(in_vecs)  # (C, S, K, d)
    a = _unit(anchor_out)  # (C, d)
    anchor_scores = sigma * torch.einsum("cd,ckd->ck", a, i[:, 0])  # (C, K)
    pair_scores = sigma * torch.einsum("cskd,csjd->cskj", o[:, :-1], i[:, 1:])  # (C, S-1, K, K)
    return anchor_scores, pair_scores


def greedy_walk_reference(anchor_scores: Tensor, pair_scores: Tensor) -> Tensor:
    """Eq. 8: anchor (C, K), pair (C, S-1, K, K) -> (C, S) int64; ties -> lowest index."""
    c = anchor_scores.argmax(dim=-1)  # (C,) torch.argmax returns the first maximum
    path = [c]
    rows = torch.arange(anchor_scores.shape[0], device=anchor_scores.device)
    for s in range(pair_scores.shape[1]):
        c = pair_scores[rows, s, c].argmax(dim=-1)  # (C,) best successor of the committed one
        path.append(c)
    return torch.stack(path, dim=1)


def viterbi_reference(anchor_scores: Tensor, pair_scores: Tensor) -> Tensor:
    """Eq. 12 exact maximizer by dynamic programming, O(S K^2); ties -> lowest index."""
    best = anchor_scores.float()  # (C, K) best path score ending at each candidate
    back = []  # per step (C, K): predecessor of each candidate on its best path
    for s in range(pair_scores.shape[1]):
        total = best[:, :, None] + pair_scores[:, s].float()  # (C, K_prev, K_next)
        best, arg = total.max(dim=1)  # max over predecessors
        # torch.max's index among equal values is not promised; take the first maximum explicitly.
        arg = (total == best[:, None, :]).to(torch.int8).argmax(dim=1)
        back.append(arg)
    c = best.argmax(dim=-1)  # (C,)
    path = [c]
    for arg in reversed(back):
        c = arg.gather(1, c[:, None])[:, 0]
        path.append(c)
    return torch.stack(path[::-1], dim=1)


def decode_reference(anchor_scores: Tensor, pair_scores: Tensor, rule: str = "greedy") -> Tensor:
    if rule == "greedy":
        return greedy_walk_reference(anchor_scores, pair_scores)
    if rule == "viterbi":
        return viterbi_reference(anchor_scores, pair_scores)
    raise ValueError(f"unknown decode rule {rule!r}; expected one of {RULES}")


def match_and_walk(
    out_vecs: Tensor, in_vecs: Tensor, anchor_out: Tensor, sigma: float, rule: str = "greedy"
) -> Tensor:
    """Raw vectors -> (C, S) int64 candidate index per slot. One Triton launch on CUDA."""
    if rule not in RULES:
        raise ValueError(f"unknown decode rule {rule!r}; expected one of {RULES}")
    if use_triton(out_vecs):
        from lilicorr.kernels.lattice_triton import match_and_walk_triton

        return match_and_walk_triton(out_vecs, in_vecs, anchor_out, sigma, rule)[0]
    anchor_scores, pair_scores = lattice_scores_reference(out_vecs, in_vecs, anchor_out, sigma)
    return decode_reference(anchor_scores, pair_scores, rule)
