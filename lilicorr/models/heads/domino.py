"""Domino baseline (DESIGN.md §4): a prefix GRU residual on the drafter's logits, one pass per slot.

Slot s >= 2 gets logits_s = drafter_logits_s + MLP(cat[h_s, g_{s-1}]), where g_{s-1} is the state of a
bias-free GRU (hidden 1024 at paper scale) run over the target embeddings of the tokens committed at
slots 1..s-1; MLP = Linear(H + G -> M) -> SiLU -> Linear(M -> V). Slot 1 is left uncorrected.
Training is teacher-forced (the GRU reads ground-truth tokens) with (1-lam) CE_final + lam CE_base,
lam decaying 1 -> 0 over training; CE_base is the drafter's own Eq. 6 loss.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lilicorr.config import DrafterConfig, HeadConfig
from lilicorr.models.losses import dflash_loss
from lilicorr.models.heads.base import HeadBatch, HeadLoss, SpecHead, full_proposal


class DominoHead(SpecHead):
    name = "domino"

    def __init__(self, cfg: HeadConfig, drafter_cfg: DrafterConfig, target_hidden: int, drafter_hidden: int,
                 vocab_size: int):
        super().__init__()
        self.beta = drafter_cfg.loss_decay_beta
        self.gru = nn.GRU(target_hidden, cfg.domino_gru_hidden, bias=False, batch_first=True)
        self.residual = nn.Sequential(nn.Linear(drafter_hidden + cfg.domino_gru_hidden, cfg.domino_mlp_hidden),
                                      nn.SiLU(), nn.Linear(cfg.domino_mlp_hidden, vocab_size))
        nn.init.zeros_(self.residual[2].weight)  # start as vanilla DFlash: the residual grows from zero
        nn.init.zeros_(self.residual[2].bias)

    def corrected_logits(self, slot_logits: Tensor, slot_hidden: Tensor, prefix_tokens: Tensor) -> Tensor:
        """Teacher-forced: prefix_tokens (C, S-1) committed at slots 1..S-1 -> final logits (C, S, V)."""
        states, _ = self.gru(self.embed(prefix_tokens).to(self.residual[0].weight.dtype))  # (C, S-1, G)
        res = self.residual(torch.cat([slot_hidden[:, 1:].to(states.dtype), states], dim=-1))
        return torch.cat([slot_logits[:, :1], slot_logits[:, 1:] + res.to(slot_logits.dtype)], dim=1)

    @torch.no_grad()
    def propose(self, slot_logits, slot_hidden, target_state, anchor_ids, temperature=0.0, generator=None):
        C, S, V = slot_logits.shape
        tok = slot_logits[:, 0].argmax(-1)  # slot 1: uncorrected
        tokens, state = [tok], None
        for s in range(1, S):  # one sequential GRU step + residual per slot
            out, state = self.gru(self.embed(tok[:, None]).to(self.residual[0].weight.dtype), state)
            res = self.residual(torch.cat([slot_hidden[:, s].to(out.dtype), out[:, 0]], dim=-1))
            tok = (slot_logits[:, s] + res.to(slot_logits.dtype)).argmax(-1)
            tokens.append(tok)
        return full_proposal(torch.stack(tokens, dim=1))

    def loss(self, batch: HeadBatch, dflash: Tensor) -> HeadLoss:
        final = self.corrected_logits(batch.slot_logits, batch.slot_hidden, batch.labels[:, :-1].clamp_min(0))
        ce_final = dflash_loss(final, batch.labels, batch.valid, self.beta)
        lam = 1.0 - min(max(batch.progress, 0.0), 1.0)
        total = (1.0 - lam) * ce_final + lam * dflash
        return HeadLoss(loss=total, terms={"dflash": dflash, "ce_final": ce_final},
                        metrics={"domino_lambda": lam})

    @torch.no_grad()
    def teacher_forced_top1(self, batch: HeadBatch) -> Tensor:
        return self.corrected_logits(batch.slot_logits, batch.slot_hidden, batch.labels[:, :-1].clamp_min(0)).argmax(-1)
