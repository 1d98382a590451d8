"""Target distributions and sampling by exponential race (argmax p / Exp(1)) keyed by per-row uniforms.

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


def exponential_race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Token ids (...,) = argmax(probs / noise) over the last axis, noise ~ Exp(1) i.i.d. (same shape).

    P(argmax = i) = p_i / sum(p) exactly (the first arrival of independent Poisson clocks with rates p_i),
    and a token with p_i = 0 scores 0, so it can never win while any p_j > 0. The inverse-CDF draw over an
    fp32 cumsum could, about once in 1e7 draws, land on a zero-probability token (the cumsum is not
    monotone to the last ulp). Rows whose probs are all zero return index 0.
    """
    return (probs.double() / noise.double().clamp_min(1e-300)).argmax(-1)


_GOLDEN, _MIX1, _MIX2 = (c - (1 << 64) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (two's-complement wrap; shifts made logical by masking)."""
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * _MIX1
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * _MIX2
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def race_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """(C, V) float64 Exp(1) noise from int64 keys (C,): element i of row c is output i + 1 of a SplitMix64
    stream seeded by mix64(keys[c]), turned into -log(u) with u in (0, 1). One vectorised pass on any device:
    row c depends on its key only."""
    seed = _mix64(keys.long())[:, None]  # mixed: nearby keys do not give overlapping streams
    idx = torch.arange(1, vocab + 1, device=keys.device, dtype=torch.long)[None, :]
    z = _mix64(seed + idx * _GOLDEN)
    u = (((z >> 11) & ((1 << 53) - 1)).double() + 0.5) * 2.0 ** -53  # 53 bits, never 0 or 1
    return -torch.log(u)


def sample_with_uniform(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids (C,) drawn from unnormalised probs (C, V) by an exponential race keyed by uniforms u (C,).

    Each row's uniform comes from its request's own torch.Generator (`draw_uniforms`): one uniform per draw
    keeps every request's stream aligned, so the result depends on the request's seed only, never on its
    batch mates. The uniform's bits key the row's Exp(1) noise (`race_noise`).
    """
    keys = (u.double().clamp(0.0, 1.0) * 2.0 ** 53).long()
    return exponential_race(probs, race_noise(keys, probs.shape[-1]))


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
