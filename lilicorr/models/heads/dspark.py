"""DSpark baseline (DESIGN.md §4): a Markov bias on the drafter's logits and a confidence cut-off.

logits_k = drafter_logits_k + W2(W1[x_{k-1}])  (rank r = 256 at paper scale; x_0 is the anchor)
conf_k   = sigmoid(Linear(cat[h_k, W1[x_{k-1}]]))  trained by BCE against 1 - 1/2 ||p_draft - p_target||_1
loss     = 0.1 CE + 0.9 TV + 1.0 BCE  (teacher-forced: x_{k-1} is the ground truth)
At inference the draft is cut at the first slot whose confidence falls below the threshold. Two
proposal contracts: deterministic (argmax, q = one-hot) and sampled (x_k ~ q_k, q_probs returned).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lilicorr.config import HeadConfig
from lilicorr.models.heads.base import HeadBatch, HeadLoss, Proposal, SpecHead

CE_WEIGHT, TV_WEIGHT, BCE_WEIGHT = 0.1, 0.9, 1.0


class DSparkHead(SpecHead):
    name = "dspark"

    def __init__(self, cfg: HeadConfig, drafter_hidden: int, vocab_size: int):
        super().__init__()
        self.threshold = cfg.dspark_threshold
        self.sampled = cfg.dspark_proposal == "sampled"
        if cfg.dspark_proposal not in ("deterministic", "sampled"):
            raise ValueError(f"unknown head.dspark_proposal {cfg.dspark_proposal!r}")
        self.w1 = nn.Embedding(vocab_size, cfg.dspark_rank)
        self.w2 = nn.Linear(cfg.dspark_rank, vocab_size, bias=False)
        self.confidence = nn.Linear(drafter_hidden + cfg.dspark_rank, 1)
        nn.init.normal_(self.w1.weight, std=0.02)
        nn.init.zeros_(self.w2.weight)  # start as vanilla DFlash

    def step(self, slot_logits: Tensor, slot_hidden: Tensor, prev_tokens: Tensor):
        """Any leading shape: logits (..., V), hidden (..., H), prev (...) -> final logits, confidence logit."""
        e = self.w1(prev_tokens)  # (..., r)
        logits = slot_logits + self.w2(e).to(slot_logits.dtype)
        conf = self.confidence(torch.cat([slot_hidden.to(e.dtype), e], dim=-1))[..., 0]
        return logits, conf

    @torch.no_grad()
    def propose(self, slot_logits, slot_hidden, target_state, anchor_ids, temperature: float = 0.0,
                generator: Optional[torch.Generator] = None) -> Proposal:
        C, S, V = slot_logits.shape
        sample = self.sampled and temperature > 0
        prev, tokens, confs, qs = anchor_ids, [], [], []
        for s in range(S):  # Markov: each slot reads the token committed just before it
            logits, conf = self.step(slot_logits[:, s], slot_hidden[:, s], prev)
            if sample:
                q = torch.softmax(logits.float() / temperature, dim=-1)
                prev = torch.multinomial(q, 1, generator=generator)[:, 0]
                qs.append(q)
            else:
                prev = logits.argmax(-1)
            tokens.append(prev)
            confs.append(torch.sigmoid(conf))
        conf = torch.stack(confs, dim=1)  # (C, S)
        low = conf < self.threshold
        # First low-confidence slot = number of slots kept (S when none is low).
        num = torch.where(low.any(1), low.to(torch.int8).argmax(1), torch.full_like(low[:, 0], S, dtype=torch.long))
        return Proposal(tokens=torch.stack(tokens, dim=1), num_proposed=num.long(),
                        q_probs=torch.stack(qs, dim=1) if sample else None, extra={"confidence": conf})

    def loss(self, batch: HeadBatch, dflash: Tensor) -> HeadLoss:
        prev = torch.cat([batch.anchor_ids[:, None], batch.labels[:, :-1].clamp_min(0)], dim=1)  # (C, S)
        logits, conf = self.step(batch.slot_logits, batch.slot_hidden, prev)
        m = batch.valid.float()
        n = m.sum().clamp_min(1.0)
        ce = (F.cross_entropy(logits.flatten(0, 1).float(), batch.labels.flatten().clamp_min(0),
                              reduction="none").view_as(m) * m).sum() / n
        p_draft = torch.softmax(logits.float(), dim=-1)
        with torch.no_grad():
            p_target = torch.softmax(batch.target_logits.float(), dim=-1)
        tv_slot = 0.5 * (p_draft - p_target).abs().sum(-1)  # (C, S)
        tv = (tv_slot * m).sum() / n
        bce = (F.binary_cross_entropy_with_logits(conf.float(), (1.0 - tv_slot).detach(), reduction="none") * m).sum() / n
        total = CE_WEIGHT * ce + TV_WEIGHT * tv + BCE_WEIGHT * bce
        return HeadLoss(loss=total, terms={"dflash": dflash, "ce": ce, "tv": tv, "bce": bce})

    @torch.no_grad()
    def teacher_forced_top1(self, batch: HeadBatch) -> Tensor:
        prev = torch.cat([batch.anchor_ids[:, None], batch.labels[:, :-1].clamp_min(0)], dim=1)
        return self.step(batch.slot_logits, batch.slot_hidden, prev)[0].argmax(-1)
