"""The LiLiCorr head (paper §3.2, Appendix A): candidate lattice -> in/out vectors -> matching scores.

Node of candidate k at slot s (all terms of the head's width W, summed):
    embed_proj(E_target[c_{s,k}]) + hidden_proj(h_s) + conf_mlp(LayerNorm(5 confidence scalars)) + slot[s] + rank[k]
A bidirectional Transformer attends over all S*K nodes; each output is then fused with the target
state t (captured target layers at the position that produced the last verified token, averaged over
layers, RMSNorm, projected to W) by SiLU(Linear(cat[h, t, h*t])). Unit-norm out/in heads give o, i
of size d_e; the anchor's single out vector is anchor_head(t). phi = sigma * cos (Eq. 1).

Parameter count at the qwen3-8b preset (H = 4096, W = 1024, d_e = 1024, FFN 2048, 8 heads, S = 15,
K = 8): 36,762,090 = the paper's 36.76M (Table 4), and 32,042,730 at qwen3-4b (H = 2560; paper 32.04M).
The count pins the choices the paper leaves open: biases on every Linear, a plain SiLU feed-forward
(not SwiGLU), a parameter-free collapse (mean) of the five captured layers before a H-wide RMSNorm,
a 5 -> W -> W confidence MLP after a LayerNorm(5) (10 parameters), one final RMSNorm after the Transformer.

Open choices (issue 16), each a HeadConfig option: ours vs NVIDIA Model-Optimizer's LiLiCorr plugin
(modelopt/torch/speculative/plugins/modeling_lilicorr.py, hf_lilicorr.py). Rule: Model-Optimizer's unless
ours trains measurably better on the learning curves of jobs/ablate_head.py (figures and the command in
docs/results.md): the defaults are raw, layernorm, torch (the one choice of ours), fused, drop. Exports
record their choices, so older ones load as made.
With lilicorr_target=fused the count drops by H - W (RMSNorm(H) before the Linear -> RMSNorm(W) after it):
36,759,018 at qwen3-8b, still 36.76M; with lilicorr_slot_bias=shared (vLLM's, the default) by one layer's bias
tables, 8 x (2S - 1) + 8 = 240 more: 36,758,778, still 36.76M.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lilicorr.config import HeadConfig, LossConfig
from lilicorr.kernels.lattice import lattice_scores_reference
from lilicorr.kernels.topk_logsoftmax import (NUM_FEATURES, candidate_features, topk_ids, topk_logsoftmax,
                                              topk_logsoftmax_reference)
from lilicorr.models import losses
from lilicorr.models.decode import commit_tokens, decode_tokens
from lilicorr.models.drafter_layers import RMSNorm
from lilicorr.models.heads import lilicorr_native
from lilicorr.models.heads.lilicorr_inference import HeadInference
from lilicorr.models.heads.base import HeadBatch, HeadLoss, SpecHead, full_proposal
from lilicorr.models.heads.lattice_transformer import LatticeTransformer


LILICORR_CHOICES = {  # HeadConfig field -> (allowed values); the first is ours, the second Model-Optimizer's
    "lilicorr_embed": ("rms", "raw"),
    "lilicorr_feature_norm": ("none", "layernorm"),
    "lilicorr_init": ("torch", "normal"),
    "lilicorr_target": ("mean", "fused"),
    "lilicorr_partial": ("cut", "drop"),
    # where vLLM's LiLiCorrHead differs (issue 39 item 2): ours, then vLLM's
    "lilicorr_slot_bias": ("per_layer", "shared"),
    "lilicorr_norm_eps": ("fixed", "drafter"),
}


def lilicorr_choices(cfg: HeadConfig) -> dict[str, str]:
    """The open choices of HeadConfig, checked, keyed without the `lilicorr_` prefix."""
    out = {}
    for key, allowed in LILICORR_CHOICES.items():
        value = getattr(cfg, key)
        if value not in allowed:
            raise ValueError(f"head.{key}={value!r}; expected one of {', '.join(allowed)}")
        out[key[len("lilicorr_"):]] = value
    return out


class LiLiCorrHead(SpecHead):
    name = "lilicorr"
    compact_vocab = True

    def __init__(self, cfg: HeadConfig, loss_cfg: LossConfig, target_hidden: int, drafter_hidden: int,
                 num_captured: int, block_size: int, drafter_eps: float = 1e-6):
        super().__init__()
        self.cfg, self.loss_cfg = cfg, loss_cfg
        self.K, self.S, self.num_captured = cfg.top_k, block_size - 1, num_captured
        W, d = cfg.width, cfg.embed_dim
        self.choices = lilicorr_choices(cfg)
        # Every RMSNorm of the head (lattice layers, final, target): ours 1e-6, vLLM's the drafter's rms_norm_eps
        eps = drafter_eps if self.choices["norm_eps"] == "drafter" else 1e-6
        self.embed_proj = nn.Linear(target_hidden, W)
        self.hidden_proj = nn.Linear(drafter_hidden, W)
        # The five features reach tens of nats early in training (log-probs, gaps); Model-Optimizer's
        # feature_mlp starts with LayerNorm(5). Separate from conf_mlp so its indices do not move.
        self.feature_norm = nn.LayerNorm(NUM_FEATURES) if self.choices["feature_norm"] == "layernorm" else nn.Identity()
        self.conf_mlp = nn.Sequential(nn.Linear(NUM_FEATURES, W), nn.SiLU(), nn.Linear(W, W))
        self.slot_table = nn.Embedding(self.S, W)
        self.rank_table = nn.Embedding(self.K, W)
        self.lattice = LatticeTransformer(W, cfg.num_heads, cfg.ffn_width, cfg.num_layers, self.S,
                                          shared_bias=self.choices["slot_bias"] == "shared", eps=eps)
        if self.choices["target"] == "mean":
            self.target_norm = RMSNorm(target_hidden, eps)  # over the mean of the n captured layers
            self.target_proj = nn.Linear(target_hidden, W)
        else:  # "fused": the drafter's own hidden_norm(fc(.)) -> Linear -> RMSNorm (Model-Optimizer's anchor)
            self.target_proj = nn.Linear(drafter_hidden, W)
            self.target_norm = RMSNorm(W, eps)
        self.fuse = nn.Linear(3 * W, W)
        self.out_head = nn.Linear(W, d)
        self.in_head = nn.Linear(W, d)
        self.anchor_head = nn.Linear(W, d)
        for m in self.modules():
            if isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
            elif isinstance(m, nn.Linear) and self.choices["init"] == "normal":
                nn.init.normal_(m.weight, std=0.02)  # Model-Optimizer's _init_head_weights
                nn.init.zeros_(m.bias)
        self._drafter = None
        self.reads_context_state = self.choices["target"] == "fused"

    def attach_drafter(self, drafter) -> None:
        # Held outside the module tree like the target: its weights stay in the drafter's state dict and
        # optimiser group; with target="fused" the head's loss still reaches its fusion layer (fc, hidden_norm).
        object.__setattr__(self, "_drafter", drafter)

    # ------------------------------------------------------------------ the single pass

    def vectors(self, cand_ids: Tensor, features: Tensor, slot_hidden: Tensor, target_state: Tensor,
                context_state: Optional[Tensor] = None):
        """cand_ids (C, S, K), features (C, S, K, 5), slot_hidden (C, S, H), target_state (C, n*H)
        -> out (C, S, K, d), in (C, S, K, d) unit-norm, anchor_out (C, d) unit-norm."""
        C, S, K = cand_ids.shape
        dtype = self.embed_proj.weight.dtype
        emb = self.candidate_embedding(self.embed(cand_ids))
        nodes = (self.embed_proj(emb.to(dtype))
                 + self.hidden_proj(slot_hidden.to(dtype))[:, :, None]
                 + self.conf_mlp(self.feature_norm(features.to(dtype)))
                 + self.slot_table.weight[:S, None]
                 + self.rank_table.weight[None, :K])  # (C, S, K, W)
        h = self.lattice(nodes)
        t = self.target_projection(target_state, context_state)  # (C, W)
        t_b = t[:, None, None].expand_as(h)
        fused = F.silu(self.fuse(torch.cat([h, t_b, h * t_b], dim=-1)))
        out_v = F.normalize(self.out_head(fused), dim=-1)
        in_v = F.normalize(self.in_head(fused), dim=-1)
        anchor_out = F.normalize(self.anchor_head(t), dim=-1)
        return out_v, in_v, anchor_out

    def candidate_embedding(self, emb: Tensor) -> Tensor:
        """The frozen target embedding of candidates (..., H) as the head reads it, fp32."""
        emb = emb.float()
        if self.choices["embed"] == "rms":
            # Parameter-free RMS normalisation (ours): target embeddings are tiny (std ~0.02), and on a
            # two-block pairing task (head alone) the matching stayed at its symmetric saddle without it. On the
            # joint learning curve (module doc) it made no measurable difference, so the default is
            # Model-Optimizer's raw frozen embedding ("raw").
            emb = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + 1e-6)
        return emb

    def target_projection(self, target_state: Tensor, context_state: Optional[Tensor] = None) -> Tensor:
        """target_state (C, n*H): the captured target layers at the position before the anchor -> (C, W).
        context_state (C, H_d): the drafter's fuse_context of it when the caller has it (the engine), "fused" only."""
        C, nH = target_state.shape
        dtype = self.target_proj.weight.dtype
        if self.choices["target"] == "fused":
            if context_state is not None:
                return self.target_norm(self.target_proj(context_state.to(dtype)))
            if self._drafter is None:
                raise RuntimeError("head.lilicorr_target='fused' needs the drafter: call attach_drafter first")
            ctx = self._drafter.fuse_context(target_state.to(self._drafter.fc.weight.dtype))  # (C, H_d), grad to fc
            return self.target_norm(self.target_proj(ctx.to(dtype)))
        collapsed = target_state.view(C, self.num_captured, nH // self.num_captured).float().mean(1)  # (C, H)
        return self.target_proj(self.target_norm(collapsed).to(dtype))

    def scores(self, batch_logits: Tensor, slot_hidden: Tensor, target_state: Tensor, differentiable: bool,
               vocab_ids: Optional[Tensor] = None):
        """slot_logits (C, S, V) -> (cand_ids (C, S, K), anchor (C, K), pair (C, S-1, K, K), out, in, a, cand_cols).

        vocab_ids (V',): the token id of each logit column when the logits cover a draft vocabulary only
        (training's compact batches); cand_cols are the candidates' columns, cand_ids their token ids.
        """
        C, S, V = batch_logits.shape
        topk = (topk_logsoftmax_reference if differentiable else topk_logsoftmax)(batch_logits.reshape(C * S, V), self.K)
        return self.scores_of_candidates(topk.ids.view(C, S, self.K), topk.logprobs.view(C, S, self.K),
                                         slot_hidden, target_state, vocab_ids)

    def scores_of_candidates(self, cols: Tensor, logprobs: Tensor, slot_hidden: Tensor, target_state: Tensor,
                             vocab_ids: Optional[Tensor] = None):
        """The candidates' columns and drafter log-probs (C, S, K) -> what `scores` returns."""
        C, S, K = cols.shape
        cand = cols if vocab_ids is None else vocab_ids[cols]
        features = candidate_features(logprobs.reshape(C * S, K)).view(C, S, K, NUM_FEATURES)
        o, i, a = self.vectors(cand, features, slot_hidden, target_state)
        anchor_scores, pair_scores = lattice_scores_reference(o, i, a, self.cfg.sigma)
        return cand, anchor_scores, pair_scores, o, i, a, cols

    # ------------------------------------------------------------------ inference

    @torch.no_grad()
    def propose(self, slot_logits, slot_hidden, target_state, anchor_ids, temperature=0.0, generator=None,
                vocab_ids=None, context_state=None, fast: Optional[HeadInference] = None):
        """fast: the decoder's HeadInference (engine/drafting.py: the paths engine/backend.py chose and their
        tables); None runs the modules, the reference."""
        C, S, V = slot_logits.shape
        if (fast is not None and fast.native and C == 1 and self.cfg.decode_rule == "greedy"
                and slot_logits.device.type == "cpu" and not torch.is_grad_enabled()):
            # the whole proposal in one C call (heads/lilicorr_native.py); None: a row it does not take
            found = lilicorr_native.propose_one_row(self, fast, slot_logits, vocab_ids, slot_hidden, target_state,
                                                    context_state)
            if found is not None:
                return full_proposal(found[0], extra={"cand_ids": found[1]})
        topk = topk_logsoftmax(slot_logits.reshape(C * S, V), self.K)
        cand = topk.ids.view(C, S, self.K)
        if vocab_ids is not None:  # draft-vocabulary logits (training metrics): columns -> token ids
            cand = vocab_ids[cand]
        features = topk.features.view(C, S, self.K, NUM_FEATURES)
        o, i, a = self.vectors(cand, features, slot_hidden, target_state, context_state)
        tokens = decode_tokens(cand, o, i, a, self.cfg.sigma, self.cfg.decode_rule)
        return full_proposal(tokens, extra={"cand_ids": cand})

    # ------------------------------------------------------------------ training

    def _teacher_forced(self, batch: HeadBatch):
        """Dense batches (metrics, tests): (cand, g_idx, prefix, z) from the batch's slot_logits."""
        cand, anchor_scores, pair_scores, *_ = self.scores(batch.slot_logits, batch.slot_hidden, batch.target_state,
                                                           True, batch.vocab_ids)
        return (cand, *self._oracle_scores(batch, cand, anchor_scores, pair_scores))

    def _oracle_scores(self, batch: HeadBatch, cand: Tensor, anchor_scores: Tensor, pair_scores: Tensor):
        # Indices fixed, gradients through the candidates' log-probs and the hidden states (§3.4).
        g_idx, prefix = losses.oracle_prefix(cand, batch.labels, batch.valid,
                                             drop_partial=self.choices["partial"] == "drop")
        z = losses.teacher_forced_scores(anchor_scores, pair_scores, g_idx)  # (C, S, K)
        return g_idx, prefix, z

    def row_terms(self, rows) -> dict:
        """Per row: Eq. 6's CE terms, the K candidates' columns, their drafter log-probs (grad) and target log q."""
        terms = rows.label_ce()
        cols = topk_ids(rows.logits, self.K)  # (r, K)
        terms["cand_cols"] = cols
        terms["cand_logprobs"] = rows.logp().gather(-1, cols)
        terms["target_logq"] = rows.target_logq(cols)  # the target's log q over the same columns
        return terms

    def objective(self, batch: HeadBatch, terms: dict) -> HeadLoss:
        dflash = batch.dflash(terms)
        cand, anchor_scores, pair_scores, *_ = self.scores_of_candidates(
            terms["cand_cols"], terms["cand_logprobs"], batch.slot_hidden, batch.target_state, batch.vocab_ids)
        g_idx, prefix, z = self._oracle_scores(batch, cand, anchor_scores, pair_scores)
        logq = terms["target_logq"]
        ce = losses.lilicorr_ce(z, g_idx, prefix)
        dist = losses.distractor_penalty(z, g_idx, logq, prefix)
        margin = losses.margin_loss(z, g_idx, prefix, self.loss_cfg.rho)
        total = losses.lilicorr_objective(dflash, ce, dist, margin, self.loss_cfg)
        with torch.no_grad():
            n = prefix.sum().clamp_min(1).float()
            metrics = {
                "head_top1_oracle": float(((z.argmax(-1) == g_idx) & prefix).sum() / n),
                "drafter_top1_oracle": float(((g_idx == 0) & prefix).sum() / n),
                "oracle_slots": float(prefix.sum()),
            }
        return HeadLoss(loss=total, terms={"dflash": dflash, "ce": ce, "dist": dist, "margin": margin},
                        metrics=metrics)

    @torch.no_grad()
    def teacher_forced_top1(self, batch: HeadBatch) -> Tensor:
        cand, g_idx, prefix, z = self._teacher_forced(batch)
        return commit_tokens(cand, z.argmax(-1))
