"""Vanilla DFlash: no head, each slot takes its own argmax; the objective is Eq. 6 alone."""

from __future__ import annotations

from lilicorr.models.heads.base import HeadBatch, HeadLoss, SpecHead, full_proposal


class VanillaHead(SpecHead):
    name = "none"

    def propose(self, slot_logits, slot_hidden, target_state, anchor_ids, temperature=0.0, generator=None):
        return full_proposal(slot_logits.argmax(-1))

    def loss(self, batch: HeadBatch, dflash) -> HeadLoss:
        return HeadLoss(loss=dflash, terms={"dflash": dflash})

    def teacher_forced_top1(self, batch: HeadBatch):
        return batch.slot_logits.argmax(-1)
