"""DSpark baseline (docs/design.md §4) as SpecForge trains it: a Markov bias on the logits and a confidence cut-off.

Reference: sgl-project/SpecForge specforge/modeling/draft/dspark.py (VanillaMarkovHead, AcceptRatePredictor,
DSparkDraftModel.predict_confidence) and specforge/algorithms/common/dflash_family_model.py
(OnlineDSparkModel: _build_dspark_labels_and_mask, _dspark_objective_chunk_terms, _compute_dspark_loss).
    logits_k = drafter_logits_k + W2(W1[x_{k-1}])  (rank r = 256 at paper scale; x_0 is the anchor)
    conf_k   = Linear(cat[h_k, W1[x_{k-1}]])  (confidence_head_with_markov = true in qwen3-8b-dspark.json)
    a_k      = clamp(1 - 1/2 ||p_draft,k - p_target,k||_1, 0, 1)
    loss     = (0.1 sum_k m_k CE_k + 0.9 sum_k m_k ||p_draft,k - p_target,k||_1 + 1.0 sum_k m_k BCE(conf_k, a_k)) / sum_k m_k
The distance term is the full L1 (twice the total variation): SpecForge's dspark_l1_loss_alpha = 0.9 weights
`l1_per_token = (p_draft - p_target).abs().sum(-1)`. The mask m is a cumulative product along the block
(`eval_mask.cumprod(dim=-1)`): a slot counts only while every earlier slot of its block is supervised, so
a block is cut at its first unsupervised slot. No slot decay (qwen3-8b-dspark-offline.yaml sets no
loss_decay_gamma). W1 and the Linears are N(0, 0.02) (HF post_init, initializer_range 0.02), biases 0.
At inference the draft is cut at the first slot whose sigmoid(conf) falls below the threshold. Two proposal
contracts: deterministic (argmax, q = one-hot) and sampled (x_k ~ q_k by exponential race, q_probs returned).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lilicorr.config import HeadConfig
from lilicorr.models import losses
from lilicorr.models.heads.base import HeadBatch, HeadLoss, Proposal, SpecHead

CE_WEIGHT, L1_WEIGHT, BCE_WEIGHT = 0.1, 0.9, 1.0  # dspark_{ce,l1,confidence_head}_alpha


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
        for w in (self.w1.weight, self.w2.weight, self.confidence.weight):
            nn.init.normal_(w, std=0.02)  # SpecForge: HF post_init, initializer_range 0.02
        nn.init.zeros_(self.confidence.bias)

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
                noise = torch.empty_like(q).exponential_(generator=generator)
                prev = (q / noise).argmax(-1)  # exponential race (engine.sampling.exponential_race): x ~ q
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

    def row_inputs(self, batch: HeadBatch) -> dict:
        prev = torch.cat([batch.anchor_ids[:, None], batch.labels[:, :-1].clamp_min(0)], dim=1)  # (C, S)
        return {"markov": self.w1(prev)}  # (C, S, r): W1[x_{k-1}], with grad

    def row_terms(self, rows) -> dict:
        terms = rows.label_ce()  # the drafter's own Eq. 6 CE: logged, not in DSpark's objective
        logits = rows.logits + self.w2(rows.extra["markov"]).to(rows.logits.dtype)  # (r, V)
        logp = torch.log_softmax(logits.float(), dim=-1)
        terms["ce"] = -logp.gather(-1, rows.label_cols[:, None])[:, 0]
        with torch.no_grad():
            p_target = torch.softmax(rows.target_logits().float(), dim=-1)
        terms["l1"] = (logp.exp() - p_target).abs().sum(-1)  # (r,), in [0, 2]
        return terms

    def objective(self, batch: HeadBatch, terms: dict) -> HeadLoss:
        dflash = batch.dflash(terms)
        m = losses.cumulative_mask(batch.valid).float()
        n = m.sum().clamp_min(1.0)
        m_ce = m * batch.ce_valid().float()  # labels outside a draft vocabulary carry no CE
        ce = (terms["ce"] * m_ce).sum() / m_ce.sum().clamp_min(1.0)
        l1 = (terms["l1"] * m).sum() / n
        accept = (1.0 - 0.5 * terms["l1"]).clamp(0.0, 1.0).detach()
        prev = torch.cat([batch.anchor_ids[:, None], batch.labels[:, :-1].clamp_min(0)], dim=1)
        conf = self.confidence(torch.cat([batch.slot_hidden.to(self.w1.weight.dtype), self.w1(prev)], dim=-1))[..., 0]
        bce = (F.binary_cross_entropy_with_logits(conf.float(), accept, reduction="none") * m).sum() / n
        total = CE_WEIGHT * ce + L1_WEIGHT * l1 + BCE_WEIGHT * bce
        return HeadLoss(loss=total, terms={"dflash": dflash, "ce": ce, "l1": l1, "bce": bce})

    @torch.no_grad()
    def teacher_forced_top1(self, batch: HeadBatch) -> Tensor:
        prev = torch.cat([batch.anchor_ids[:, None], batch.labels[:, :-1].clamp_min(0)], dim=1)
        return self.step(batch.slot_logits, batch.slot_hidden, prev)[0].argmax(-1)
