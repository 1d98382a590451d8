"""The one interface every speculative head implements (vanilla, LiLiCorr, Domino, DSpark).

Inference: `propose(slot_logits, slot_hidden, target_state, anchor_ids) -> Proposal`.
Training: `loss(batch, dflash) -> HeadLoss` where `dflash` is the drafter's Eq. 6 loss on the same
blocks and `HeadLoss.loss` is the head's whole objective (it decides how the DFlash term enters).
Shapes: C blocks, S = B - 1 slots, V vocab, H drafter hidden, n captured target layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor, nn


@dataclass
class Proposal:
    tokens: Tensor  # (C, S) int64 drafted token per slot
    num_proposed: Tensor  # (C,) int64 slots offered for verification (DSpark's cut-off; S otherwise)
    q_probs: Optional[Tensor] = None  # (C, S, V) proposal distribution, only for sampled proposals
    extra: dict = field(default_factory=dict)  # head-specific (scores, confidences, candidate ids)


@dataclass
class HeadBatch:
    """Teacher-forced training inputs for C blocks."""

    slot_logits: Tensor  # (C, S, V) drafter logits (with grad)
    slot_hidden: Tensor  # (C, S, H) drafter hidden states (with grad)
    labels: Tensor  # (C, S) int64 ground-truth token per slot
    valid: Tensor  # (C, S) bool: label exists and is inside the loss mask
    target_logits: Optional[Tensor]  # (C, S, V) target logits at the position that predicts each slot (no grad);
    # None in vanilla DFlash steps without metrics (nothing reads them)
    target_state: Tensor  # (C, n*H) captured target states at the position before the anchor
    anchor_ids: Tensor  # (C,) int64
    progress: float = 0.0  # training progress in [0, 1] (Domino's lambda decay)
    # (C, S) bool: labels the drafter can propose (drafter.draft_vocab); None = all. Token-CE terms skip the
    # others (their logit is a floor: no gradient worth following, and a loss that would swamp the rest).
    label_drafted: Optional[Tensor] = None
    # (V',) int64: the token id of each column of slot_logits / target_logits when they cover only the drafter's
    # draft vocabulary (a "compact" batch: heads with `compact_vocab`); None = the columns are the token ids.
    # target_logits are then the target's distribution renormalised over that vocabulary.
    vocab_ids: Optional[Tensor] = None
    target_greedy: Optional[Tensor] = None  # (C, S) the target's greedy token ids (over the full vocabulary)

    def column_ids(self, cols: Tensor) -> Tensor:
        """Logit column indices -> token ids."""
        return cols if self.vocab_ids is None else self.vocab_ids[cols]

    def ce_valid(self) -> Tensor:
        """Where a token cross-entropy on the labels applies: valid and proposable."""
        return self.valid if self.label_drafted is None else self.valid & self.label_drafted


@dataclass
class HeadLoss:
    loss: Tensor  # scalar: the whole objective, DFlash term included as the head prescribes
    terms: dict  # name -> scalar tensor (for logging)
    metrics: dict = field(default_factory=dict)  # name -> float


class SpecHead(nn.Module):
    name = "base"
    sampled = False  # True when propose() samples and returns q_probs
    # True when the head trains on compact batches (logits over the draft vocabulary only, see HeadBatch.vocab_ids)
    # and its propose() takes vocab_ids: V / draft_vocab times less logit memory and work per training step.
    compact_vocab = False

    def __init__(self):
        super().__init__()
        self._target = None

    def attach_target(self, target) -> None:
        # Held outside the module tree: the frozen target's weights never enter the head's state dict.
        object.__setattr__(self, "_target", target)

    def embed(self, ids: Tensor) -> Tensor:
        with torch.no_grad():
            return self._target.embed(ids)

    def propose(self, slot_logits: Tensor, slot_hidden: Tensor, target_state: Tensor, anchor_ids: Tensor,
                temperature: float = 0.0, generator: Optional[torch.Generator] = None) -> Proposal:
        raise NotImplementedError

    def loss(self, batch: HeadBatch, dflash: Tensor) -> HeadLoss:
        raise NotImplementedError

    def teacher_forced_top1(self, batch: HeadBatch) -> Optional[Tensor]:
        """(C, S) the head's choice per slot given the ground-truth predecessors, if it has one."""
        return None


def full_proposal(tokens: Tensor, **kw) -> Proposal:
    C, S = tokens.shape
    return Proposal(tokens=tokens, num_proposed=torch.full((C,), S, dtype=torch.long, device=tokens.device), **kw)
