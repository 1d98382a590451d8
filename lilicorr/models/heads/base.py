"""The one interface every speculative head implements (vanilla, LiLiCorr, Domino, DSpark).

Inference: `propose(slot_logits, slot_hidden, target_state, anchor_ids) -> Proposal`.
Training: `loss(batch) -> HeadLoss`, the head's whole objective (it decides how the drafter's Eq. 6 DFlash term
enters), computed from per-row terms (`row_inputs`, `row_terms`, `objective`) so that no (blocks, slots, vocabulary)
tensor exists at once (models/slot_rows.py).
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
    """Teacher-forced training inputs for C blocks.

    Two forms (models/slot_rows.py): a training batch carries the drafter's hidden states, the target's states at
    the same rows and the LM head (`lm`), and every head's loss runs the LM head, top-K and CE in checkpointed
    chunks of rows; a dense batch (tests, metrics, hand-made batches) carries the logits themselves.
    """

    slot_logits: Optional[Tensor]  # (C, S, V) drafter logits (with grad); None in a chunked training batch
    slot_hidden: Tensor  # (C, S, H) drafter hidden states (with grad)
    labels: Tensor  # (C, S) int64 ground-truth token per slot
    valid: Tensor  # (C, S) bool: label exists and is inside the loss mask
    target_logits: Optional[Tensor]  # (C, S, V) target logits at the position that predicts each slot (no grad);
    # None in chunked batches (computed per chunk where a head reads them)
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
    # Chunked form (slot_rows.py): the target's final-normed states at the rows (C, S, H), its log-normaliser over
    # the columns (C, S), the LM head, and the rows per checkpointed chunk.
    target_hidden: Optional[Tensor] = None
    target_lse: Optional[Tensor] = None
    lm: Optional[object] = None  # slot_rows.SlotLM
    chunk_rows: int = 2048
    beta: float = 7.0  # Eq. 6's slot decay
    distill: float = 0.0  # weight of the soft-label CE in Eq. 6 (train.distill)

    def column_ids(self, cols: Tensor) -> Tensor:
        """Logit column indices -> token ids."""
        return cols if self.vocab_ids is None else self.vocab_ids[cols]

    def ce_valid(self) -> Tensor:
        """Where a token cross-entropy on the labels applies: valid and proposable."""
        return self.valid if self.label_drafted is None else self.valid & self.label_drafted

    def label_columns(self) -> Tensor:
        """(C, S) the label's column in the logits (its index in the draft vocabulary of a compact batch)."""
        if self.lm is not None:
            return self.lm.label_columns(self.labels)
        labels = self.labels.clamp_min(0)
        if self.vocab_ids is None:
            return labels
        return torch.searchsorted(self.vocab_ids, labels.contiguous()).clamp_max(self.vocab_ids.numel() - 1)

    def soft_label_logits(self, target_logits: Tensor) -> Tensor:
        return self.lm.soft_label_logits(target_logits) if self.lm is not None else target_logits

    def slot_weights(self) -> Tensor:
        """(C, S) Eq. 6's weights: exp(-(s-1)/beta) where a label CE applies, else 0."""
        from lilicorr.models.losses import slot_decay_weights

        S = self.labels.shape[1]
        return slot_decay_weights(S, self.beta, self.labels.device)[None, :] * self.ce_valid().float()

    def dflash(self, terms: dict[str, Tensor]) -> Tensor:
        """Eq. 6 (+ soft labels) from the per-row "hard" / "soft" CE terms of `SlotRows.label_ce`."""
        ce = terms["hard"] if "soft" not in terms else (1.0 - self.distill) * terms["hard"] + self.distill * terms["soft"]
        w = self.slot_weights()
        return (ce * w).sum() / w.sum().clamp_min(1e-12)

    def blocks(self, start: int, stop: int, **dense) -> "HeadBatch":
        """Blocks start:stop of this batch (every per-block tensor sliced), with `dense` fields replaced."""
        import dataclasses

        def cut(v):
            return v[start:stop] if isinstance(v, Tensor) and v.dim() > 0 and v is not self.vocab_ids else v

        fields = {f.name: cut(getattr(self, f.name)) for f in dataclasses.fields(self)}
        fields.update(dense)
        return HeadBatch(**fields)


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
    # True when propose() takes context_state: the drafter's fused context (fuse_context) at the position
    # before the anchor, which the engine already computed when it extended the drafter's context.
    reads_context_state = False

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

    def loss(self, batch: HeadBatch) -> HeadLoss:
        """The head's whole objective on `batch`, Eq. 6's DFlash term included as the head prescribes."""
        from lilicorr.models.slot_rows import slot_terms

        return self.objective(batch, slot_terms(batch, self))

    # The loss in two parts (models/slot_rows.py), so that no (C, S, V) tensor is needed:
    def row_inputs(self, batch: HeadBatch) -> dict:
        """Per-row tensors of the head's own (C, S, ...) that its row_terms read, with grad."""
        return {}

    def row_terms(self, rows) -> dict:
        """One chunk of rows (slot_rows.SlotRows) -> per-row outputs {name: (r, ...)}; default: Eq. 6's CE terms."""
        return rows.label_ce()

    def objective(self, batch: HeadBatch, terms: dict) -> HeadLoss:
        """Per-row terms (C, S, ...) -> the objective."""
        raise NotImplementedError

    def teacher_forced_top1(self, batch: HeadBatch) -> Optional[Tensor]:
        """(C, S) the head's choice per slot given the ground-truth predecessors, if it has one."""
        return None


def full_proposal(tokens: Tensor, **kw) -> Proposal:
    C, S = tokens.shape
    return Proposal(tokens=tokens, num_proposed=torch.full((C,), S, dtype=torch.long, device=tokens.device), **kw)
