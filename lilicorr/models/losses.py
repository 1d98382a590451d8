"""Training objectives: the DFlash block CE (Eq. 6), LiLiCorr's oracle-prefix terms (Eq. 2-5, 13), totals.

Shapes: C blocks, S = B - 1 speculative slots (index 0 here is paper slot 1), K candidates, V vocab.
Every LiLiCorr term is averaged over the same set of supervised slots: the oracle prefix, the leading
run of slots whose ground truth is among the K candidates (App. A "Objective").
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from lilicorr.config import LossConfig


def slot_decay_weights(num_slots: int, beta: float, device=None) -> Tensor:
    """w_s = exp(-(s-1)/beta) for paper slots s = 1..S -> (S,)."""
    s = torch.arange(num_slots, device=device, dtype=torch.float32)
    return torch.exp(-s / beta)


def dflash_loss(slot_logits: Tensor, labels: Tensor, valid: Tensor, beta: float) -> Tensor:
    """Eq. 6: decayed per-slot CE, normalised by the summed weights of the valid slots.

    slot_logits (C, S, V), labels (C, S) int64, valid (C, S) bool. Slot 0 of the block (the anchor)
    is not passed in: it carries no loss.
    """
    C, S, V = slot_logits.shape
    ce = F.cross_entropy(slot_logits.reshape(C * S, V).float(), labels.reshape(-1).clamp_min(0),
                         reduction="none").view(C, S)
    w = slot_decay_weights(S, beta, slot_logits.device)[None, :] * valid.float()  # (C, S)
    return (ce * w).sum() / w.sum().clamp_min(1e-12)


def _slot_ce(logits: Tensor, labels: Tensor, soft_logits: Optional[Tensor], distill: float) -> Tensor:
    """Per-row CE (R,) of logits (R, V): (1 - distill) x hard CE on labels + distill x CE on softmax(soft_logits)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    ce = -logp.gather(-1, labels.clamp_min(0)[:, None])[:, 0]
    if soft_logits is not None and distill > 0:
        soft = -(torch.softmax(soft_logits.float(), dim=-1) * logp).sum(-1)
        ce = (1.0 - distill) * ce + distill * soft
    return ce


def dflash_loss_distilled(slot_logits: Tensor, labels: Tensor, valid: Tensor, beta: float,
                          target_logits: Optional[Tensor] = None, distill: float = 0.0) -> Tensor:
    """Eq. 6 with an optional soft-label term: per slot (1-d) CE(label) + d CE(softmax(target_logits)).

    distill = 0 is `dflash_loss` exactly. slot_logits / target_logits (C, S, V).
    """
    C, S, V = slot_logits.shape
    tl = target_logits.reshape(C * S, V) if target_logits is not None else None
    ce = _slot_ce(slot_logits.reshape(C * S, V), labels.reshape(-1), tl, distill).view(C, S)
    w = slot_decay_weights(S, beta, slot_logits.device)[None, :] * valid.float()
    return (ce * w).sum() / w.sum().clamp_min(1e-12)


def oracle_prefix(cand_ids: Tensor, labels: Tensor, valid: Tensor,
                  drop_partial: bool = False) -> tuple[Tensor, Tensor]:
    """cand_ids (C, S, K), labels (C, S), valid (C, S) -> (g_idx (C, S) int64, prefix (C, S) bool).

    g_idx is the ground truth's candidate index (0 where it is not a candidate); prefix marks the slots
    up to, not including, the first slot whose ground truth is missing (or whose label is invalid).
    drop_partial: a block with any invalid slot gets no prefix at all (Model-Optimizer's hf_lilicorr.py
    trains a block "only when every one of its slots is a supervised position"); otherwise it is cut.
    """
    if drop_partial:
        valid = valid & valid.all(-1, keepdim=True)
    hit = (cand_ids == labels[..., None]) & valid[..., None]  # (C, S, K)
    covered = hit.any(-1)
    g_idx = hit.to(torch.int8).argmax(-1).long()
    prefix = torch.cumprod(covered.long(), dim=1).bool()
    return g_idx, prefix


def cumulative_mask(valid: Tensor) -> Tensor:
    """valid (C, S) bool -> (C, S) bool: slot s kept only while slots 0..s are all valid (a cumulative product
    along the block, SpecForge DSpark's `eval_mask.cumprod(dim=-1)`)."""
    return torch.cumprod(valid.long(), dim=1).bool()


def teacher_forced_scores(anchor_scores: Tensor, pair_scores: Tensor, g_idx: Tensor) -> Tensor:
    """Eq. 2 logits conditioned on the ground-truth predecessor: z (C, S, K).

    z[:, 0] = anchor_scores; z[:, s] = pair_scores[:, s-1, g_idx[:, s-1], :] for s >= 1.
    """
    C, S1, K, _ = pair_scores.shape
    prev = g_idx[:, :S1, None, None].expand(C, S1, 1, K)  # (C, S-1, 1, K)
    rows = pair_scores.gather(2, prev)[:, :, 0]  # (C, S-1, K)
    return torch.cat([anchor_scores[:, None], rows], dim=1)


def _prefix_mean(per_slot: Tensor, prefix: Tensor) -> Tensor:
    """Mean of per_slot (C, S) over prefix slots; 0 (still in the graph) when there are none."""
    m = prefix.float()
    return (per_slot * m).sum() / m.sum().clamp_min(1.0)


def lilicorr_ce(z: Tensor, g_idx: Tensor, prefix: Tensor) -> Tensor:
    """Eq. 3: -mean over oracle-prefix slots of log softmax_k(z_s)[g_s]."""
    nll = -torch.log_softmax(z.float(), dim=-1).gather(-1, g_idx[..., None])[..., 0]  # (C, S)
    return _prefix_mean(nll, prefix)


def distractor_penalty(z: Tensor, g_idx: Tensor, target_logq: Tensor, prefix: Tensor) -> Tensor:
    """Eq. 4-5: mean over prefix slots of sum_k P(k) relu(log q_g - log q_k).

    target_logq (C, S, K): the target's log-probability of each candidate (teacher-forced pass).
    """
    p = torch.softmax(z.float(), dim=-1)  # (C, S, K)
    logq_g = target_logq.gather(-1, g_idx[..., None])  # (C, S, 1)
    cost = torch.relu(logq_g - target_logq).detach()  # the target is frozen: constants
    return _prefix_mean((p * cost).sum(-1), prefix)


def margin_loss(z: Tensor, g_idx: Tensor, prefix: Tensor, rho: float) -> Tensor:
    """Eq. 13: mean over prefix slots of relu(rho - (z[g] - max_{k != g} z[k]))."""
    z = z.float()
    zg = z.gather(-1, g_idx[..., None])[..., 0]
    others = z.scatter(-1, g_idx[..., None], -math.inf)
    gap = zg - others.max(-1).values
    return _prefix_mean(torch.relu(rho - gap), prefix)


def lilicorr_objective(dflash: Tensor, ce: Tensor, dist: Tensor, margin: Tensor, cfg: LossConfig) -> Tensor:
    """Eq. 7 with the margin blend of App. G: L_DFlash + gamma[(1-mu) L_CE + lambda L_dist + mu L_margin].

    mu = 0 gives Eq. 7 exactly.
    """
    return dflash + cfg.gamma * ((1.0 - cfg.mu) * ce + cfg.lam * dist + cfg.mu * margin)
