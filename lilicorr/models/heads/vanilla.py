"""Vanilla DFlash: no head, each slot takes its own argmax; the objective is Eq. 6 alone."""

from __future__ import annotations

from lilicorr.models.heads.base import HeadBatch, HeadLoss, SpecHead, full_proposal


class VanillaHead(SpecHead):
    name = "none"
    compact_vocab = True

    def propose(self, slot_logits, slot_hidden, target_state, anchor_ids, temperature=0.0, generator=None,
                vocab_ids=None):
        cols = slot_logits.argmax(-1)
        return full_proposal(cols if vocab_ids is None else vocab_ids[cols])

    def objective(self, batch: HeadBatch, terms: dict) -> HeadLoss:
        dflash = batch.dflash(terms)
        return HeadLoss(loss=dflash, terms={"dflash": dflash})

    def teacher_forced_top1(self, batch: HeadBatch):
        return batch.column_ids(batch.slot_logits.argmax(-1))
