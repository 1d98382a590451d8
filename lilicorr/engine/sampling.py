"""Target distributions and inverse-CDF sampling from given uniforms (no torch.multinomial).

Greedy is the special case of sampling: a row with temperature 0 gets the one-hot distribution of
its argmax, so verification and sampling run one code path for every row of a mixed batch. Uniforms
come from each request's own torch.Generator (see `draw_uniforms`), so a request's output depends on
its seed only, not on which other requests share its batch.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """(C, N, V) probabilities from logits (C, N, V) with per-row temperature (C,).

    temperature == 0 -> one-hot argmax. Otherwise softmax(logits / T) restricted to the top_k tokens
    (0 = off) and to the smallest set of tokens whose mass reaches top_p (1.0 = off), renormalised.
    """
    logits = logits.float()
    greedy = torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    temp = temperature.float().clamp_min(1e-6)[:, None, None]  # (C, 1, 1)
    scaled = logits / temp
    if top_k and top_k > 0 and top_k < logits.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]  # (C, N, 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly above each token
        keep_sorted = before < top_p  # the top token is always kept
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(-1, keepdim=True)
    is_greedy = (temperature <= 0)[:, None, None]
    return torch.where(is_greedy, greedy, probs)


def warp_proposal(q: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Apply the same top-k / top-p truncation to a proposal distribution q (..., V), renormalised.

    A sampled proposer should draw from this warped q so draft and target are truncated alike; the
    verifier is exact for whatever q the tokens were actually drawn from.
    """
    if top_k and 0 < top_k < q.shape[-1]:
        kth = q.topk(top_k, dim=-1).values[..., -1:]
        q = q * (q >= kth)
    if top_p < 1.0:
        sorted_q, order = q.sort(dim=-1, descending=True)
        norm = sorted_q.sum(-1, keepdim=True).clamp_min(1e-30)
        keep_sorted = (sorted_q.cumsum(-1) - sorted_q) / norm < top_p
        q = q * torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return q / q.sum(-1, keepdim=True).clamp_min(1e-30)


def sample_with_uniform(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids (C,) drawn from unnormalised probs (C, V) by inverse CDF with uniforms u (C,) in [0, 1)."""
    cdf = probs.float().cumsum(-1)  # (C, V)
    target = (u.float() * cdf[:, -1])[:, None]
    idx = torch.searchsorted(cdf, target, right=True)[:, 0]  # first index whose cdf exceeds the draw
    return idx.clamp(max=probs.shape[-1] - 1)


def draw_uniforms(generators: Sequence[Optional[torch.Generator]], shape: tuple[int, ...],
                  device: torch.device | str) -> torch.Tensor:
    """(C, *shape) uniforms, row c from generators[c] (a fixed count per step keeps streams aligned).

    A row without a generator (greedy) gets zeros: its distributions are one-hot, so any u works.
    """
    rows = []
    for g in generators:
        if g is None:
            rows.append(torch.zeros(shape, device=device))
        else:
            rows.append(torch.rand(shape, generator=g, device=g.device))
    return torch.stack(rows).to(device)
