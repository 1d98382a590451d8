"""Adaptive verification length (engine.adaptive_draft_survival): per block and row, verify only the drafts the
drafter itself expects to survive.

The rule. c_s = the top-1 probability of slot s's draft distribution (softmax of the drafter's slot logits at the
row's temperature; 1 for a greedy row), s = 1..S; survival_s = c_1 * ... * c_s, the drafter's own estimate that the
first s drafts are all accepted. A row verifies L = #{s : survival_s >= threshold} drafts, at least 1 (a block
always offers one draft) and at most S; survival never rises along a block, so those are its first L slots. The
target's pass then runs over 1 + max_row L nodes instead of 1 + S (`verified_width`), and every row's chain stops at
its own L.

Why it stays lossless. L is a function of the drafter's slot logits, which exist before the head picks (or samples)
any draft token, so whether slot s is verified never depends on the token drafted there: greedy rows accept the
same prefix of the target's argmaxes, only possibly shorter, and at T > 0 each verified slot is judged by the
proposal's own rule with the proposal's own q (a sampled head's q is untouched), the first unverified slot getting
the bonus token drawn from the target's distribution, as the end of a full block does. The uniforms a row draws
keep their count whatever its width (runner.verify), so a seeded row's output does not depend on its batch mates.

Why a threshold on the drafter's confidence and not vLLM's cost model: see docs/vllm-lilicorr.md (item 6).
"""

from __future__ import annotations

from typing import Sequence

import torch


def check(min_survival: float, tree_head: bool) -> None:
    """Raise on a setting the rule cannot take (called where the engine checks engine.draft_tokens)."""
    if not 0.0 <= min_survival < 1.0:
        raise ValueError(f"engine.adaptive_draft_survival={min_survival}: a survival probability in [0, 1), "
                         f"0 = off (verify every drafted slot)")
    if min_survival > 0 and tree_head:
        raise ValueError("engine.adaptive_draft_survival cuts a chain of drafts; a tree head sizes its tree with "
                         "engine.ddtree_budget")


def slot_confidence(slot_logits: torch.Tensor, temps: Sequence[float]) -> torch.Tensor:
    """(C, S) top-1 probability of each slot's distribution, from slot logits (C, S, V) at each row's temperature
    (a greedy row's at 1: its acceptance is whether the top-1 is the target's argmax, which this estimates)."""
    t = torch.tensor([x if x > 0 else 1.0 for x in temps], dtype=torch.float32, device=slot_logits.device)
    scaled = slot_logits.float() / t[:, None, None]
    # max softmax = exp(max - logsumexp): no (C, S, V) probabilities are materialised
    return torch.exp(scaled.amax(-1) - torch.logsumexp(scaled, -1))


def survival_lengths(confidence: torch.Tensor, min_survival: float) -> torch.Tensor:
    """(C,) drafts to verify per row, in [1, S]: the slots whose running product of confidences (C, S) stays at or
    above min_survival."""
    survival = confidence.cumprod(1)
    return (survival >= min_survival).sum(1).clamp(min=1)


def cut(num_proposed: torch.Tensor, slot_logits: torch.Tensor, temps: Sequence[float],
        min_survival: float) -> torch.Tensor:
    """A proposal's num_proposed (C,) shortened to the rule's lengths."""
    lengths = survival_lengths(slot_confidence(slot_logits, temps), min_survival)
    return torch.minimum(num_proposed.to(torch.long), lengths)


def verified_width(num_proposed: torch.Tensor) -> int:
    """Drafts the target's pass must hold for the rows (C,): the longest row's. One read of the device per block
    (free on CPU, where this option pays; with CUDA graphs the pass keeps its static width and is not cut)."""
    return max(1, int(num_proposed.max()))
