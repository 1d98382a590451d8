"""Domino baseline (docs/design.md §4) as SpecForge trains it: a prefix GRU residual on the drafter's logits.

Reference: sgl-project/SpecForge specforge/modeling/draft/domino.py (DominoDraftModel.apply_logits_head,
_init_draft_head) and specforge/algorithms/common/dflash_family_model.py (OnlineDominoModel.forward).
Slot s >= 2 (paper numbering; slot s predicts the token at anchor + s) gets
    logits_s = drafter_logits_s + MLP(cat[h_s, g_s]),   g_s = GRU state after reading [anchor, t_1, ..., t_{s-1}]
so the GRU runs over the anchor too and the first corrected slot (s = 2) already sees two tokens
(SpecForge: gru_inputs = prev_token_embeddings[:, :, :B-1], prefix_states = gru_out[:, :, suffix_start-1:],
suffix_start = 1 + pure_draft_prefix_len with pure_draft_prefix_len = 1). Slot 1 is left uncorrected.
GRU: one layer, no bias (hidden 1024 at paper scale). MLP = Linear(H + G -> M, no bias) -> SiLU ->
Linear(M -> V, no bias), both N(0, 0.02) (SpecForge builds them with bias=False and its post_init applies
the HF init, initializer_range 0.02; the GRU keeps PyTorch's default init there as here).
Training is teacher-forced (the GRU reads ground-truth tokens) with (1-lam) CE_final + lam CE_base, lam
decaying linearly 1 -> 0 over training (SpecForge linear_lambda_base, lambda_base_decay_ratio 1.0 in
qwen3-8b-domino-offline.yaml); CE_base is the drafter's own Eq. 6 loss, CE_final the same decayed CE.

Label layout: the platform's DFlash layout (block position s predicts anchor + s), which is SpecForge's
`shift_label=False` Domino mode. SpecForge's shipped qwen3-8b-domino.json uses `shift_label=True`, where
the anchor position's own hidden state predicts anchor + 1 and the block drafts B tokens instead of B - 1;
that changes the drafter itself (and the verifier's block length) for every head, so it is not taken
here: all heads share one drafter layout. The tokens each corrected slot conditions on are the same in
both modes ([anchor, t_1, ..., t_{s-1}]).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lilicorr.config import DrafterConfig, HeadConfig
from lilicorr.models.heads.base import HeadBatch, HeadLoss, SpecHead, full_proposal


class DominoHead(SpecHead):
    name = "domino"

    def __init__(self, cfg: HeadConfig, drafter_cfg: DrafterConfig, target_hidden: int, drafter_hidden: int,
                 vocab_size: int):
        super().__init__()
        self.beta = drafter_cfg.loss_decay_beta
        self.gru = nn.GRU(target_hidden, cfg.domino_gru_hidden, bias=False, batch_first=True)
        self.residual = nn.Sequential(
            nn.Linear(drafter_hidden + cfg.domino_gru_hidden, cfg.domino_mlp_hidden, bias=False),
            nn.SiLU(), nn.Linear(cfg.domino_mlp_hidden, vocab_size, bias=False))
        for layer in (self.residual[0], self.residual[2]):
            nn.init.normal_(layer.weight, std=0.02)  # HF post_init, initializer_range 0.02

    def _dtype(self):
        return self.residual[0].weight.dtype

    def corrected_logits(self, slot_logits: Tensor, slot_hidden: Tensor, anchor_ids: Tensor,
                         prefix_tokens: Tensor) -> Tensor:
        """Teacher-forced: anchor_ids (C,), prefix_tokens (C, S-1) committed at slots 1..S-1 -> logits (C, S, V)."""
        read = torch.cat([anchor_ids[:, None], prefix_tokens], dim=1)  # (C, S): [anchor, t_1, ..., t_{S-1}]
        states, _ = self.gru(self.embed(read).to(self._dtype()))  # states[:, i]: after reading read[:, :i+1]
        res = self.residual(torch.cat([slot_hidden[:, 1:].to(states.dtype), states[:, 1:]], dim=-1))
        return torch.cat([slot_logits[:, :1], slot_logits[:, 1:] + res.to(slot_logits.dtype)], dim=1)

    @torch.no_grad()
    def propose(self, slot_logits, slot_hidden, target_state, anchor_ids, temperature=0.0, generator=None):
        C, S, V = slot_logits.shape
        _, state = self.gru(self.embed(anchor_ids[:, None]).to(self._dtype()))  # the GRU reads the anchor first
        tok = slot_logits[:, 0].argmax(-1)  # slot 1: uncorrected
        tokens = [tok]
        for s in range(1, S):  # one sequential GRU step + residual per slot
            out, state = self.gru(self.embed(tok[:, None]).to(self._dtype()), state)
            res = self.residual(torch.cat([slot_hidden[:, s].to(out.dtype), out[:, 0]], dim=-1))
            tok = (slot_logits[:, s] + res.to(slot_logits.dtype)).argmax(-1)
            tokens.append(tok)
        return full_proposal(torch.stack(tokens, dim=1))

    def _teacher_forced(self, batch: HeadBatch) -> Tensor:
        return self.corrected_logits(batch.slot_logits, batch.slot_hidden, batch.anchor_ids,
                                     batch.labels[:, :-1].clamp_min(0))

    def row_inputs(self, batch: HeadBatch) -> dict:
        """The residual MLP's hidden layer per slot, teacher-forced (C, S, M); zeros at slot 1, which stays
        uncorrected (the MLP's last Linear has no bias, so a zero input adds exactly nothing)."""
        read = torch.cat([batch.anchor_ids[:, None], batch.labels[:, :-1].clamp_min(0)], dim=1)  # (C, S)
        states, _ = self.gru(self.embed(read).to(self._dtype()))
        hidden = self.residual[1](self.residual[0](torch.cat([batch.slot_hidden[:, 1:].to(states.dtype),
                                                              states[:, 1:]], dim=-1)))  # (C, S-1, M)
        return {"mlp": torch.cat([torch.zeros_like(hidden[:, :1]), hidden], dim=1)}

    def row_terms(self, rows) -> dict:
        terms = rows.label_ce()  # the drafter's own Eq. 6 CE (CE_base)
        corrected = rows.logits + self.residual[2](rows.extra["mlp"]).to(rows.logits.dtype)  # (r, V)
        logp = torch.log_softmax(corrected.float(), dim=-1)
        terms["final"] = -logp.gather(-1, rows.label_cols[:, None])[:, 0]
        return terms

    def objective(self, batch: HeadBatch, terms: dict) -> HeadLoss:
        dflash = batch.dflash(terms)
        w = batch.slot_weights()  # CE_final: the same decayed CE (Eq. 6, no soft labels) on the corrected logits
        ce_final = (terms["final"] * w).sum() / w.sum().clamp_min(1e-12)
        lam = 1.0 - min(max(batch.progress, 0.0), 1.0)
        total = (1.0 - lam) * ce_final + lam * dflash
        return HeadLoss(loss=total, terms={"dflash": dflash, "ce_final": ce_final},
                        metrics={"domino_lambda": lam})

    @torch.no_grad()
    def teacher_forced_top1(self, batch: HeadBatch) -> Tensor:
        return self._teacher_forced(batch).argmax(-1)
